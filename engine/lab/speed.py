"""The measured plane: experiments timed on this machine with the loaded model.

    point = measure_context(lm, 512)        # prefill of exactly 512 tokens, then a few decode steps
    roof = measure_roof(lm.device)          # peak bandwidth (copy benchmark) and FLOP/s of this device
    place = place_decode(lm, roof, point)   # the decode step on this device's roofline

Every figure here is timed, never derived from a table; `engine.projection` holds the analytic
plane, and `ceiling` applies its cost model to this device's measured peaks so the two can be
compared with a ratio.
"""
from __future__ import annotations

import math
import platform
import statistics
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Sequence

import numpy as np
import torch
from transformers import DynamicCache

from engine.projection.card import lm_head_params
from engine.errors import ContextLengthError, InvalidRequestError
from engine.core.generate import GenerationRequest, forward, generate, sync
from engine.core.hooks import CAPTURE_OFF, CapturePolicy
from engine.core.loader import LoadedModel
from engine.projection.cost import (CostModel, attention_flops_per_pair, decode_flops, linear_flops_per_token,
                                    prefill_flops)
from engine.core.records import DecodeRecord, PrefillRecord
from engine.projection.specs import GPU_PRESETS, GPUSpec

FILLER = (
    "Rivers carry water from the hills to the sea, and along the way they carve valleys, feed farms and "
    "give towns a reason to exist. Engineers measure their flow in cubic metres per second and plan bridges "
    "around the worst flood they expect in a century. "
)
DEFAULT_DECODE_STEPS = 4
COPY_BYTES = 256 * 2**20


# --- prompts of an exact length ---------------------------------------------------------------------

def prompt_of_length(lm: LoadedModel, n: int, text: str = FILLER) -> list[int]:
    """Exactly n token ids: the text's tokens repeated, then cut (no chat template)."""
    if n < 1:
        raise InvalidRequestError("the prompt needs at least one token")
    unit = lm.tokenizer(text, add_special_tokens=False)["input_ids"]
    if not unit:
        raise InvalidRequestError("the filler text has no tokens")
    return (unit * math.ceil(n / len(unit)))[:n]


def check_room(lm: LoadedModel, n: int, steps: int) -> None:
    limit = lm.spec.max_context
    if n + steps > limit:
        raise ContextLengthError(f"{n:,} prompt tokens + {steps} decode steps exceed the {limit:,}-token "
                                 f"context of {lm.label}; choose at most {limit - steps:,} tokens")


# --- timing prefill and decode -----------------------------------------------------------------------

@dataclass(frozen=True)
class DecodeTiming:
    """One prompt, prefilled once, then `len(steps)` greedy decode steps. Seconds."""

    prompt_tokens: int
    prefill: float               # forward over the prompt + choosing the first token: the TTFT
    steps: tuple[float, ...]     # each decode step: one token through the model

    @property
    def itl(self) -> float:
        """Inter-token latency: the median decode step (robust to a noisy neighbour)."""
        return statistics.median(self.steps) if self.steps else float("nan")

    @property
    def tokens_per_second(self) -> float:
        return 1.0 / self.itl if self.steps else float("nan")


def time_decode(lm: LoadedModel, ids: list[int], steps: int = DEFAULT_DECODE_STEPS) -> DecodeTiming:
    """Prefill `ids` and run `steps` greedy decode steps through `engine.core.generate.forward`, timing each."""
    check_room(lm, len(ids), steps)
    cache = DynamicCache(config=lm.model.config)
    with torch.inference_mode():
        t0 = time.perf_counter()
        logits = forward(lm, ids, cache)                      # logits: (V,)
        token = int(logits.argmax())
        sync(lm.device)
        prefill = time.perf_counter() - t0
        times = []
        for _ in range(steps):
            t = time.perf_counter()
            logits = forward(lm, [token], cache)
            token = int(logits.argmax())
            sync(lm.device)
            times.append(time.perf_counter() - t)
    return DecodeTiming(len(ids), prefill, tuple(times))


@dataclass(frozen=True)
class ContextPoint:
    """One point of the context sweep: the prompt length and what it cost."""

    tokens: int
    ttft: float                  # seconds
    itl: float                   # seconds per decode step at this context
    repeats: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def measure_context(lm: LoadedModel, n: int, steps: int = DEFAULT_DECODE_STEPS, repeats: int = 1) -> ContextPoint:
    """Prefill exactly n tokens and decode a few; with repeats, keep the fastest TTFT and median ITL."""
    ids = prompt_of_length(lm, n)
    runs = [time_decode(lm, ids, steps) for _ in range(max(1, repeats))]
    return ContextPoint(n, min(r.prefill for r in runs), _median_step(runs), len(runs))


def sweep_context(lm: LoadedModel, lengths: Sequence[int], steps: int = DEFAULT_DECODE_STEPS, rounds: int = 1,
                  progress: Callable[[float, str], None] | None = None) -> list[ContextPoint]:
    """Measure every length, the lengths interleaved round by round; per length the fastest prefill and the
    median decode step over all rounds."""
    runs: dict[int, list[DecodeTiming]] = {n: [] for n in lengths}
    total = max(1, rounds) * len(lengths)
    for r in range(max(1, rounds)):
        for i, n in enumerate(lengths):
            if progress:
                progress((r * len(lengths) + i) / total, f"prefill of {n:,} tokens")
            runs[n].append(time_decode(lm, prompt_of_length(lm, n), steps))
    return [ContextPoint(n, min(t.prefill for t in ts), _median_step(ts), len(ts)) for n, ts in runs.items()]


def _median_step(timings: Sequence[DecodeTiming]) -> float:
    steps = [s for t in timings for s in t.steps]
    return statistics.median(steps) if steps else float("nan")


# --- where attention's N^2 shows --------------------------------------------------------------------

def attention_share(spec, n: int) -> float:
    """Share of a causal prefill's FLOPs spent scoring (query, key) pairs: grows from ~0 towards 1."""
    pairs = n * (n + 1) / 2 * attention_flops_per_pair(spec)
    return pairs / prefill_flops(spec, n)


def attention_onset(spec, share: float = 0.1) -> int:
    """Smallest prompt length whose prefill spends at least `share` of its FLOPs in attention.

    share(N) = a(N+1)/2 / (l + a(N+1)/2) with l linear FLOPs per token (the LM head, run once per
    prompt, left out), a per pair, so N = 2 x share / (1 - share) x l / a - 1; then a step or two
    corrects for the one LM head pass.
    """
    if not 0 < share < 1:
        raise ValueError("share must be between 0 and 1")
    ratio = (linear_flops_per_token(spec) - 2 * lm_head_params(spec)) / attention_flops_per_pair(spec)
    n = max(1, math.ceil(2 * share / (1 - share) * ratio - 1))
    while n > 1 and attention_share(spec, n - 1) >= share:
        n -= 1
    while attention_share(spec, n) < share:
        n += 1
    return n


@dataclass(frozen=True)
class CurveFit:
    """TTFT ~ a + b N + c N^2 fitted to measured points (least squares)."""

    a: float
    b: float
    c: float
    onset: int | None            # N where c N^2 reaches `share` of (b N + c N^2); None if no N^2 term shows

    def predict(self, n: float) -> float:
        return self.a + self.b * n + self.c * n * n


def fit_ttft(points: Sequence[ContextPoint], share: float = 0.1) -> CurveFit | None:
    """Fit the measured TTFT curve; None with fewer than 4 distinct lengths.

    The quadratic term is kept only when it stands out of the noise: its share of the curve at the
    longest length must exceed both twice its standard error and a relative floor of 1e-9 (exact
    linear data would otherwise get a c of either sign at rounding level). Otherwise c is 0 and the
    line is refitted, so the same points always give the same answer.
    """
    by_n = {p.tokens: p.ttft for p in points}
    if len(by_n) < 4:
        return None
    n = np.array(sorted(by_n), dtype=np.float64)
    y = np.array([by_n[int(k)] for k in n], dtype=np.float64)
    scale = float(n.max())
    x = n / scale                                                        # (P,) in (0, 1]
    quad = np.stack([np.ones_like(x), x, x * x], axis=1)                 # (P, 3)
    coef, noise = _least_squares(quad, y)
    if abs(coef[2]) <= max(2 * noise[2], 1e-9 * float(np.abs(y).max())):
        coef, _ = _least_squares(quad[:, :2], y)
        coef = np.append(coef, 0.0)
    a, b, c = float(coef[0]), float(coef[1]) / scale, float(coef[2]) / scale**2
    onset = max(1, round(share / (1 - share) * b / c)) if c > 0 and b > 0 else None
    return CurveFit(a, b, c, onset)


def _least_squares(basis: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Coefficients of basis (P, K) @ coef ~ y through a QR solve, and each one's standard error."""
    q, r = np.linalg.qr(basis)
    coef = np.linalg.solve(r, q.T @ y)
    dof = len(y) - basis.shape[1]
    if dof <= 0:
        return coef, np.zeros_like(coef)
    sigma2 = float(np.sum((basis @ coef - y) ** 2)) / dof
    r_inv = np.linalg.inv(r)
    return coef, np.sqrt(sigma2 * np.sum(r_inv * r_inv, axis=1))


# --- this device's peaks ------------------------------------------------------------------------------

@dataclass(frozen=True)
class DeviceRoof:
    """Peak memory bandwidth and FLOP/s of the device the model runs on."""

    name: str
    bandwidth: float             # bytes/s
    peak_flops: float            # FLOP/s in the model's precision
    source: str                  # "measured" or "spec sheet"

    @property
    def ridge_point(self) -> float:
        return self.peak_flops / self.bandwidth

    def attainable(self, intensity: float) -> float:
        return min(self.peak_flops, intensity * self.bandwidth)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def copy_bandwidth(nbytes: int = COPY_BYTES, repeats: int = 5, device: torch.device | str = "cpu") -> float:
    """Bytes/s of the best of `repeats` tensor copies (each copy reads n bytes and writes n bytes)."""
    dev = torch.device(device)
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats + 1):                                       # the first copy also faults pages in
        sync(dev)
        t = time.perf_counter()
        dst.copy_(src)
        sync(dev)
        best = min(best, time.perf_counter() - t)
    return 2 * src.numel() * 4 / best


def matmul_flops(size: int = 2048, repeats: int = 5, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32) -> float:
    """FLOP/s of the best of `repeats` square matmuls (2 size^3 FLOPs each)."""
    dev = torch.device(device)
    a = torch.randn(size, size, device=dev, dtype=dtype)
    b = torch.randn(size, size, device=dev, dtype=dtype)
    best = float("inf")
    with torch.inference_mode():
        for _ in range(repeats + 1):
            sync(dev)
            t = time.perf_counter()
            torch.mm(a, b)
            sync(dev)
            best = min(best, time.perf_counter() - t)
    return 2 * size**3 / best


def known_gpu(device_name: str) -> GPUSpec | None:
    """The spec-sheet entry for a CUDA device name such as 'NVIDIA H100 80GB HBM3'."""
    name = device_name.lower()
    checks = [("h200", "h200"), ("b200", "b200"), ("a100", "a100-80gb"), ("l40s", "l40s"),
              ("4090", "rtx-4090"), ("h100 pcie", "h100-pcie"), ("h100", "h100-sxm")]
    for needle, key in checks:
        if needle in name:
            return GPU_PRESETS[key]
    return None


def measure_roof(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> DeviceRoof:
    """A known GPU: its spec sheet. Anything else: a copy benchmark and a matmul benchmark, run here."""
    dev = torch.device(device)
    if dev.type == "cuda":
        gpu = known_gpu(torch.cuda.get_device_name(dev))
        if gpu is not None:
            flops = gpu.bf16_tflops * 1e12 / (2 if dtype == torch.float32 else 1)
            return DeviceRoof(gpu.name, gpu.bandwidth_bytes_s, flops, "spec sheet")
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else cpu_name()
    return DeviceRoof(name, copy_bandwidth(device=dev), matmul_flops(device=dev, dtype=dtype), "measured")


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "this CPU"


# --- the decode step on the roofline, and the ceiling for this device -------------------------------

def weight_bytes_read(lm: LoadedModel) -> int:
    """Bytes of weights one decode step reads: every parameter once (tied embeddings counted once)."""
    return lm.weight_bytes


def kv_bytes_per_token_loaded(lm: LoadedModel) -> float:
    spec = lm.spec
    return 2 * spec.n_layers * spec.n_kv_heads * spec.head_dim * lm.dtype.itemsize


def device_cost_model(lm: LoadedModel, roof: DeviceRoof) -> CostModel:
    """The projection's time model with this device's peaks and the loaded weights, at 100% efficiency."""
    return CostModel(weight_bytes=weight_bytes_read(lm), kv_bytes_per_token=kv_bytes_per_token_loaded(lm),
                     linear_flops_per_token=linear_flops_per_token(lm.spec),
                     attention_flops_per_pair=attention_flops_per_pair(lm.spec),
                     lm_head_flops=2.0 * lm_head_params(lm.spec),   # prefill runs it on the last position only
                     peak_flops=roof.peak_flops, bandwidth=roof.bandwidth,
                     flops_efficiency=1.0, bandwidth_efficiency=1.0)


@dataclass(frozen=True)
class DecodePlacement:
    """A measured decode step against this device's roofline and the projected ceiling."""

    context: int                 # cached tokens the step attended to
    step_seconds: float          # measured
    bytes_read: float            # weights + KV read by the step
    flops: float
    effective_bandwidth: float   # bytes_read / step_seconds
    achieved_flops: float        # flops / step_seconds
    intensity: float             # FLOPs per byte
    bandwidth_share: float       # effective / peak bandwidth
    ceiling_step_seconds: float  # the projection for this device at 100% of its peaks
    ratio: float                 # measured tok/s / ceiling tok/s

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def place_decode(lm: LoadedModel, roof: DeviceRoof, step_seconds: float, context: int) -> DecodePlacement:
    """Put one measured decode step (at `context` cached tokens) on the roofline."""
    cm = device_cost_model(lm, roof)
    nbytes = cm.decode_bytes(context)
    flops = decode_flops(lm.spec, context)
    ceiling = cm.decode_seconds(1, context)
    return DecodePlacement(context, step_seconds, nbytes, flops, nbytes / step_seconds, flops / step_seconds,
                           flops / nbytes, nbytes / step_seconds / roof.bandwidth, ceiling,
                           ceiling / step_seconds)


def ceiling_prefill_seconds(lm: LoadedModel, roof: DeviceRoof, tokens: int) -> float:
    """The fastest this device could prefill `tokens` (its measured peaks, the projection's formula)."""
    return device_cost_model(lm, roof).prefill_seconds([tokens])


def compare_decode(models: Sequence[LoadedModel], ids: list[int], steps: int = 8, rounds: int = 3,
                   progress: Callable[[float, str], None] | None = None) -> list[DecodeTiming]:
    """Time several models on the same prompt, interleaved round by round so a noisy neighbour hits all
    alike; per model, the decode steps of all rounds and the fastest prefill."""
    runs: list[list[DecodeTiming]] = [[] for _ in models]
    for r in range(rounds):
        for i, lm in enumerate(models):
            if progress:
                progress((r * len(models) + i) / (rounds * len(models)), f"round {r + 1}: {lm.label}")
            runs[i].append(time_decode(lm, ids, steps))
    return [DecodeTiming(len(ids), min(t.prefill for t in ts), tuple(s for t in ts for s in t.steps))
            for ts in runs]


# --- the observer effect -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ObserverEffect:
    """The same request decoded with capture off and with a capture policy, interleaved (measured)."""

    off: DecodeTiming
    on: DecodeTiming
    same_tokens: bool            # capturing changed nothing in the answer
    rounds: tuple[tuple[float, float], ...] = ()     # each round's median step (off, on), seconds

    @property
    def ratio(self) -> float:
        """How much longer a decode step takes while its internals are captured."""
        return self.on.itl / self.off.itl

    @property
    def noise(self) -> float:
        """How far apart the rounds of one setting came out (the larger spread, off or on), seconds: a difference
        between off and on no larger than this is not told apart from the machine's own variation."""
        if len(self.rounds) < 2:
            return 0.0
        return max(max(r[i] for r in self.rounds) - min(r[i] for r in self.rounds) for i in (0, 1))

    @property
    def within_noise(self) -> bool:
        return abs(self.on.itl - self.off.itl) <= self.noise


def observer_effect(lm: LoadedModel, request: GenerationRequest, policy: CapturePolicy, rounds: int = 3,
                    progress: Callable[[float, str], None] | None = None) -> ObserverEffect:
    """Run `request` greedily with capture off and with `policy`, `rounds` times each, alternating.

    Each run goes through `engine.core.generate` (the page's path without the page): its decode records'
    seconds are the steps timed. Medians of all rounds' steps; the fastest prefill.
    """
    request = replace(request, temperature=0.0)
    runs: dict[str, list] = {"off": [], "on": []}
    tokens: dict[str, list[int]] = {}
    for r in range(rounds):
        for name, p in (("off", CAPTURE_OFF), ("on", policy)):
            if progress:
                progress((2 * r + (name == "on")) / (2 * rounds), f"round {r + 1} of {rounds}: capture {name}")
            records = list(generate(lm, request, p))
            prefill = next(x for x in records if isinstance(x, PrefillRecord))
            steps = [x for x in records if isinstance(x, DecodeRecord)]
            runs[name].append(DecodeTiming(len(prefill.prompt), prefill.seconds, tuple(x.seconds for x in steps)))
            tokens[name] = [prefill.token.id] + [x.token.id for x in steps]
    merged = {name: DecodeTiming(ts[0].prompt_tokens, min(t.prefill for t in ts),
                                 tuple(s for t in ts for s in t.steps)) for name, ts in runs.items()}
    per_round = tuple((off.itl, on.itl) for off, on in zip(runs["off"], runs["on"]))
    return ObserverEffect(merged["off"], merged["on"], tokens["off"] == tokens["on"], per_round)
