"""Every view of a run, derived from the residual stream it kept and the model's own weights, when someone looks.

    lens = lens_at(lm.model, kept, position=41, top=5)       # LensView: each kept layer's top tokens, |residual|
    norms = qkv_norms(lm.model, kept, layer=3, positions=[41]) # |Q| per query head, |K|, |V| per K/V head
    records = derive_captures(lm.model, kept, records, policy)  # the records with the views a file carries

The residual leaving layer i is hidden state i + 1 (hooks.py), so the logit lens and the residual's norm at a
position read one row of it; Q, K and V come from the layer's own modules run on hidden state i
(engine/core/recompute.py `layer_qk`); attention from those (engine/core/attention_maps.py). Every number is what the
model computed in the pass that read that position, to float32 rounding: the same modules on the same input.
`derive_captures` rebuilds the per-pass captures (`LayerCapture`) that records carried before the engine kept only
the residual, for the files that hold them (run files, recordings, the command line's capture file).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np
import torch

from engine.core.attention_maps import attention_rows
from engine.core.hooks import CapturePolicy, LayerCapture
from engine.core.kept import KeptInputs
from engine.core.recompute import AttentionInputs, layer_qk
from engine.core.records import DecodeRecord, PrefillRecord, SpecRoundRecord


@dataclass(frozen=True)
class LensView:
    """One position through the layers: what each layer would predict if the model stopped there, and how large the
    residual stream is leaving it."""

    position: int
    layers: tuple[int, ...]                        # layers whose output the run kept
    top: tuple[tuple[tuple[int, float], ...], ...]  # per layer: (token id, probability), most likely first
    resid_norm: tuple[float, ...]                  # per layer: |residual leaving it| at the position

    def captures(self) -> dict[int, LayerCapture]:
        """As the journey page's figures read them (one LayerCapture per layer)."""
        return {i: LayerCapture(i, lens=list(t), resid_norm=n) for i, t, n in zip(self.layers, self.top,
                                                                                   self.resid_norm)}


def lens_of(model: Any, resid: torch.Tensor, top: int) -> list[list[tuple[int, float]]]:
    """(k, d_model) residuals leaving some layers -> each one's top tokens through the final norm and the LM head
    (one matmul for all). Reads two weights, never a cache: safe beside a running generation."""
    param = next(model.lm_head.parameters())
    with torch.inference_mode():
        logits = model.lm_head(model.model.norm(resid.to(param.device, param.dtype))).float()      # (k, V)
        best = torch.softmax(logits, dim=-1).topk(top, dim=-1)
    return [list(zip(i, p)) for i, p in zip(best.indices.tolist(), best.values.tolist())]


def outputs_kept(kept: KeptInputs, n_layers: int) -> tuple[int, ...]:
    """Layers whose output (hidden state i + 1) the run holds."""
    return tuple(i for i in range(n_layers) if i + 1 in kept.layers or i + 1 in kept.recomputed)


def lens_at(model: Any, kept: KeptInputs, position: int, top: int = 5) -> LensView:
    """The logit lens and the residual's norm leaving every kept layer, at one position."""
    layers = outputs_kept(kept, len(model.model.layers))
    if not layers:
        return LensView(position, (), (), ())
    resid = torch.cat([kept.rows(i + 1, [position]) for i in layers])                         # (L_kept, d_model)
    norms = resid.float().norm(dim=-1).tolist()
    return LensView(position, layers, tuple(tuple(t) for t in lens_of(model, resid, top)), tuple(norms))


def qkv_norms(model: Any, kept: KeptInputs, layer: int, positions: Sequence[int]) -> tuple[np.ndarray, ...]:
    """|Q| per query head, |K| and |V| per K/V head at some positions of one layer: (n, H), (n, KVH), (n, KVH)."""
    x = kept.rows(layer, positions)
    if x is None:
        raise ValueError(f"layer {layer}'s input was not kept")
    qkv = [layer_qk(model, layer, x[j:j + 1], start=p) for j, p in enumerate(positions)]
    return tuple(np.stack([_norm(getattr(a, name)[:, 0]) for a in qkv]) for name in ("q", "k", "v"))


def _norm(t: torch.Tensor) -> np.ndarray:
    return t.float().norm(dim=-1).cpu().numpy()


# --- the captures an exported file carries ---------------------------------------------------------------------

@dataclass(frozen=True)
class Pass:
    """One forward pass of a run as its record saw it: the query positions it produced rows for, and its newest."""

    index: int                  # the record's place in the run's records
    first: int                  # first query position whose row the record carries
    rows: int                   # query rows it carries
    newest: int                 # the position its norms and lens were taken at


def passes(records: Sequence[Any], length: int, matrix: bool) -> list[Pass]:
    """The passes of a run's records within the `length` positions it kept: the prefill (every prompt position, or
    its last with `matrix` False), one position per decode step, each speculative round's accepted positions."""
    out, at = [], 0
    for i, r in enumerate(records):
        if isinstance(r, PrefillRecord):
            n = len(r.prompt)
            out.append(Pass(i, 0 if matrix else n - 1, n if matrix else 1, n - 1))
            at = n
        elif isinstance(r, DecodeRecord):
            out.append(Pass(i, at, 1, at))
            at += 1
        elif isinstance(r, SpecRoundRecord):
            n = len(r.emitted)
            out.append(Pass(i, at, n, at + n - 1))
            at += n
    return [p for p in out if p.newest < length]


def derive_captures(model: Any, kept: KeptInputs | None, records: Sequence[Any], policy: CapturePolicy) -> list[Any]:
    """The records with the captures `policy` names (its layers' attention, norms and lens), derived from the kept
    residual: copies where anything is added (records may be shared). Layers whose input (for attention and |Q|) or
    output (for the lens and the residual's norm) was not kept are left out."""
    if kept is None or not policy.views or kept.length == 0:
        return list(records)
    n_layers, found = len(model.model.layers), {}
    steps = passes(records, kept.length, policy.prefill_matrix)
    for layer in policy.layer_ids(n_layers):
        for p, cap in _layer_views(model, kept, layer, steps, policy).items():
            found.setdefault(p.index, {})[layer] = cap
    if policy.logit_lens or policy.stats:
        _add_outputs(model, kept, steps, policy, found)
    out = list(records)
    for i, caps in found.items():
        out[i] = replace(out[i], captures={k: caps[k] for k in sorted(caps)})
    return out


def _layer_views(model: Any, kept: KeptInputs, layer: int, steps: list[Pass],
                 policy: CapturePolicy) -> dict[Pass, LayerCapture]:
    """One layer's attention rows and |Q|, |K|, |V| for every pass: one call of the layer over all positions."""
    x = kept.input(layer)
    if x is None or not (policy.attention or policy.stats):
        return {}
    qk = layer_qk(model, layer, x)
    heads = list(policy.head_ids(qk.q.shape[0]))
    out = {}
    for p in steps:
        cap = LayerCapture(layer)
        if policy.attention:
            _rows(cap, qk, heads, p, policy.max_keys)
        if policy.stats:
            cap.q_norm, cap.k_norm, cap.v_norm = (_norm(t[:, p.newest]) for t in (qk.q, qk.k, qk.v))
        out[p] = cap
    return out


def _rows(cap: LayerCapture, qk: AttentionInputs, heads: list[int], p: Pass, max_keys: int | None) -> None:
    """The pass's rows over every key they see (h, rows, newest + 1), the oldest keys cut past `max_keys`."""
    probs = attention_rows(qk, heads, p.first, p.first + p.rows).cpu().numpy()           # (h, rows, first + rows)
    t_k = p.first + p.rows
    start = t_k - max_keys if max_keys and t_k > max_keys else 0
    cap.heads, cap.kv_heads = tuple(heads), tuple(qk.kv_head(h) for h in heads)
    cap.attention, cap.query_start, cap.key_start = probs[..., start:], p.first, start


def _add_outputs(model: Any, kept: KeptInputs, steps: list[Pass], policy: CapturePolicy,
                 found: dict[int, dict[int, LayerCapture]]) -> None:
    """The residual's norm and the logit lens leaving each layer at every pass's newest position."""
    layers = [i for i in outputs_kept(kept, len(model.model.layers)) if i in policy.layer_ids(len(model.model.layers))]
    for p in steps:
        if not layers:
            return
        resid = torch.cat([kept.rows(i + 1, [p.newest]) for i in layers])                     # (L, d_model)
        norms = resid.float().norm(dim=-1).tolist()
        tops = lens_of(model, resid, policy.logit_lens) if policy.logit_lens else [None] * len(layers)
        for i, norm, top in zip(layers, norms, tops):
            cap = found.setdefault(p.index, {}).setdefault(i, LayerCapture(i))
            cap.resid_norm = norm if policy.stats else None
            cap.lens = top
