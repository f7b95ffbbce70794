"""The memory ledger: where the device's memory goes, measured, beside the model card's formula.

    ledger = memory_ledger(lm, last_cache_state)      # cheap: reads counters, runs nothing

On CUDA the measured side comes from PyTorch's caching allocator: `torch.cuda.memory_allocated`
(live tensors now), `max_memory_allocated` / `max_memory_reserved` (the high-water marks since the
process started or the last reset) and `mem_get_info` (the card). On a CPU there is no allocator to
ask: the ledger reports the process's resident memory (psutil) and the tensors' own bytes, and says
so in `measured_by`. The formula side is engine/projection/card.py: weights = parameters x bytes, KV = 2 x
layers x KV heads x head_dim x bytes per token.

For a precise split (what loading the weights or allocating a cache really took), measure the
allocator around the step: `allocated_by(fn, device)` and `peak_during(fn, device)`; bench/gpu.py does.
"""
from __future__ import annotations

import gc
from dataclasses import asdict, dataclass
from typing import Any, Callable, TypeVar

import psutil
import torch

from engine.projection.card import kv_cache_bytes, weight_bytes
from engine.core.loader import LoadedModel
from engine.core.small_batch import kernels_for
from engine.core.records import CacheState

T = TypeVar("T")
CUDA_SOURCE = "torch.cuda allocator (memory_allocated, max_memory_reserved, mem_get_info)"
CPU_SOURCE = "CPU: process resident memory (psutil) and tensor bytes; no allocator counters on a CPU"


@dataclass(frozen=True)
class MemoryLedger:
    """Bytes. `*_formula` fields come from the card; the rest is measured as `measured_by` says."""

    device: str
    measured_by: str
    weights: int                  # the parameter tensors (tied embeddings once)
    weights_formula: float
    kv_tokens: int                # positions the last run's cache held
    kv: int                       # their K and V bytes, read from the cache object
    kv_formula: float
    allocated: int | None = None       # CUDA: live tensors now
    peak_allocated: int | None = None  # CUDA: high-water mark of live tensors
    peak_reserved: int | None = None   # CUDA: high-water mark of what the allocator took from the card
    device_total: int | None = None    # CUDA: the card's memory
    process_rss: int | None = None     # CPU: resident set size of this process
    packed: int = 0                    # CPU: the small-batch kernel's packed weight copies (engine/core/small_batch.py)
    kv_pool: int = 0                   # CUDA: the batch's K/V pool, kept for its CUDA graphs (engine/serving/graphed.py)
    kv_pool_tokens: int = 0            # positions it holds
    resid_pool: int = 0                # CUDA: the residual pool beside it (every hidden state of every position)
    resid_tokens: int = 0              # positions of residual the last run keeps
    resid: int = 0                     # their bytes, read from what the run keeps
    resid_formula: float = 0.0         # (kept hidden states) x d_model x bytes x positions

    @property
    def workspace(self) -> int:
        """What the peak held beyond the weights and the KV cache.

        CUDA: activations, logits, CUDA-graph pools and allocator slack (peak reserved - weights - KV - the
        batch's kept K/V pool).
        CPU: the rest of the process (Python, libraries, activations): RSS - weights - packed copies - KV.
        """
        top = self.peak_reserved if self.peak_reserved is not None else (self.process_rss or 0)
        return top - self.weights - self.packed - self.kv - self.kv_pool - self.resid_pool

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "workspace": self.workspace}


def cuda(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_available()


def memory_ledger(lm: LoadedModel, cache: CacheState | None = None, kept: Any = None) -> MemoryLedger:
    """The ledger now: weights, the last run's cache (`cache`) and the residual it keeps (`kept`, a KeptInputs),
    counters."""
    dtype = lm.dtype_name
    tokens, kv = (cache.length, cache.bytes) if cache is not None else (0, 0)
    common = dict(device=str(lm.device), weights=lm.weight_bytes, weights_formula=weight_bytes(lm.spec, dtype),
                  kv_tokens=tokens, kv=kv, kv_formula=kv_cache_bytes(lm.spec, tokens, dtype))
    if kept is not None:
        common.update(resid_tokens=kept.length, resid=kept.nbytes,
                      resid_formula=len(kept.layers) * lm.spec.d_model * lm.dtype.itemsize * kept.length)
    if cuda(lm.device):
        pool = getattr(lm.batch_graphs, "pool", None)
        if pool is not None:
            common.update(kv_pool=sum(t.numel() * t.element_size() for t in (*pool.keys, *pool.values)),
                          kv_pool_tokens=pool.keys[0].shape[0],
                          resid_pool=pool.resid.numel() * pool.resid.element_size() if pool.resid is not None else 0)
        return MemoryLedger(measured_by=CUDA_SOURCE, allocated=torch.cuda.memory_allocated(lm.device),
                            peak_allocated=torch.cuda.max_memory_allocated(lm.device),
                            peak_reserved=torch.cuda.max_memory_reserved(lm.device),
                            device_total=torch.cuda.mem_get_info(lm.device)[1], **common)
    kernels = kernels_for(lm, pack=False)
    return MemoryLedger(measured_by=CPU_SOURCE, process_rss=psutil.Process().memory_info().rss,
                        packed=kernels.nbytes if kernels is not None else 0, **common)


def allocated_by(fn: Callable[[], T], device: torch.device) -> tuple[T, int | None]:
    """Run fn; how much more `torch.cuda.memory_allocated` holds afterwards (None off CUDA)."""
    if not cuda(device):
        return fn(), None
    gc.collect()             # garbage from before (a model in a reference cycle) freed inside fn would be netted out
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    result = fn()
    torch.cuda.synchronize(device)
    return result, torch.cuda.memory_allocated(device) - before


def peak_during(fn: Callable[[], T], device: torch.device) -> tuple[T, int | None, int | None]:
    """Run fn; the peak of live tensors above the start, and the allocator's peak reservation (None off CUDA)."""
    if not cuda(device):
        return fn(), None, None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    result = fn()
    torch.cuda.synchronize(device)
    return result, torch.cuda.max_memory_allocated(device) - before, torch.cuda.max_memory_reserved(device)
