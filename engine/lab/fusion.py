"""FlashAttention and kernel fusion: the unfused attention path against the fused one, measured and projected.

    shape = AttentionShape.of_spec(lm.spec, tokens=1024, itemsize=4)
    point = measure_fusion(shape, lm.device, lm.dtype)       # eager vs fused, timed here
    proj = project_fusion(MODEL_PRESETS["llama-3.1-8b"], GPU_PRESETS["h100-sxm"], 32_768)

The unfused ("eager") path is Hugging Face's `eager_attention_forward`, written out step by step so the
bytes each step writes and reads can be counted from the real tensors: Q·Kᵀ materialises an N x N score
matrix per head, and scaling, masking, softmax (in float32) and the cast back each write a new one that
the next step reads again. The fused path is PyTorch's `scaled_dot_product_attention`, which on CPU and
GPU runs a FlashAttention-style kernel: it streams tiles of K and V past each tile of queries and keeps
the running softmax on chip, so no N x N matrix ever reaches main memory.

Projected traffic for a GPU uses the same counts: eager moves every score matrix through HBM; fused moves
Q, K and V in and the output out, once each (a lower bound: real kernels re-read K/V tiles, mostly from
on-chip cache). Time is max(FLOPs / peak, bytes / bandwidth) at the projection's default share of the spec
sheet's peaks (engine.projection.cost), as on every page.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from engine.errors import InvalidRequestError
from engine.core.generate import sync
from engine.projection.cost import DEFAULT_BANDWIDTH_EFFICIENCY, DEFAULT_FLOPS_EFFICIENCY, linear_flops_per_token
from engine.projection.specs import GPUSpec, ModelSpec, dtype_bytes
from engine.projection.units import fmt_bytes

FLOAT32_BYTES = 4            # HF's eager softmax runs in float32 whatever the model's precision
MAX_SCORE_BYTES = 3 * 2**30  # refuse a measured eager run whose float32 score matrix would exceed this


@dataclass(frozen=True)
class AttentionShape:
    """One layer's attention over one prompt: heads, K/V heads, tokens, head_dim, bytes per value."""

    heads: int
    kv_heads: int
    tokens: int
    head_dim: int
    itemsize: float

    @classmethod
    def of_spec(cls, spec: ModelSpec, tokens: int, itemsize: float) -> "AttentionShape":
        return cls(spec.n_heads, spec.n_kv_heads, tokens, spec.head_dim, itemsize)

    @property
    def scores(self) -> int:
        """Elements of one score matrix over all heads: H x N x N."""
        return self.heads * self.tokens * self.tokens

    @property
    def qo_values(self) -> int:
        return self.heads * self.tokens * self.head_dim            # Q or the output

    @property
    def kv_values(self) -> int:
        return self.kv_heads * self.tokens * self.head_dim         # K or V, before any repeat


# --- the memory-traffic arithmetic ---------------------------------------------------------------------

def eager_bytes(s: AttentionShape) -> float:
    """Bytes the eager path writes and reads, step by step, if nothing stays in cache.

    repeat K, V per query head (when grouped) | Q·Kᵀ -> S | S x scale | S + mask | softmax in float32 |
    cast back (skipped in float32) | S·V.
    """
    b, n2 = s.itemsize, s.tokens * s.tokens
    repeat = 2 * (s.kv_values + s.qo_values) * b if s.heads != s.kv_heads else 0
    k_read = s.qo_values if s.heads != s.kv_heads else s.kv_values
    qk = (s.qo_values + k_read) * b + s.scores * b
    scale = 2 * s.scores * b
    mask = (2 * s.scores + n2) * b
    softmax = s.scores * (b + FLOAT32_BYTES)
    cast = s.scores * (FLOAT32_BYTES + b) if b != FLOAT32_BYTES else 0
    pv = s.scores * b + k_read * b + s.qo_values * b
    return repeat + qk + scale + mask + softmax + cast + pv


def fused_bytes(s: AttentionShape) -> float:
    """The least a fused kernel moves: Q, K, V read once, the output written once."""
    return (2 * s.qo_values + 2 * s.kv_values) * s.itemsize


def eager_flops(s: AttentionShape) -> float:
    """Q·Kᵀ and P·V over every (query, key) pair, masked ones included: 4 x H x d per pair."""
    return 4.0 * s.heads * s.head_dim * s.tokens * s.tokens


def fused_flops(s: AttentionShape) -> float:
    """A causal fused kernel skips tiles above the diagonal: only the N(N+1)/2 visible pairs."""
    return 4.0 * s.heads * s.head_dim * s.tokens * (s.tokens + 1) / 2


def eager_bytes_per_score(itemsize: float) -> float:
    """Bytes the eager steps write and read per score element: 7 x b + 4 (+ 4 + b for the cast back)."""
    return 7 * itemsize + FLOAT32_BYTES + (FLOAT32_BYTES + itemsize if itemsize != FLOAT32_BYTES else 0)


def decode_row_bytes(spec: ModelSpec, context: int, itemsize: float) -> float:
    """A decode step's eager score rows over all layers: one query per head against `context` keys."""
    return spec.n_layers * spec.n_heads * context * eager_bytes_per_score(itemsize)


def largest_intermediate_bytes(s: AttentionShape) -> float:
    """The biggest tensor the eager path holds: the float32 probabilities, H x N x N x 4 bytes."""
    return s.scores * FLOAT32_BYTES


# --- the two paths, run for real -------------------------------------------------------------------------

class Traffic:
    """Counts the bytes each step of a computation writes (its output) and reads (its inputs)."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, int, int]] = []        # (name, bytes read, bytes written)

    def __call__(self, name: str, out: torch.Tensor, *inputs: torch.Tensor) -> torch.Tensor:
        if not (len(inputs) == 1 and out is inputs[0]):  # a no-op (same tensor back) moves nothing
            self.steps.append((name, sum(_nbytes(t) for t in inputs), _nbytes(out)))
        return out

    @property
    def total(self) -> int:
        return sum(r + w for _, r, w in self.steps)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def causal_mask(n: int, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """(N, N) additive mask: 0 where a query may look, the dtype's minimum above the diagonal (as HF builds it)."""
    full = torch.full((n, n), torch.finfo(dtype).min, dtype=dtype, device=device)
    return torch.triu(full, diagonal=1)


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float, mask: torch.Tensor,
                    traffic: Traffic | None = None) -> torch.Tensor:
    """HF's eager attention, one materialised tensor per step. q: [1, H, N, d]; k, v: [1, KVH, N, d]."""
    log = traffic or Traffic()
    groups = q.shape[1] // k.shape[1]
    k_rep = log("repeat K", k.repeat_interleave(groups, dim=1), k) if groups > 1 else k   # [1, H, N, d]
    v_rep = log("repeat V", v.repeat_interleave(groups, dim=1), v) if groups > 1 else v
    scores = log("Q·Kᵀ", torch.matmul(q, k_rep.transpose(2, 3)), q, k_rep)             # [1, H, N, N]
    scaled = log("÷√d", scores * scaling, scores)
    masked = log("+ mask", scaled + mask, scaled, mask)
    probs32 = log("softmax (float32)", F.softmax(masked, dim=-1, dtype=torch.float32), masked)
    probs = log("cast back", probs32.to(q.dtype), probs32)
    return log("P·V", torch.matmul(probs, v_rep), probs, v_rep)                        # [1, H, N, d]


def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scaling: float) -> torch.Tensor:
    """One fused kernel: q [1, H, N, d], k, v [1, KVH, N, d] -> [1, H, N, d]."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling, enable_gqa=True)


def random_qkv(s: AttentionShape, device: torch.device | str, dtype: torch.dtype,
               seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q [1, H, N, d], K and V [1, KVH, N, d] (the values do not change the work, only the shapes do)."""
    g = torch.Generator().manual_seed(seed)
    make = lambda heads: torch.randn(1, heads, s.tokens, s.head_dim, generator=g).to(device, dtype)  # noqa: E731
    return make(s.heads), make(s.kv_heads), make(s.kv_heads)


# --- measured here -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FusionPoint:
    """Eager against fused attention for one layer at one prompt length, measured on this device."""

    tokens: int
    eager_seconds: float          # best of the repeats
    fused_seconds: float
    eager_bytes: int              # counted from the tensors the eager steps wrote and read
    fused_bytes: float            # Q, K, V and the output, once each
    largest_bytes: int            # the largest tensor the eager path held
    max_difference: float         # |eager - fused|, largest element: the two compute the same thing

    @property
    def speedup(self) -> float:
        return self.eager_seconds / self.fused_seconds

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_measurable(s: AttentionShape) -> None:
    if s.tokens < 1:
        raise InvalidRequestError("attention needs at least one token")
    if largest_intermediate_bytes(s) > MAX_SCORE_BYTES:
        raise InvalidRequestError(f"at {s.tokens:,} tokens the eager score matrix alone takes "
                                  f"{fmt_bytes(largest_intermediate_bytes(s))}; choose a shorter prompt")


def best_time(fn: Callable[[], Any], device: torch.device, repeats: int) -> float:
    """The fastest of `repeats` timed calls of `fn` (seconds), the device synchronized around each."""
    best = math.inf
    for _ in range(max(1, repeats)):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - t)
    return best


def measure_fusion(s: AttentionShape, device: torch.device | str, dtype: torch.dtype,
                   repeats: int = 3) -> FusionPoint:
    """Time one layer's attention both ways (interleaved, best of `repeats`) and count the eager traffic."""
    check_measurable(s)
    dev = torch.device(device)
    q, k, v = random_qkv(s, dev, dtype)
    scaling, mask = s.head_dim ** -0.5, causal_mask(s.tokens, dtype, dev)
    with torch.inference_mode():
        log = Traffic()
        eager_out = eager_attention(q, k, v, scaling, mask, log)
        diff = float((eager_out.float() - fused_attention(q, k, v, scaling).float()).abs().max())
        eager_t = best_time(lambda: eager_attention(q, k, v, scaling, mask), dev, repeats)
        fused_t = best_time(lambda: fused_attention(q, k, v, scaling), dev, repeats)
    largest = max(w for _, _, w in log.steps)
    return FusionPoint(s.tokens, eager_t, fused_t, log.total, fused_bytes(s), largest, diff)


def sweep_fusion(spec: ModelSpec, lengths: Sequence[int], device: torch.device | str, dtype: torch.dtype,
                 repeats: int = 3, progress: Callable[[float, str], None] | None = None) -> list[FusionPoint]:
    itemsize = torch.empty((), dtype=dtype).element_size()
    points = []
    for i, n in enumerate(lengths):
        if progress:
            progress(i / len(lengths), f"one layer's attention over {n:,} tokens, eager then fused")
        points.append(measure_fusion(AttentionShape.of_spec(spec, n, itemsize), device, dtype, repeats))
    return points


# --- projected for a GPU -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class FusionProjection:
    """Attention of one prefill on a GPU at its spec-sheet peaks: eager against fused, all layers."""

    tokens: int
    eager_seconds: float          # all layers
    fused_seconds: float
    eager_bytes: float            # all layers
    fused_bytes: float
    largest_bytes: float          # one layer's float32 probabilities
    linear_seconds: float         # the rest of the prefill (every weight, N tokens), compute-bound
    fits: bool                    # does one layer's score matrix fit in the GPU's memory at all

    @property
    def eager_ttft(self) -> float:
        return self.linear_seconds + self.eager_seconds

    @property
    def fused_ttft(self) -> float:
        return self.linear_seconds + self.fused_seconds

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def roofline_seconds(flops: float, nbytes: float, gpu: GPUSpec, dtype: str = "bf16",
                     flops_efficiency: float = DEFAULT_FLOPS_EFFICIENCY,
                     bandwidth_efficiency: float = DEFAULT_BANDWIDTH_EFFICIENCY) -> float:
    """max(FLOPs / reached FLOP/s, bytes / reached bandwidth): the peaks at the projection's default efficiencies."""
    return max(flops / (gpu.peak_flops(dtype) * flops_efficiency),
               nbytes / (gpu.bandwidth_bytes_s * bandwidth_efficiency))


def project_fusion(spec: ModelSpec, gpu: GPUSpec, tokens: int, dtype: str = "bf16") -> FusionProjection:
    """One prefill of `tokens` on `gpu`: attention time eager vs fused from FLOPs and bytes, all layers, at the
    projection's default efficiencies (engine.projection.cost), as on every page."""
    s = AttentionShape.of_spec(spec, tokens, dtype_bytes(dtype))
    eager = roofline_seconds(eager_flops(s), eager_bytes(s), gpu, dtype) * spec.n_layers
    fused = roofline_seconds(fused_flops(s), fused_bytes(s), gpu, dtype) * spec.n_layers
    linear = tokens * linear_flops_per_token(spec) / (gpu.peak_flops(dtype) * DEFAULT_FLOPS_EFFICIENCY)
    return FusionProjection(tokens, eager, fused, eager_bytes(s) * spec.n_layers, fused_bytes(s) * spec.n_layers,
                            largest_intermediate_bytes(s), linear, largest_intermediate_bytes(s) < gpu.memory_bytes)
