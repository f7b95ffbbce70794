"""A discrete-event simulation of one serving engine on projected hardware.

Time comes from `engine.projection.CostModel`: a decode step over a batch of b requests holding K
cached tokens in all costs max((weights + K x KV bytes) / bandwidth, FLOPs / peak); a prefill of new
prompts costs its FLOPs (or its weight read, for short prompts). Requests arrive as a seeded
Poisson process with random prompt and output lengths.

- static batching: when the GPU is idle, take up to `max_batch` waiting requests, prefill them,
  and decode until the longest is done; finished ones stay in the batch (padding) until then.
- continuous batching: the batch is rebuilt before every decode step: finished requests leave,
  waiting ones are prefilled and join (prefill stalls that step, as without chunked prefill).

KV memory is paged (blocks of `block_size` tokens). A request is admitted only when blocks for its
prompt plus its full output are free, so nothing is ever preempted. Each output token costs one
decode step (first token = end of the first decode step after its prefill: one step more than the
projection's TTFT, which is queueing + prefill).
"""
from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Sequence

from engine.projection import (DEFAULT_BANDWIDTH_EFFICIENCY, DEFAULT_DOLLARS_PER_HOUR,
                               DEFAULT_FLOPS_EFFICIENCY, CostModel, cost_model, gpu_memory_bytes)
from engine.specs import GPUSpec, ModelSpec

MAX_SERIES_POINTS = 2000


@dataclass(frozen=True)
class Workload:
    n_requests: int = 500
    arrival_rate: float = 20.0      # requests per second (Poisson); math.inf: all at t = 0
    prompt_min: int = 64
    prompt_max: int = 1024
    output_min: int = 16
    output_max: int = 512
    distribution: str = "uniform"   # or "lognormal" (median at the geometric mean, clipped)
    seed: int = 0


@dataclass(frozen=True)
class ServerConfig:
    policy: str = "continuous"      # or "static"
    max_batch: int = 64
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    block_size: int = 16
    flops_efficiency: float = DEFAULT_FLOPS_EFFICIENCY
    bandwidth_efficiency: float = DEFAULT_BANDWIDTH_EFFICIENCY
    dollars_per_hour: float = DEFAULT_DOLLARS_PER_HOUR
    memory_fraction: float = 1.0    # share of GPU memory for weights + KV


@dataclass(frozen=True)
class SimRequest:
    rid: int
    arrival: float        # seconds
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class RequestRecord:
    rid: int
    arrival: float
    start: float          # admitted (prefill begins)
    first_token: float
    finish: float
    prompt_tokens: int
    output_tokens: int
    tokens: int           # tokens generated (equals output_tokens)

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def latency(self) -> float:
        return self.finish - self.arrival

    @property
    def tok_s(self) -> float:
        """This user's decode speed after the first token."""
        span = self.finish - self.first_token
        return (self.tokens - 1) / span if self.tokens > 1 and span > 0 else 0.0


@dataclass(frozen=True)
class SeriesPoint:
    time: float           # seconds, end of a decode step
    batch: int            # requests in that step
    kv_tokens: int        # tokens cached
    kv_reserved_tokens: int   # tokens held by allocated blocks


@dataclass(frozen=True)
class SimResult:
    policy: str
    max_batch: int
    records: list[RequestRecord]
    series: list[SeriesPoint]     # thinned to at most MAX_SERIES_POINTS
    duration: float               # first arrival to last finish, seconds
    busy_seconds: float
    total_tokens: int
    decode_steps: int
    throughput_tok_s: float
    per_user_tok_s: float         # median over requests
    ttft_p50: float
    ttft_p95: float
    latency_p50: float
    latency_p95: float
    busy_fraction: float
    mean_batch: float             # requests per decode step
    cost_per_million_tokens: float
    kv_capacity_tokens: int

    def summary(self) -> dict[str, Any]:
        """Scalar results only (no records or series)."""
        return {k: v for k, v in asdict(self).items() if k not in ("records", "series")}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _draw_length(rng: random.Random, lo: int, hi: int, distribution: str) -> int:
    if distribution == "uniform":
        return rng.randint(lo, hi)
    if distribution == "lognormal":
        mu, sigma = math.log(math.sqrt(lo * hi)), math.log(hi / lo) / 4
        return min(hi, max(lo, round(rng.lognormvariate(mu, sigma))))
    raise ValueError(f"unknown length distribution {distribution!r}; use 'uniform' or 'lognormal'")


def make_requests(workload: Workload) -> list[SimRequest]:
    """Seeded Poisson arrivals with random prompt and output lengths."""
    rng = random.Random(workload.seed)
    t, out = 0.0, []
    for rid in range(workload.n_requests):
        if not math.isinf(workload.arrival_rate):
            t += rng.expovariate(workload.arrival_rate)
        prompt = _draw_length(rng, workload.prompt_min, workload.prompt_max, workload.distribution)
        output = _draw_length(rng, workload.output_min, workload.output_max, workload.distribution)
        out.append(SimRequest(rid, t, prompt, max(1, output)))
    return out


@dataclass(eq=False)
class _Live:
    req: SimRequest
    start: float
    blocks: int
    output: int               # tokens to generate (copied from req for the hot loop)
    generated: int = 0
    first_token: float = -1.0

    @property
    def length(self) -> int:
        return self.req.prompt_tokens + self.generated


@dataclass
class _State:
    cost: CostModel
    free_blocks: int
    pending: deque            # SimRequest, not yet arrived
    clock: float = 0.0
    busy: float = 0.0
    steps: int = 0
    kv_tokens: int = 0        # tokens cached by the running requests
    reserved_blocks: int = 0  # blocks held by the running requests
    waiting: deque = field(default_factory=deque)
    running: list = field(default_factory=list)
    records: list = field(default_factory=list)
    series: list = field(default_factory=list)    # (time, batch, kv tokens, reserved tokens)


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def _arrive(state: _State) -> None:
    while state.pending and state.pending[0].arrival <= state.clock:
        state.waiting.append(state.pending.popleft())


def _idle_until_arrival(state: _State) -> None:
    state.clock = max(state.clock, state.pending[0].arrival)
    _arrive(state)


def _spend(state: _State, seconds: float) -> None:
    state.clock += seconds
    state.busy += seconds


def _admit_and_prefill(state: _State, server: ServerConfig) -> None:
    """FIFO admission while the batch has room and the head request's blocks are free."""
    new: list[int] = []
    while state.waiting and len(state.running) < server.max_batch:
        req = state.waiting[0]
        need = _blocks(req.prompt_tokens + req.output_tokens, server.block_size)
        if need > state.free_blocks:
            break
        state.waiting.popleft()
        state.free_blocks -= need
        state.reserved_blocks += need
        state.kv_tokens += req.prompt_tokens
        state.running.append(_Live(req, state.clock, need, req.output_tokens))
        new.append(req.prompt_tokens)
    if new:
        _spend(state, state.cost.prefill_seconds(new))


def _decode_step(state: _State, block_size: int) -> list[_Live]:
    """One token for every unfinished request in the batch (finished ones only pad it).
    Returns the requests that finished in this step."""
    _spend(state, state.cost.decode_seconds(len(state.running), state.kv_tokens))
    state.steps += 1
    finished, grown = [], 0
    for live in state.running:
        if live.generated < live.output:
            live.generated += 1
            grown += 1
            if live.generated == 1:
                live.first_token = state.clock
            if live.generated == live.output:
                finished.append(live)
    state.kv_tokens += grown
    state.series.append((state.clock, len(state.running), state.kv_tokens, state.reserved_blocks * block_size))
    return finished


def _release(state: _State, finished: list[_Live]) -> None:
    for live in finished:
        state.free_blocks += live.blocks
        state.reserved_blocks -= live.blocks
        state.kv_tokens -= live.length
        state.records.append(RequestRecord(live.req.rid, live.req.arrival, live.start, live.first_token,
                                           state.clock, live.req.prompt_tokens, live.req.output_tokens,
                                           live.generated))
    gone = {id(r) for r in finished}
    state.running = [r for r in state.running if id(r) not in gone]


def _run_continuous(state: _State, server: ServerConfig) -> None:
    while state.pending or state.waiting or state.running:
        _arrive(state)
        if not state.running and not state.waiting:
            _idle_until_arrival(state)
        _admit_and_prefill(state, server)
        finished = _decode_step(state, server.block_size)
        if finished:
            _release(state, finished)


def _run_static(state: _State, server: ServerConfig) -> None:
    while state.pending or state.waiting:
        _arrive(state)
        if not state.waiting:
            _idle_until_arrival(state)
        _admit_and_prefill(state, server)
        batch, done = list(state.running), 0
        while done < len(batch):
            done += len(_decode_step(state, server.block_size))
        _release(state, batch)


def kv_capacity_blocks(spec: ModelSpec, gpu: GPUSpec, server: ServerConfig, cost: CostModel) -> int:
    """Blocks of KV that fit in GPU memory beside the weights."""
    free = gpu_memory_bytes(gpu, server.memory_fraction) - cost.weight_bytes
    blocks = math.floor(free / (cost.kv_bytes_per_token * server.block_size))
    if blocks <= 0:
        raise ValueError(f"the weights of {spec.name} ({cost.weight_bytes / 1e9:.1f} GB) leave no room "
                         f"for a KV cache on {gpu.name}")
    return blocks


def _percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    xs = sorted(values)
    if not xs:
        return 0.0
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _thin(series: list[tuple], limit: int = MAX_SERIES_POINTS) -> list[SeriesPoint]:
    """Every k-th step (and the last) so a chart gets at most `limit` points."""
    stride = max(1, math.ceil(len(series) / limit))
    picked = series[::stride] + (series[-1:] if (len(series) - 1) % stride else [])
    return [SeriesPoint(*point) for point in picked]


def _result(state: _State, server: ServerConfig, capacity_tokens: int) -> SimResult:
    records = sorted(state.records, key=lambda r: r.rid)
    start = min((r.arrival for r in records), default=0.0)
    duration = max(state.clock - start, 1e-12)
    tokens = sum(r.tokens for r in records)
    return SimResult(
        policy=server.policy, max_batch=server.max_batch, records=records, series=_thin(state.series),
        duration=duration, busy_seconds=state.busy, total_tokens=tokens, decode_steps=state.steps,
        throughput_tok_s=tokens / duration, per_user_tok_s=_percentile([r.tok_s for r in records], 50),
        ttft_p50=_percentile([r.ttft for r in records], 50), ttft_p95=_percentile([r.ttft for r in records], 95),
        latency_p50=_percentile([r.latency for r in records], 50),
        latency_p95=_percentile([r.latency for r in records], 95),
        busy_fraction=state.busy / duration,
        mean_batch=sum(p[1] for p in state.series) / max(1, len(state.series)),
        cost_per_million_tokens=server.dollars_per_hour * duration / 3600 / max(tokens, 1) * 1e6,
        kv_capacity_tokens=capacity_tokens,
    )


def simulate(spec: ModelSpec, gpu: GPUSpec, workload: Workload = Workload(),
             server: ServerConfig = ServerConfig(), requests: list[SimRequest] | None = None) -> SimResult:
    """Serve every request of the workload (or of `requests`) to completion."""
    if server.policy not in ("static", "continuous"):
        raise ValueError(f"unknown batching policy {server.policy!r}; use 'static' or 'continuous'")
    if server.max_batch < 1:
        raise ValueError("max_batch must be at least 1")
    cost = cost_model(spec, gpu, server.weight_dtype, server.kv_dtype,
                      server.flops_efficiency, server.bandwidth_efficiency)
    capacity = kv_capacity_blocks(spec, gpu, server, cost)
    requests = make_requests(workload) if requests is None else requests
    if any(_blocks(r.prompt_tokens + r.output_tokens, server.block_size) > capacity for r in requests):
        raise ValueError("a request's prompt plus output does not fit in the KV memory on its own")
    state = _State(cost, capacity, deque(sorted(requests, key=lambda r: r.arrival)))
    (_run_static if server.policy == "static" else _run_continuous)(state, server)
    return _result(state, server, capacity * server.block_size)


@dataclass(frozen=True)
class SweepRow:
    max_batch: int
    throughput_tok_s: float
    per_user_tok_s: float
    mean_batch: float
    ttft_p50: float
    latency_p50: float
    latency_p95: float
    cost_per_million_tokens: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def sweep_max_batch(spec: ModelSpec, gpu: GPUSpec, workload: Workload = Workload(),
                    server: ServerConfig = ServerConfig(),
                    batches: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256)) -> list[SweepRow]:
    """Throughput, per-user speed, latency and cost as the batch limit grows (same requests each time)."""
    requests = make_requests(workload)
    rows = []
    for b in batches:
        res = simulate(spec, gpu, workload, replace(server, max_batch=b), requests)
        rows.append(SweepRow(b, res.throughput_tok_s, res.per_user_tok_s, res.mean_batch, res.ttft_p50,
                             res.latency_p50, res.latency_p95, res.cost_per_million_tokens))
    return rows
