"""The model card: parameter counts, bytes and KV-cache size computed from a `ModelSpec`.

Every figure the pages teach about a model's size starts here, from the config alone.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.specs import ModelSpec, dtype_bytes


@dataclass(frozen=True)
class ParamCounts:
    """Parameters per component of a Llama-family decoder."""

    embeddings: int
    attention: int   # all layers: W_Q, W_K, W_V, W_O (+ Q/K/V biases where the model has them)
    mlp: int         # all layers: W_gate, W_up, W_down
    norms: int       # two RMSNorms per layer plus the final norm
    lm_head: int     # 0 when tied to the embeddings

    @property
    def total(self) -> int:
        return self.embeddings + self.attention + self.mlp + self.norms + self.lm_head

    def as_dict(self) -> dict[str, int]:
        return {"embeddings": self.embeddings, "attention": self.attention, "mlp": self.mlp,
                "norms": self.norms, "lm_head": self.lm_head, "total": self.total}


def attention_params_per_layer(spec: ModelSpec) -> int:
    q_width = spec.n_heads * spec.head_dim
    kv_width = spec.n_kv_heads * spec.head_dim
    weights = spec.d_model * q_width + 2 * spec.d_model * kv_width + q_width * spec.d_model
    biases = q_width + 2 * kv_width if spec.attention_bias else 0
    return weights + biases


def mlp_params_per_layer(spec: ModelSpec) -> int:
    return 3 * spec.d_model * spec.intermediate_size


def param_counts(spec: ModelSpec) -> ParamCounts:
    embeddings = spec.vocab_size * spec.d_model
    return ParamCounts(
        embeddings=embeddings,
        attention=spec.n_layers * attention_params_per_layer(spec),
        mlp=spec.n_layers * mlp_params_per_layer(spec),
        norms=(2 * spec.n_layers + 1) * spec.d_model,
        lm_head=0 if spec.tie_embeddings else embeddings,
    )


def weight_bytes(spec: ModelSpec, dtype: str = "bf16") -> float:
    """Bytes of all weights stored in `dtype`."""
    return param_counts(spec).total * dtype_bytes(dtype)


def kv_bytes_per_token(spec: ModelSpec, dtype: str = "bf16") -> float:
    """2 (K and V) x layers x kv_heads x head_dim x bytes per value."""
    return 2 * spec.n_layers * spec.n_kv_heads * spec.head_dim * dtype_bytes(dtype)


def kv_cache_bytes(spec: ModelSpec, tokens: int, dtype: str = "bf16", batch: int = 1) -> float:
    return kv_bytes_per_token(spec, dtype) * tokens * batch


def model_card(spec: ModelSpec, dtype: str = "bf16") -> dict:
    """Everything a page or the CLI prints about a model, as plain JSON-able data."""
    counts = param_counts(spec)
    return {
        "name": spec.name,
        "architecture": spec.architecture,
        "layers": spec.n_layers,
        "d_model": spec.d_model,
        "query_heads": spec.n_heads,
        "kv_heads": spec.n_kv_heads,
        "query_heads_per_kv_head": spec.group_size,
        "head_dim": spec.head_dim,
        "intermediate_size": spec.intermediate_size,
        "vocab_size": spec.vocab_size,
        "max_context": spec.max_context,
        "rope_theta": spec.rope_theta,
        "tied_embeddings": spec.tie_embeddings,
        "parameters": counts.as_dict(),
        "attention_params_per_layer": attention_params_per_layer(spec),
        "mlp_params_per_layer": mlp_params_per_layer(spec),
        "dtype": dtype,
        "weight_bytes": {d: weight_bytes(spec, d) for d in ("fp32", "bf16", "int8", "int4")},
        "kv_bytes_per_token": {d: kv_bytes_per_token(spec, d) for d in ("fp32", "bf16", "fp8", "int4")},
    }


def forward_shapes(spec: ModelSpec, tokens: int, batch: int = 1) -> dict[str, tuple[int, ...]]:
    """The tensor shapes one forward pass over `tokens` positions goes through, in order."""
    b, t, d = batch, tokens, spec.d_model
    return {
        "input_ids": (b, t),
        "embedding": (b, t, d),
        "q": (b, spec.n_heads, t, spec.head_dim),
        "k": (b, spec.n_kv_heads, t, spec.head_dim),
        "v": (b, spec.n_kv_heads, t, spec.head_dim),
        "attention_scores": (b, spec.n_heads, t, t),
        "attention_out": (b, t, spec.n_heads * spec.head_dim),
        "o_proj": (b, t, d),
        "mlp_gate_up": (b, t, spec.intermediate_size),
        "mlp_down": (b, t, d),
        "final_norm": (b, t, d),
        "logits": (b, spec.vocab_size),
        "probabilities": (b, spec.vocab_size),
    }
