"""One decode step of a Llama-family model, on the model's own weights, without its modules.

    lean = lean_step_for(lm)                          # None for a model it does not cover (it says why in `why_not`)
    logits = lean(token_id, position, kv)             # (V,); kv(layer, k, v) stores the new K/V, returns all of it
    logits = lean.rows(ids, positions, kv, mask)      # [B, V]: one token for each of B sequences (a batch's step)

A batch-1 decode step reads every weight once (0.54 GB for SmolLM2-135M in float32), and on a CPU that is most
of its time; the rest is host work: transformers' modules build a mask, a cache update and a dozen small tensors
per layer through a few hundred Python calls. Measured on this 2-core machine (docs/engine.md, "Where a lone
request's milliseconds go"), that host work was about a fifth of the step. Here a step is the same arithmetic in
a dozen tensor operations per layer, reading the same parameters (nothing is copied): the RMS norms as
transformers writes them, its own rotary embedding and `apply_rotary_pos_emb`, q/k/v/o and the gated MLP as
`F.linear` on the module's weights and biases, and attention as one SDPA call over the sequence's keys (no mask:
a single query sees every key before it). No hooks run.

`rows` is the same step for a batch (engine/serving/lean.py): each row its own token and position, the keys each
row reads padded on the left and hidden by `mask` [B, 1, 1, W], the products through `linear` (the packed
small-batch kernel, engine/core/small_batch.py), and, when asked, the residual entering every layer and the final
norm (`hidden`, as transformers' `output_hidden_states` numbers them) for the rows that capture.

Which models: the plain decoder stacks whose layers are exactly that (`model_type` llama, qwen2, mistral without
a sliding window): any other gets None and keeps the ordinary path. Tests check the logits against the model's
own forward and the tokens of whole answers against `engine.core.generate` (tests/test_lean.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.nn import functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from engine.core.loader import LoadedModel

COVERED = ("llama", "qwen2", "mistral")
# kv(layer, k, v): k, v [B, KVH, 1, D] of the new positions; returns the layer's keys and values [B, KVH, T, D]
KV = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
# linear(x, weight, bias): x @ weight.T + bias, as F.linear
Linear = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]
# x -> the products of x with several weights, side by side (e.g. [q | k | v])
Product = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Fused:
    """A layer's products that share an input, each made as one product (None: one weight at a time)."""

    qkv: Product | None = None
    gate_up: Product | None = None


NOT_FUSED = Fused()


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer's parameters (the module's own tensors, not copies)."""

    ln1: torch.Tensor
    ln2: torch.Tensor
    q: tuple[torch.Tensor, torch.Tensor | None]
    k: tuple[torch.Tensor, torch.Tensor | None]
    v: tuple[torch.Tensor, torch.Tensor | None]
    o: tuple[torch.Tensor, torch.Tensor | None]
    gate: tuple[torch.Tensor, torch.Tensor | None]
    up: tuple[torch.Tensor, torch.Tensor | None]
    down: tuple[torch.Tensor, torch.Tensor | None]


def why_not(model: Any) -> str | None:
    """Why the lean step cannot stand in for this model's forward, or None when it can."""
    config = model.config
    if getattr(config, "model_type", None) not in COVERED:
        return f"model type {getattr(config, 'model_type', None)!r} (covered: {', '.join(COVERED)})"
    if getattr(config, "hidden_act", "silu") != "silu" or getattr(config, "pretraining_tp", 1) != 1:
        return "an activation other than SiLU, or split weights (pretraining_tp)"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "sliding-window attention"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "rotary_emb") or not hasattr(model, "lm_head"):
        return "not a decoder stack with rotary embeddings and an LM head"
    attn = inner.layers[0].self_attn
    if any(hasattr(attn, name) for name in ("q_norm", "k_norm")):
        return "per-head Q/K norms"
    return None


def _lin(module: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    return module.weight, module.bias


def _layer_weights(layer: Any) -> LayerWeights:
    attn, mlp = layer.self_attn, layer.mlp
    return LayerWeights(layer.input_layernorm.weight, layer.post_attention_layernorm.weight, _lin(attn.q_proj),
                        _lin(attn.k_proj), _lin(attn.v_proj), _lin(attn.o_proj), _lin(mlp.gate_proj),
                        _lin(mlp.up_proj), _lin(mlp.down_proj))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm, operation for operation: x [..., d]."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


class LeanStep:
    """A decode step of one sequence: embedding, every layer, the final norm and the LM head."""

    def __init__(self, lm: LoadedModel):
        model = lm.model
        self.lm, self.config = lm, model.config
        self.layers = [_layer_weights(layer) for layer in model.model.layers]
        self.embed, self.norm = model.model.embed_tokens, model.model.norm.weight
        self.head = _lin(model.lm_head)
        self.rotary = model.model.rotary_emb
        self.eps = float(self.config.rms_norm_eps)
        self.heads, self.kv_heads, self.head_dim = lm.spec.n_heads, lm.spec.n_kv_heads, lm.spec.head_dim
        self.scaling = float(getattr(model.model.layers[0].self_attn, "scaling", self.head_dim ** -0.5))

    def __call__(self, token: int, position: int, kv: KV) -> torch.Tensor:
        """Logits (V,) of the token after `token`, which sits at `position`; `kv` keeps and returns the K/V."""
        device = self.embed.weight.device
        return self.rows(torch.tensor([token], device=device), torch.tensor([position], device=device), kv)[0]

    def rows(self, ids: torch.Tensor, positions: torch.Tensor, kv: KV, mask: torch.Tensor | None = None,
             linear: Linear = F.linear, hidden: list[torch.Tensor] | None = None,
             fused: list[Fused] | None = None) -> torch.Tensor:
        """Logits [B, V] of each row's next token: ids and positions [B]; `mask` [B, 1, 1, T] (True: attend) where
        rows read padded keys; `hidden`, when given, receives the L + 1 residuals [B, 1, d]; `fused`, per layer,
        products made as one."""
        x = F.embedding(ids[:, None], self.embed.weight)                               # [B, 1, d]
        cos, sin = self.rotary(x, positions[:, None])                                   # [B, 1, D] each
        for i, w in enumerate(self.layers):
            f = fused[i] if fused is not None else NOT_FUSED
            if hidden is not None:
                hidden.append(x)
            x = x + self._attention(i, w, rms_norm(x, w.ln1, self.eps), cos, sin, kv, mask, linear, f)
            h = rms_norm(x, w.ln2, self.eps)
            gate, up = f.gate_up(h).chunk(2, dim=-1) if f.gate_up else (linear(h, *w.gate), linear(h, *w.up))
            x = x + linear(F.silu(gate) * up, *w.down)
        if hidden is not None:
            hidden.append(x)
        return linear(rms_norm(x, self.norm, self.eps), *self.head)[:, -1]              # [B, V]

    def _attention(self, i: int, w: LayerWeights, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   kv: KV, mask: torch.Tensor | None, linear: Linear, f: Fused) -> torch.Tensor:
        # h: [B, 1, d] -> q [B, H, 1, D], k, v [B, KVH, 1, D]; keys K, V [B, KVH, T, D]; out [B, 1, d]
        b, d, kvd = h.shape[0], self.heads * self.head_dim, self.kv_heads * self.head_dim
        q, k, v = f.qkv(h).split((d, kvd, kvd), dim=-1) if f.qkv else (linear(h, *p) for p in (w.q, w.k, w.v))
        q = q.view(b, 1, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, 1, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, 1, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        keys, values = kv(i, k, v)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scaling,
                                             enable_gqa=self.heads != self.kv_heads)   # [B, H, 1, D]
        return linear(out.transpose(1, 2).reshape(b, 1, -1), *w.o)


def lean_step_for(lm: LoadedModel) -> LeanStep | None:
    """The lean step for this model, or None where it does not apply (`why_not`)."""
    return None if why_not(lm.model) is not None else LeanStep(lm)
