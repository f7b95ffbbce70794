"""Each weight matrix in the memory layout a one-token step reads fastest on this CPU, measured at load.

    relayout(lm)          # on a CPU: matrices whose transposed storage measured faster now use it (values unchanged)

A decode step of one request multiplies a (1, in) row by every weight matrix (out, in): a matrix-vector product,
bound by how fast the weights stream from memory. **Where the row kernel is built** (engine/core/kernels: a float32
model on the CPU), every matrix stays as stored, with no timing: the kernel reads the stored (out, in) rows, and a
lone step's plan (engine/core/lone.py) binds its products to them. Measured on a quiet 2-core AMD EPYC (Zen 3,
AVX2), each matrix of a shape in turn, the kernel as stored against MKL's product on the matrix stored transposed
(`time_both`): on two threads the kernel took 0.50-0.62x MKL's time for every SmolLM2 shape (the LM head 2.8-2.9 ms
against 4.5-4.7); on one thread 0.69-0.91x for q/o, gate/up and down, and 1.10-1.12x for the LM head alone (5.2-5.3
ms against 4.7-4.8: a one-thread server gives up about half a millisecond a token there). The layout was timed at
every load before, and decided the stored form of each shape from that timing: on a machine busy while a server
loaded (vLLM's server starting beside ours in bench/vs_vllm.py; two busy processes in a test run), the kernel's
second thread shared a core, MKL's single thread did not, and q/o, down and the LM head went transposed, so the
lone step lost its plan and its products for good and took 41 ms a token where the same server loaded on a quiet
machine took 19.7 (docs/engine.md, "A layout timed at load"). A layout that does not depend on the load at load,
and a logit's last bits that do not either.

**Where it is not** (another dtype, or no compiler), each distinct shape is timed both ways once, at load, on the
threads torch has then and by wall clock, as split into blocks of output rows (engine/core/matvec.py) or through
F.linear as stored against F.linear transposed: MKL's two ways of a matrix-vector product did not stream equally
well here (SmolLM2's LM head took 14.7-16.8 ms with F.linear as stored and 6.9-8.2 ms transposed, one thread). The
matrices of a shape that is clearly faster transposed are stored so: `weight.data = weight.t().contiguous().t()` is
the same tensor of values, shape and parameter, with other strides. Every operation (`F.linear`, the embedding
lookup of a tied LM head, the small-batch kernel's packing, the speed lab's readings) sees the same numbers; no
memory is added once loaded (the timing holds transposed copies of at most COLD_BYTES, or of one larger matrix,
and each matrix is copied once while it is converted). Matrices under `MIN_BYTES` are left as they are (nothing to
gain), and so is every model off the CPU. No switch turns it off: it only picks how the same values are stored (its
PLAYGROUND_LAYOUT variable went with issue 53).

    lm.side_by_side = side_by_side(lm)    # on a CPU: per layer, its q|k|v and its gate|up as one matrix each

Then each decoder layer's weights that multiply the same input (q, k, v; gate, up) are copied into one matrix and
the parameters pointed at their rows of it (engine.core.matvec.side_by_side): the same values and parameters, no
memory added once done, so a lone step makes each group as one product (engine.serving.lean.LeanDecode).

    in_huge_pages(lm)                     # on Linux: every parameter moved into memory advised for 2 MB pages

Last, every float32 parameter (a matrix stored transposed too, its strides kept) is copied, one after another, into one anonymous mapping advised for transparent huge
pages (`madvise(MADV_HUGEPAGE)`: a machine whose setting is "madvise", as most distributions ship it, gives torch's
own allocations 4 KB pages) and pointed at its place there (`.data`, as above: the same parameters and values, the
old storage freed). A lone step streams every weight once; in 2 MB pages a page walk per 4 KB of weights becomes one
per 2 MB and the prefetchers no longer stop at every 4 KB (docs/engine.md, "Alone at the floor", measures it). Where
the kernel has no huge page to give, the mapping is ordinary memory.
"""
from __future__ import annotations

import mmap
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.core import kernels, matvec
from engine.core.openmp import in_passing_thread

MIN_BYTES = 1 << 20          # matrices smaller than this keep their layout
GAIN = 0.85                  # transposed storage must take at most this share of the time
ROUNDS = 5
COLD_BYTES = 64 * 10 ** 6     # a shape's matrices timed in turn up to this much: twice this machine's 32 MiB of L3


def _seconds(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def time_both(weights: torch.Tensor | list[torch.Tensor], rounds: int = ROUNDS) -> tuple[float, float]:
    """Wall seconds of (1, in) x (out, in)^T products with `weights` (matrices of one shape) as stored, and stored
    transposed, as a lone step makes them (engine.core.matvec.linear: the row kernel, or split into blocks, where
    stored (out, in); F.linear, MKL's one-thread matrix-vector product, where transposed), on torch's threads now:
    each matrix in turn, so that as in a step they come from memory, not from the cache (`cold`); fastest of
    `rounds`, alternating (the fastest: other processes on the machine only ever add time). Wall time, not the
    thread's CPU time: the kernel's second thread does half the work on the other core."""
    plain = cold(weights if isinstance(weights, list) else [weights])
    x = torch.randn(1, plain[0].shape[1], dtype=plain[0].dtype)
    other = [w.t().contiguous().t() for w in plain]
    stored, transposed = [], []
    with torch.inference_mode():
        for _ in range(rounds + 1):                          # the first round warms up; not counted
            stored.append(_seconds(lambda: [matvec.linear(x, w) for w in plain]) / len(plain))
            transposed.append(_seconds(lambda: [matvec.linear(x, w) for w in other]) / len(plain))
    return min(stored[1:]), min(transposed[1:])


def cold(weights: list[torch.Tensor]) -> list[torch.Tensor]:
    """The first of `weights` that together pass COLD_BYTES (all of them if they do not): read in turn, the first
    have left the cache when they come round again."""
    taken, nbytes = [], 0
    for w in weights:
        taken.append(w)
        nbytes += w.numel() * w.element_size()
        if nbytes >= COLD_BYTES:
            break
    return taken


def relayout(lm: Any) -> dict[tuple[int, int], tuple[float, float, bool]]:
    """Store each large float matrix of a CPU model transposed where that measured faster; returns, per shape
    (out, in), the seconds as stored and transposed and whether it changed. Nothing is timed, and nothing changes,
    where the row kernel makes the model's products (`kept_as_stored`)."""
    if lm.device.type != "cpu" or kept_as_stored(lm):
        return {}
    linears = [m for m in lm.model.modules() if isinstance(m, nn.Linear)
               and m.weight.is_contiguous() and m.weight.numel() * m.weight.element_size() >= MIN_BYTES]
    threads = torch.get_num_threads()    # a lone step's: every core unless fixed lower
    timed = in_passing_thread(lambda: _timed(linears, threads))
    with torch.no_grad():
        for m in linears:
            if timed[tuple(m.weight.shape)][2] and m.weight.is_contiguous():   # a tied matrix: converted once
                m.weight.data = m.weight.data.t().contiguous().t()
    return timed


def kept_as_stored(lm: Any) -> bool:
    """Whether every matrix stays as stored without timing: a float32 model where the row kernel is built (it reads
    the stored rows faster than MKL reads either layout on the step's threads; see the module's docstring)."""
    return lm.dtype == torch.float32 and kernels.row_kernel() is not None


def _timed(linears: list[Any], threads: int) -> dict[tuple[int, int], tuple[float, float, bool]]:
    """Each shape timed both ways (`time_both`) on `threads` threads. Run in a passing thread (engine.core.openmp):
    the two-thread products make an OpenMP team, and a team left on the loading thread would make libgomp throttle
    the step loop's (a lone step in the server took 31-39 ms against 21.5 with it, and a step loop beside such a
    team in one process 29.3 against 19.8 on its own)."""
    torch.set_num_threads(threads)
    timed = {}
    for shape in dict.fromkeys(tuple(m.weight.shape) for m in linears):
        plain, transposed = time_both([m.weight.detach() for m in linears if tuple(m.weight.shape) == shape])
        timed[shape] = (plain, transposed, transposed <= GAIN * plain)
    return timed


def side_by_side(lm: Any) -> list[tuple[torch.Tensor | None, torch.Tensor | None]]:
    """On a CPU, each decoder layer's q|k|v and gate|up weights laid out one after another in one matrix each
    (engine.core.matvec.side_by_side); per layer, the two matrices (None where a group could not be). Empty off
    the CPU or for a model without Llama-style layers."""
    layers = getattr(getattr(lm.model, "model", None), "layers", None)
    if lm.device.type != "cpu" or layers is None:
        return []
    out = []
    with torch.no_grad():
        for layer in layers:
            groups = ((getattr(layer, "self_attn", None), ("q_proj", "k_proj", "v_proj")),
                      (getattr(layer, "mlp", None), ("gate_proj", "up_proj")))
            weights = [[getattr(getattr(parent, n, None), "weight", None) for n in names] for parent, names in groups]
            out.append(tuple(matvec.side_by_side(w) if all(isinstance(x, torch.Tensor) for x in w) else None
                             for w in weights))
    return out


def in_huge_pages(lm: Any, advise: bool = True) -> int:
    """On a CPU under Linux, every float32 contiguous parameter moved into one anonymous mapping, advised for 2 MB
    pages unless `advise` is False (the bench's comparison: the same layout in ordinary pages); the side-by-side
    groups move whole, their weights views of them again, and `lm.side_by_side` names the new matrices. Each old
    storage is let go as soon as it is copied. Returns the bytes moved (0: nothing done)."""
    if lm.device.type != "cpu" or not hasattr(mmap, "MADV_HUGEPAGE"):
        return 0
    params = [p for p in lm.model.parameters() if p.device.type == "cpu" and p.dtype == torch.float32
              and _dense(p) and p.numel()]
    groups = [(i, j) for i, pair in enumerate(lm.side_by_side) for j, w in enumerate(pair) if w is not None]
    inside = {g: [p for p in params if _within(p, lm.side_by_side[g[0]][g[1]])] for g in groups}
    grouped = {id(p) for members in inside.values() for p in members}
    singles = [p for p in params if id(p) not in grouped]
    once = {(p.data_ptr(), p.shape): p for p in singles}           # two parameters on the same values stay one
    total = sum(lm.side_by_side[i][j].numel() for i, j in groups) + sum(p.numel() for p in once.values())
    if not total or _available_bytes() < 4 * total:      # while moving, old pages may linger (about 0.6x the weights)
        return 0
    flat, at = mapped_floats(total, advise), 0
    with torch.no_grad():
        for i, j in groups:                                               # a group: its weights views of it again
            old = lm.side_by_side[i][j]
            new = flat[at:at + old.numel()].view(old.shape).copy_(old)
            for p in inside[i, j]:
                start = at + (p.data_ptr() - old.data_ptr()) // 4
                p.data = flat[start:start + p.numel()].view(p.shape)
            lm.side_by_side[i] = tuple(new if k == j else w for k, w in enumerate(lm.side_by_side[i]))
            at += old.numel()
        moved = {}
        for p in singles:
            key = (p.data_ptr(), p.shape)
            if key not in moved:
                moved[key] = _placed(flat[at:at + p.numel()], p).copy_(p)
                at += p.numel()
            p.data = moved[key]
    return 4 * at


def mapped_floats(count: int, advise: bool = True) -> torch.Tensor:
    """`count` float32s (uninitialised) in one anonymous mapping of their own, advised for 2 MB pages
    (`madvise(MADV_HUGEPAGE)`) unless `advise` is False; the tensor and its views keep the mapping alive. Linux
    (mmap.MADV_HUGEPAGE) only: the caller checks."""
    area = mmap.mmap(-1, 4 * count, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if advise:
        area.madvise(mmap.MADV_HUGEPAGE)
    return torch.frombuffer(area, dtype=torch.float32)


def _dense(p: torch.Tensor) -> bool:
    """Contiguous, or a matrix stored transposed (`relayout`): its values one block of memory either way."""
    return p.is_contiguous() or (p.dim() == 2 and p.t().is_contiguous())


def _placed(area: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """`area` (p's number of floats) viewed with p's shape and strides: a transposed matrix stays transposed."""
    return area.view(p.shape) if p.is_contiguous() else area.view(p.shape[::-1]).t()


def _within(p: torch.Tensor, whole: torch.Tensor) -> bool:
    """Whether p's elements lie inside `whole`'s (a side-by-side group's weight: a view of its rows)."""
    start = whole.data_ptr()
    return start <= p.data_ptr() and p.data_ptr() + 4 * p.numel() <= start + 4 * whole.numel()


def _available_bytes() -> int:
    """The memory the kernel says is available (MemAvailable), 0 where it cannot be read."""
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
        return next(int(line.split()[1]) * 1024 for line in lines if line.startswith("MemAvailable:"))
    except (OSError, ValueError, IndexError, StopIteration):
        return 0
