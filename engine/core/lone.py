"""A lone row's products that share an input made as one: each layer's q|k|v and gate|up, where the loader laid
them side by side (engine.core.layout.side_by_side).

    grouped = SideBySide(lean)            # lean: engine.core.lean.LeanStep
    logits = lean.forward(..., linear=matvec.linear, fused=grouped.fused())   # None: each weight on its own

A lone decode step multiplies one row by every matrix, each product a call with its own fixed cost. With q, k and v
one after another in memory, their products are one product (engine.core.matvec.linear: the row kernel, or the
split product) on the whole matrix, which is a view: nothing is copied per step; likewise gate and up (docs/engine.md, "Where a lone step's
time goes", measures what it saved). `fused()` checks that every weight is still where the loader put it (a
parameter pointed elsewhere since, e.g. by a test, falls back to one product per weight).
"""
from __future__ import annotations

from typing import Any

import torch

from engine.core import kernels, matvec
from engine.core.lean import Fused, LeanStep


class SideBySide:
    """Per layer, the Fused products over the loader's side-by-side matrices, made once."""

    def __init__(self, lean: LeanStep):
        self.lean = lean
        self._made: tuple[list[int], list[Fused], list[torch.Tensor]] | None = None
        if lean.embed.weight.device.type == "cpu":
            kernels.row_kernel()         # built or found now, not at the first lone step (a build takes a second)

    def weights(self) -> list[torch.Tensor]:
        return [p[0] for w in self.lean.layers for p in (w.q, w.k, w.v, w.gate, w.up)]

    def fused(self) -> list[Fused] | None:
        """Each layer's Fused, or None where any group is missing or a weight has moved since. Checked every step,
        over the weights as listed when made (a lone step's host work: the list made afresh and read by a
        comprehension took 0.15 ms of a step here, its caches cold after the weights have streamed through)."""
        if self._made is None:
            self._made = (*_made(self.lean), self.weights())
        where, fused, weights = self._made
        return fused if where and list(map(torch.Tensor.data_ptr, weights)) == where else None


def _made(lean: LeanStep) -> tuple[list[int], list[Fused]]:
    """(where each grouped weight starts, per layer its Fused); ([], []) where any layer's group is missing."""
    wholes, where, fused = lean.lm.side_by_side, [], []
    if len(wholes) != len(lean.layers):
        return [], []
    for w, (qkv, gate_up) in zip(lean.layers, wholes):
        groups = [(qkv, (w.q, w.k, w.v)), (gate_up, (w.gate, w.up))]
        at = [matvec.addresses(whole, [p[0] for p in pairs]) if whole is not None else None for whole, pairs in groups]
        if None in at:
            return [], []
        where += at[0] + at[1]
        fused.append(Fused(*(matvec.product(whole, _biases(pairs)) for whole, pairs in groups)))
    return where, fused


def _biases(pairs: Any) -> torch.Tensor | None:
    """The weights' biases one after another (zeros for a weight without one), or None where none has one."""
    if all(b is None for _, b in pairs):
        return None
    return torch.cat([b if b is not None else w.new_zeros(w.shape[0]) for w, b in pairs])
