"""Typed records the generation loop yields: one for prefill, one per decode step, one at the end.

Records carry the token, its probabilities, timings and the cache size, so a page streams them and redraws from
them without touching the model again. A run's captures are not in its records: the run keeps its residual stream
(engine/core/kept.py) and every view is derived from it when asked (engine/core/views.py); `captures` is filled only
in records a file carries (derived when it is written) and in files written before.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Union

import numpy as np

from engine.core.hooks import LayerCapture


@dataclass
class Piece:
    """One token of text: its id and the text it decodes to."""

    id: int
    text: str


@dataclass
class Candidate:
    id: int
    text: str
    prob: float


@dataclass
class SampledToken:
    id: int
    text: str                     # the text this token added to the answer
    prob: float                   # probability of the chosen token under the filtered distribution
    top: list[Candidate]          # alternatives after temperature / top-k / top-p
    logit_ids: np.ndarray         # (K,) ids of the largest raw logits, kept for re-drawing
    logits: np.ndarray            # (K,) their raw logits (before temperature)
    rest_logsumexp: float | None = None   # log Σ exp of the V - K raw logits not kept (None: none left out)
    rest_count: int = 0                   # V - K: how many that is
    logit: float | None = None            # the chosen token's own raw logit (it may lie outside the K kept)

    def logprob(self) -> float | None:
        """log p of the chosen token under the model's raw distribution (before temperature, top-k, top-p)."""
        if self.logit is None or len(self.logits) == 0:
            return None
        return self.logit - self.log_total()

    def log_total(self) -> float:
        """log Σ exp of every raw logit: the K kept and the rest."""
        kept = float(np.logaddexp.reduce(self.logits.astype(np.float64)))
        return kept if self.rest_logsumexp is None else float(np.logaddexp(kept, self.rest_logsumexp))


@dataclass
class CacheState:
    length: int                   # positions held, read from the cache object
    bytes: int                    # bytes of K and V tensors, all layers
    bytes_per_layer: list[int]


@dataclass
class PrefillRecord:
    prompt: list[Piece]
    shapes: dict[str, tuple[int, ...]]
    seconds: float                # prefill forward + first sample: the time to first token
    cache: CacheState
    token: SampledToken           # the first generated token comes out of prefill
    captures: dict[int, LayerCapture] = field(default_factory=dict)
    kind: str = "prefill"
    reused_tokens: int = 0        # prompt tokens whose K/V came from the prefix cache (not computed again)


@dataclass
class DecodeRecord:
    step: int                     # 1 for the second generated token, and so on
    seconds: float                # one forward over one token + sampling
    cache: CacheState
    token: SampledToken
    captures: dict[int, LayerCapture] = field(default_factory=dict)
    kind: str = "decode"


@dataclass
class DoneRecord:
    text: str
    finish_reason: str            # "eos", "stop", "length", "cancelled"
    prompt_tokens: int
    generated_tokens: int
    ttft: float
    decode_seconds: float
    total_seconds: float
    kind: str = "done"
    logits_sha256: str | None = None  # sha256 over the float32 bytes of every step's logits row (a batched run's)

    @property
    def tokens_per_second(self) -> float:
        """Decode rate: tokens after the first over the time they took."""
        steps = self.generated_tokens - 1
        return steps / self.decode_seconds if steps > 0 and self.decode_seconds > 0 else 0.0

    @property
    def inter_token_latency(self) -> float:
        steps = self.generated_tokens - 1
        return self.decode_seconds / steps if steps > 0 else 0.0


Record = Union[PrefillRecord, DecodeRecord, DoneRecord]


# --- speculative decoding: a round of drafts and their verdicts, and the run's totals ----------------------

@dataclass
class DraftedToken:
    id: int
    text: str                     # the token decoded on its own
    draft_prob: float             # q(x): probability the draft gave it (1.0 for n-gram lookups)
    target_prob: float            # p(x): probability the target gives it at the same position
    accepted: bool


@dataclass
class SpecRoundRecord:
    round: int                    # 1 for the first draft/verify round
    drafted: list[DraftedToken]   # may be fewer than k (n-gram found nothing, or the answer is nearly done)
    accepted: int                 # length of the drafted prefix the target accepted
    bonus: SampledToken           # the target's own token after that prefix: a correction, or the bonus when all passed
    emitted: list[SampledToken]   # what joined the answer: accepted drafts, then `bonus`; cut at EOS, stop, max tokens
    draft_seconds: float          # proposing (for a model draft: catching up on the context, then k steps)
    verify_seconds: float         # one target pass over k+1 positions, acceptance, rollback
    cache: CacheState             # the target's cache after rollback: every token so far but the newest
    draft_cache_length: int | None  # the draft's cache after rollback (None: n-gram lookup keeps no cache)
    draft_fed: int                # context tokens the draft read before drafting (the whole prompt in round 1)
    captures: dict[int, LayerCapture] = field(default_factory=dict)   # from the verify pass
    kind: str = "spec_round"


@dataclass
class SpecDoneRecord(DoneRecord):
    draft: str = ""
    k: int = 0
    rounds: int = 0
    target_passes: int = 0        # the prefill pass plus one verify pass per round
    drafted: int = 0
    accepted: int = 0
    acceptance_rate: float = 0.0  # accepted / drafted over the run
    acceptance_by_position: list[float] = field(default_factory=list)  # [j]: accepted d_{j+1} / drafted d_{j+1}
    tokens_per_pass: float = 0.0  # tokens emitted per verify pass (plain decoding: 1.0)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0


SpecRecord = Union[PrefillRecord, SpecRoundRecord, SpecDoneRecord]


def to_json(record: Record, with_captures: bool = True) -> dict[str, Any]:
    """Plain JSON-able dict of a record (numpy arrays become lists)."""
    data = asdict(record)
    if not with_captures:
        data.pop("captures", None)
    if isinstance(record, DoneRecord):
        data["tokens_per_second"] = record.tokens_per_second
        data["inter_token_latency"] = record.inter_token_latency
    return _plain(data)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value
