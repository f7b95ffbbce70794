"""Attention arithmetic, step by step, with the real numbers of one head of one layer of the loaded model.

    qkv = capture_qkv(lm, ids, layer=3)          # Q, K, V of that layer for a prompt (after RoPE), one pass
    steps = attention_steps(qkv, head=5)         # Q·Kᵀ, ÷√d, causal mask, softmax, ·V for that head
    qkv.hf_difference                            # |o_proj(all heads' outputs) - HF's own attention output|
    cap = capture_attention(lm, ids, layer=3)    # the engine's capture of one layer over a whole run's positions

Q, K and V come from the layer's own modules: the residual stream entering the layer (HF's
`output_hidden_states`), its `input_layernorm`, `q_proj` / `k_proj` / `v_proj`, and the architecture's own
`apply_rotary_pos_emb`. The check calls the layer's `self_attn` on the same input, so the numbers on screen
are the ones the model uses, not a re-implementation that could drift.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
import torch

from engine.errors import InvalidRequestError
from engine.core.attention_maps import attention_rows
from engine.core.hooks import LayerCapture
from engine.core.recompute import embeddings, layer_qk, run_layers
from engine.core.loader import LoadedModel
from engine.core.token_bytes import token_texts

MAX_TOKENS = 48              # a prompt longer than this is cut: the matrices are shown number by number


@dataclass(frozen=True)
class LayerQKV:
    """One layer's attention inputs for one prompt (numpy, float32), and how far our arithmetic is from HF's."""

    layer: int
    tokens: tuple[str, ...]
    q: np.ndarray                # (H, T, d) after RoPE
    k: np.ndarray                # (KVH, T, d) after RoPE
    v: np.ndarray                # (KVH, T, d)
    scaling: float               # the layer's own 1/√d
    hf_difference: float         # largest |o_proj(our outputs of all heads) - the layer's self_attn output|

    @property
    def group(self) -> int:
        return self.q.shape[0] // self.k.shape[0]


@dataclass(frozen=True)
class AttentionSteps:
    """The arithmetic of one head, every intermediate kept (numpy, float32)."""

    layer: int
    head: int
    kv_head: int                 # the K/V head this query head reads (grouped-query attention)
    tokens: tuple[str, ...]
    scaling: float
    q: np.ndarray                # (T, d)
    k: np.ndarray                # (T, d)
    v: np.ndarray                # (T, d)
    scores: np.ndarray           # (T, T) q·k for every (query, key)
    scaled: np.ndarray           # (T, T) scores x scaling
    masked: np.ndarray           # (T, T) -inf where the key comes after the query
    probs: np.ndarray            # (T, T) softmax of each row
    out: np.ndarray              # (T, d) probs · v


def _rotary(attn: torch.nn.Module):
    """The architecture's own apply_rotary_pos_emb (Llama, Qwen2, Mistral each define one)."""
    return sys.modules[type(attn).__module__].apply_rotary_pos_emb


def _split_heads(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    # x: [1, T, heads x d] -> [1, heads, T, d]
    return x.view(1, x.shape[1], -1, head_dim).transpose(1, 2)


def check_request(lm: LoadedModel, ids: list[int], layer: int) -> None:
    if not ids:
        raise InvalidRequestError("the prompt encodes to no tokens")
    if not 0 <= layer < lm.spec.n_layers:
        raise InvalidRequestError(f"layer must be 0 to {lm.spec.n_layers - 1}")


def capture_qkv(lm: LoadedModel, ids: list[int], layer: int) -> LayerQKV:
    """One forward pass to the layer's input, then the layer's own projections and RoPE (first MAX_TOKENS ids)."""
    check_request(lm, ids, layer)
    ids = ids[:MAX_TOKENS]
    model, attn = lm.model, lm.model.model.layers[layer].self_attn
    x = torch.tensor([ids], device=lm.device)                                           # [1, T]
    with torch.inference_mode():
        hidden = model(input_ids=x, use_cache=False, output_hidden_states=True, logits_to_keep=1).hidden_states[layer]
        normed = model.model.layers[layer].input_layernorm(hidden)                     # [1, T, d_model]
        pe = model.model.rotary_emb(normed, torch.arange(len(ids), device=lm.device)[None])
        d = attn.head_dim
        q, k = _rotary(attn)(_split_heads(attn.q_proj(normed), d), _split_heads(attn.k_proj(normed), d), *pe)
        v = _split_heads(attn.v_proj(normed), d)
        hf = attn(hidden_states=normed, position_embeddings=pe, attention_mask=None)[0][0]  # (T, d_model)
        ours = all_heads_output(q[0].float(), k[0].float(), v[0].float(), float(attn.scaling), attn.o_proj)
    texts = tuple(token_texts(lm.tokenizer, ids))
    as_np = lambda t: t[0].float().cpu().numpy()                                        # noqa: E731
    return LayerQKV(layer, texts, as_np(q), as_np(k), as_np(v), float(attn.scaling),
                    float((ours - hf.float()).abs().max()))


def capture_attention(lm: LoadedModel, ids: list[int], layer: int) -> LayerCapture:
    """Every head's causal attention (heads, T, T) of one layer over all of `ids`, as the engine derives any run's:
    the residual entering the layer (layers 0 to `layer - 1` run once over the prompt: TransformerLens'
    stop_at_layer), then the layer's own Q and K (engine/core/recompute.py) and softmax of their scaled products."""
    check_request(lm, ids, layer)
    x = run_layers(lm.model, embeddings(lm.model, ids, lm.device), 0, layer)                  # (T, d_model)
    qk = layer_qk(lm.model, layer, x)
    heads = list(range(qk.q.shape[0]))
    probs = attention_rows(qk, heads, 0, len(ids)).cpu().numpy()                              # (H, T, T)
    return LayerCapture(layer, tuple(heads), tuple(qk.kv_head(h) for h in heads), probs)


def head_steps(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float) -> dict[str, torch.Tensor]:
    """q, k, v: (T, d) of one head -> every intermediate of causal attention."""
    t = q.shape[0]
    scores = q @ k.T                                                                    # (T, T)
    scaled = scores * scaling
    future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    masked = scaled.masked_fill(future, float("-inf"))
    probs = torch.softmax(masked, dim=-1)
    return {"scores": scores, "scaled": scaled, "masked": masked, "probs": probs, "out": probs @ v}


def all_heads_output(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float,
                     o_proj: torch.nn.Module) -> torch.Tensor:
    """q (H, T, d), k and v (KVH, T, d): every head's output, concatenated, through o_proj -> (T, d_model)."""
    group = q.shape[0] // k.shape[0]
    outs = [head_steps(q[h], k[h // group], v[h // group], scaling)["out"] for h in range(q.shape[0])]
    concat = torch.cat(outs, dim=-1)                                                    # (T, H x d)
    bias = None if o_proj.bias is None else o_proj.bias.float()
    return torch.nn.functional.linear(concat, o_proj.weight.float(), bias)


def attention_steps(qkv: LayerQKV, head: int) -> AttentionSteps:
    """The arithmetic of one query head, from the captured Q, K, V (no model needed)."""
    n_heads = qkv.q.shape[0]
    if not 0 <= head < n_heads:
        raise InvalidRequestError(f"head must be 0 to {n_heads - 1}")
    kv = head // qkv.group
    q, k, v = (torch.from_numpy(a) for a in (qkv.q[head], qkv.k[kv], qkv.v[kv]))
    steps = {name: t.numpy() for name, t in head_steps(q, k, v, qkv.scaling).items()}
    return AttentionSteps(qkv.layer, head, kv, qkv.tokens, qkv.scaling, qkv.q[head], qkv.k[kv], qkv.v[kv],
                          steps["scores"], steps["scaled"], steps["masked"], steps["probs"], steps["out"])
