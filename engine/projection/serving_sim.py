"""A discrete-event simulation of a serving engine on projected hardware.

Time comes from `engine.projection.cost.CostModel`: a decode step over a batch of b requests holding K
cached tokens in all costs max((weights + K x KV bytes) / bandwidth, FLOPs / peak); a prefill of new
prompts costs its FLOPs (or its weight read, for short prompts); a step mixing decodes with prompt
chunks costs the one forward pass over all their tokens. Requests arrive as a seeded Poisson process
with random prompt and output lengths.

Policies (the GPUs of a colocated server each run one of the first three on their own share of the
requests, dealt round-robin in order of arrival):

- static: when the GPU is idle, take up to `max_batch` waiting requests, prefill them, and decode until
  the longest is done; finished ones stay in the batch (padding) until then.
- continuous: the batch is rebuilt before every decode step: finished requests leave, waiting ones
  are prefilled and join. Their prefill is a pass of its own, so everyone already decoding waits for
  it (a long prompt stalls the others' next token).
- chunked: chunked prefill. Every step is one forward pass of at most `token_budget` tokens: one for
  each request decoding, and the rest filled with chunks of the prompts being read, oldest first.
  A long prompt is spread over several steps, and the others keep getting a token every step.
- disaggregated: prefill/decode disaggregation. `prefill_gpus` GPUs only read prompts (several at
  once, within `token_budget` tokens; their memory is not limited here); the K/V of a prompt then
  travels to one of `decode_gpus` GPUs (`kv_link_gbs` one way, plus a fixed 10 µs), which only
  decode, with continuous batching.

KV memory on a decoding GPU is paged (blocks of `block_size` tokens). A request is admitted only
when blocks for its prompt plus its full output are free, so nothing is ever preempted. The prefill
pass yields the first token (TTFT = queueing + prefill, as the projection, vLLM and DistServe count
it); each further token costs one decode step. Goodput counts the requests served within their
latency targets (TTFT, and the mean gap between their tokens) per second.
"""
from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Sequence

from engine.projection.cost import (COLLECTIVE_LATENCY_S, DEFAULT_BANDWIDTH_EFFICIENCY, DEFAULT_DOLLARS_PER_HOUR,
                                    DEFAULT_FLOPS_EFFICIENCY, CostModel, cost_model, gpu_memory_bytes)
from engine.projection.specs import GPUSpec, ModelSpec

MAX_SERIES_POINTS = 2000
POLICIES = ("static", "continuous", "chunked", "disaggregated")


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
    policy: str = "continuous"      # one of POLICIES
    max_batch: int = 64             # requests at once on one GPU
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    block_size: int = 16
    flops_efficiency: float = DEFAULT_FLOPS_EFFICIENCY
    bandwidth_efficiency: float = DEFAULT_BANDWIDTH_EFFICIENCY
    dollars_per_hour: float = DEFAULT_DOLLARS_PER_HOUR    # per GPU
    memory_fraction: float = 1.0    # share of GPU memory for weights + KV
    token_budget: int = 512         # tokens in one forward pass: chunked prefill's step, a prefill GPU's batch
    gpus: int = 1                   # colocated policies: GPUs, each serving its share of the requests
    prefill_gpus: int = 1           # disaggregated: GPUs that only prefill
    decode_gpus: int = 1            # disaggregated: GPUs that only decode
    kv_link_gbs: float = 0.0        # disaggregated: GB/s one way for the K/V hand-off; 0: half the GPU's link

    @property
    def total_gpus(self) -> int:
        return self.prefill_gpus + self.decode_gpus if self.policy == "disaggregated" else self.gpus


@dataclass(frozen=True)
class Targets:
    """Latency targets a request must meet to count towards goodput."""

    ttft: float = 1.0               # seconds to the first token
    itl: float = 0.05               # seconds between tokens, on average over the request (time per output token)


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
    first_token: float    # the prefill's last pass ends
    finish: float         # released: its last token, or (static) the end of its batch
    prompt_tokens: int
    output_tokens: int
    tokens: int           # tokens generated (equals output_tokens)
    last_token: float = 0.0
    max_gap: float = 0.0  # the longest wait between two of its tokens

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def latency(self) -> float:
        return self.finish - self.arrival

    @property
    def itl(self) -> float:
        """Mean inter-token latency (time per output token after the first); 0 for a one-token answer."""
        return (self.last_token - self.first_token) / (self.tokens - 1) if self.tokens > 1 else 0.0

    @property
    def tok_s(self) -> float:
        """This user's decode speed after the first token."""
        return 1 / self.itl if self.itl > 0 else 0.0


@dataclass(frozen=True)
class SeriesPoint:
    time: float           # seconds, end of a step
    batch: int            # requests in that step
    kv_tokens: int        # tokens cached
    kv_reserved_tokens: int   # tokens held by allocated blocks


@dataclass(frozen=True)
class Goodput:
    """Requests served within both targets, and their output tokens, per second of the run."""

    requests: int
    tokens: int
    requests_per_s: float
    tokens_per_s: float
    share: float          # of all requests


@dataclass(frozen=True)
class SimResult:
    policy: str
    max_batch: int
    records: list[RequestRecord]
    series: list[SeriesPoint]     # the first decoding GPU's steps, thinned to at most MAX_SERIES_POINTS
    duration: float               # first arrival to last finish, seconds
    busy_seconds: float           # summed over GPUs
    total_tokens: int
    decode_steps: int             # forward passes that gave running requests a token, all GPUs
    throughput_tok_s: float
    per_user_tok_s: float         # median over requests
    ttft_p50: float
    ttft_p95: float
    itl_p50: float                # over every gap between two tokens of a request
    itl_p95: float
    itl_p99: float
    latency_p50: float
    latency_p95: float
    busy_fraction: float          # of duration x GPUs
    mean_batch: float             # requests per step
    cost_per_million_tokens: float
    kv_capacity_tokens: int       # per decoding GPU
    gpus: int
    targets: Targets
    goodput: Goodput
    kv_handoff_mean: float = 0.0  # disaggregated: seconds to move a prompt's K/V to a decode GPU, on average

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


# --- one GPU ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Job:
    """A request reaching one GPU: at its arrival, or (disaggregated) when its K/V has come from a prefill GPU."""

    ready: float
    req: SimRequest
    first_token: float = -1.0     # >= 0: prefilled elsewhere, first token already out
    start: float = -1.0           # >= 0: when that prefill began


@dataclass(eq=False)
class _Live:
    req: SimRequest
    start: float
    blocks: int
    output: int               # tokens to generate (copied from req for the hot loop)
    prefilled: int = 0        # prompt tokens whose K/V is cached
    generated: int = 0
    first_token: float = -1.0
    last_token: float = -1.0
    max_gap: float = 0.0

    @property
    def kv(self) -> int:
        """Cached tokens: the prompt read so far, then each generated token once it is fed back."""
        return self.prefilled + max(self.generated - 1, 0)


@dataclass
class _State:
    cost: CostModel
    free_blocks: int
    pending: deque            # _Job, not yet ready
    clock: float = 0.0
    busy: float = 0.0
    steps: int = 0
    kv_tokens: int = 0        # tokens cached by the running requests
    reserved_blocks: int = 0  # blocks held by the running requests
    waiting: deque = field(default_factory=deque)
    running: list = field(default_factory=list)
    reading: list = field(default_factory=list)   # running requests whose prompt is not fully read, oldest first
    records: list = field(default_factory=list)
    series: list = field(default_factory=list)    # (time, batch, kv tokens, reserved tokens)
    gaps: list = field(default_factory=list)      # seconds between two tokens of a request


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def _arrive(state: _State) -> None:
    while state.pending and state.pending[0].ready <= state.clock:
        state.waiting.append(state.pending.popleft())


def _idle_until_arrival(state: _State) -> None:
    state.clock = max(state.clock, state.pending[0].ready)
    _arrive(state)


def _spend(state: _State, seconds: float) -> None:
    state.clock += seconds
    state.busy += seconds


def _token(state: _State, live: _Live) -> None:
    """`live` gets its next token now."""
    if live.generated:
        gap = state.clock - live.last_token
        state.gaps.append(gap)
        live.max_gap = max(live.max_gap, gap)
    else:
        live.first_token = state.clock
    live.last_token = state.clock
    live.generated += 1


def _admit(state: _State, server: ServerConfig) -> int:
    """FIFO admission while the batch has room and the head request's blocks are free. A request prefilled
    on another GPU joins with its whole prompt cached and its first token out. Returns how many joined."""
    joined = len(state.running)
    while state.waiting and len(state.running) < server.max_batch:
        job = state.waiting[0]
        need = _blocks(job.req.prompt_tokens + job.req.output_tokens, server.block_size)
        if need > state.free_blocks:
            break
        state.waiting.popleft()
        state.free_blocks -= need
        state.reserved_blocks += need
        live = _Live(job.req, job.start if job.start >= 0 else state.clock, need, job.req.output_tokens)
        if job.first_token >= 0:
            live.prefilled, live.generated = job.req.prompt_tokens, 1
            live.first_token = live.last_token = job.first_token
            state.kv_tokens += live.prefilled
        else:
            state.reading.append(live)
        state.running.append(live)
    return len(state.running) - joined


def _prefill(state: _State) -> None:
    """One pass over every admitted prompt not read yet; each gets its first token at its end."""
    new, state.reading = state.reading, []
    if not new:                                  # joined already prefilled (disaggregated)
        return
    _spend(state, state.cost.prefill_seconds([live.req.prompt_tokens for live in new]))
    for live in new:
        state.kv_tokens += live.req.prompt_tokens
        live.prefilled = live.req.prompt_tokens
        _token(state, live)


def _log_step(state: _State, block_size: int) -> None:
    state.steps += 1
    state.series.append((state.clock, len(state.running), state.kv_tokens, state.reserved_blocks * block_size))


def _advance(state: _State) -> int:
    """Every request past its first token and not done gets its next token now (`_token` written out: this is
    the hot loop). Returns how many got their last one."""
    now, grown, done, gaps = state.clock, 0, 0, state.gaps
    for live in state.running:
        if 0 < live.generated < live.output:
            gap = now - live.last_token
            gaps.append(gap)
            if gap > live.max_gap:
                live.max_gap = gap
            live.last_token = now
            live.generated += 1
            grown += 1                           # the previous token's K/V is written as it is fed back
            done += live.generated == live.output
    state.kv_tokens += grown
    return done


def _decode_step(state: _State, block_size: int) -> int:
    """One token for every request still generating; finished ones (static batching) only pad the batch.
    Returns how many requests got their last token."""
    _spend(state, state.cost.decode_seconds(len(state.running), state.kv_tokens))
    done = _advance(state)
    _log_step(state, block_size)
    return done


def _plan_chunks(reading: list[_Live], budget: int) -> list[tuple[_Live, int]]:
    """Prompt chunks for one step, oldest admission first, within the tokens the decodes leave."""
    chunks = []
    for live in reading:
        if budget <= 0:
            break
        chunks.append((live, min(live.req.prompt_tokens - live.prefilled, budget)))
        budget -= chunks[-1][1]
    return chunks


def _mixed_step(state: _State, server: ServerConfig) -> int:
    """Chunked prefill: one pass with a token for every decoding request (all those running but the prompts
    still being read: finished ones leave after each step) and prompt chunks in the rest of the budget. A
    prompt's last chunk yields its first token. Returns how many requests got their last token."""
    decoding = len(state.running) - len(state.reading)
    chunks = _plan_chunks(state.reading, server.token_budget - decoding)
    parts = [(n, live.prefilled, live.prefilled + n == live.req.prompt_tokens) for live, n in chunks]
    decode_kv = state.kv_tokens - sum(live.prefilled for live in state.reading)
    _spend(state, state.cost.mixed_step_seconds(decoding, decode_kv, parts))
    done = _advance(state)
    for live, n in chunks:
        live.prefilled += n
        state.kv_tokens += n
        if live.prefilled == live.req.prompt_tokens:
            _token(state, live)
            done += live.generated == live.output
    state.reading = [live for live in state.reading if live.prefilled < live.req.prompt_tokens]
    _log_step(state, server.block_size)
    return done


def _release(state: _State, finished: list[_Live]) -> None:
    for live in finished:
        state.free_blocks += live.blocks
        state.reserved_blocks -= live.blocks
        state.kv_tokens -= live.kv
        state.records.append(RequestRecord(live.req.rid, live.req.arrival, live.start, live.first_token,
                                           state.clock, live.req.prompt_tokens, live.req.output_tokens,
                                           live.generated, live.last_token, live.max_gap))
    gone = {id(r) for r in finished}
    state.running = [r for r in state.running if id(r) not in gone]


def _release_finished(state: _State) -> None:
    finished = [live for live in state.running if live.generated >= live.output]
    if finished:
        _release(state, finished)


def _run_continuous(state: _State, server: ServerConfig) -> None:
    while state.pending or state.waiting or state.running:
        _arrive(state)
        if not state.running and not state.waiting:
            _idle_until_arrival(state)
        if _admit(state, server):
            _prefill(state)                      # everyone decoding waits for it
            _release_finished(state)             # one-token answers are done
        if state.running and _decode_step(state, server.block_size):
            _release_finished(state)


def _run_chunked(state: _State, server: ServerConfig) -> None:
    while state.pending or state.waiting or state.running:
        _arrive(state)
        if not state.running and not state.waiting:
            _idle_until_arrival(state)
        _admit(state, server)
        if _mixed_step(state, server):
            _release_finished(state)


def _run_static(state: _State, server: ServerConfig) -> None:
    while state.pending or state.waiting:
        _arrive(state)
        if not state.waiting:
            _idle_until_arrival(state)
        _admit(state, server)
        _prefill(state)
        left = sum(live.generated < live.output for live in state.running)
        while left:
            left -= _decode_step(state, server.block_size)
        _release(state, list(state.running))


RUNNERS = {"static": _run_static, "continuous": _run_continuous, "chunked": _run_chunked,
           "disaggregated": _run_continuous}


def _serve(jobs: list[_Job], cost: CostModel, capacity: int, server: ServerConfig) -> _State:
    """One GPU serving `jobs` to completion under the server's policy."""
    state = _State(cost, capacity, deque(sorted(jobs, key=lambda j: j.ready)))
    RUNNERS[server.policy](state, server)
    return state


# --- prefill GPUs and the K/V hand-off (disaggregated) ------------------------------------------------

def _prefill_gpu(requests: list[SimRequest], cost: CostModel, budget: int) -> tuple[list[tuple], float]:
    """A GPU that only prefills: when free, it reads every prompt that has arrived (oldest first, at least one,
    within `budget` tokens) in one pass. Returns (request, start, end) for each, and the busy seconds."""
    clock, busy, out, i = 0.0, 0.0, [], 0
    while i < len(requests):
        clock = max(clock, requests[i].arrival)
        group, tokens = [requests[i]], requests[i].prompt_tokens
        i += 1
        while i < len(requests) and requests[i].arrival <= clock and tokens + requests[i].prompt_tokens <= budget:
            group.append(requests[i])
            tokens += requests[i].prompt_tokens
            i += 1
        seconds = cost.prefill_seconds([r.prompt_tokens for r in group])
        out += [(r, clock, clock + seconds) for r in group]
        clock += seconds
        busy += seconds
    return out, busy


def kv_transfer_seconds(cost: CostModel, prompt_tokens: int, link_gbs: float) -> float:
    """Moving one prompt's K/V from a prefill GPU to a decode GPU: a fixed hand-off plus bytes over the link."""
    return COLLECTIVE_LATENCY_S + prompt_tokens * cost.kv_bytes_per_token / (link_gbs * 1e9)


def _link_gbs(gpu: GPUSpec, server: ServerConfig) -> float:
    """One direction of the link: the spec sheet's figure counts both directions."""
    return server.kv_link_gbs or gpu.interconnect_gbs / 2


def _deal(items: list, n: int) -> list[list]:
    """Round-robin: item i to GPU i mod n."""
    return [items[k::n] for k in range(n)]


def _disaggregated(requests: list[SimRequest], cost: CostModel, capacity: int, server: ServerConfig,
                   link_gbs: float) -> tuple[list[_State], float]:
    """Prefill GPUs read the prompts; each prompt's K/V then travels to a decode GPU, which only decodes.
    Returns the decode GPUs' states and the prefill GPUs' busy seconds."""
    prefilled, prefill_busy = [], 0.0
    for share in _deal(requests, server.prefill_gpus):
        done, busy = _prefill_gpu(share, cost, server.token_budget)
        prefilled += done
        prefill_busy += busy
    jobs = sorted((_Job(end + kv_transfer_seconds(cost, r.prompt_tokens, link_gbs), r, end, start)
                   for r, start, end in prefilled), key=lambda j: (j.ready, j.req.rid))
    return [_serve(share, cost, capacity, server) for share in _deal(jobs, server.decode_gpus)], prefill_busy


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


def goodput(records: Sequence[RequestRecord], duration: float, targets: Targets) -> Goodput:
    """Requests whose TTFT and mean inter-token latency are both within the targets, per second of the run."""
    met = [r for r in records if r.ttft <= targets.ttft and r.itl <= targets.itl]
    tokens = sum(r.tokens for r in met)
    return Goodput(len(met), tokens, len(met) / duration, tokens / duration, len(met) / max(1, len(records)))


def rescore(result: SimResult, targets: Targets) -> SimResult:
    """The same run against other targets (nothing is simulated again)."""
    return replace(result, targets=targets, goodput=goodput(result.records, result.duration, targets))


def _result(states: list[_State], server: ServerConfig, capacity_tokens: int, targets: Targets,
            extra_busy: float = 0.0, handoff: float = 0.0) -> SimResult:
    """Everything the GPUs did, as one server's results; `extra_busy`: prefill GPUs' seconds."""
    records = sorted((r for s in states for r in s.records), key=lambda r: r.rid)
    start = min((r.arrival for r in records), default=0.0)
    duration = max(max((r.finish for r in records), default=0.0) - start, 1e-12)
    tokens, gpus = sum(r.tokens for r in records), server.total_gpus
    busy = sum(s.busy for s in states) + extra_busy
    steps = [p for s in states for p in s.series]
    gaps = [g for s in states for g in s.gaps]
    ttfts, latencies = [r.ttft for r in records], [r.latency for r in records]
    return SimResult(
        policy=server.policy, max_batch=server.max_batch, records=records, series=_thin(states[0].series),
        duration=duration, busy_seconds=busy, total_tokens=tokens, decode_steps=len(steps),
        throughput_tok_s=tokens / duration, per_user_tok_s=_percentile([r.tok_s for r in records], 50),
        ttft_p50=_percentile(ttfts, 50), ttft_p95=_percentile(ttfts, 95),
        itl_p50=_percentile(gaps, 50), itl_p95=_percentile(gaps, 95), itl_p99=_percentile(gaps, 99),
        latency_p50=_percentile(latencies, 50), latency_p95=_percentile(latencies, 95),
        busy_fraction=busy / (duration * gpus), mean_batch=sum(p[1] for p in steps) / max(1, len(steps)),
        cost_per_million_tokens=server.dollars_per_hour * gpus * duration / 3600 / max(tokens, 1) * 1e6,
        kv_capacity_tokens=capacity_tokens, gpus=gpus, targets=targets,
        goodput=goodput(records, duration, targets), kv_handoff_mean=handoff,
    )


def check_server(server: ServerConfig) -> None:
    if server.policy not in POLICIES:
        raise ValueError(f"unknown batching policy {server.policy!r}; use one of {', '.join(POLICIES)}")
    if server.max_batch < 1 or server.token_budget < 1:
        raise ValueError("the batch limit and the tokens per step must be at least 1")
    if min(server.gpus, server.prefill_gpus, server.decode_gpus) < 1:
        raise ValueError("every pool needs at least one GPU")
    if server.kv_link_gbs < 0:
        raise ValueError("the K/V link's bandwidth cannot be negative")


def simulate(spec: ModelSpec, gpu: GPUSpec, workload: Workload = Workload(),
             server: ServerConfig = ServerConfig(), requests: list[SimRequest] | None = None,
             targets: Targets = Targets()) -> SimResult:
    """Serve every request of the workload (or of `requests`) to completion."""
    check_server(server)
    cost = cost_model(spec, gpu, server.weight_dtype, server.kv_dtype,
                      server.flops_efficiency, server.bandwidth_efficiency)
    capacity = kv_capacity_blocks(spec, gpu, server, cost)
    requests = sorted(make_requests(workload) if requests is None else requests, key=lambda r: (r.arrival, r.rid))
    if any(_blocks(r.prompt_tokens + r.output_tokens, server.block_size) > capacity for r in requests):
        raise ValueError("a request's prompt plus output does not fit in the KV memory on its own")
    handoff = 0.0
    if server.policy == "disaggregated":
        link = _link_gbs(gpu, server)
        states, extra = _disaggregated(requests, cost, capacity, server, link)
        handoff = sum(kv_transfer_seconds(cost, r.prompt_tokens, link) for r in requests) / max(1, len(requests))
    else:
        states, extra = [_serve([_Job(r.arrival, r) for r in share], cost, capacity, server)
                         for share in _deal(requests, server.gpus)], 0.0
    return _result(states, server, capacity * server.block_size, targets, extra, handoff)


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
