"""Each weight matrix in the memory layout a one-token step reads fastest on this CPU, measured at load.

    relayout(lm)          # on a CPU: matrices whose transposed storage measured faster now use it (values unchanged)

A decode step of one request multiplies a (1, in) row by every weight matrix (out, in): a matrix-vector product,
bound by how fast the weights stream from memory. MKL's two ways of doing it do not stream equally well here:
measured on this 2-core machine (one thread, CPU time), SmolLM2's LM head (49152 x 576) took 14.7-16.8 ms stored
as transformers keeps it, (out, in) row-major, and 6.9-8.2 ms stored transposed, (in, out) row-major, read
row by row of the input; its MLP's gate and up (1536 x 576) 354-596 us against 258-281 us; its down (576 x 1536)
the other way round, 271-290 us against 387-421 us. So each distinct shape is timed both ways once, at load, and
the matrices of a shape that is clearly faster transposed are stored so: `weight.data = weight.t().contiguous().t()`
is the same tensor of values, shape and parameter, with other strides. Every operation (`F.linear`, the embedding
lookup of a tied LM head, the small-batch kernel's packing, the speed lab's readings) sees the same numbers;
no memory is added (each matrix is copied once while it is converted). Matrices under `MIN_BYTES` are left as
they are (nothing to gain), and so is every model off the CPU. `PLAYGROUND_LAYOUT=off` turns it off.
"""
from __future__ import annotations

import os
import time
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

ENV = "PLAYGROUND_LAYOUT"
MIN_BYTES = 1 << 20          # matrices smaller than this keep their layout
GAIN = 0.85                  # transposed storage must take at most this share of the time
ROUNDS = 5


def _cpu_seconds(fn) -> float:
    t = time.thread_time()
    fn()
    return time.thread_time() - t


def time_both(weight: torch.Tensor, rounds: int = ROUNDS) -> tuple[float, float]:
    """CPU seconds of a (1, in) x (out, in)^T product with `weight` as stored, and stored transposed; fastest of
    `rounds`, alternating (CPU time, so that other processes on the machine do not count)."""
    x = torch.randn(1, weight.shape[1], dtype=weight.dtype)
    other = weight.t().contiguous().t()
    plain, transposed = [], []
    with torch.inference_mode():
        for _ in range(rounds + 1):                          # the first round warms up; not counted
            plain.append(_cpu_seconds(lambda: F.linear(x, weight)))
            transposed.append(_cpu_seconds(lambda: F.linear(x, other)))
    return min(plain[1:]), min(transposed[1:])


def relayout(lm: Any) -> dict[tuple[int, int], tuple[float, float, bool]]:
    """Store each large float matrix of a CPU model transposed where that measured faster; returns, per shape
    (out, in), the seconds as stored and transposed and whether it changed."""
    if lm.device.type != "cpu" or os.environ.get(ENV, "on") == "off":
        return {}
    linears = [m for m in lm.model.modules() if isinstance(m, nn.Linear)
               and m.weight.is_contiguous() and m.weight.numel() * m.weight.element_size() >= MIN_BYTES]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                                  # a lone step's matrices, as one thread reads them
    try:
        timed = {}
        for m in linears:
            shape = tuple(m.weight.shape)
            if shape not in timed:
                plain, transposed = time_both(m.weight.detach())
                timed[shape] = (plain, transposed, transposed <= GAIN * plain)
    finally:
        torch.set_num_threads(threads)
    with torch.no_grad():
        for m in linears:
            if timed[tuple(m.weight.shape)][2] and m.weight.is_contiguous():   # a tied matrix: converted once
                m.weight.data = m.weight.data.t().contiguous().t()
    return timed
