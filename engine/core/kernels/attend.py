"""The attention kernel of the invariant mode: each query row's softmax over its keys in one fixed order (attend.c).

    kernel = attend_kernel()                          # the loaded library, or None (one warning says why)
    if kernel.fits(q, keys, values, mask):            # float32 on the CPU, D a multiple of 16
        out = kernel.attention(q, keys, values, mask, scaling)   # [B, H, T, D], a view of [B, T, H, D]

Built as the row kernel is (engine/core/kernels/__init__.py: the same flags, cache folder and OpenMP team), from
attend.c. A query's output is bitwise the same alone or among any rows, in a decode step or in a prefill chunk of
any length, with any thread count: keys in blocks of 64 from the row's first real key, an online softmax from block
to block in key order, threads split over (row, kv head, query tile) items only (attend.c says how). Where it
cannot be built or loaded, `attend_kernel()` is None and engine/core/invariant.py keeps its torch path.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from engine.core import kernels

SOURCE = Path(__file__).with_name("attend.c")
LANES = 16                     # D must be a multiple of this: attend.c's widest vector, and its weights' sum
MAX_GROUP = 64                 # query heads per kv head attend.c keeps state for
QTILE = 16                     # attend.c's query rows per item: a row of fewer is one item a kv head


class AttendKernel:
    """The loaded library (`path`: built from attend.c, or from a test's copy of it)."""

    def __init__(self, path: Path):
        self.path = path
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as err:
            raise kernels.BuildError(f"could not load {path.name}: {err}") from err
        self._call = lib.attend
        ptr = ctypes.c_void_p
        self._call.argtypes = [ptr, ptr, ptr, ptr, ptr, ctypes.c_long, ptr, ctypes.c_float, ctypes.c_int]
        self._call.restype = None
        self._row = lib.attend_row                      # one row, mask None, on the calling thread
        self._row.argtypes = [ptr, ptr, ptr, ptr, ptr, ctypes.c_float, ctypes.c_int]
        self._row.restype = None
        self.row_address = ctypes.cast(lib.attend_row, ctypes.c_void_p).value     # for glue.c's lone_layers

    @staticmethod
    def fits(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None) -> bool:
        """Whether attend.c computes this call: all float32 on the CPU, D a multiple of LANES, the query heads a
        multiple of the kv heads (at most MAX_GROUP each), a boolean mask [B, 1, T, S] or None, no autograd."""
        (b, h, t, d), kvh = q.shape, keys.shape[1]
        tensors = (q, keys, values)
        return (all(x.dtype == torch.float32 and x.device.type == "cpu" and x.dim() == 4 for x in tensors)
                and d % LANES == 0 and kvh > 0 and h % kvh == 0 and h // kvh <= MAX_GROUP
                and keys.shape == values.shape and keys.shape[0] == b and keys.shape[3] == d
                and (mask is None or (mask.dtype == torch.bool and mask.device.type == "cpu"
                                      and mask.shape == (b, 1, t, keys.shape[2])))
                and not (torch.is_grad_enabled() and any(x.requires_grad for x in tensors)))

    def attention(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
                  scaling: float, threads: int | None = None) -> torch.Tensor:
        """Softmax(q K^T * scaling) V: q [B, H, T, D]; keys, values [B, KVH, S, D]; mask [B, 1, T, S] (True:
        attend) or None for causal over the last T keys. Returns [B, H, T, D] (a view of a [B, T, H, D] tensor)."""
        (b, h, t, d), (kvh, s) = q.shape, keys.shape[1:3]
        q, keys, values = (x if x.stride(3) == 1 else x.contiguous() for x in (q, keys, values))
        flags = None if mask is None else mask[:, 0]                                  # [B, T, S]
        if flags is not None and flags.stride(2) != 1:
            flags = flags.contiguous()
        out = torch.empty(b, t, h, d, dtype=torch.float32)                             # [B, T, H, D]
        dims = (h, kvh, t, s, d, *q.stride()[:3], *keys.stride()[:3], *values.stride()[:3],
                *(flags.stride()[:2] if flags is not None else (0, 0)))
        if b == 1 and flags is None and t < QTILE:          # one item a kv head: on this thread unless told
            self._row(q.data_ptr(), keys.data_ptr(), values.data_ptr(), out.data_ptr(),
                      (ctypes.c_long * len(dims))(*dims), scaling, 1 if threads is None else threads)
        else:
            self._call(q.data_ptr(), keys.data_ptr(), values.data_ptr(),
                       flags.data_ptr() if flags is not None else None, out.data_ptr(), b,
                       (ctypes.c_long * len(dims))(*dims), scaling, torch.get_num_threads() if threads is None else threads)
        return out.transpose(1, 2)


ATTEND = kernels.Lazy("attention kernel", lambda: AttendKernel(kernels.build(SOURCE)),
                      "the invariant attention takes torch's path")


def attend_kernel() -> AttendKernel | None:
    """The kernel, built and loaded at the first call in this process; None (and one warning) where it cannot be,
    or where `use(False)` turned it off."""
    return ATTEND.get()                                                             # type: ignore[return-value]


why_off, use, forget = ATTEND.why_off, ATTEND.use, ATTEND.forget
