"""Prefix reuse, measured: one prompt's time to first token from scratch, and with its start reused.

    r = measure_prefix_reuse(lm, GenerationRequest(opening + "question a"), GenerationRequest(opening + "question b"))
    r.reused_tokens, r.ttft_cold, r.ttft_warm       # tokens whose K/V came from the prefix cache; seconds

Both runs go through the serving path (`engine.serving.batch.BatchRunner`), alone, with a prefix cache of
their own: cold with none, warm after `first` filled a fresh one (`engine.serving.prefix.PrefixCache`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from engine.core.generate import GenerationRequest, encode_prompt
from engine.core.hooks import CapturePolicy
from engine.core.loader import LoadedModel
from engine.core.records import PrefillRecord, Record
from engine.serving.batch import BatchRunner, Slot
from engine.serving.prefix import PrefixCache


@dataclass(frozen=True)
class PrefixReuse:
    """One prompt's time to first token computed from scratch, then with its start reused (measured)."""

    prompt_tokens: int
    reused_tokens: int
    ttft_cold: float             # seconds, nothing reused
    ttft_warm: float             # seconds, the start reused from the prefix cache


def measure_prefix_reuse(lm: LoadedModel, first: GenerationRequest, second: GenerationRequest,
                         rounds: int = 3) -> PrefixReuse:
    """Run `second` alone cold, then after `first` has filled a fresh prefix cache; best of `rounds` each."""
    first, second = replace(first, max_new_tokens=1), replace(second, max_new_tokens=1)
    first_ids, ids = encode_prompt(lm, first), encode_prompt(lm, second)
    cold, warm, reused = [], [], 0
    for _ in range(rounds):
        cold.append(ttft(lm, second, ids, None))
        prefix = PrefixCache(2**62)
        ttft(lm, first, first_ids, prefix)
        warm.append(ttft(lm, second, ids, prefix))
        reused = prefix.stats.reused_tokens
    return PrefixReuse(len(ids), reused, min(cold), min(warm))


def ttft(lm: LoadedModel, request: GenerationRequest, ids: list[int], prefix: PrefixCache | None) -> float:
    """Seconds to the first token of `request` (prompt `ids`), alone in a batch runner with `prefix`."""
    got: list[Record] = []
    runner = BatchRunner(lm, max_batch=1, prefill_chunk=1 << 30, prefix=prefix)
    runner.add(Slot(request, ids, CapturePolicy(layers=()), got.append, _raise))
    while not runner.idle:
        runner.step()
    return next(r.seconds for r in got if isinstance(r, PrefillRecord))


def _raise(err: Exception) -> None:
    raise err
