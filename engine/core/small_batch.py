"""Small-batch matrix products on CPU: weights packed once for a room's decode steps and short prefill chunks.

A decode step of B requests multiplies a (B, d_in) activation by every weight matrix. On a CPU with AVX2
(the 2-core machine this app is built on), torch's default float32 path (MKL sgemm) is poor at 2 <= B <= 32:
measured single-threaded, a 1536 x 576 matrix takes 84 us at B = 1, 158 us at B = 2 and 287 us at B = 6, and
SmolLM2's 49152 x 576 LM head 8.3 ms at B = 1 but 19.5 ms at B = 2. A copy of each weight packed once for a
blocked product is faster there. Two packers, by what this machine has:

- the row kernel's panels (engine/core/kernels, rows.c's `panels_pack` and `panels_linear`), where it builds: the
  same sums in the same order as a request alone (`ordered`: a row's products have the bits they have alone, in a
  room of any size, which also makes them the invariant mode's products for any step, `ordered_linear`), and the
  fastest of the ways measured here for 2 to 128 rows (docs/engine.md, "Room products on panels");
- else oneDNN's matmul on its blocked layout (`torch.ops.mkldnn._reorder_linear_weight`), which rounds differently
  from MKL and from a request alone: a batched row equals the same request alone within float32 tolerance.

A step of ROWS rows uses the packed copy, only for the matrix shapes where it measured faster on this machine
(`calibrate`); a request alone runs the row kernel's few-rows product, longer chunks MKL.

    with small_batch_kernels(lm):                # on this thread: small batches use the packed weights
        lm.model(input_ids=ids, ...)             # (packed on first use; nothing where there is no gain)
    packed, bias = kernels.fuse([(q, qb), (k, kb), (v, vb)])   # one product for weights sharing an input (the
                                                               # lean batch step, engine/serving/lean.py)

The packed copies cost memory (SmolLM2-135M: about 0.54 GB beside its 0.54 GB of float32 weights), so packing
stops at `max_bytes` (tests/test_small_batch.py). The `small_batch` setting, `PLAYGROUND_SMALL_BATCH=off`, turns it
off; `=all` packs every CPU float32 linear without measuring (the tests do, so that they run the packed kernel on
any machine). docs/serving.md and docs/engine.md have the measurements.
"""
from __future__ import annotations

import threading
import time
import weakref
from contextlib import contextmanager
from typing import Any, Iterator

import psutil
import torch
from torch import nn
from torch.nn import functional as F

from engine import settings
from engine.core import invariant, kernels, matvec
from engine.core.kernels import Panels
from engine.core.openmp import in_passing_thread

ROWS = range(2, 129)            # rows of the activation that use the packed weights: a room's decode step (up to
                                # 32), a prefill chunk or a mixed step of up to 128 tokens. Measured against MKL on
                                # SmolLM2's layer products, two threads (docs/serving.md, "Prefill chunks on the
                                # packed weights", bench/results/chunk_products/20261129T005937Z-b407b1d.json):
                                # 0.80x its time at 41 rows, 0.88x at 64, 0.95x at 128, 1.01x at 256, 1.07x at 512
PROBE_ROWS = 4                  # the batch size `calibrate` times
MIN_GAIN = 0.9                  # packed at most this share of MKL's time, or the shape is not packed
MAX_BYTES = 2 * 1024 ** 3       # packed copies kept at most (and at most a quarter of the free memory)
ENV = "PLAYGROUND_SMALL_BATCH"  # the `small_batch` setting: "auto" (default): shapes measured faster; "all": every
                                # one (tests); "off"

_active = threading.local()


def available() -> bool:
    """Whether a packed product exists here: the row kernel's panels (engine.core.kernels) or oneDNN's packed
    linear (a CPU build of torch with MKL-DNN)."""
    return kernels.row_kernel() is not None or onednn_available()


def onednn_available() -> bool:
    """Whether this torch has oneDNN's packed linear (a CPU build with MKL-DNN)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def pack_weight(weight: torch.Tensor) -> torch.Tensor | Panels:
    """`weight` (out, in) packed for `packed_linear`: in the row kernel's panels where it fits (a float32 CPU
    weight: every row's product then has the bits it has alone, `ordered`), else in oneDNN's blocked layout."""
    kernel = kernels.row_kernel()
    w = weight.detach()
    if kernel is not None and kernels.fits(w[:1], w, None, max_rows=None):
        return kernel.pack(w)
    return torch.ops.mkldnn._reorder_linear_weight(w, None)


def ordered(packed: torch.Tensor | Panels) -> bool:
    """Whether `packed` multiplies in the row kernel's one order per output (its panels): a row's numbers then do not
    depend on the other rows, as the invariant mode's products (engine.core.invariant)."""
    return isinstance(packed, Panels)


def packed_linear(x: torch.Tensor, packed: torch.Tensor | Panels, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ W.T + bias with W packed by `pack_weight`; x is (..., in)."""
    rows = x.reshape(-1, x.shape[-1])
    if isinstance(packed, Panels):
        out = packed.kernel.on_panels(rows, packed, bias)
    else:
        out = torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")
    return out.reshape(*x.shape[:-1], -1)


def _seconds(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def calibrate(weight: torch.Tensor, packed: torch.Tensor, rows: int = PROBE_ROWS) -> tuple[float, float]:
    """Seconds of one (rows, in) product with MKL and with the packed weight on this machine: the two
    alternate, and the fastest of each counts (the least disturbed by whatever else the machine runs)."""
    x = torch.randn(rows, weight.shape[1], dtype=weight.dtype)
    rounds = 4 if weight.numel() > 8_000_000 else 12          # an LM head takes milliseconds
    mkl, onednn = [], []
    with torch.inference_mode():
        for _ in range(rounds + 1):                           # the first round allocates; not counted
            mkl.append(_seconds(lambda: F.linear(x, weight)))
            onednn.append(_seconds(lambda: packed_linear(x, packed, None)))
    return min(mkl[1:]), min(onednn[1:])


def _faster(times: tuple[float, float]) -> bool:
    """Whether (MKL s, packed s) from `calibrate` is worth packing for."""
    mkl, onednn = times
    return onednn <= MIN_GAIN * mkl


class SmallBatchLinear(nn.Linear):
    """An nn.Linear (the same object, its class switched by `SmallBatchKernels.pack`) that uses its packed weight
    inside `SmallBatchKernels.active()` for ROWS rows. A copy of the module, or a new weight, finds no packed
    weight for it and computes as nn.Linear does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernels = getattr(_active, "kernels", None)
        return F.linear(x, self.weight, self.bias) if kernels is None else kernels.linear(x, self.weight, self.bias)


class SmallBatchKernels:
    """The packed weights of one model, by the identity of the weight tensor they were packed from."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self._packed: dict[int, tuple[weakref.ref, torch.Tensor, int]] = {}   # (weight, packed, where it was)
        self._fused: dict[tuple[int, ...], tuple[tuple[weakref.ref, ...], torch.Tensor, torch.Tensor | None]] = {}
        self.nbytes, self.max_bytes = 0, max_bytes
        self.shapes: dict[tuple[int, int], tuple[float, float]] = {}     # (out, in) -> (MKL s, packed s)
        self._all_ordered = True                 # every copy made so far is the row kernel's panels (`ordered`)

    @classmethod
    def pack(cls, model: nn.Module, max_bytes: int = MAX_BYTES,
             environ: dict[str, str] | None = None) -> "SmallBatchKernels | None":
        """Pack every float32 CPU linear whose shape measured faster packed, up to `max_bytes` of copies;
        None when nothing was packed (not a CPU float32 model, no oneDNN, turned off, or nothing faster)."""
        mode = settings.of(environ).small_batch.lower()
        if mode in ("off", "0", "false", "no") or not available():
            return None
        kernels = cls(max_bytes)
        for layer in model.modules():
            if type(layer) in (nn.Linear, SmallBatchLinear) and kernels._worth_packing(layer.weight, max_bytes,
                                                                                         measure=mode != "all"):
                kernels._add(layer)
        return kernels if kernels._packed else None

    def _worth_packing(self, weight: torch.Tensor, max_bytes: int, measure: bool = True) -> bool:
        if weight.device.type != "cpu" or weight.dtype != torch.float32:
            return False
        if id(weight) in self._packed:                                  # a tied weight: packed once
            return True
        if self.nbytes + weight.numel() * weight.element_size() > max_bytes:
            return False
        if not measure:
            return True
        shape = tuple(weight.shape)
        if shape not in self.shapes:
            self.shapes[shape] = calibrate(weight, pack_weight(weight))
        return _faster(self.shapes[shape])

    def _add(self, layer: nn.Linear) -> None:
        weight, key = layer.weight, id(layer.weight)
        if key not in self._packed:
            self._packed[key] = (weakref.ref(weight), pack_weight(weight), weight.data_ptr())
            self._all_ordered &= ordered(self._packed[key][1])
            self.nbytes += weight.numel() * weight.element_size()
            weakref.finalize(weight, self._packed.pop, key, None)
        layer.__class__ = SmallBatchLinear

    def _copy_of(self, weight: torch.Tensor) -> torch.Tensor | Panels | None:
        """`weight`'s own packed copy, None where it has none or where the weight has since been pointed at other
        values (its copy is stale)."""
        entry = self._packed.get(id(weight))
        if entry is None or entry[0]() is not weight or entry[2] != weight.data_ptr():
            return None
        return entry[1]

    def packed_for(self, weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor | Panels | None:
        """The packed copy of `weight` when `x` is a small batch this kernel serves, else None."""
        if x.dtype != torch.float32 or torch.is_grad_enabled() or x.numel() // x.shape[-1] not in ROWS:
            return None
        return self._copy_of(weight)

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x @ weight.T + bias, on the packed copy where this kernel serves `x`; one row with the row kernel
        (engine.core.matvec.linear, a lone decode step's products, at the speed the weights stream: a prefill
        chunk's LM head on its last token, which MKL's sgemv made in about twice that time, above); F.linear
        elsewhere. docs/serving.md, "A short prompt's first token", has what it saved."""
        packed = self.packed_for(weight, x)
        if packed is not None:
            return packed_linear(x, packed, bias)
        return matvec.linear(x, weight, bias) if x.numel() == x.shape[-1] else F.linear(x, weight, bias)

    @property
    def ordered(self) -> bool:
        """Whether every packed copy is the row kernel's panels (`ordered`): then the products of any number of rows
        keep each row's bits, and the invariant mode takes them for every step (`ordered_linear`)."""
        return bool(self._packed or self._fused) and self._all_ordered

    def ordered_linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x @ weight.T + bias in the row kernel's one order per output for any number of rows (the invariant mode's
        products, engine.core.invariant): on the weight's panels where it has them, else invariant.linear."""
        copy = self._copy_of(weight)
        return packed_linear(x, copy, bias) if copy is not None and ordered(copy) else invariant.linear(x, weight, bias)

    ordered_linear.ordered = True          # type: ignore[attr-defined]  # LeanStep.forward keeps it in the mode

    def fuse(self, pairs: list[tuple[torch.Tensor, torch.Tensor | None]]
             ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """One packed matrix (and bias) for weights that multiply the same input, e.g. q|k|v or gate|up: their
        products side by side in one call (`packed_linear`). The weights' own packed copies are given back (the
        fused one serves the decode steps they served). None for weights that are not CPU float32, or where it
        would take the copies past `max_bytes`. Fused once per group of weights: a later call gets the same."""
        weights = [w for w, _ in pairs]
        key = tuple(id(w) for w in weights)
        if key in self._fused and all(ref() is w for ref, w in zip(self._fused[key][0], weights)):
            return self._fused[key][1:]
        if any(w.device.type != "cpu" or w.dtype != torch.float32 for w in weights):
            return None
        size = sum(w.numel() * w.element_size() for w in weights)
        own = {id(w): w.numel() * w.element_size() for w in weights if id(w) in self._packed}
        if self.nbytes - sum(own.values()) + size > self.max_bytes:
            return None
        bias = None
        if any(b is not None for _, b in pairs):
            bias = torch.cat([b if b is not None else w.new_zeros(w.shape[0]) for w, b in pairs])
        packed = pack_weight(torch.cat(weights))
        for weight_id, nbytes in own.items():
            self._packed.pop(weight_id, None)
            self.nbytes -= nbytes
        self._fused[key] = (tuple(weakref.ref(w) for w in weights), packed, bias)
        self._all_ordered &= ordered(packed)
        weakref.finalize(weights[0], self._fused.pop, key, None)
        self.nbytes += size
        return packed, bias

    def faster_shapes(self) -> dict[tuple[int, int], tuple[float, float]]:
        """The shapes packed because they measured faster: (out, in) -> (MKL s, packed s) for PROBE_ROWS rows."""
        return {shape: times for shape, times in self.shapes.items() if _faster(times)}

    @property
    def weights(self) -> int:
        """How many weight tensors have a packed copy, their own or in a fused one (a tied LM head and embedding
        count once)."""
        return len(self._packed) + sum(len(refs) for refs, _, _ in self._fused.values())

    @contextmanager
    def active(self) -> Iterator[None]:
        """Within: this thread's small batches use the packed weights."""
        before = getattr(_active, "kernels", None)
        _active.kernels = self
        try:
            yield
        finally:
            _active.kernels = before


_packing = threading.Lock()
NOT_PACKED = "not packed"        # lm.small_batch once packing found nothing to gain


def kernels_for(lm: Any, pack: bool = True) -> SmallBatchKernels | None:
    """The model's packed weights, packed on the first call (a CPU float32 model only) unless `pack` is False;
    None where nothing is packed."""
    with _packing:
        if lm.small_batch is None and pack:
            cpu32 = lm.device.type == "cpu" and lm.dtype == torch.float32
            budget = min(MAX_BYTES, psutil.virtual_memory().available // 4)    # a machine short of memory packs less
            packed = in_passing_thread(lambda: SmallBatchKernels.pack(lm.model, budget)) if cpu32 else None
            lm.small_batch = packed or NOT_PACKED
    return lm.small_batch if isinstance(lm.small_batch, SmallBatchKernels) else None


@contextmanager
def small_batch_kernels(lm: Any) -> Iterator[SmallBatchKernels | None]:
    """Within: this thread's forward passes of ROWS rows use the model's packed weights, where it has any."""
    kernels = kernels_for(lm)
    if kernels is None:
        yield None
        return
    with kernels.active():
        yield kernels
