"""Contiguous vs paged KV allocation: a small, seeded simulation in whole decode steps.

Requests of varied lengths arrive (Poisson), wait in a FIFO queue, run, and leave a fixed KV
memory measured in tokens. Each step every running request grows by one token.

- contiguous: a request reserves the model's `max_len` tokens when it starts (the pre-PagedAttention
  way): memory it will never use is held for its whole life.
- paged: memory comes in blocks of `block_size` tokens, taken one at a time as the request grows
  (PagedAttention). When a block is needed and none is free, the youngest request is preempted:
  it frees its blocks and goes back to the head of the queue (recomputed later, as vLLM does).

A request with prompt p and output o runs o steps with lengths p+1 .. p+o.
"""
from __future__ import annotations

import random
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class PagingConfig:
    capacity_tokens: int = 32_768   # KV memory, in tokens
    max_len: int = 2048             # what contiguous allocation reserves per request
    block_size: int = 16
    n_requests: int = 300
    arrival_rate: float = 1.0       # requests per step (Poisson)
    prompt_min: int = 32
    prompt_max: int = 512
    output_min: int = 16
    output_max: int = 512
    seed: int = 0


@dataclass(frozen=True)
class PagingRequest:
    rid: int
    arrival_step: int
    prompt: int
    output: int


@dataclass(frozen=True)
class PagingStep:
    step: int
    running: int
    waiting: int
    allocated_tokens: int   # reserved (contiguous) or blocks x block_size (paged)
    used_tokens: int        # tokens actually cached

    @property
    def waste_pct(self) -> float:
        return 100.0 * (self.allocated_tokens - self.used_tokens) / self.allocated_tokens if self.allocated_tokens else 0.0


@dataclass(frozen=True)
class PagingResult:
    mode: str
    steps: list[PagingStep]
    waste_pct: float            # sum(allocated - used) / sum(allocated) over all steps
    mean_running: float         # requests held concurrently, averaged over busy steps
    max_running: int
    finished: int
    makespan: int               # steps until the last request finished
    preemptions: int
    mean_waste_tokens: float    # per running request, averaged over busy steps

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PagingComparison:
    config: PagingConfig
    requests: list[PagingRequest]
    contiguous: PagingResult
    paged: PagingResult


@dataclass
class _Live:
    req: PagingRequest
    generated: int = 0
    allocated: int = 0       # tokens held (max_len, or blocks x block_size)

    @property
    def length(self) -> int:
        return self.req.prompt + self.generated


@dataclass
class _State:
    free: int                                  # free tokens
    pending: deque = field(default_factory=deque)   # not yet arrived
    waiting: deque = field(default_factory=deque)   # arrived, not running
    running: list = field(default_factory=list)     # oldest first
    finished: int = 0
    preemptions: int = 0


def make_requests(config: PagingConfig) -> list[PagingRequest]:
    """Seeded Poisson arrivals with uniform prompt and output lengths (p + o <= max_len)."""
    rng = random.Random(config.seed)
    t, out = 0.0, []
    for rid in range(config.n_requests):
        t += rng.expovariate(config.arrival_rate)
        prompt = rng.randint(config.prompt_min, config.prompt_max)
        output = min(rng.randint(config.output_min, config.output_max), config.max_len - prompt)
        out.append(PagingRequest(rid, int(t), prompt, output))
    return out


def _blocks_tokens(tokens: int, block: int) -> int:
    """Tokens held by the blocks that store `tokens`: rounded up to a whole block."""
    return -(-tokens // block) * block


def _admit(state: _State, mode: str, config: PagingConfig) -> None:
    """Start waiting requests in order while the head one fits (no overtaking)."""
    while state.waiting:
        live = state.waiting[0]
        need = config.max_len if mode == "contiguous" else _blocks_tokens(live.length + 1, config.block_size)
        if need > state.free:
            return
        state.waiting.popleft()
        live.allocated, state.free = need, state.free - need
        state.running.append(live)


def _preempt_youngest(state: _State) -> _Live:
    victim = state.running.pop()
    state.free += victim.allocated
    victim.allocated = 0
    state.waiting.appendleft(victim)
    state.preemptions += 1
    return victim


def _grow(state: _State, mode: str, block: int) -> None:
    """Every running request gains one token; paged ones take a new block when they cross one."""
    i = 0
    while i < len(state.running):
        live = state.running[i]
        need = 0 if mode == "contiguous" else _blocks_tokens(live.length + 1, block) - live.allocated
        while need > state.free:
            if _preempt_youngest(state) is live:
                return
        live.allocated += need
        state.free -= need
        live.generated += 1
        i += 1


def _record(state: _State, step: int) -> PagingStep:
    return PagingStep(step, len(state.running), len(state.waiting),
                      sum(r.allocated for r in state.running), sum(r.length for r in state.running))


def _retire(state: _State) -> None:
    done = [r for r in state.running if r.generated >= r.req.output]
    state.running = [r for r in state.running if r.generated < r.req.output]
    state.free += sum(r.allocated for r in done)
    state.finished += len(done)


def _run_steps(state: _State, mode: str, config: PagingConfig, total: int) -> list[PagingStep]:
    steps: list[PagingStep] = []
    step = 0
    while state.finished < total:
        while state.pending and state.pending[0].req.arrival_step <= step:
            state.waiting.append(state.pending.popleft())
        _admit(state, mode, config)
        _grow(state, mode, config.block_size)
        steps.append(_record(state, step))
        _retire(state)
        step += 1
    return steps


def _summarize(mode: str, steps: list[PagingStep], state: _State) -> PagingResult:
    busy = [s for s in steps if s.running]
    allocated = sum(s.allocated_tokens for s in steps)
    wasted = sum(s.allocated_tokens - s.used_tokens for s in steps)
    request_steps = sum(s.running for s in busy)
    return PagingResult(
        mode=mode, steps=steps, waste_pct=100.0 * wasted / allocated if allocated else 0.0,
        mean_running=request_steps / len(busy) if busy else 0.0,
        max_running=max((s.running for s in steps), default=0), finished=state.finished,
        makespan=len(steps), preemptions=state.preemptions,
        mean_waste_tokens=wasted / request_steps if request_steps else 0.0,
    )


def simulate(config: PagingConfig, mode: str, requests: list[PagingRequest] | None = None) -> PagingResult:
    """Run every request to completion under one allocation mode: 'contiguous' or 'paged'."""
    if mode not in ("contiguous", "paged"):
        raise ValueError(f"unknown allocation mode {mode!r}; use 'contiguous' or 'paged'")
    if config.max_len > config.capacity_tokens:
        raise ValueError("one request's max length does not fit in the KV memory")
    requests = make_requests(config) if requests is None else requests
    state = _State(free=config.capacity_tokens, pending=deque(_Live(r) for r in requests))
    steps = _run_steps(state, mode, config, len(requests))
    return _summarize(mode, steps, state)


def compare(config: PagingConfig = PagingConfig()) -> PagingComparison:
    """The same seeded requests under both allocation modes."""
    requests = make_requests(config)
    return PagingComparison(config, requests, simulate(config, "contiguous", requests),
                            simulate(config, "paged", requests))


def expected_contiguous_waste_pct(config: PagingConfig) -> float:
    """Analytic waste of contiguous allocation for uniform lengths (p + o <= max_len assumed).

    Over its o steps a request holds max_len and uses p+1 .. p+o tokens, so
    waste = 1 - E[o p + o (o + 1) / 2] / (max_len E[o]), with p and o independent.
    """
    mean_p = (config.prompt_min + config.prompt_max) / 2
    mean_o = (config.output_min + config.output_max) / 2
    width = config.output_max - config.output_min + 1
    mean_o2 = (width * width - 1) / 12 + mean_o * mean_o
    used = mean_o * mean_p + (mean_o2 + mean_o) / 2
    return 100.0 * (1 - used / (config.max_len * mean_o))
