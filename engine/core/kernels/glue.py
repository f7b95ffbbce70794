"""The work around a step's products in C (glue.c): the RMS norm, the rotary embedding and the gated SiLU, per row.

    glue = glue_kernel()                          # the loaded library, or None (one warning says why)
    y = glue.norm(x, weight, eps)                 # transformers' RMS norm, x [..., d] float32 on the CPU
    glue.rope_(x, cos, sin, heads, dim)           # x [B, T, >= heads * dim] rotated in place, cos/sin [B, T, dim]
    y = glue.silu_mul(gate, up)                   # F.silu(gate) * up, [..., f]

Built as the row kernel is (engine/core/kernels/__init__.py: the same flags, cache folder and OpenMP team). Each
call is one ctypes call over every row where torch makes several operators (engine/core/lean.py's forward takes
these through `TorchGlue`'s interface: `CGlue` where the kernel is built and the step is float32 on the CPU). A
row's numbers do not depend on the other rows or the thread count (glue.c says how); rope is bitwise transformers',
the norm and the SiLU differ from torch's in the last bits (tests/test_glue.py measures them).
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import torch

from engine.core import kernels

SOURCE = Path(__file__).with_name("glue.c")
F32 = torch.float32


class GlueKernel:
    """The loaded library (`path`: built from glue.c)."""

    def __init__(self, path: Path):
        self.path = path
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as err:
            raise kernels.BuildError(f"could not load {path.name}: {err}") from err
        ptr, long, c_int, c_float = ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_float
        self._norm = _fn(lib.glue_norm, [ptr, long, ptr, ptr, long, long, long, c_float, c_int])
        self._rope = _fn(lib.glue_rope, [ptr, long, ptr, ptr, long, long, long, long, c_int])
        self._silu_mul = _fn(lib.glue_silu_mul, [ptr, ptr, long, ptr, long, long, long, c_int])
        self.lone_before, self.lone_after = lib["lone_before"], lib["lone_after"]   # C values in: LonePlan's
        self._pick = _fn(lib.pick_row, [ptr, long, long, ptr, ptr, ptr, ptr])
        self.lone_layers = _fn(lib["lone_layers"], [ptr, ptr, long, ptr, long, ptr, ptr, long, long, long, c_int])
        self.lone_token = _fn(lib["lone_token"], [ptr, ptr, long, ptr, ptr, long, ptr, ptr, long, long, long, c_int])
        for fn in (self.lone_before, self.lone_after):
            fn.restype = None

    def norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """weight * (x * rsqrt(mean(x^2) + eps)) over x's last dimension [..., d] -> a new [..., d]."""
        rows = _rows(x)                                                               # [N, d]
        y = torch.empty(x.shape, dtype=F32)
        n, d = rows.shape
        self._norm(rows.data_ptr(), rows.stride(0), weight.data_ptr(), y.data_ptr(), d, n, d, eps,
                   torch.get_num_threads())
        return y

    def rope_(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, dim: int) -> None:
        """The first heads * dim values of each row of x [B, T, width] (x[b, t] contiguous, rows evenly strided),
        each head rotated in place by its row's cos, sin [B, T, dim] (contiguous)."""
        b, t, _ = x.shape
        self._rope(x.data_ptr(), x.stride(1), cos.data_ptr(), sin.data_ptr(), dim, b * t, heads, dim,
                   torch.get_num_threads())

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """F.silu(gate) * up: gate and up [..., f] views with the same strides (gate|up halves of one product, or two
        contiguous tensors) -> a new [..., f]."""
        f = gate.shape[-1]
        g, u = gate.reshape(-1, f), up.reshape(-1, f)                                 # views where they can be
        y = torch.empty(gate.shape, dtype=F32)
        self._silu_mul(g.data_ptr(), u.data_ptr(), g.stride(0), y.data_ptr(), f, g.shape[0], f,
                       torch.get_num_threads())
        return y


    def pick(self, logits: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each row of logits [B, V] (float32, rows contiguous): its k largest logits' ids [B, k] (int64) and values
        [B, k], largest first, the lower id first among equal ones, and stats [B, 3] (float64): the log-sum-exp of the
        row, the largest logit left out (L) and the log-sum-exp of every logit left out (the last two where V > k).
        numpy arrays: no torch operator on the way (a lone step's pick runs cold, after the weights have streamed)."""
        b, v = logits.shape
        at_stats, at_vals = 8 * b * k, 8 * b * k + 24 * b        # ids, stats, vals: one allocation, 8-aligned
        space = np.empty(at_vals + 4 * b * k, np.uint8)
        at = space.__array_interface__["data"][0]         # not numpy's .ctypes: a Python helper, slow cold
        ids = space[:at_stats].view(np.int64).reshape(b, k)
        stats = space[at_stats:at_vals].view(np.float64).reshape(b, 3)
        vals = space[at_vals:].view(np.float32).reshape(b, k)
        stats.fill(np.nan)
        scratch = np.empty(2 * (k + 1), np.int64)                                # k + 1 (value, id) pairs
        work = scratch.__array_interface__["data"][0]
        x, row = logits.data_ptr(), 4 * logits.stride(0)
        for r in range(b):
            self._pick(x + r * row, v, k, at + 8 * k * r, at + at_vals + 4 * k * r, at + at_stats + 24 * r, work)
        return ids, vals, stats


class LoneLayer(ctypes.Structure):
    """glue.c's lone_layer_t: one layer's parameters (addresses; 0 for a missing bias)."""

    _fields_ = [(name, ctypes.c_void_p) for name in ("ln1", "ln2", "qkv", "qkv_bias", "o", "o_bias", "gate_up",
                                                     "gate_up_bias", "down", "down_bias")]


class LoneState(ctypes.Structure):
    """glue.c's lone_t: the row kernel's product, the shapes, the row's buffers and this step's rotary table; attend.c's
    attend_row, attention's output buffer, its scaling and its threads (0: the step's; for `lone_layers`)."""

    _fields_ = [("product", ctypes.c_void_p), *((name, ctypes.c_long) for name in
                                                 ("d", "qkv_out", "rotated", "dim", "f", "width")),
                ("eps", ctypes.c_float), *((name, ctypes.c_void_p) for name in
                                           ("x", "h", "qkv_out_buf", "gate_up_buf", "delta", "cos", "sin")),
                ("attend", ctypes.c_void_p), ("attn", ctypes.c_void_p), ("scale", ctypes.c_float),
                ("attend_threads", ctypes.c_int)]


class LoneEnds(ctypes.Structure):
    """glue.c's lone_ends_t: a lone token's embedding row, the final norm's weight, the LM head (its bias 0 where it
    has none) and its vocabulary, and where the logits go (`lone_token`)."""

    _fields_ = [*((name, ctypes.c_void_p) for name in ("embed", "norm", "head", "head_bias")),
                ("vocab", ctypes.c_long), ("logits", ctypes.c_void_p)]


def _fn(fn, argtypes):
    fn.argtypes, fn.restype = argtypes, None
    return fn


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., d] as [N, d] rows with the last dimension contiguous (a copy only where no view is)."""
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


GLUE = kernels.Lazy("glue kernel", lambda: GlueKernel(kernels.build(SOURCE)),
                    "the norms, rotary and SiLU take torch's operators")


def glue_kernel() -> GlueKernel | None:
    """The kernel, built and loaded at the first call in this process; None (and one warning) where it cannot be,
    or where `use(False)` turned it off."""
    return GLUE.get()                                                               # type: ignore[return-value]


why_off, use, forget = GLUE.why_off, GLUE.use, GLUE.forget
