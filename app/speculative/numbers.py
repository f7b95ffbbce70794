"""Speculative decoding as the page sees it: a `SpecRun` that fills up round by round, the one call site
that drives `engine.speculative` (then plain decoding of the same request, for the measured speedup),
which drafts this process can offer, and the numbers the page draws from the records.

No Streamlit here. Like `app.run.stream_generation`, `stream_speculative` goes through the shared
model's scheduler, so these runs queue, obey the server's limits and can be cancelled like any other.

Times compared are the engine's own per-record timings (prefill, each round's draft and verify, each
plain decode step), never wall time around the loop, which would include the page redrawing charts.
"""
from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from engine.card import param_counts
from engine.demo_prompts import SPECULATIVE_PROMPTS
from engine.drafts import Draft
from engine.generate import GenerationRequest
from engine.hooks import CAPTURE_OFF
from engine.loader import ALIASES, EMBEDDED, LoadedModel, cache_dir, read_spec
from engine.projection import project
from engine.records import DecodeRecord, DoneRecord, PrefillRecord
from engine.specs import GPU_PRESETS, MODEL_PRESETS, ModelSpec
from engine.scheduler import Handle, QueueStatus, scheduler_for
from engine.speculative import SpecDoneRecord, SpecRoundRecord, expected_tokens_per_pass

K_RANGE = range(1, 9)                    # k offered on the page and drawn on the charts
PROJECTED_DRAFT, PROJECTED_TARGET, PROJECTED_GPU = "llama-3.2-1b", "llama-3.1-8b", "h100-sxm"
EXTRA_PRESETS = {"qwen-0.5b": "qwen2.5-coder-0.5b", "qwen-1.5b": "qwen2.5-coder-1.5b"}   # extra key -> ModelSpec preset

PRESETS = {   # the three prompts of bench/speculative.py, so the page's numbers compare with the README's
    "Code continuation": SPECULATIVE_PROMPTS["code"],
    "Copy a passage": SPECULATIVE_PROMPTS["copy"],
    "Open question": SPECULATIVE_PROMPTS["question"],
}


# --- the run -------------------------------------------------------------------------------------------

@dataclass
class SpecRun:
    """A speculative generation and the plain one of the same request, as they stream."""

    model: str
    request: GenerationRequest
    draft: str                               # the draft's label
    draft_kind: str                          # "ngram", "early-exit" or "model"
    k: int
    prefill: PrefillRecord | None = None
    rounds: list[SpecRoundRecord] = field(default_factory=list)
    done: SpecDoneRecord | None = None
    plain_prefill_seconds: float | None = None
    plain_steps: list[float] = field(default_factory=list)    # seconds of each plain decode step
    plain: DoneRecord | None = None
    live: bool = True
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    started: float = field(default_factory=time.time)

    def add(self, record: PrefillRecord | SpecRoundRecord | SpecDoneRecord) -> None:
        if isinstance(record, PrefillRecord):
            self.prefill = record
        elif isinstance(record, SpecRoundRecord):
            self.rounds.append(record)
        elif isinstance(record, SpecDoneRecord):
            self.done = record

    def add_plain(self, record: PrefillRecord | DecodeRecord | DoneRecord) -> None:
        if isinstance(record, PrefillRecord):
            self.plain_prefill_seconds = record.seconds
        elif isinstance(record, DecodeRecord):
            self.plain_steps.append(record.seconds)
        elif isinstance(record, DoneRecord):
            self.plain = record

    @property
    def status(self) -> str:
        """'running', 'done' (both runs finished), or 'stopped'."""
        if self.plain is not None and self.done is not None and self.done.finish_reason != "cancelled":
            return "done"
        return "running" if self.live else "stopped"

    @property
    def text(self) -> str:
        if self.done is not None:
            return self.done.text
        first = self.prefill.token.text if self.prefill else ""
        return first + "".join(t.text for r in self.rounds for t in r.emitted)

    @property
    def generated(self) -> int:
        return (1 if self.prefill else 0) + sum(len(r.emitted) for r in self.rounds)


def new_spec_run(lm: LoadedModel, request: GenerationRequest, draft: Draft, k: int) -> SpecRun:
    return SpecRun(model=lm.label, request=request, draft=draft.label, draft_kind=draft.kind, k=k)


def _drive(handle: Handle, add: Callable, on_record: Callable[[SpecRun], None] | None, run: SpecRun,
           on_wait: Callable[[QueueStatus], None] | None) -> None:
    try:
        for record in handle.records(on_wait=on_wait):
            add(record)
            if on_record is not None:
                on_record(run)
    finally:
        handle.cancel()  # a no-op once finished


def stream_speculative(lm: LoadedModel, draft: Draft, run: SpecRun, on_record: Callable[[SpecRun], None],
                       on_plain: Callable[[SpecRun], None] | None = None,
                       on_wait: Callable[[QueueStatus], None] | None = None, session: str | None = None) -> SpecRun:
    """Speculative decoding of `run.request`, then plain decoding of the same request, both through the
    shared model's scheduler (queue position, limits and time limit as for every other request).

    The speedup compares the engine's own per-record timings, so another session's request running
    between the two does not skew it. `on_record(run)` follows the speculative rounds, `on_plain(run)`
    the plain steps. If a callback raises (Streamlit stops a script that way on Stop), the request in
    flight is cancelled at once, queued or running.
    """
    scheduler = scheduler_for(lm)
    try:
        _drive(scheduler.submit(run.request, CAPTURE_OFF, session=session, draft=draft, k=run.k),
               run.add, on_record, run, on_wait)
        if run.done is not None and run.done.finish_reason not in ("cancelled", "timeout"):
            _drive(scheduler.submit(run.request, CAPTURE_OFF, session=session), run.add_plain, on_plain, run, on_wait)
    finally:
        run.live = False
    return run


# --- which drafts this process can offer ------------------------------------------------------------------

@dataclass(frozen=True)
class DraftModelOption:
    name: str            # what load_model takes: an extra's key or a folder
    label: str
    usable: bool
    reason: str = ""     # why it cannot draft for the loaded model


def is_model_spec(text: str) -> bool:
    return not (text == "ngram" or text.startswith(("ngram:", "early-exit", "early_exit")))


def extra_installed(key: str) -> bool:
    """Converted already, or its chunk packages are installed (the first use converts them)."""
    if (cache_dir() / EMBEDDED[key].folder / "config.json").exists():
        return True
    from engine.extras import EXTRAS, package_chunks

    return all(package_chunks(module) for module in EXTRAS[key].modules())


def candidate_spec(name: str) -> tuple[ModelSpec | None, str]:
    """(ModelSpec, label) of a draft candidate without loading its weights; None when it cannot be read."""
    key = ALIASES.get(name, name)
    if key in EXTRA_PRESETS:
        return MODEL_PRESETS[EXTRA_PRESETS[key]], EMBEDDED[key].label
    folder = cache_dir() / EMBEDDED[key].folder if key in EMBEDDED else os.path.expanduser(name)
    try:
        return read_spec(folder, str(name)), str(name)
    except Exception:  # noqa: BLE001 - a hub id or a broken folder: loading it will say what is wrong
        return None, str(name)


def judge_candidate(name: str, target: ModelSpec, target_label: str) -> DraftModelOption:
    """Usable when it shares the target's vocabulary size and is smaller (the tokenizer is checked at load)."""
    spec, label = candidate_spec(name)
    if spec is None:
        return DraftModelOption(name, label, True)
    if spec.vocab_size != target.vocab_size:
        return DraftModelOption(name, label, False,
                                f"{label} has {spec.vocab_size:,} vocabulary rows and {target_label} has "
                                f"{target.vocab_size:,}: a draft must share the target's tokenizer")
    if param_counts(spec).total >= param_counts(target).total:
        return DraftModelOption(name, label, False, f"{label} is not smaller than {target_label}")
    return DraftModelOption(name, label, True)


def draft_model_options(lm: LoadedModel, launched: str | None = None) -> list[DraftModelOption]:
    """The launcher's draft model (PLAYGROUND_DRAFT) and every installed extra except the target itself."""
    target_key = ALIASES.get(lm.name, lm.name)
    names = [launched] if launched and is_model_spec(launched) else []
    names += [key for key in EXTRA_PRESETS if key != target_key and key not in names and extra_installed(key)]
    return [judge_candidate(name, lm.spec, lm.label) for name in names]


# --- what the records measure -----------------------------------------------------------------------------

def per_token_acceptance(rounds: list[SpecRoundRecord]) -> float:
    """a: accepted drafts / drafts the target checked (up to and including each round's first rejection).

    This is the per-token rate in (1 - a^(k+1)) / (1 - a). Accepted / drafted is lower: drafts after a
    rejection are thrown away without being judged on their own.
    """
    accepted = sum(r.accepted for r in rounds)
    checked = accepted + sum(1 for r in rounds if r.accepted < len(r.drafted))
    return accepted / checked if checked else 0.0


def costs_from_rounds(rounds: list[SpecRoundRecord]) -> tuple[float, float, float]:
    """(draft seconds per drafted token, verify seconds per round, drafted tokens per round).

    Round 1 is left out when there are others: a model draft reads the whole prompt there first.
    """
    steady = rounds[1:] if len(rounds) > 1 else rounds
    drafted = sum(len(r.drafted) for r in steady)
    draft = sum(r.draft_seconds for r in steady) / drafted if drafted else 0.0
    verify = sum(r.verify_seconds for r in steady) / len(steady) if steady else 0.0
    return draft, verify, drafted / len(steady) if steady else 0.0


@dataclass(frozen=True)
class Measured:
    """Everything the page reports about one finished run; times in seconds, ratios against a plain step."""

    k: int
    rounds: int
    drafted: int
    accepted: int
    acceptance_rate: float          # accepted / drafted
    a: float                        # per-token acceptance (see per_token_acceptance)
    by_position: list[float]        # accepted / drafted at draft position j+1
    tokens_per_pass: float          # tokens per verify pass (plain decoding: 1)
    expected_at_k: float            # (1 - a^(k+1)) / (1 - a)
    expected_drafted: float         # the same formula averaged over each round's actual draft length
    short_rounds: int               # rounds that drafted fewer than k tokens
    draft_per_token: float
    verify_per_round: float
    steady_drafted: float           # drafted tokens per round, over the rounds the two costs come from
    spec_decode: float              # every round's draft + verify
    spec_tokens: int                # tokens decoded after the first (which prefill gives both runs)
    plain_step: float | None        # mean plain decode step
    plain_decode: float | None
    plain_tokens: int | None
    speedup: float | None           # plain seconds per token / speculative seconds per token, decode only
    same_text: bool | None

    @property
    def cost_ratio(self) -> float | None:
        """c: one drafted token's cost as a share of one plain target step."""
        return self.draft_per_token / self.plain_step if self.plain_step else None

    @property
    def verify_ratio(self) -> float | None:
        """v: one verify pass over k+1 positions, in plain target steps."""
        return self.verify_per_round / self.plain_step if self.plain_step else None

    @property
    def check_ratio(self) -> float | None:
        """u: what checking one more drafted token adds to a verify pass, in plain target steps.

        The verify pass reads k + 1 positions where a plain step reads 1: v = 1 + k·u. On a GPU u is close to 0
        (the step reads the weights once either way); on a CPU the arithmetic grows with the positions."""
        if self.verify_ratio is None or not self.steady_drafted:
            return None
        return max(0.0, (self.verify_ratio - 1.0) / self.steady_drafted)

    @property
    def drafted_per_round(self) -> float:
        return self.drafted / self.rounds if self.rounds else 0.0


def measure(run: SpecRun) -> Measured:
    rounds, done = run.rounds, run.done
    a = per_token_acceptance(rounds)
    draft, verify, steady_drafted = costs_from_rounds(rounds)
    spec_decode = sum(r.draft_seconds + r.verify_seconds for r in rounds)
    spec_tokens = sum(len(r.emitted) for r in rounds)
    drafted = sum(len(r.drafted) for r in rounds)
    accepted = sum(r.accepted for r in rounds)
    plain_decode = sum(run.plain_steps) if run.plain is not None else None
    plain_tokens = len(run.plain_steps) if run.plain is not None else None
    plain_step = plain_decode / plain_tokens if plain_tokens else None
    speedup = (plain_step / (spec_decode / spec_tokens)
               if plain_step and spec_tokens and spec_decode > 0 else None)
    return Measured(
        k=run.k, rounds=len(rounds), drafted=drafted, accepted=accepted,
        acceptance_rate=accepted / drafted if drafted else 0.0, a=a,
        by_position=list(done.acceptance_by_position) if done else by_position(rounds),
        tokens_per_pass=spec_tokens / len(rounds) if rounds else 0.0,
        expected_at_k=expected_tokens_per_pass(a, run.k),
        expected_drafted=(sum(expected_tokens_per_pass(a, len(r.drafted)) for r in rounds) / len(rounds)
                          if rounds else 0.0),
        short_rounds=sum(1 for r in rounds if len(r.drafted) < run.k),
        draft_per_token=draft, verify_per_round=verify, steady_drafted=steady_drafted, spec_decode=spec_decode,
        spec_tokens=spec_tokens,
        plain_step=plain_step, plain_decode=plain_decode, plain_tokens=plain_tokens, speedup=speedup,
        same_text=(run.plain.text == run.done.text) if run.plain is not None and done is not None else None)


def by_position(rounds: list[SpecRoundRecord]) -> list[float]:
    """accepted / drafted at each draft position, for a run that stopped before its summary."""
    drafted: list[int] = []
    accepted: list[int] = []
    for r in rounds:
        for j in range(len(r.drafted)):
            if j == len(drafted):
                drafted.append(0)
                accepted.append(0)
            drafted[j] += 1
            accepted[j] += int(j < r.accepted)
    return [x / n for x, n in zip(accepted, drafted)]


def expected_speedup(a: float, k: int, c: float, u: float = 0.0) -> float:
    """E[tokens per pass] / (1 + k·(c + u)): a round drafts k tokens (c plain steps each) and verifies them in one
    pass that costs a plain step plus u for each drafted token it checks."""
    return expected_tokens_per_pass(a, k) / (1 + k * (c + u))


def speedup_curve(a: float, c: float, ks: range = K_RANGE, u: float = 0.0) -> list[float]:
    return [expected_speedup(a, k, c, u) for k in ks]


def best_k(a: float, c: float, ks: range = K_RANGE, u: float = 0.0) -> tuple[int, float]:
    curve = speedup_curve(a, c, ks, u)
    i = max(range(len(curve)), key=curve.__getitem__)
    return ks[i], curve[i]


@dataclass(frozen=True)
class ProjectedPair:
    draft: str
    target: str
    gpu: str
    draft_step_ms: float
    target_step_ms: float

    @property
    def cost_ratio(self) -> float:
        return self.draft_step_ms / self.target_step_ms


def projected_pair(draft: str = PROJECTED_DRAFT, target: str = PROJECTED_TARGET,
                   gpu: str = PROJECTED_GPU) -> ProjectedPair:
    """Decode step times of both models at batch 1 from engine.projection (bandwidth, weight and KV bytes)."""
    gpu_spec = GPU_PRESETS[gpu]
    d, t = project(MODEL_PRESETS[draft], gpu_spec), project(MODEL_PRESETS[target], gpu_spec)
    return ProjectedPair(MODEL_PRESETS[draft].name, MODEL_PRESETS[target].name, gpu_spec.name,
                         d.decode_step_ms, t.decode_step_ms)
