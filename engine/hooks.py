"""The hook layer: named capture points inside a Hugging Face Llama-family model.

Hook points reuse the model's own module paths:

    model.layers.{i}.self_attn   attention probabilities per query head  (heads, T_q, T_k)
                                 and the norms of Q (per query head) and K, V (per K/V head)
    model.layers.{i}             the residual stream leaving layer i      (d_model,) at the newest position

Attention is captured by a registered attention function ("playground"): transformers calls it
with Q after rotary embedding and the full K/V including the cache. It always computes the
output with PyTorch SDPA; only when the forward call carries a `StepCapture` (the keyword
`playground_capture`) does it also compute softmax(QK^T) for the selected layers and heads.
Residual hooks are ordinary forward hooks that live only inside `instrument(...)` and are
removed in `finally`. Because the capture object travels with the call's keywords, two
requests interleaving on one shared model never write into each other's captures.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import AttentionInterface

ATTENTION_NAME = "playground"
CAPTURE_KWARG = "playground_capture"


@dataclass(frozen=True)
class CapturePolicy:
    """What one run captures. `CAPTURE_OFF` costs one dictionary lookup per layer."""

    layers: tuple[int, ...] | None = None  # None: every layer; (): none
    heads: tuple[int, ...] | None = None   # query heads kept; None: all
    attention: bool = True                 # attention probabilities
    prefill_matrix: bool = True            # at prefill keep the full causal matrix, else the last row only
    max_keys: int | None = None            # keep at most this many most recent keys of each row
    stats: bool = True                     # norms of Q, K, V and of the residual stream
    logit_lens: int = 0                    # top tokens each layer would predict (0: off)
    lens_on_demand: bool = False           # keep each layer's residual; compute the lens only when asked (logit_lens())

    @property
    def enabled(self) -> bool:
        return (self.layers is None or len(self.layers) > 0) and (self.attention or self.stats or self.logit_lens > 0)

    def layer_ids(self, n_layers: int) -> tuple[int, ...]:
        if self.layers is None:
            return tuple(range(n_layers))
        return tuple(i for i in self.layers if 0 <= i < n_layers)

    def head_ids(self, n_heads: int) -> tuple[int, ...]:
        return tuple(range(n_heads)) if self.heads is None else tuple(h for h in self.heads if 0 <= h < n_heads)


CAPTURE_OFF = CapturePolicy(layers=(), attention=False, stats=False)
CAPTURE_ALL = CapturePolicy(logit_lens=5)


@dataclass
class LayerCapture:
    """What one layer showed during one forward pass (numpy, detached from the model)."""

    layer: int
    heads: tuple[int, ...] = ()        # query heads whose attention is kept
    kv_heads: tuple[int, ...] = ()     # the K/V head each of those query heads reads (GQA)
    attention: np.ndarray | None = None  # (len(heads), T_q, T_k_kept) probabilities
    query_start: int = 0               # absolute position of the first query row
    key_start: int = 0                 # absolute position of the first key column kept
    q_norm: np.ndarray | None = None   # (n_heads,) at the newest position
    k_norm: np.ndarray | None = None   # (n_kv_heads,) at the newest position
    v_norm: np.ndarray | None = None   # (n_kv_heads,)
    resid_norm: float | None = None    # residual stream leaving the layer, newest position
    lens: list[tuple[int, float]] | None = None  # (token id, probability) through final norm + LM head
    resid: np.ndarray | None = None    # (d_model,) residual leaving the layer, newest position: lens on demand


@dataclass
class StepCapture:
    """Collects one forward pass. Created per pass; handed to the model via keyword arguments."""

    policy: CapturePolicy
    layer_ids: frozenset[int]
    layers: dict[int, LayerCapture] = field(default_factory=dict)
    _resid: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> (d_model,) newest position

    def _layer(self, i: int) -> LayerCapture:
        return self.layers.setdefault(i, LayerCapture(layer=i))

    def on_attention(self, module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     mask: torch.Tensor | None, scaling: float) -> None:
        # query: [B, H, T_q, D] after RoPE; key, value: [B, KVH, T_k, D] including the cache
        i = module.layer_idx
        if i not in self.layer_ids:
            return
        cap = self._layer(i)
        if self.policy.stats:
            cap.q_norm = _np(query[0, :, -1].norm(dim=-1))
            cap.k_norm = _np(key[0, :, -1].norm(dim=-1))
            cap.v_norm = _np(value[0, :, -1].norm(dim=-1))
        if self.policy.attention:
            self._attention(cap, module, query, key, mask, scaling)

    def _attention(self, cap: LayerCapture, module: Any, query: torch.Tensor, key: torch.Tensor,
                   mask: torch.Tensor | None, scaling: float) -> None:
        heads = self.policy.head_ids(query.shape[1])
        group = query.shape[1] // key.shape[1]
        kv_of = tuple(h // group for h in heads)
        q = query[0, list(heads)]                    # (h, T_q, D)
        if not self.policy.prefill_matrix:
            q = q[:, -1:]
        t_q, t_k = q.shape[1], key.shape[2]
        k = key[0, list(kv_of)]                      # (h, T_k, D): each query head's own K/V head
        scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scaling  # (h, T_q, T_k)
        scores = _apply_mask(scores, mask, t_k)
        probs = torch.softmax(scores, dim=-1)
        key_start = 0
        if self.policy.max_keys and t_k > self.policy.max_keys:
            key_start = t_k - self.policy.max_keys
            probs = probs[..., key_start:]
        cap.heads, cap.kv_heads = heads, kv_of
        cap.attention = _np(probs)
        cap.query_start, cap.key_start = t_k - t_q, key_start

    def on_residual(self, i: int, hidden: torch.Tensor) -> None:
        # hidden: [B, T, d_model] leaving layer i
        newest = hidden[0, -1].detach()
        if self.policy.stats:
            self._layer(i).resid_norm = float(newest.float().norm())
        if self.policy.logit_lens:
            self._resid[i] = newest

    def finish(self, model: Any) -> dict[int, LayerCapture]:
        """Run the logit lens (one batched matmul for all layers), or keep the residuals for it, and return."""
        if self.policy.logit_lens and self._resid:
            if self.policy.lens_on_demand:
                for i, resid in self._resid.items():
                    self._layer(i).resid = _np(resid)
            else:
                _apply_lens(model, {i: (self._layer(i), r) for i, r in self._resid.items()}, self.policy.logit_lens)
            self._resid.clear()
        return self.layers


def logit_lens(model: Any, captures: dict[int, LayerCapture], top: int = 5) -> dict[int, LayerCapture]:
    """Fill in the lens of captures that kept their residual (lens_on_demand): one matmul for all layers.

    Reads only the final norm and the LM head, never the cache: safe beside a running generation.
    """
    todo = {i: (c, torch.from_numpy(c.resid)) for i, c in captures.items() if c.resid is not None and c.lens is None}
    if todo:
        param = next(model.lm_head.parameters())
        todo = {i: (c, r.to(param.device, param.dtype)) for i, (c, r) in todo.items()}
        _apply_lens(model, todo, top)
    return captures


def _apply_lens(model: Any, resid: dict[int, tuple[LayerCapture, torch.Tensor]], top: int) -> None:
    order = sorted(resid)
    with torch.no_grad():
        stacked = torch.stack([resid[i][1] for i in order])               # (L, d_model)
        logits = model.lm_head(model.model.norm(stacked)).float()         # (L, vocab)
        best = torch.softmax(logits, dim=-1).topk(top, dim=-1)
    ids, probs = best.indices.tolist(), best.values.tolist()
    for row, i in enumerate(order):
        resid[i][0].lens = list(zip(ids[row], probs[row]))


def _apply_mask(scores: torch.Tensor, mask: torch.Tensor | None, t_k: int) -> torch.Tensor:
    """Causal masking for the captured rows: a query at absolute position p sees keys 0..p."""
    t_q = scores.shape[-2]
    if mask is None:
        q_pos = torch.arange(t_k - t_q, t_k, device=scores.device)[:, None]
        allowed = torch.arange(t_k, device=scores.device)[None, :] <= q_pos
        return scores.masked_fill(~allowed, float("-inf"))
    m = mask[0, 0, -t_q:, :t_k]
    if m.dtype == torch.bool:
        return scores.masked_fill(~m, float("-inf"))
    return scores + m.float()


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def playground_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask: torch.Tensor | None, dropout: float = 0.0,
                         scaling: float | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """SDPA attention that also feeds a StepCapture when the call carries one."""
    capture: StepCapture | None = kwargs.pop(CAPTURE_KWARG, None)
    out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                    scaling=scaling, **kwargs)
    if capture is not None:
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        capture.on_attention(module, query, key, value, attention_mask, scale)
    return out, None


AttentionInterface.register(ATTENTION_NAME, playground_attention)
AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)


def decoder_layers(model: Any) -> Any:
    return model.model.layers


def hook_points(model: Any) -> dict[str, str]:
    """Every named capture point of a loaded model, with what it records."""
    points = {}
    for i in range(len(decoder_layers(model))):
        points[f"model.layers.{i}.self_attn"] = "attention probabilities (heads, T_q, T_k); |Q| per head, |K|, |V| per K/V head"
        points[f"model.layers.{i}"] = "residual stream leaving the layer (d_model,); logit lens on request"
    return points


class Instrument:
    """Handed out by `instrument()`: makes one StepCapture per forward pass."""

    def __init__(self, policy: CapturePolicy, n_layers: int):
        self.policy = policy
        self.layer_ids = frozenset(policy.layer_ids(n_layers)) if policy.enabled else frozenset()

    def new_step(self) -> StepCapture | None:
        return StepCapture(self.policy, self.layer_ids) if self.layer_ids else None


@contextmanager
def instrument(model: Any, policy: CapturePolicy) -> Iterator[Instrument]:
    """Attach the residual hooks a policy needs; they are removed when the block exits, even on error."""
    layers = decoder_layers(model)
    inst = Instrument(policy, len(layers))
    handles = []
    try:
        if policy.stats or policy.logit_lens:
            for i in sorted(inst.layer_ids):
                handles.append(layers[i].register_forward_hook(_residual_hook(i), with_kwargs=True))
        yield inst
    finally:
        for handle in handles:
            handle.remove()


def _residual_hook(i: int):
    def hook(module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        capture = kwargs.get(CAPTURE_KWARG)
        if capture is not None:
            capture.on_residual(i, output[0] if isinstance(output, tuple) else output)
    hook.playground_point = f"model.layers.{i}"  # marks our hooks apart from transformers' own
    return hook


def count_hooks(model: Any) -> int:
    """Playground hooks attached anywhere in the model: 0 outside a run.

    transformers v5 installs output-recording hooks of its own on first use; those are not ours.
    """
    return sum(hasattr(hook, "playground_point")
               for m in model.modules()
               for hook in (*m._forward_hooks.values(), *m._forward_pre_hooks.values()))
