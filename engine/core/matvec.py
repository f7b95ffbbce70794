"""A few rows times a weight matrix at the speed the weights stream from memory: a lone request's decode step.

    y = linear(x, weight, bias)     # = F.linear(x, weight, bias); x (..., in) of up to 8 rows, on a CPU
    y = split(x, weight, bias)      # torch's path, where the row kernel is not built
    p = Bound(kernel, weight, bias); y = p(x)   # linear for one row [1, 1, in], made once: a lone step's products

A decode step of one request multiplies one row by every weight matrix (out, in): it reads each weight once and
does two flops per 4-byte float, so it can go no faster than the weights stream from memory. `linear` makes it with
the row kernel (engine/core/kernels: a C file built once with this machine's compiler, one fixed order of each
output's sum, torch's own threads) where it is built and the product fits it (CPU float32, the weight contiguous
(out, in) as stored, at most 8 rows); docs/engine.md, "Alone at the floor", says what it measured against `split`.
Elsewhere, or where no compiler could build it, `split`:

`F.linear` on one row is MKL's matrix-vector product (sgemv), which streamed slower than a sum reads memory on
this 2-core AMD EPYC (Zen 4), and runs on one thread whatever torch's count (docs/engine.md, "Two threads, and why
they were ten times slower"). `torch.bmm` of the same matrix viewed as PARTS blocks of its
output rows, (PARTS, out / PARTS, in), against the row repeated (a stride-0 expand, no copy) goes through MKL's
batched matrix product instead, which streams faster and splits the blocks among torch's threads. Every SmolLM2
product of a step timed alone (bench/lone_step.py, bench/results/lone_step/20261127T202139Z-8048acf.json, a busy
machine): 34.6 ms with F.linear (its weights in the layout it reads fastest) and 29.5 ms split, one thread; 37.8 and
30.6 ms with two; the weights' bytes over the read bandwidth of a sum, 21.7 ms. Nothing is copied: the
blocks are a view of the stored weight, which must be contiguous (out, in); anything else (a transposed matrix,
more rows, another dtype or device) takes F.linear. Both sum in another order than sgemv's, so the result
differs from F.linear in the last bits (tests/test_matvec.py measures by how much).

    qkv = side_by_side([q.weight, k.weight, v.weight])    # one (out_q + out_k + out_v, in) matrix; q, k, v its rows

Products that share an input (a layer's q|k|v, its gate|up) are one split product each when their weights lie one
after another in memory: `side_by_side` copies them into one matrix and points each parameter's `.data` at its own
rows of it (the same Parameter objects and values, the old storage freed: no memory added once done), as
engine/core/layout.py points a weight at a transposed copy. Fewer, larger products: a layer's five calls become
two (what that saved is measured in docs/engine.md, "Where a lone step's time goes").
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch.nn import functional as F

from engine.core import kernels

F32 = torch.float32
PARTS = 4        # blocks of output rows: a multiple of the 2 threads a 2-core machine runs (4 measured as good as 2)
MAX_ROWS = 4     # at most this many rows (a lone step has one); more take F.linear


def splits(weight: torch.Tensor) -> bool:
    """Whether `linear` splits this weight: CPU float32, contiguous (out, in), out a multiple of PARTS."""
    return (weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.dim() == 2
            and weight.is_contiguous() and weight.shape[0] % PARTS == 0)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T + bias, as F.linear: x (..., in) -> (..., out); the row kernel where it is built and fits (at
    most kernels.MAX_ROWS rows, CPU float32, the weight contiguous (out, in)), else split into PARTS blocks of
    output rows where `splits(weight)` and x has at most MAX_ROWS rows of float32, else F.linear."""
    rows = x.reshape(-1, x.shape[-1])                                              # [R, in]
    kernel = kernels.row_kernel()
    if kernel is not None and kernels.fits(rows, weight, bias):
        return kernel.linear(rows, weight, bias).view(*x.shape[:-1], weight.shape[0])
    return split(x, weight, bias)


def split(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """linear's torch path, x (..., in) -> (..., out): one torch.bmm over PARTS blocks of output rows where
    `splits(weight)` and x has at most MAX_ROWS rows of float32, else F.linear."""
    rows = x.reshape(-1, x.shape[-1])                                              # [R, in]
    if rows.shape[0] > MAX_ROWS or x.dtype != torch.float32 or not splits(weight):
        return F.linear(x, weight, bias)
    out, width = weight.shape
    blocks = weight.view(PARTS, out // PARTS, width)                               # [P, out / P, in], a view
    y = torch.bmm(blocks, rows.t().expand(PARTS, -1, -1)).view(out, -1).t()       # [R, out]
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], out)


class Bound:
    """linear(x, weight, bias) for one row x [1, 1, in], made once for a lone step's products (engine.core.lone):
    the row kernel's checks made here, its C arguments made once, and the output written into one tensor [1, 1, out]
    made once, so each call overwrites the last call's values: the caller must be done with them by its next call
    (`fresh`: a new tensor each call, for an output the caller keeps, as the logits). Any other x takes `linear`.
    The weight and bias are held, so the addresses stay valid whatever their parameters are pointed at later."""

    def __init__(self, kernel: kernels.RowKernel, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 fresh: bool = False):
        out, width = weight.shape
        self.weight, self.bias, self.fresh = weight.detach(), bias.detach() if bias is not None else None, fresh
        self.shape = torch.Size((1, 1, width))
        if not kernels.fits(torch.empty(1, width), self.weight, self.bias):
            raise ValueError("the row kernel does not take this weight (kernels.fits)")
        with torch.inference_mode(False):                # a normal tensor: usable in and out of inference mode
            self.out = torch.empty(1, 1, out)
        self._call, self._at = kernel.one_row(self.weight, self.bias), self.out.data_ptr()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape != self.shape or x.dtype != F32 or not (x.is_cpu and x.is_contiguous()) or x.requires_grad:
            return linear(x, self.weight, self.bias)
        if self.fresh:
            y = torch.empty(self.out.shape)
            self._call(x.data_ptr(), y.data_ptr())
            return y
        self._call(x.data_ptr(), self._at)
        return self.out


def side_by_side(weights: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """One contiguous (sum of outs, in) matrix holding `weights` (parameters, each (out, in)) one after another, each
    parameter's `.data` made a view of its rows; None (nothing changed) where they are not all CPU float32
    contiguous matrices of the same width, or the whole would not split (`splits`)."""
    if not weights or not all(w.dim() == 2 and w.is_contiguous() and w.dtype == torch.float32
                              and w.device.type == "cpu" for w in weights):
        return None
    if len({w.shape[1] for w in weights}) != 1 or len({id(w) for w in weights}) != len(weights):
        return None
    whole = torch.cat([w.detach() for w in weights])                               # [sum out, in]
    if not splits(whole):
        return None
    start = 0
    for w in weights:
        w.data = whole[start:start + w.shape[0]]                                   # the same values, now a view
        start += w.shape[0]
    return whole


def addresses(whole: torch.Tensor, weights: Sequence[torch.Tensor]) -> list[int] | None:
    """Where each weight starts if it is still the view `side_by_side` made of `whole`, else None."""
    start, out = whole.data_ptr(), []
    for w in weights:
        if w.data_ptr() != start or not w.is_contiguous():
            return None
        out.append(start)
        start += w.numel() * w.element_size()
    return out


def product(whole: torch.Tensor, bias: torch.Tensor | None) -> Callable[[torch.Tensor], torch.Tensor]:
    """x -> linear(x, whole, bias): the products of several weights side by side, [..., sum of outs]."""
    return lambda x: linear(x, whole, bias)
