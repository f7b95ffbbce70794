"""The hook layer: named capture points inside a Hugging Face Llama-family model.

Hook points reuse the model's own module paths:

    model.layers.{i}.self_attn   attention probabilities per query head  (heads, T_q, T_k)
                                 and the norms of Q (per query head) and K, V (per K/V head)
    model.layers.{i}             the residual stream leaving layer i      (d_model,) at the newest position
    model.layers.{i} (input)     the residual stream entering layer i     (T, d_model), every position, kept in a
                                 `KeptInputs` to compute attention again on demand (engine/core/recompute.py)

Attention is captured by a registered attention function ("playground"): transformers calls it
with Q after rotary embedding and the full K/V including the cache. It always computes the
output with PyTorch SDPA; only when the forward call carries a `StepCapture` (the keyword
`playground_capture`) does it also compute softmax(QK^T) for the selected layers and heads.
In decode (and for prefill without the full matrix) only the newest query row is kept: each layer
adds one matmul of its query heads, grouped by K/V head, against its K (no copy of K), and
scaling, softmax, the norms and the copy to host happen once per step for all layers in
`StepCapture.finish`, which every forward with a capture must call.
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

from engine.core.kept import KeptInputs

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
    inputs: tuple[int, ...] | None = ()    # layers whose input (every position) is kept to recompute attention; None: all

    @property
    def enabled(self) -> bool:
        return ((self.layers is None or len(self.layers) > 0) and (self.attention or self.stats or self.logit_lens > 0)
                or self.keeps_inputs)

    @property
    def keeps_inputs(self) -> bool:
        return self.inputs is None or len(self.inputs) > 0

    def input_ids(self, n_layers: int) -> tuple[int, ...]:
        """The layers whose input this policy keeps."""
        if self.inputs is None:
            return tuple(range(n_layers))
        return tuple(i for i in self.inputs if 0 <= i < n_layers)

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
class NewestRows:
    """One step's raw scores q·K^T of the newest query row, for the layers sharing one key length."""

    scores: torch.Tensor                                   # (L_sel, KVH, group, T_k) float32, filled slot by slot
    layers: list[tuple[int, torch.Tensor | None, float]] = field(default_factory=list)  # per slot: layer, mask, scaling


@dataclass
class StepCapture:
    """Collects one forward pass. Created per pass; handed to the model via keyword arguments.

    The newest row's attention and the norms are gathered layer by layer as tensors and converted
    together in `finish` (one softmax and one host copy per step, not per layer and head).
    """

    policy: CapturePolicy
    layer_ids: frozenset[int]
    layers: dict[int, LayerCapture] = field(default_factory=dict)
    kept: KeptInputs | None = None         # where each kept layer's input goes (None: nowhere)
    start: int = 0                         # absolute position of this pass's first token (set by the caller)
    _resid: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> (d_model,) newest position
    _rows: dict[int, NewestRows] = field(default_factory=dict)              # key length -> the rows of that length
    _qkv: dict[int, tuple[torch.Tensor, ...]] = field(default_factory=dict)   # layer -> (H, D), (KVH, D), (KVH, D)

    def _layer(self, i: int) -> LayerCapture:
        return self.layers.setdefault(i, LayerCapture(layer=i))

    def on_attention(self, module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     mask: torch.Tensor | None, scaling: float) -> None:
        # query: [B, H, T_q, D] after RoPE; key, value: [B, KVH, T_k, D] including the cache
        i = module.layer_idx
        if i not in self.layer_ids:
            return
        newest = _newest(query[0])                                                # (H, D)
        if self.policy.stats:
            self._qkv[i] = (newest, key[0, :, -1], value[0, :, -1])              # K, V live in the cache anyway
        if not self.policy.attention:
            return
        if query.shape[2] > 1 and self.policy.prefill_matrix:
            self._attention(self._layer(i), query, key, mask, scaling)
        else:
            self._newest_row(i, newest, key[0], mask, scaling)

    def _newest_row(self, i: int, query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None,
                    scaling: float) -> None:
        """q·K^T of the newest query row, all heads in one matmul, written into this step's buffer.

        query: (H, D); key: (KVH, T_k, D). Query head h reads K/V head h // (H / KVH), as transformers'
        repeat_kv lays them out, so grouping the queries by K/V head needs no copy of K.
        """
        n_kv, t_k, d = key.shape
        rows = self._rows.get(t_k)
        if rows is None:  # one buffer per key length: every layer shares one unless some use a window
            shape = (len(self.layer_ids), n_kv, query.shape[0] // n_kv, t_k)
            rows = self._rows[t_k] = NewestRows(torch.empty(shape, dtype=torch.float32, device=query.device))
        slot = rows.scores[len(rows.layers)]                                      # (KVH, group, T_k)
        torch.bmm(query.float().reshape(n_kv, -1, d), key.float().transpose(1, 2), out=slot)
        rows.layers.append((i, mask, scaling))

    def _attention(self, cap: LayerCapture, query: torch.Tensor, key: torch.Tensor,
                   mask: torch.Tensor | None, scaling: float) -> None:
        """The full causal matrix (prefill) of the kept heads, for one layer."""
        heads = self.policy.head_ids(query.shape[1])
        group = query.shape[1] // key.shape[1]
        kv_of = tuple(h // group for h in heads)
        q = query[0, list(heads)]                    # (h, T_q, D)
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

    def on_layer_input(self, i: int, hidden: torch.Tensor) -> None:
        # hidden: [1, T, d_model] entering layer i, positions start..start+T-1
        if self.kept is not None:
            self.kept.write(i, self.start, hidden[0])

    def on_residual(self, i: int, hidden: torch.Tensor) -> None:
        # hidden: [B, T, d_model] leaving layer i
        if self.policy.stats or self.policy.logit_lens:
            self._resid[i] = _newest(hidden.detach())[0]

    def finish(self, model: Any) -> dict[int, LayerCapture]:
        """Convert the step's rows and norms (all layers at once), run or keep the logit lens, and return."""
        if self._rows:
            self._finish_rows()
        if self._qkv:
            self._finish_norms()
        if self._resid:
            self._finish_residuals(model)
        if self.kept is not None:
            self.kept.commit()
        return self.layers

    def _finish_residuals(self, model: Any) -> None:
        """Residual norms, and the logit lens run now or kept for later, for every layer at once."""
        order = list(self._resid)
        stacked = torch.stack([self._resid[i] for i in order])                  # (L, d_model)
        if self.policy.stats:
            for i, norm in zip(order, stacked.float().norm(dim=-1).tolist()):
                self._layer(i).resid_norm = norm
        if self.policy.logit_lens and self.policy.lens_on_demand:
            kept = _np(stacked)
            for row, i in enumerate(order):
                self._layer(i).resid = kept[row]
        elif self.policy.logit_lens:
            _apply_lens(model, {i: (self._layer(i), r) for i, r in self._resid.items()}, self.policy.logit_lens)
        self._resid.clear()

    def _finish_rows(self) -> None:
        """Scale, mask and softmax the newest rows of every layer at once; one host copy per key length."""
        for t_k, rows in self._rows.items():
            n, group = len(rows.layers), rows.scores.shape[2]
            scaling = torch.tensor([s for _, _, s in rows.layers], device=rows.scores.device)    # (L,)
            scores = rows.scores[:n].view(n, -1, t_k).mul_(scaling[:, None, None])  # (L, H, T_k), in place
            for slot, (_, mask, _) in enumerate(rows.layers):
                if mask is not None:  # without a mask the newest query sees every key
                    scores[slot] = _apply_mask(scores[slot][:, None], mask, t_k)[:, 0]
            heads = self.policy.head_ids(scores.shape[1])
            if len(heads) < scores.shape[1]:
                scores = scores[:, list(heads)]                                  # (L, h, T_k)
            key_start = t_k - self.policy.max_keys if self.policy.max_keys and t_k > self.policy.max_keys else 0
            probs = _np(torch.softmax(scores, dim=-1)[..., key_start:])          # (L, h, T_k_kept)
            for row, (i, _, _) in enumerate(rows.layers):
                cap = self._layer(i)
                cap.heads, cap.kv_heads = heads, tuple(h // group for h in heads)
                cap.attention, cap.query_start, cap.key_start = probs[row][:, None], t_k - 1, key_start
        self._rows.clear()

    def _finish_norms(self) -> None:
        """|Q| per query head and |K|, |V| per K/V head at the newest position, every layer in one go."""
        order = list(self._qkv)
        parts = [torch.stack([self._qkv[i][j] for i in order]).float().norm(dim=-1) for j in range(3)]
        q, k, v = (_np(p) for p in parts)                                       # (L, H), (L, KVH), (L, KVH)
        for row, i in enumerate(order):
            cap = self._layer(i)
            cap.q_norm, cap.k_norm, cap.v_norm = q[row], k[row], v[row]
        self._qkv.clear()


def _newest(t: torch.Tensor) -> torch.Tensor:
    """t[..., -1, :]: a view in decode; a copy after a longer pass, so the whole pass is not kept until finish."""
    last = t[..., -1, :]
    return last.clone() if t.shape[-2] > 1 else last


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
    if getattr(capture, "grab_only", False):           # engine/core/recompute.py: Q and K are all it needs
        capture.grab(module, query, key, scaling, kwargs)
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

    def __init__(self, policy: CapturePolicy, n_layers: int, kept: KeptInputs | None = None):
        self.policy, self.kept = policy, kept
        self.layer_ids = frozenset(policy.layer_ids(n_layers)) if policy.enabled else frozenset()
        self.input_ids = frozenset(policy.input_ids(n_layers)) if kept is not None else frozenset()

    def new_step(self) -> StepCapture | None:
        if not self.layer_ids and not self.input_ids:
            return None
        return StepCapture(self.policy, self.layer_ids, kept=self.kept)


@contextmanager
def instrument(model: Any, policy: CapturePolicy, kept: KeptInputs | None = None) -> Iterator[Instrument]:
    """Attach the residual hooks a policy needs (and, for kept inputs, a pre-hook on each kept layer); they are
    removed when the block exits, even on error."""
    layers = decoder_layers(model)
    inst = Instrument(policy, len(layers), kept)
    handles = []
    try:
        if policy.stats or policy.logit_lens:
            for i in sorted(inst.layer_ids):
                handles.append(layers[i].register_forward_hook(_residual_hook(i), with_kwargs=True))
        for i in policy.input_ids(len(layers)) if policy.keeps_inputs else ():
            handles.append(layers[i].register_forward_pre_hook(_input_hook(i), with_kwargs=True))
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


def _input_hook(i: int):
    def hook(module: Any, args: tuple, kwargs: dict) -> None:
        capture = kwargs.get(CAPTURE_KWARG)
        if capture is not None and hasattr(capture, "on_layer_input"):
            capture.on_layer_input(i, args[0] if args else kwargs["hidden_states"])
    hook.playground_point = f"model.layers.{i} (input)"
    return hook


def count_hooks(model: Any) -> int:
    """Playground hooks attached anywhere in the model: 0 outside a run.

    transformers v5 installs output-recording hooks of its own on first use; those are not ours.
    """
    return sum(hasattr(hook, "playground_point")
               for m in model.modules()
               for hook in (*m._forward_hooks.values(), *m._forward_pre_hooks.values()))
