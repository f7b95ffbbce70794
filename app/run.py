"""One generation as the pages see it: a `Run` that fills up record by record, and the single call
site that drives the engine (`stream_generation`).

A speculative run is a `Run` too: its `speculation` holds the draft, k, the rounds as the engine
yielded them and the plain decoding of the same request (for the measured speedup), and each round's
tokens also join `steps` as one decode step per token, so every page reads it like any other run.

The finished (or stopped) run of a session lives in `st.session_state[LAST_RUN]`: the journey page
writes it, and the attention and KV-cache pages draw from the same run, so one generation can be
looked at from every page. A `Run` holds only plain data (dataclasses of numbers, strings and
numpy arrays), never the model, a module or a hook handle.

The model is shared by every session: `stream_generation` submits the request to the process-wide
scheduler (engine/serving/scheduler.py), which runs one request at a time, and streams the records back. A
run can also come from a recording file (app/recordings.py), in which case no model is needed at all.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from engine.speculative.drafts import Draft
from engine.core.generate import GenerationRequest
from engine.core.hooks import CAPTURE_OFF, CapturePolicy, LayerCapture
from engine.core.loader import LoadedModel
from engine.core.records import CacheState, DecodeRecord, DoneRecord, PrefillRecord, Record, SampledToken
from engine.serving.scheduler import CheckedRequest, Handle, QueueStatus, scheduler_for
from engine.projection.specs import ModelSpec
from engine.speculative.decode import SpecRoundRecord
from engine.projection.units import fmt_bytes

LAST_RUN = "last_run"                 # st.session_state key shared by all pages
ATTENTION_BUDGET = 256 * 2**20        # bytes of attention probabilities one run may capture
LOGIT_LENS_TOP = 5
CAPTURED_BYTES = 4                    # the engine captures float32 probabilities


@dataclass
class Metrics:
    ttft: float | None              # seconds
    itl: float | None               # mean seconds per decode step
    tokens_per_second: float | None
    prompt_tokens: int
    generated_tokens: int


@dataclass
class Speculation:
    """The speculative part of a run: the draft, k, the rounds, and plain decoding of the same request."""

    draft: str                               # the draft's label
    draft_kind: str                          # "ngram", "early-exit" or "model"
    k: int
    rounds: list[SpecRoundRecord] = field(default_factory=list)
    baseline: Run | None = None              # plain decoding of the same request, run right after (the speedup)


@dataclass
class Run:
    """A generation as it streams: the request, how it was captured, and its records so far."""

    model: str
    spec: ModelSpec
    request: GenerationRequest
    policy: CapturePolicy
    capture_note: str | None = None
    prefill: PrefillRecord | None = None
    steps: list[DecodeRecord] = field(default_factory=list)
    done: DoneRecord | None = None
    live: bool = True
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    started: float = field(default_factory=time.time)
    dtype: str = ""                 # the model's dtype when it ran ("float32", "bfloat16", ...)
    device: str = ""
    source: str | None = None       # the recording's title when the run was loaded from a file
    warning: str | None = None      # why the server stopped it early (its time limit), for the page to show
    speculation: Speculation | None = None   # set for speculative decoding

    def add(self, record: Record | SpecRoundRecord) -> None:
        if isinstance(record, PrefillRecord):
            self.prefill = record
        elif isinstance(record, DecodeRecord):
            self.steps.append(record)
        elif isinstance(record, SpecRoundRecord):
            self.speculation.rounds.append(record)
            self.steps.extend(round_steps(record, len(self.steps) + 1))
        elif isinstance(record, DoneRecord):
            self.done = record

    @property
    def status(self) -> str:
        """'running', 'done', or 'stopped' (interrupted before its DoneRecord)."""
        if self.done is not None:
            return "stopped" if self.done.finish_reason == "cancelled" else "done"
        return "running" if self.live else "stopped"

    def status_line(self) -> str:
        """The run's state in one sentence, for the line above its answer."""
        if self.status == "running":
            return f"Generating with {self.model}…"
        if self.status == "stopped":
            return f"Stopped after {len(self.tokens)} tokens; what streamed so far is kept below."
        reason = {"eos": "the model ended its answer", "length": "the token limit was reached",
                  "stop": "a stop string appeared"}.get(self.done.finish_reason, self.done.finish_reason)
        return f"Done: {reason}. {self.done.total_seconds:.2f} s in total."

    @property
    def tokens(self) -> list[SampledToken]:
        """Generated tokens in order: the one prefill produced, then one per decode step."""
        first = [self.prefill.token] if self.prefill else []
        return first + [s.token for s in self.steps]

    @property
    def text(self) -> str:
        return self.done.text if self.done else "".join(t.text for t in self.tokens)

    @property
    def prompt_texts(self) -> list[str]:
        return [p.text for p in self.prefill.prompt] if self.prefill else []

    @property
    def n_prompt(self) -> int:
        return len(self.prefill.prompt) if self.prefill else 0

    def position_texts(self) -> list[str]:
        """Text of every cached position: the prompt, then each generated token that was fed back."""
        fed = [t.text for t in self.tokens[:-1]]
        return self.prompt_texts + fed

    def captures(self, index: int) -> dict[int, LayerCapture]:
        """What the forward pass that produced generated token `index` captured."""
        if index == 0:
            return self.prefill.captures if self.prefill else {}
        return self.steps[index - 1].captures

    def cache_states(self) -> list[CacheState]:
        first = [self.prefill.cache] if self.prefill else []
        return first + [s.cache for s in self.steps]

    def step_seconds(self) -> list[float]:
        """Durations: prefill first, then each decode step."""
        first = [self.prefill.seconds] if self.prefill else []
        return first + [s.seconds for s in self.steps]

    def metrics(self) -> Metrics:
        decode = [s.seconds for s in self.steps]
        return Metrics(
            ttft=self.prefill.seconds if self.prefill else None,
            itl=float(np.mean(decode)) if decode else None,
            tokens_per_second=len(decode) / sum(decode) if decode and sum(decode) > 0 else None,
            prompt_tokens=self.n_prompt,
            generated_tokens=len(self.tokens),
        )


def round_steps(rec: SpecRoundRecord, first_step: int) -> list[DecodeRecord]:
    """A round's tokens as decode steps, one per token, as plain decoding would have made them.

    The round fed [last token, d_1..d_k] at positions start..start+k in one verify pass; token j of the round came
    out of row j (position start + j). Its captures are that row (`row_captures`), its cache the positions up to
    start + j (bytes in proportion: every position holds the same K and V), and the round's time is shared evenly.
    The round's own captures are dropped once cut into rows (the rejected rows are never drawn).
    """
    n = len(rec.emitted)
    start, newest = rec.cache.length - n, rec.cache.length - n + len(rec.drafted)
    seconds = (rec.draft_seconds + rec.verify_seconds) / n
    steps = [DecodeRecord(first_step + j, seconds, cache_at(rec.cache, start + j + 1), token,
                          row_captures(rec.captures, start + j, newest)) for j, token in enumerate(rec.emitted)]
    rec.captures = {}
    return steps


def cache_at(state: CacheState, length: int) -> CacheState:
    """The cache as it held `length` of `state.length` positions (K and V bytes grow by the same amount a position)."""
    if state.length <= 0:
        return CacheState(length, 0, [0] * len(state.bytes_per_layer))
    return CacheState(length, state.bytes * length // state.length,
                      [b * length // state.length for b in state.bytes_per_layer])


def row_captures(captures: dict[int, LayerCapture], position: int, newest: int) -> dict[int, LayerCapture]:
    """The captures of a verify pass seen from one query position: its attention row over the keys up to it, and
    the norms and logit lens only where it is the pass's newest position (the only one they were taken at)."""
    rows = {}
    for layer, cap in captures.items():
        row = None
        r = position - cap.query_start
        if cap.attention is not None and 0 <= r < cap.attention.shape[1]:
            row = cap.attention[:, r:r + 1, :position + 1 - cap.key_start].copy()     # (h, 1, T_k_kept)
        stats = {} if position == newest else {"q_norm": None, "k_norm": None, "v_norm": None, "resid_norm": None,
                                                "lens": None, "resid": None}
        rows[layer] = replace(cap, attention=row, query_start=position, **stats)
    return rows


# --- how much to capture -------------------------------------------------------------------------------

def attention_bytes(spec: ModelSpec, n_prompt: int, max_new: int, matrix: bool) -> int:
    """Bytes of attention probabilities one layer captures: the prefill rows plus one row per step."""
    prefill_rows = n_prompt * n_prompt if matrix else n_prompt
    decode_rows = sum(n_prompt + s for s in range(1, max_new))
    return spec.n_heads * (prefill_rows + decode_rows) * CAPTURED_BYTES


def spread_layers(n_layers: int, k: int) -> tuple[int, ...]:
    """k layers spread over the depth (k=1: the middle one)."""
    if k >= n_layers:
        return tuple(range(n_layers))
    if k == 1:
        return (n_layers // 2,)
    return tuple(sorted({round(i * (n_layers - 1) / (k - 1)) for i in range(k)}))


def capture_policy(spec: ModelSpec, n_prompt: int, max_new: int, enabled: bool = True,
                   budget: int = ATTENTION_BUDGET, max_layers: int | None = None) -> tuple[CapturePolicy, str | None]:
    """All layers and heads when the prompt is short; fewer layers, or last rows only, when it is long.

    `budget` (bytes) and `max_layers` are the server's capture limits. Returns the policy and, when
    something was left out, a sentence the page shows.
    """
    if not enabled:
        return CAPTURE_OFF, "Capture is off: no attention maps, logit lens or norms for this run."
    full = attention_bytes(spec, n_prompt, max_new, matrix=True)
    allowed = min(spec.n_layers, max_layers or spec.n_layers)
    if full * spec.n_layers <= budget and allowed == spec.n_layers:
        return CapturePolicy(logit_lens=LOGIT_LENS_TOP, lens_on_demand=True), None
    if full * allowed <= budget:
        layers = spread_layers(spec.n_layers, allowed)
        note = (f"This server captures at most {allowed} layers per request, so attention maps (and the logit "
                f"lens) were kept for layers {', '.join(map(str, layers))} of {spec.n_layers}.")
        return CapturePolicy(layers=layers, logit_lens=LOGIT_LENS_TOP, lens_on_demand=True), note
    k = min(budget // full, allowed)
    if k >= 1:
        layers = spread_layers(spec.n_layers, int(k))
        note = (f"The prompt is long ({n_prompt:,} tokens), so full attention maps (and the logit lens) were kept "
                f"for {len(layers)} of {spec.n_layers} layers ({', '.join(map(str, layers))}) to stay within "
                f"{fmt_bytes(budget)} of capture.")
        return CapturePolicy(layers=layers, logit_lens=LOGIT_LENS_TOP, lens_on_demand=True), note
    rows = attention_bytes(spec, n_prompt, max_new, matrix=False)
    layers = spread_layers(spec.n_layers, max(1, min(int(budget // rows), allowed)))
    note = (f"The prompt is very long ({n_prompt:,} tokens): only the last query row of each step was kept, "
            f"for {len(layers)} of {spec.n_layers} layers.")
    return CapturePolicy(layers=layers, prefill_matrix=False, logit_lens=LOGIT_LENS_TOP,
                         lens_on_demand=True), note


def compact(record: Record) -> Record:
    """Store captured attention as float16: half the session memory, more precision than a plot shows."""
    for cap in getattr(record, "captures", {}).values():
        if cap.attention is not None and cap.attention.dtype != np.float16:
            cap.attention = cap.attention.astype(np.float16)
    return record


# --- the one call site that runs the model -------------------------------------------------------------

def new_run(lm: LoadedModel, request: GenerationRequest, policy: CapturePolicy, note: str | None,
            draft: Draft | None = None, k: int = 0) -> Run:
    """A run about to start; with a draft, a speculative one drafting `k` tokens a round."""
    speculation = Speculation(draft.label, draft.kind, k) if draft is not None else None
    return Run(model=lm.label, spec=lm.spec, request=request, policy=policy, capture_note=note,
               dtype=lm.dtype_name, device=str(lm.device), speculation=speculation)


def stream_generation(lm: LoadedModel, run: Run, on_record: Callable[[Run], None],
                      on_wait: Callable[[QueueStatus], None] | None = None, session: str | None = None,
                      draft: Draft | None = None, checked: CheckedRequest | None = None) -> Run:
    """Run `run.request` through the shared model's scheduler, calling `on_record(run)` after every record.

    `checked` is the request as the page already checked it at the scheduler's door (its ids are not encoded
    again); without it the request is checked here, once (an EngineError when refused). While
    the request waits, `on_wait(status)` is called a few times a second with its queue position and
    estimated wait. If `on_record` or `on_wait` raises (Streamlit stops a script that way when the
    user presses Stop or leaves the page) the request is cancelled at once, queued or running. A
    request the server stopped at its time limit keeps what streamed; `run.warning` says why.

    A speculative run (`draft` given, `run.speculation` set) is followed by plain decoding of the same
    request into `run.speculation.baseline`, unless it was stopped; `on_record(run)` follows that too.
    The speedup compares the engine's own per-record timings, so another session's request running
    between the two does not skew it.
    """
    scheduler = scheduler_for(lm)
    checked = scheduler.check(run.request, run.policy) if checked is None else checked
    spec = run.speculation
    extra = {"draft": draft, "k": spec.k} if spec is not None else {}
    handle = scheduler.submit(checked, run.policy, session=session, **extra)
    follow(handle, run, run, on_record, on_wait)
    run.warning = str(handle.error) if handle.error is not None else None
    if spec is not None and run.done is not None and run.done.finish_reason not in ("cancelled", "timeout"):
        spec.baseline = Run(model=run.model, spec=run.spec, request=run.request, policy=run.policy,
                            dtype=run.dtype, device=run.device)
        follow(scheduler.submit(checked, run.policy, session=session), spec.baseline, run, on_record, on_wait,
               keep_captures=False)
    return run


def follow(handle: Handle, into: Run, run: Run, on_record: Callable[[Run], None],
           on_wait: Callable[[QueueStatus], None] | None, keep_captures: bool = True) -> None:
    """Add each record of `handle` to `into` and call `on_record(run)`; cancel the request if a callback raises.

    The baseline of a speculative run captures what the run captured, so both pay the same for it, and drops it
    as it arrives (`keep_captures=False`): only its timings are read.
    """
    try:
        for record in handle.records(on_wait=on_wait):
            if not keep_captures and hasattr(record, "captures"):
                record.captures = {}
            into.add(compact(record))
            on_record(run)
    finally:
        handle.cancel()          # a no-op once finished
        into.live = False


class Throttle:
    """True at most once per `interval` x `share()` seconds (and always for the first and the forced call).

    `share` (default 1) stretches the interval while the server is busy: with the number of requests running,
    a room's pages together redraw about as often as one page alone does.
    """

    def __init__(self, interval: float, share: Callable[[], int] = lambda: 1):
        self.interval, self.share, self.last = interval, share, -float("inf")

    def __call__(self, force: bool = False) -> bool:
        now = time.perf_counter()
        waited = now - self.last
        if force or (waited >= self.interval and waited >= self.interval * max(1, self.share())):
            self.last = now
            return True
        return False

