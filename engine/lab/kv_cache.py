"""The KV cache, with and without: the same greedy generation run both ways, each token timed.

    on, off = generate_both(lm, ids, steps=32)      # in lockstep: with the cache (prefill, then one token per
                                                    # pass) and without (every step runs the whole sequence)
    rows = compare_runs(lm.spec, on, off)                      # per token: time both ways, FLOPs both ways

Without the cache, token i needs the keys and values of every earlier position, so each step recomputes
them: a forward pass over the whole sequence, which grows with N (and its attention with N²). With the
cache, each step pushes one token through the model and reads the stored K/V. Both produce the same tokens.
FLOPs come from the projection's formulas: a step with the cache costs `decode_flops(spec, n)`, one
without costs `prefill_flops(spec, n)`, where n is the sequence length the step attends over.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch
from transformers import DynamicCache

from engine.core.generate import forward, sync
from engine.core.loader import LoadedModel
from engine.projection.cost import CostModel, cost_model, decode_flops, prefill_flops
from engine.projection.specs import GPUSpec, ModelSpec
from engine.lab.speed import check_room


@dataclass(frozen=True)
class TimedRun:
    """Greedy tokens and the seconds each took; step 0 is the prefill (the prompt), the same both ways."""

    prompt_tokens: int
    use_cache: bool
    tokens: tuple[int, ...]
    seconds: tuple[float, ...]

    def lengths(self) -> list[int]:
        """Sequence length each step's new token attends over: the prompt, then one more per token."""
        return [self.prompt_tokens + i for i in range(len(self.tokens))]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _next_without_cache(lm: LoadedModel, seq: list[int]) -> int:
    """The whole sequence through the model, nothing kept: the greedy next token."""
    out = lm.model(input_ids=torch.tensor([seq], device=lm.device), use_cache=False, logits_to_keep=1)
    return int(out.logits[0, -1].argmax())


def _next_with_cache(lm: LoadedModel, seq: list[int], cache: DynamicCache) -> int:
    """Only what the cache does not hold yet (the prompt at first, then the newest token): the greedy next token."""
    new = seq[cache.get_seq_length():]
    logits = forward(lm, new, cache)
    return int(logits.argmax())


def _timed_step(lm: LoadedModel, seq: list[int], cache: DynamicCache | None) -> tuple[int, float]:
    """One greedy token, with the cache when one is given, and the seconds it took (CUDA synchronised)."""
    t = time.perf_counter()
    token = _next_with_cache(lm, seq, cache) if cache is not None else _next_without_cache(lm, seq)
    sync(lm.device)
    return token, time.perf_counter() - t


def generate_timed(lm: LoadedModel, ids: list[int], steps: int, use_cache: bool) -> TimedRun:
    """Greedy generation of `steps` tokens after `ids` one way, timing each token (CUDA synchronised)."""
    return generate_both(lm, ids, steps, ways=(use_cache,))[0]


def generate_both(lm: LoadedModel, ids: list[int], steps: int, ways: tuple[bool, ...] = (True, False),
                  progress: Callable[[int], None] | None = None) -> list[TimedRun]:
    """The same greedy generation each way in `ways` (True: with the cache), in lockstep: token i with the
    cache, then token i without, so a noisy neighbour slows both alike."""
    check_room(lm, len(ids), steps)
    caches = {way: DynamicCache(config=lm.model.config) if way else None for way in ways}
    seqs = {way: list(ids) for way in ways}
    times: dict[bool, list[float]] = {way: [] for way in ways}
    with torch.inference_mode():
        for i in range(steps):
            for way in ways:
                token, seconds = _timed_step(lm, seqs[way], caches[way])
                seqs[way].append(token)
                times[way].append(seconds)
            if progress:
                progress(i + 1)
    return [TimedRun(len(ids), way, tuple(seqs[way][len(ids):]), tuple(times[way])) for way in ways]


@dataclass(frozen=True)
class TokenRow:
    """One generated token: its sequence length and what it cost with and without the cache."""

    length: int                  # positions the new token attends over
    seconds_on: float            # measured
    seconds_off: float           # measured
    flops_on: float              # one token through the model, attending to `length` cached positions
    flops_off: float             # the whole sequence again

    @property
    def flops_saved(self) -> float:
        """Share of the no-cache compute the cache avoids at this step: (n - 1)/n of the linear part, and more."""
        return 1 - self.flops_on / self.flops_off


def compare_runs(spec: ModelSpec, on: TimedRun, off: TimedRun) -> list[TokenRow]:
    """Per decode step (the prefill, step 0, is left out: it is the same work both ways)."""
    if on.tokens != off.tokens:
        first = next(i for i, (a, b) in enumerate(zip(on.tokens, off.tokens)) if a != b)
        raise ValueError(f"with and without the cache the greedy tokens part at token {first + 1} (a near tie "
                         "decided differently by float rounding); try another prompt length")
    rows = []
    for n, t_on, t_off in list(zip(on.lengths(), on.seconds, off.seconds))[1:]:
        rows.append(TokenRow(n, t_on, t_off, decode_flops(spec, n), prefill_flops(spec, n)))
    return rows


def slope(rows: list[TokenRow], attr: str) -> float:
    """Seconds per extra token of context for one series ('seconds_on' or 'seconds_off'): the median of the
    slopes between every pair of points (Theil-Sen), so one slow step on a busy machine does not tip it."""
    pts = [(r.length, getattr(r, attr)) for r in rows]
    slopes = [(y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(pts) for x2, y2 in pts[i + 1:] if x2 != x1]
    return statistics.median(slopes) if slopes else 0.0


# --- projected --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CacheProjection:
    """One token at sequence length n on a GPU: with the cache, and recomputing everything."""

    length: int
    seconds_on: float
    seconds_off: float

    @property
    def ratio(self) -> float:
        return self.seconds_off / self.seconds_on


def projection_cost_model(spec: ModelSpec, gpu: GPUSpec, dtype: str = "bf16") -> CostModel:
    """The projection's cost model at its default efficiencies, the ones every page projects with."""
    return cost_model(spec, gpu, dtype, dtype)


def project_token(spec: ModelSpec, gpu: GPUSpec, length: int, dtype: str = "bf16") -> CacheProjection:
    """With the cache a token is one decode step (weights + KV read); without, a prefill of `length` tokens. At the
    projection's default efficiencies (engine.projection.cost), as on every page."""
    cm = projection_cost_model(spec, gpu, dtype)
    return CacheProjection(length, cm.decode_seconds(1, length), cm.prefill_seconds([length]))


def project_answer_seconds(spec: ModelSpec, gpu: GPUSpec, prompt: int, answer: int,
                           dtype: str = "bf16") -> tuple[float, float]:
    """Total seconds for `answer` tokens after `prompt`: (with the cache, without)."""
    steps = [project_token(spec, gpu, prompt + i, dtype) for i in range(1, answer)]
    first = projection_cost_model(spec, gpu, dtype).prefill_seconds([prompt])
    return first + sum(s.seconds_on for s in steps), first + sum(s.seconds_off for s in steps)
