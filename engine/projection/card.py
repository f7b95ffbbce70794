"""The model card: parameter counts, bytes and KV-cache size computed from a `ModelSpec`.

Every figure the pages teach about a model's size starts here, from the config alone: dense
and mixture-of-experts MLPs (total and active parameters), grouped-query and multi-head latent
attention, sliding-window and chunked layers, and weights as real quantized checkpoints store them.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.projection.specs import ModelSpec, dtype_bytes

# How quantized checkpoints store a weight matrix: extra bytes per weight for scales (and zeros).
# INT4 (AWQ/GPTQ): an FP16 scale and a 4-bit zero point per group of 128 weights.
# NF4 (bitsandbytes): an FP32 absmax per block of 64 weights.
# FP8 / INT8: one FP32 scale per output channel, i.e. per row of about d_model weights.
GROUPED_SCALE_BYTES = {"int4": 2.5 / 128, "nf4": 4 / 64}
CHANNEL_SCALE_BYTES = 4.0
HIGH_PRECISION = "bf16"   # embeddings, LM head, norms and routers stay 16-bit in quantized checkpoints


@dataclass(frozen=True)
class ParamCounts:
    """Parameters per component of a decoder."""

    embeddings: int
    attention: int   # all layers: Q, K, V, O (MLA: the low-rank projections and their norms), biases, q/k norms
    mlp: int         # dense layers' MLPs plus MoE layers' shared experts
    norms: int       # the per-layer RMSNorms plus the final norm
    lm_head: int     # 0 when tied to the embeddings
    experts: int = 0   # routed experts of every MoE layer (all of them, or the routed share: see `active`)
    routers: int = 0   # one d_model x n_experts gate per MoE layer

    @property
    def total(self) -> int:
        return self.embeddings + self.attention + self.mlp + self.norms + self.lm_head + self.experts + self.routers

    def as_dict(self) -> dict[str, int]:
        return {"embeddings": self.embeddings, "attention": self.attention, "mlp": self.mlp,
                "experts": self.experts, "routers": self.routers, "norms": self.norms, "lm_head": self.lm_head,
                "total": self.total}


def _mla_params_per_layer(spec: ModelSpec) -> int:
    """DeepSeek MLA: Q through an optional low-rank bottleneck; one latent (plus a RoPE key) for K and V."""
    d, h, rank, rope = spec.d_model, spec.n_heads, spec.kv_lora_rank, spec.qk_rope_head_dim
    q_width = h * spec.head_dim
    q = d * spec.q_lora_rank + spec.q_lora_rank + spec.q_lora_rank * q_width if spec.q_lora_rank else d * q_width
    kv_down = d * (rank + rope) + rank                                  # W_DKV and W_KR, then the latent's norm
    kv_up = rank * h * (spec.head_dim - rope + spec.value_dim)          # K (no-RoPE part) and V from the latent
    return q + kv_down + kv_up + h * spec.value_dim * d


def attention_params_per_layer(spec: ModelSpec) -> int:
    if spec.is_mla:
        return _mla_params_per_layer(spec)
    q_width = spec.n_heads * spec.head_dim
    k_width, v_width = spec.n_kv_heads * spec.head_dim, spec.n_kv_heads * spec.value_dim
    weights = spec.d_model * (q_width + k_width + v_width) + spec.n_heads * spec.value_dim * spec.d_model
    biases = q_width + k_width + v_width if spec.attention_bias else 0
    return weights + biases + (2 * spec.head_dim if spec.qk_norm else 0)


def mlp_params_per_layer(spec: ModelSpec) -> int:
    """A dense layer's SwiGLU MLP: gate, up and down."""
    return 3 * spec.d_model * spec.intermediate_size


def expert_params(spec: ModelSpec) -> int:
    """One routed expert of one MoE layer: a SwiGLU MLP of the expert width."""
    return 3 * spec.d_model * spec.expert_intermediate_size


def moe_params_per_layer(spec: ModelSpec, experts: float | None = None) -> float:
    """An MoE layer with all (or `experts`) routed experts, its shared experts and its router."""
    n = spec.n_experts if experts is None else experts
    return n * expert_params(spec) + 3 * spec.d_model * spec.shared_intermediate_size + spec.d_model * spec.n_experts


def param_counts(spec: ModelSpec, experts_per_layer: float | None = None) -> ParamCounts:
    """Every parameter; with `experts_per_layer`, only that many routed experts per MoE layer."""
    embeddings = spec.vocab_size * spec.d_model
    n = spec.n_experts if experts_per_layer is None else experts_per_layer
    return ParamCounts(
        embeddings=embeddings,
        attention=spec.n_layers * attention_params_per_layer(spec),
        mlp=spec.dense_layers * mlp_params_per_layer(spec) + spec.moe_layers * 3 * spec.d_model * spec.shared_intermediate_size,
        norms=(spec.norms_per_layer * spec.n_layers + 1) * spec.d_model,
        lm_head=0 if spec.tie_embeddings else embeddings,
        experts=round(spec.moe_layers * n * expert_params(spec)),
        routers=spec.moe_layers * spec.d_model * spec.n_experts,
    )


def active_param_counts(spec: ModelSpec) -> ParamCounts:
    """The parameters one token goes through: the routed experts it picks, everything else whole."""
    return param_counts(spec, spec.experts_per_token if spec.is_moe else None)


def lm_head_params(spec: ModelSpec) -> int:
    """The LM head matrix (the embedding matrix again when tied): computed on, whether stored twice or not."""
    return spec.vocab_size * spec.d_model


def matmul_params_per_token(spec: ModelSpec) -> int:
    """Weights one token is multiplied through in decode: active parameters less the embedding lookup
    (a row read, no arithmetic) and the norms (elementwise), plus the LM head."""
    active = active_param_counts(spec)
    return active.total - active.embeddings - active.norms - active.lm_head + lm_head_params(spec)


# --- bytes of weights -----------------------------------------------------------------------------

def naive_weight_bytes(spec: ModelSpec, dtype: str = "bf16") -> float:
    """Parameters x bytes per weight: the textbook figure (Llama 70B in INT4 = 35 GB)."""
    return param_counts(spec).total * dtype_bytes(dtype)


def bytes_per_quantized_weight(spec: ModelSpec, dtype: str) -> float:
    """Bytes one weight of a linear layer takes, scales and zero points included."""
    size = dtype_bytes(dtype)
    if size >= 2:
        return size
    key = str(dtype).lower()
    return size + GROUPED_SCALE_BYTES.get(key, CHANNEL_SCALE_BYTES / spec.d_model)


def high_precision_params(spec: ModelSpec) -> int:
    """Parameters a quantized checkpoint keeps in 16-bit: embeddings, LM head, norms, routers."""
    c = param_counts(spec)
    return c.embeddings + c.lm_head + c.norms + c.routers


def weight_bytes(spec: ModelSpec, dtype: str = "bf16") -> float:
    """Bytes of the weights as a checkpoint in `dtype` stores them. 16/32-bit: parameters x bytes.
    8- and 4-bit: linear layers at that width plus their scales; the rest stays 16-bit (INT4 8B: ~5.7 GB)."""
    size = dtype_bytes(dtype)
    if size >= 2:
        return naive_weight_bytes(spec, dtype)
    kept = high_precision_params(spec)
    quantized = param_counts(spec).total - kept
    return quantized * bytes_per_quantized_weight(spec, dtype) + kept * dtype_bytes(HIGH_PRECISION)


def expert_bytes(spec: ModelSpec, dtype: str = "bf16") -> float:
    """Bytes of one routed expert of one layer."""
    return expert_params(spec) * bytes_per_quantized_weight(spec, dtype)


# --- the KV cache ----------------------------------------------------------------------------------

def kv_bytes_per_token_per_layer(spec: ModelSpec, dtype: str = "bf16") -> float:
    """GQA: K and V for each KV head. MLA: one latent plus the shared RoPE key, whatever the head count."""
    if spec.is_mla:
        return (spec.kv_lora_rank + spec.qk_rope_head_dim) * dtype_bytes(dtype)
    return spec.n_kv_heads * (spec.head_dim + spec.value_dim) * dtype_bytes(dtype)


def kv_bytes_per_token(spec: ModelSpec, dtype: str = "bf16") -> float:
    """Bytes one token adds while it is inside every window: 2 (K and V) x layers x kv_heads x head_dim
    x bytes per value (MLA: (latent + RoPE dims) x layers x bytes)."""
    return spec.n_layers * kv_bytes_per_token_per_layer(spec, dtype)


def residual_bytes_per_token(spec: ModelSpec, value_bytes: float) -> float:
    """Bytes one token's residual stream takes when a run keeps it whole (engine/core/hooks.py): d_model values
    entering each of the layers and the final norm, (layers + 1) x d_model x bytes per value."""
    return (spec.n_layers + 1) * spec.d_model * value_bytes


def cached_layer_tokens(spec: ModelSpec, context: int) -> int:
    """(layer, token) pairs held in the cache at `context`. A windowed layer keeps only the last
    window - 1 tokens between steps (the next token completes its window), as transformers' cache does."""
    windowed = min(context, spec.window - 1) if spec.windowed_layers else 0
    return spec.full_layers * context + spec.windowed_layers * windowed


def kv_bytes_per_user(spec: ModelSpec, context: int, dtype: str = "bf16") -> float:
    """The cache one sequence of `context` tokens holds."""
    return cached_layer_tokens(spec, context) * kv_bytes_per_token_per_layer(spec, dtype)


def kv_cache_bytes(spec: ModelSpec, tokens: int, dtype: str = "bf16", batch: int = 1) -> float:
    return kv_bytes_per_user(spec, tokens, dtype) * batch


def expected_experts_touched(spec: ModelSpec, tokens: int) -> float:
    """Distinct routed experts per MoE layer that `tokens` tokens pick, with balanced routing:
    each token picks k of E, so one expert is missed by all of them with probability (1 - k/E)^tokens."""
    if not spec.is_moe:
        return 0.0
    e, k = spec.n_experts, spec.experts_per_token
    return e * (1 - (1 - k / e) ** max(tokens, 0))


# --- the card --------------------------------------------------------------------------------------

def _architecture_notes(spec: ModelSpec) -> dict:
    notes: dict = {}
    if spec.is_moe:
        notes["mixture_of_experts"] = {
            "experts": spec.n_experts, "experts_per_token": spec.experts_per_token,
            "expert_intermediate_size": spec.expert_intermediate_size,
            "shared_intermediate_size": spec.shared_intermediate_size, "moe_layers": spec.moe_layers,
            "dense_layers": spec.dense_layers,
            "experts_touched_per_step": {b: round(expected_experts_touched(spec, b), 2) for b in (1, 8, 64, 256)}}
    if spec.is_mla:
        notes["latent_attention"] = {"kv_lora_rank": spec.kv_lora_rank, "q_lora_rank": spec.q_lora_rank,
                                     "qk_rope_head_dim": spec.qk_rope_head_dim, "v_head_dim": spec.value_dim}
    if spec.windowed_layers:
        notes["windowed_layers"] = {"kind": spec.window_kind, "window": spec.window, "layers": spec.windowed_layers,
                                    "full_layers": spec.full_layers}
    return notes


def model_card(spec: ModelSpec, dtype: str = "bf16") -> dict:
    """Everything a page or the CLI prints about a model, as plain JSON-able data."""
    contexts = sorted({c for c in (1024, 8192, 32768, 131072) if c <= spec.max_context} | {spec.max_context})
    return {
        "name": spec.name, "architecture": spec.architecture, "model_type": spec.model_type,
        "layers": spec.n_layers, "d_model": spec.d_model, "query_heads": spec.n_heads, "kv_heads": spec.n_kv_heads,
        "query_heads_per_kv_head": spec.group_size, "head_dim": spec.head_dim,
        "intermediate_size": spec.intermediate_size, "vocab_size": spec.vocab_size, "max_context": spec.max_context,
        "rope_theta": spec.rope_theta, "tied_embeddings": spec.tie_embeddings,
        **_architecture_notes(spec),
        "parameters": param_counts(spec).as_dict(),
        "active_parameters": active_param_counts(spec).as_dict(),
        "attention_params_per_layer": attention_params_per_layer(spec),
        "mlp_params_per_layer": mlp_params_per_layer(spec),
        "dtype": dtype,
        "weight_bytes": {d: weight_bytes(spec, d) for d in ("fp32", "bf16", "fp8", "int8", "int4")},
        "weight_bytes_params_x_width": {d: naive_weight_bytes(spec, d) for d in ("fp32", "bf16", "int8", "int4")},
        "kv_bytes_per_token": {d: kv_bytes_per_token(spec, d) for d in ("fp32", "bf16", "fp8", "int4")},
        "kv_bytes_per_user": {str(c): kv_bytes_per_user(spec, c, dtype) for c in contexts},
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
