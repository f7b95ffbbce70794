"""The projected plane: what a model would cost on a GPU, from its config and the spec sheet alone.

Pure arithmetic, no torch. Every figure is a closed-form estimate a page can show next to its
formula. Conventions (docs/projection.md explains them):

- "1K" tokens = 1024, so "128K" is Llama 3.1's 131,072-token context.
- GPU memory: the spec sheet's "80 GB" of HBM is read as 80 GiB (nvidia-smi shows an H100 80GB as
  81,559 MiB). Weights are reported in decimal GB, as the FACTS table does (8.03 B x 2 = 16.06 GB).
- A forward pass costs 2 FLOPs per parameter per token (one multiply-add), plus causal attention:
  4 x layers x query heads x head_dim FLOPs for every (query, key) pair it scores.
- A step moves, at least, every weight once plus the KV cache it reads (or writes); its time is
  max(bytes / (bandwidth x bw_eff), FLOPs / (peak x flops_eff)): a roofline in time.
- Each output token costs one decode step; TTFT = prefill + the first decode step (the FACTS
  worked example counts it this way: 5 ms + 8 ms = 13 ms).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Sequence

from engine.card import kv_bytes_per_token, param_counts
from engine.specs import GPUSpec, ModelSpec, dtype_bytes

TOKENS_PER_K = 1024            # "1K tokens"
GPU_GB = 2**30                 # bytes in one spec-sheet GB of GPU memory (HBM ships in GiB)
DEFAULT_FLOPS_EFFICIENCY = 0.6      # share of peak tensor FLOP/s a real forward pass reaches
DEFAULT_BANDWIDTH_EFFICIENCY = 0.6  # share of peak bandwidth a plain PyTorch decode step reaches
DEFAULT_DOLLARS_PER_HOUR = 3.0      # rental price of one GPU


def gpu_memory_bytes(gpu: GPUSpec, memory_fraction: float = 1.0) -> float:
    """Usable GPU memory in bytes: spec-sheet GB read as GiB, times the share we may fill."""
    return gpu.memory_gb * GPU_GB * memory_fraction


def compute_precision(weight_dtype: str) -> str:
    """The precision the matmuls run in: 8-bit weights use 8-bit tensor cores; 4-bit weights are
    dequantized to BF16 (weight-only quantization); FP32 runs as TF32."""
    size = dtype_bytes(weight_dtype)
    if size >= 4:
        return "fp32"
    return "fp8" if size == 1 else "bf16"


def peak_flops(gpu: GPUSpec, weight_dtype: str = "bf16") -> float:
    """Peak dense FLOP/s for matmuls with these weights (TF32 = half the BF16 rate)."""
    precision = compute_precision(weight_dtype)
    if precision == "fp32":
        return gpu.bf16_tflops * 1e12 / 2
    return gpu.peak_flops(precision)


def linear_flops_per_token(spec: ModelSpec) -> float:
    """2 FLOPs (multiply + add) per parameter per token: ~16 GFLOPs for Llama 3.1 8B."""
    return 2.0 * param_counts(spec).total


def attention_flops_per_pair(spec: ModelSpec) -> float:
    """FLOPs for one (query, key) pair over all layers and heads: q.k (2 x head_dim) + p.v (2 x head_dim)."""
    return 4.0 * spec.n_layers * spec.n_heads * spec.head_dim


def prefill_flops(spec: ModelSpec, tokens: int) -> float:
    """One prompt of `tokens`: linear part grows with N, causal attention with N(N+1)/2 pairs."""
    pairs = tokens * (tokens + 1) / 2
    return tokens * linear_flops_per_token(spec) + pairs * attention_flops_per_pair(spec)


def decode_flops(spec: ModelSpec, context: int) -> float:
    """One new token attending to `context` cached positions."""
    return linear_flops_per_token(spec) + context * attention_flops_per_pair(spec)


@dataclass(frozen=True)
class CostModel:
    """Per-step time model shared by the projection and the serving simulation."""

    weight_bytes: float
    kv_bytes_per_token: float
    linear_flops_per_token: float
    attention_flops_per_pair: float
    peak_flops: float           # FLOP/s
    bandwidth: float            # bytes/s
    flops_efficiency: float = DEFAULT_FLOPS_EFFICIENCY
    bandwidth_efficiency: float = DEFAULT_BANDWIDTH_EFFICIENCY

    def memory_seconds(self, nbytes: float) -> float:
        return nbytes / (self.bandwidth * self.bandwidth_efficiency)

    def compute_seconds(self, flops: float) -> float:
        return flops / (self.peak_flops * self.flops_efficiency)

    def decode_bytes(self, kv_tokens: int) -> float:
        """Every weight once plus every cached K/V value of the batch."""
        return self.weight_bytes + kv_tokens * self.kv_bytes_per_token

    def decode_step_flops(self, batch: int, kv_tokens: int) -> float:
        """`batch` new tokens; `kv_tokens` = cached positions summed over the batch."""
        return batch * self.linear_flops_per_token + kv_tokens * self.attention_flops_per_pair

    def decode_seconds(self, batch: int, kv_tokens: int) -> float:
        """One decode step: bandwidth-bound until the batch is large enough to be compute-bound."""
        return max(self.memory_seconds(self.decode_bytes(kv_tokens)),
                   self.compute_seconds(self.decode_step_flops(batch, kv_tokens)))

    def prefill_step_flops(self, prompts: Sequence[int]) -> float:
        pairs = sum(n * (n + 1) / 2 for n in prompts)
        return sum(prompts) * self.linear_flops_per_token + pairs * self.attention_flops_per_pair

    def prefill_seconds(self, prompts: Sequence[int]) -> float:
        """Prefill several prompts in one pass: weights read once, their K/V written once."""
        nbytes = self.weight_bytes + sum(prompts) * self.kv_bytes_per_token
        return max(self.memory_seconds(nbytes), self.compute_seconds(self.prefill_step_flops(prompts)))

    def ideal(self) -> "CostModel":
        """The same hardware at 100% of peak: the ceiling."""
        return replace(self, flops_efficiency=1.0, bandwidth_efficiency=1.0)


def cost_model(spec: ModelSpec, gpu: GPUSpec, weight_dtype: str = "bf16", kv_dtype: str = "bf16",
               flops_efficiency: float = DEFAULT_FLOPS_EFFICIENCY,
               bandwidth_efficiency: float = DEFAULT_BANDWIDTH_EFFICIENCY) -> CostModel:
    if not (0 < flops_efficiency <= 1 and 0 < bandwidth_efficiency <= 1):
        raise ValueError("efficiencies must be in (0, 1]")
    return CostModel(
        weight_bytes=param_counts(spec).total * dtype_bytes(weight_dtype),
        kv_bytes_per_token=kv_bytes_per_token(spec, kv_dtype),
        linear_flops_per_token=linear_flops_per_token(spec),
        attention_flops_per_pair=attention_flops_per_pair(spec),
        peak_flops=peak_flops(gpu, weight_dtype),
        bandwidth=gpu.bandwidth_bytes_s,
        flops_efficiency=flops_efficiency,
        bandwidth_efficiency=bandwidth_efficiency,
    )


def users_that_fit(spec: ModelSpec, gpu: GPUSpec, context: int, weight_dtype: str = "bf16",
                   kv_dtype: str = "bf16", memory_fraction: float = 1.0) -> int:
    """How many users, each holding `context` cached tokens, fit beside the weights."""
    free = gpu_memory_bytes(gpu, memory_fraction) - param_counts(spec).total * dtype_bytes(weight_dtype)
    per_user = kv_bytes_per_token(spec, kv_dtype) * context
    return max(0, math.floor(free / per_user)) if per_user > 0 else 0


@dataclass(frozen=True)
class UsersRow:
    """One row of the KV-cache page's table."""

    context: int            # tokens per user
    kv_bytes_per_user: float
    users: int              # users that fit beside the weights

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def users_table(spec: ModelSpec, gpu: GPUSpec, kv_dtype: str = "bf16", weight_dtype: str = "bf16",
                contexts: Sequence[int] = (1024, 10240, 102400, 131072)) -> list[UsersRow]:
    """Rows (context, cache per user, users) for each context length."""
    per_token = kv_bytes_per_token(spec, kv_dtype)
    return [UsersRow(c, per_token * c, users_that_fit(spec, gpu, c, weight_dtype, kv_dtype)) for c in contexts]


@dataclass(frozen=True)
class Projection:
    """Everything projected for one (model, GPU, precisions, batch, context). Times in ms."""

    model: str
    gpu: str
    weight_dtype: str
    kv_dtype: str
    batch: int
    context: int                 # cached tokens per user during decode
    prompt_tokens: int
    output_tokens: int
    flops_efficiency: float
    bandwidth_efficiency: float
    dollars_per_hour: float
    params: int
    weight_bytes: float
    kv_bytes_per_token: float
    kv_bytes_per_user: float     # at `context`
    kv_bytes_total: float        # batch x per user
    memory_bytes: float          # the budget: GPU memory
    memory_needed_bytes: float   # weights + KV of the whole batch
    fits: bool
    users_that_fit: int          # at `context`
    prefill_flops: float         # the whole batch's prompts
    prefill_ms: float
    ttft_ms: float               # prefill + first decode step
    request_ms: float            # prefill + output_tokens decode steps
    decode_step_ms: float        # at `context`, with the efficiencies
    decode_memory_ms: float      # bytes / (bandwidth x bw_eff)
    decode_compute_ms: float     # FLOPs / (peak x flops_eff)
    decode_bound: str            # "memory" or "compute"
    ceiling_step_ms: float       # the same step at 100% of peak
    ceiling_tok_s_per_user: float
    per_user_tok_s: float
    total_tok_s: float
    cost_per_million_tokens: float   # $ per 1M output tokens
    prefill_intensity: float     # FLOPs per byte moved
    decode_intensity: float
    ridge_point: float           # FLOPs per byte where the roofline bends
    decode_flops_utilization: float  # share of peak FLOP/s a decode step uses

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _memory_fields(spec: ModelSpec, gpu: GPUSpec, cm: CostModel, batch: int, context: int,
                   weight_dtype: str, kv_dtype: str, memory_fraction: float) -> dict[str, Any]:
    per_user = cm.kv_bytes_per_token * context
    budget = gpu_memory_bytes(gpu, memory_fraction)
    needed = cm.weight_bytes + batch * per_user
    return dict(
        params=param_counts(spec).total, weight_bytes=cm.weight_bytes,
        kv_bytes_per_token=cm.kv_bytes_per_token, kv_bytes_per_user=per_user,
        kv_bytes_total=batch * per_user, memory_bytes=budget, memory_needed_bytes=needed,
        fits=needed <= budget,
        users_that_fit=users_that_fit(spec, gpu, context, weight_dtype, kv_dtype, memory_fraction),
    )


def _request_fields(cm: CostModel, batch: int, prompt: int, output: int) -> dict[str, Any]:
    """Prefill of the batch's prompts, then `output` decode steps at the mean context."""
    prefill = cm.prefill_seconds([prompt] * batch)
    first_step = cm.decode_seconds(batch, batch * (prompt + 1))
    mean_context = prompt + (output + 1) / 2
    decode_total = output * cm.decode_seconds(batch, round(batch * mean_context))
    return dict(prefill_flops=cm.prefill_step_flops([prompt] * batch), prefill_ms=prefill * 1e3,
                ttft_ms=(prefill + first_step) * 1e3 if output else prefill * 1e3,
                request_ms=(prefill + decode_total) * 1e3)


def _decode_fields(cm: CostModel, batch: int, context: int, dollars_per_hour: float) -> dict[str, Any]:
    kv_tokens = batch * context
    step = cm.decode_seconds(batch, kv_tokens)
    memory = cm.memory_seconds(cm.decode_bytes(kv_tokens))
    compute = cm.compute_seconds(cm.decode_step_flops(batch, kv_tokens))
    ceiling = cm.ideal().decode_seconds(batch, kv_tokens)
    return dict(
        decode_step_ms=step * 1e3, decode_memory_ms=memory * 1e3, decode_compute_ms=compute * 1e3,
        decode_bound="memory" if memory >= compute else "compute",
        ceiling_step_ms=ceiling * 1e3, ceiling_tok_s_per_user=1 / ceiling,
        per_user_tok_s=1 / step, total_tok_s=batch / step,
        cost_per_million_tokens=dollars_per_hour / 3600 * step / batch * 1e6,
        decode_flops_utilization=cm.decode_step_flops(batch, kv_tokens) / step / cm.peak_flops,
    )


def _intensity_fields(cm: CostModel, batch: int, context: int, prompt: int) -> dict[str, Any]:
    prefill_bytes = cm.weight_bytes + batch * prompt * cm.kv_bytes_per_token
    kv_tokens = batch * context
    return dict(
        prefill_intensity=cm.prefill_step_flops([prompt] * batch) / prefill_bytes,
        decode_intensity=cm.decode_step_flops(batch, kv_tokens) / cm.decode_bytes(kv_tokens),
        ridge_point=cm.peak_flops / cm.bandwidth,
    )


def project(spec: ModelSpec, gpu: GPUSpec, weight_dtype: str = "bf16", kv_dtype: str = "bf16",
            batch: int = 1, context: int = 1024, prompt_tokens: int | None = None,
            output_tokens: int = 128, flops_efficiency: float = DEFAULT_FLOPS_EFFICIENCY,
            bandwidth_efficiency: float = DEFAULT_BANDWIDTH_EFFICIENCY,
            dollars_per_hour: float = DEFAULT_DOLLARS_PER_HOUR, memory_fraction: float = 1.0) -> Projection:
    """Project memory, speed and cost. `prompt_tokens` defaults to `context`."""
    if batch < 1 or context < 1 or output_tokens < 0:
        raise ValueError("batch and context must be >= 1, output tokens >= 0")
    prompt = context if prompt_tokens is None else int(prompt_tokens)
    cm = cost_model(spec, gpu, weight_dtype, kv_dtype, flops_efficiency, bandwidth_efficiency)
    return Projection(
        model=spec.name, gpu=gpu.name, weight_dtype=weight_dtype, kv_dtype=kv_dtype, batch=batch,
        context=context, prompt_tokens=prompt, output_tokens=output_tokens,
        flops_efficiency=flops_efficiency, bandwidth_efficiency=bandwidth_efficiency,
        dollars_per_hour=dollars_per_hour,
        **_memory_fields(spec, gpu, cm, batch, context, weight_dtype, kv_dtype, memory_fraction),
        **_request_fields(cm, batch, prompt, output_tokens),
        **_decode_fields(cm, batch, context, dollars_per_hour),
        **_intensity_fields(cm, batch, context, prompt),
    )


def sweep_batch(spec: ModelSpec, gpu: GPUSpec, batches: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256),
                **kwargs: Any) -> list[Projection]:
    """`project` at each batch size (same keyword arguments): for cost- and speed-vs-batch charts."""
    return [project(spec, gpu, batch=b, **kwargs) for b in batches]


@dataclass(frozen=True)
class RooflinePoint:
    intensity: float          # FLOPs per byte
    attainable_flops: float   # FLOP/s


def ridge_point(gpu: GPUSpec, weight_dtype: str = "bf16") -> float:
    """Arithmetic intensity (FLOPs/byte) above which a kernel is compute-bound."""
    return peak_flops(gpu, weight_dtype) / gpu.bandwidth_bytes_s


def attainable_flops(gpu: GPUSpec, intensity: float, weight_dtype: str = "bf16") -> float:
    """The roofline: min(peak FLOP/s, intensity x bandwidth)."""
    return min(peak_flops(gpu, weight_dtype), intensity * gpu.bandwidth_bytes_s)


def roofline(gpu: GPUSpec, weight_dtype: str = "bf16",
             intensities: Sequence[float] | None = None) -> list[RooflinePoint]:
    """Points of the roofline, by default 0.1 to 10^5 FLOPs/byte, 10 per decade, plus the ridge."""
    if intensities is None:
        grid = [10 ** (k / 10) for k in range(-10, 51)]
        intensities = sorted(grid + [ridge_point(gpu, weight_dtype)])
    return [RooflinePoint(i, attainable_flops(gpu, i, weight_dtype)) for i in intensities]
