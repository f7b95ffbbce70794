"""One generation as the pages see it: a `Run` that fills up record by record, and the single call
site that drives the engine (`stream_generation`).

A speculative run is a `Run` too: its `speculation` holds the draft, k, the rounds as the engine
yielded them and the plain decoding of the same request (for the measured speedup), and each round's
tokens also join `steps` as one decode step per token, so every page reads it like any other run.

The finished (or stopped) run of a session lives in `st.session_state[LAST_RUN]`: the journey page
writes it, and the attention and KV-cache pages draw from the same run, so one generation can be
looked at from every page. A `Run` holds only plain data (dataclasses of numbers, strings and
numpy arrays), never the model, a module or a hook handle.

The model is shared by every session: `stream_generation` submits the request through the page's ModelClient
(in-process or a model server) to the model's scheduler, which batches it with everyone else's, and streams the
records back. The run keeps the server's run id, so anyone can open it again by id (`run_from_slice`: a
presenter's followers, a `?run=` link). A run can also come from a recording file (app/runs/recordings.py), in which
case no model is needed at all.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from engine.core.generate import GenerationRequest
from engine.errors import EngineError
from engine.core.hooks import CapturePolicy, LayerCapture
from engine.core.records import CacheState, DecodeRecord, DoneRecord, PrefillRecord, Record, SampledToken
from engine.projection.specs import ModelSpec
from engine.service.client import ModelClient
from engine.service.runs import RunInfo, RunSlice
from engine.serving.scheduler import CheckedRequest, QueueStatus
from engine.speculative.decode import SpecRoundRecord
from engine.serving.capture import LOGIT_LENS_TOP, capture_policy  # noqa: F401 - the pages' capture, named here

LAST_RUN = "last_run"                 # st.session_state key shared by all pages
PAST_ANY_END = 2**31                   # a record index past any run's end: a wait from it returns when the run ends
SETTLE_SECONDS = 8.0                   # the longest a stopped run's page waits for the server to keep it


@dataclass(frozen=True)
class Draft:
    """A speculative run's draft as a page names it: the spec the server builds it from, and its label."""

    spec: str                                # "ngram", "early-exit:8", a draft model's name
    label: str
    kind: str                                # "ngram", "early-exit" or "model"


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
    recorded: str = ""              # a recording's date (ISO 8601), for a run loaded from a file
    machine: str = ""               # where a recording ran and how busy it was (engine.serving.recording)
    warning: str | None = None      # why the server stopped it early (its time limit), for the page to show
    speculation: Speculation | None = None   # set for speculative decoding
    kept: bool | None = None        # stopped: whether the server said its file is on disk (None: not asked)
    timeline: dict[str, Any] | None = None   # why it took its time: its story in the room (engine.serving.timeline)

    def add(self, record: Record | SpecRoundRecord) -> None:
        if isinstance(record, PrefillRecord):
            self.prefill = record
        elif isinstance(record, DecodeRecord):
            self.steps.append(record)
        elif isinstance(record, SpecRoundRecord):
            self.steps.extend(round_steps(record, len(self.steps) + 1))
            self.speculation.rounds.append(replace(record, captures={}))    # cut into rows above; not kept twice
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
        if self.status == "stopped" and self.kept is False:
            return (f"Stopped after {len(self.tokens)} tokens, shown below; the model server did not confirm it "
                    "kept this run (it may be busy or restarting), so it has no link here.")
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

    def first_token_seconds(self) -> float | None:
        """Submission to the first token as the room's timeline counts it (queue + prefill, until the token left the
        step: the line under the answer and the API's `time_to_first_token_seconds` say the same); without a
        timeline (a recording, an exclusive run), the prefill record's own time."""
        told = _told_ttft(self.timeline)
        return told if told is not None else self.prefill.seconds if self.prefill else None

    def step_seconds(self) -> list[float]:
        """Durations: prefill first, then each decode step."""
        first = [self.prefill.seconds] if self.prefill else []
        return first + [s.seconds for s in self.steps]

    def metrics(self) -> Metrics:
        decode = [s.seconds for s in self.steps]
        return Metrics(
            ttft=self.first_token_seconds(),
            itl=float(np.mean(decode)) if decode else None,
            tokens_per_second=len(decode) / sum(decode) if decode and sum(decode) > 0 else None,
            prompt_tokens=self.n_prompt,
            generated_tokens=len(self.tokens),
        )


def _told_ttft(timeline: dict[str, Any] | None) -> float | None:
    """The time to first token a run's timeline states (its `timings`), when it states one."""
    timings = timeline.get("timings") if isinstance(timeline, dict) else None
    value = timings.get("time_to_first_token_seconds") if isinstance(timings, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def round_steps(rec: SpecRoundRecord, first_step: int) -> list[DecodeRecord]:
    """A round's tokens as decode steps, one per token, as plain decoding would have made them.

    The round fed [last token, d_1..d_k] at positions start..start+k in one verify pass; token j of the round came
    out of row j (position start + j). Its captures are that row (`row_captures`), its cache the positions up to
    start + j (bytes in proportion: every position holds the same K and V), and the round's time is shared evenly.
    The run keeps the round without its captures once they are cut into rows (the rejected rows are never drawn);
    the record itself is not changed (a follower's page may read the same one).
    """
    n = len(rec.emitted)
    start, newest = rec.cache.length - n, rec.cache.length - n + len(rec.drafted)
    seconds = (rec.draft_seconds + rec.verify_seconds) / n
    steps = [DecodeRecord(first_step + j, seconds, cache_at(rec.cache, start + j + 1), token,
                          row_captures(rec.captures, start + j, newest)) for j, token in enumerate(rec.emitted)]
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


def compact(record: Record) -> Record:
    """The record with its captured attention as float16: half the session memory, more precision than a plot shows.
    A copy where anything changes: the record may be shared (the server's run store, a follower's page)."""
    captures = getattr(record, "captures", None)
    if not captures or all(c.attention is None or c.attention.dtype == np.float16 for c in captures.values()):
        return record
    halved = {i: c if c.attention is None else replace(c, attention=c.attention.astype(np.float16))
              for i, c in captures.items()}
    return replace(record, captures=halved)


# --- the one call site that runs the model -------------------------------------------------------------

def new_run(lm: ModelClient, request: GenerationRequest, policy: CapturePolicy, note: str | None,
            draft: Draft | None = None, k: int = 0) -> Run:
    """A run about to start; with a draft, a speculative one drafting `k` tokens a round."""
    speculation = Speculation(draft.label, draft.kind, k) if draft is not None else None
    return Run(model=lm.label, spec=lm.spec, request=request, policy=policy, capture_note=note,
               dtype=lm.dtype_name, device=str(lm.device), speculation=speculation)


def stream_generation(lm: ModelClient, run: Run, on_record: Callable[[Run], None],
                      on_wait: Callable[[QueueStatus], None] | None = None, session: str | None = None,
                      draft: Draft | None = None, checked: CheckedRequest | None = None) -> Run:
    """Run `run.request` through the model's scheduler, calling `on_record(run)` after every record.

    `checked` is the request as the page already checked it at the door; without it the request is checked at
    submit (an EngineError when refused). While the request waits, `on_wait(status)` is called a few times a
    second with its queue position and estimated wait. If `on_record` or `on_wait` raises (Streamlit stops a
    script that way when the user presses Stop or leaves the page) the request is cancelled at once, queued or
    running. A request the server stopped at its time limit keeps what streamed; `run.warning` says why. The run
    takes the server's run id at submit.

    A speculative run (`draft` given, `run.speculation` set) is followed by plain decoding of the same
    request into `run.speculation.baseline`, unless it was stopped; `on_record(run)` follows that too.
    The speedup compares the engine's own per-record timings, so another session's request running
    between the two does not skew it.
    """
    request = checked if checked is not None else run.request
    spec = run.speculation
    extra = {"draft": draft.spec, "k": spec.k} if spec is not None and draft is not None else {}
    handle = lm.submit(request, run.policy, session=session, **extra)
    run.id = handle.run_id
    follow(handle, run, run, on_record, on_wait)
    run.timeline = getattr(handle, "story", None)
    run.warning = str(handle.error) if handle.error is not None else None
    if spec is not None and run.done is not None and run.done.finish_reason not in ("cancelled", "timeout"):
        spec.baseline = Run(model=run.model, spec=run.spec, request=run.request, policy=run.policy,
                            dtype=run.dtype, device=run.device)
        baseline = lm.submit(request, run.policy, session=session, parent=run.id)
        spec.baseline.id = baseline.run_id
        follow(baseline, spec.baseline, run, on_record, on_wait, keep_captures=False)
    return run


def settle(lm: ModelClient, run: Run) -> None:
    """After a Stop: wait until the server has ended the run and written its file, so that the link the page shows
    opens whatever dies next; `run.kept` is False when the server could not say (it went away as the run stopped),
    and until it has said: a page drawn meanwhile (the next run's, once Streamlit stops waiting for this one) shows
    the unconfirmed line, not a bare one."""
    run.kept = False
    try:
        run.kept = not lm.run_wait(run.id, PAST_ANY_END, SETTLE_SECONDS).info.live
    except EngineError:
        run.kept = False


def follow(handle: Any, into: Run, run: Run, on_record: Callable[[Run], None],
           on_wait: Callable[[QueueStatus], None] | None, keep_captures: bool = True) -> None:
    """Add each record of `handle` to `into` and call `on_record(run)`; cancel the request if a callback raises.

    The baseline of a speculative run captures what the run captured, so both pay the same for it, and drops it
    as it arrives (`keep_captures=False`): only its timings are read.
    """
    try:
        for record in handle.records(on_wait=on_wait):
            if not keep_captures and getattr(record, "captures", None):
                record = replace(record, captures={})
            into.add(compact(record))
            on_record(run)
    finally:
        handle.cancel()          # a no-op once finished
        into.live = False


# --- a run opened by id ------------------------------------------------------------------------------------------

def run_from_slice(part: RunSlice, spec: ModelSpec, into: Run | None = None) -> Run:
    """A run as the server keeps it (a presenter's, a `?run=` link's), or `into` grown by the records after it."""
    run = into if into is not None else run_of(part.info, spec)
    for record in part.records:
        run.add(compact(record))
    run.live = part.info.live
    run.timeline = getattr(part.info, "timeline", None)
    run.kept = not part.info.live or None          # read back from the server: it has it
    if part.info.error and not part.info.live:
        run.warning = part.info.error
    return run


def run_of(info: RunInfo, spec: ModelSpec) -> Run:
    """An empty Run for a stored run's info (its records are added by `run_from_slice`)."""
    speculation = None
    if info.kind == "speculative":
        kind = "ngram" if info.draft.startswith("ngram") else "early-exit" if info.draft.startswith("early") else "model"
        speculation = Speculation(info.label or info.draft, kind, info.k)
    return Run(model=info.model, spec=spec, request=info.request, policy=info.policy, id=info.id,
               started=info.created, speculation=speculation)


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

