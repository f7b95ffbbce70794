"""One model, many sessions: a bounded queue in front of a continuous batch.

    scheduler = scheduler_for(lm)                       # one per loaded model, shared by every session
    checked = scheduler.check(GenerationRequest("Why is the sky blue?"), policy)   # raises an EngineError if refused
    handle = scheduler.submit(checked, session="a1b2")  # or submit(request, policy, ...): checked there
    for record in handle.records(on_wait=lambda s: print(s.position, s.estimated_wait)):
        ...                                             # PrefillRecord, DecodeRecord..., DoneRecord
    handle.cancel()                                     # queued or running; a no-op once finished

A request is checked and tokenized once, at this door (settings, prompt length, the launch limits,
the memory its KV cache needs): `check` returns a `CheckedRequest` holding its token ids, which a page
can show and then submit as it is; `submit` takes one (or a bare request, which it checks itself),
then the request waits in a bounded queue. One worker thread admits
waiting requests into the running batch (engine.serving.batch.BatchRunner) whenever it has room, and steps
the batch: every running request gets its next token from the same forward pass, newcomers join at a
step boundary and finished ones leave. Every request keeps its own records and captures, and
receives exactly what it would receive alone (tests check it token for token).

Speculative requests and jobs (speed-lab measurements) run exclusively, in their turn: the batch
drains, the job runs alone, then batching resumes. Nothing outside this worker runs the shared
model. See docs/serving.md.
"""
from __future__ import annotations

import heapq
import itertools
import logging
import queue
import statistics
import threading
import time
from collections import deque
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator

import torch

from engine import settings
from engine.serving.capture import capture_policy
from engine.serving.graphed import graphed_decode
from engine.serving.batch import BatchRunner, Slot, StepInfo, batchable
from engine.errors import EngineError, InvalidRequestError, QueueFullError, RequestTimeoutError
from engine.core.generate import GenerationRequest, check_context, encode_prompt, history_chars, validate
from engine.core.hooks import CAPTURE_OFF, CapturePolicy
from engine.serving.limits import (Limits, capture_bytes, check_capture, check_memory, check_prompt_chars, check_request,
                                   kv_bytes)
from engine.core.kept import KeptInputs, kept_for
from engine.core.loader import LoadedModel, free_memory
from engine.serving.people import People, SessionLimitError, retry_after  # noqa: F401 - SessionLimitError: here too
from engine.serving.prefix import PrefixCache
from engine.serving.threads import ThreadChoice, ThreadTuner
from engine.serving.timeline import (RATE_HISTORY, STOPPED, Rates, RequestTimeline, StepSeen, Timings, rates_of,
                                     story, timings_of)
from engine.core.records import DoneRecord, PrefillRecord
from engine.speculative.decode import speculative_generate
from engine.speculative.drafts import Draft

log = logging.getLogger(__name__)
SERVICE_HISTORY = 20           # finished requests the mean service time averages over
STEP_HISTORY = 400             # batch steps kept for the room view and the wait estimate
TIMELINE_LENGTH = 200          # finished requests kept for `timeline()`
STORIES_KEPT = 64              # finished requests' timelines kept for `story()` (the room page's pick)
WARM_UP_PROMPTS = ("Before the room comes in, the server runs two short prompts like this one once.",
                   "Their prefill and one decode step of two rows pay the model's first call, not the first person.")
_END = object()                # end of a handle's record stream


class JobCancelled(EngineError):
    """A job noticed at one of its progress points that it was cancelled."""


@dataclass(frozen=True)
class CheckedRequest:
    """A request that passed every check at the scheduler's door, with the ids the model will read."""

    request: GenerationRequest
    policy: CapturePolicy
    ids: tuple[int, ...]             # model input (chat template included), encoded once
    door: Any = field(default=None, repr=False, compare=False)   # the Scheduler that checked it

    @property
    def n_prompt(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class JobProgress:
    """A job's progress, streamed to the page that submitted it."""

    fraction: float
    text: str
    kind: str = "progress"
    partial: Any = None              # a result so far, for a page that draws it as the job goes (None: none)


@dataclass(frozen=True)
class JobResult:
    """What a job returned: its last record."""

    value: Any
    kind: str = "result"


@dataclass(frozen=True)
class QueueStatus:
    """Where a request stands, for the page to show while it waits."""

    state: str                       # "queued", "running", "done", "cancelled", "failed"
    position: int                    # 1 = next to join the batch; 0 once running or finished
    ahead: int                       # requests queued before this one
    estimated_wait: float | None     # seconds until it starts, from measured step times (None: nothing measured yet)
    waited: float                    # seconds since it was submitted (until it started)
    running: int = 0                 # requests in the batch now
    batch: int = 1                   # the most the batch holds


@dataclass(eq=False)
class Handle:
    """A submitted request: iterate it for records, ask for its status, cancel it."""

    id: int
    request: GenerationRequest | None
    policy: CapturePolicy
    session: str | None
    scheduler: "Scheduler" = field(repr=False)
    draft: Draft | None = None       # speculative decoding's draft, or None for plain decoding
    k: int = 4
    job: Callable[..., Any] | None = None   # a job run exclusively: job(progress) -> value
    label: str = ""                  # what a job is, for the room view
    ids: list[int] = field(default_factory=list, repr=False)   # the prompt's token ids, encoded once at the door
    state: str = "queued"
    error: EngineError | None = None  # why it failed, or RequestTimeoutError when stopped by the time limit
    submitted: float = field(default_factory=time.perf_counter)
    started: float | None = None
    finished: float | None = None
    tokens: int = 0                   # tokens generated so far
    run_id: str = ""                  # the caller's name for this request (the service's run id)
    kept: KeptInputs | None = field(default=None, repr=False)   # where its residual goes (the policy's hidden states)
    listeners: tuple[Callable[["Handle", Any], None], ...] = field(default=(), repr=False)   # listener(handle, record)
    timeline: RequestTimeline | None = field(default=None, repr=False)   # its story, filled by the worker
    timings: Timings | None = None   # its time taken apart, once it has ended (before its stream's end marker)
    _story: dict[str, Any] | None = field(default=None, repr=False)   # `story`, built once
    _records: queue.Queue = field(default_factory=queue.Queue, repr=False)
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)
    _got_done: bool = False
    _ended: bool = False             # its final record (DoneRecord, JobResult) is made: a Stop from now on is a no-op

    @property
    def done(self) -> bool:
        return self.state in ("done", "cancelled", "failed")

    @property
    def exclusive(self) -> bool:
        return self.draft is not None or self.job is not None

    def status(self) -> QueueStatus:
        return self.scheduler.status(self)

    @property
    def story(self) -> dict[str, Any] | None:
        """Its timeline and timings as plain values once it has ended (engine.serving.timeline.story), else None:
        built once, on first asking (the run store's close, the API's last chunk and the page share it; nothing
        changes a timeline once its timings are taken)."""
        if self._story is None:
            self._story = story(self.timeline, self.timings)
        return self._story

    def cancel(self) -> None:
        """Stop this request: dropped from the queue, or stopped after the current step if running."""
        self.scheduler.cancel(self)

    def _put(self, item: Any) -> None:
        """A record for the reader and each listener, in the worker's thread (listeners: cheap calls only). The end
        marker goes to the listeners first: a reader that has seen the end finds the run already closed where the
        listeners keep it (on a fast machine `result()` returned before the run store's close had run). The final
        record marks the handle ended before anyone has it: a reader that stops once it has it (a Stop a moment late,
        a loop that breaks at the DoneRecord) finds the request done, not cancelled, though the worker settles it
        after the reader has the record."""
        self._ended = self._ended or isinstance(item, (DoneRecord, JobResult))
        if item is not _END:
            self._records.put(item)
        for listener in self.listeners:
            try:
                listener(self, item)
            except Exception:  # noqa: BLE001 - an observer's bug must not fail the request or the batch
                log.exception("a listener of request %s failed", self.id)
        if item is _END:
            self._records.put(item)

    def get(self, timeout: float | None = None) -> Any:
        """The next record, None on timeout, or the end marker `Handle.END` once the stream is over."""
        try:
            item = self._records.get(timeout=timeout)
        except queue.Empty:
            return None
        if item is _END:
            self._records.put(_END)          # keep the stream closed for later readers (listeners saw it once)
        return item

    END = _END

    def records(self, on_wait: Callable[[QueueStatus], None] | None = None,
                poll: float = 0.25) -> Iterator[Any]:
        """Yield records as they come, calling `on_wait(status)` every `poll` seconds without one.

        Raises the request's EngineError if it failed before its final record. Closing the
        iterator early (or an exception in the consumer's loop body) cancels the request.
        """
        try:
            while (item := self.get(timeout=poll)) is not _END:
                if item is None:
                    if on_wait is not None:
                        on_wait(self.status())
                    continue
                self._got_done = self._got_done or isinstance(item, (DoneRecord, JobResult))
                yield item
            if self.error is not None and not self._got_done:
                raise self.error
        finally:
            if not self.done:
                self.cancel()

    def __iter__(self) -> Iterator[Any]:
        return self.records()

    def result(self, timeout: float | None = None) -> list[Any]:
        """Every record, waiting up to `timeout` seconds in all (for scripts and tests)."""
        deadline = None if timeout is None else time.perf_counter() + timeout

        def check(_: QueueStatus) -> None:
            if deadline is not None and time.perf_counter() > deadline:
                raise RequestTimeoutError(f"request {self.id} did not finish within {timeout} s")

        return list(self.records(on_wait=check, poll=0.05))

    def value(self, timeout: float | None = None) -> Any:
        """A job's return value (raises its error if it failed)."""
        results = [r for r in self.result(timeout) if isinstance(r, JobResult)]
        if not results:
            raise self.error or JobCancelled("the job was cancelled before it finished")
        return results[-1].value

    @property
    def wait_seconds(self) -> float | None:
        return None if self.started is None else self.started - self.submitted

    @property
    def service_seconds(self) -> float | None:
        return None if self.started is None or self.finished is None else self.finished - self.started


@dataclass
class SchedulerStats:
    """Counters since the scheduler started, and the state of the queue now."""

    submitted: int = 0
    refused: int = 0                 # raised at submit: invalid, over a limit, queue full, room full
    served: int = 0                  # ran to their final record
    cancelled: int = 0
    timed_out: int = 0
    failed: int = 0
    queued: int = 0
    running: int = 0                 # requests in the batch (or the one exclusive job) now
    max_batch: int = 1
    sessions: int = 0
    mean_service: float | None = None
    mean_wait: float | None = None
    step_seconds: float | None = None   # median of the recent batch steps


@dataclass(frozen=True)
class Span:
    """One finished request on the scheduler's timeline (seconds since the scheduler was made)."""

    id: int
    session: str | None
    submitted: float
    started: float | None          # None: cancelled while queued
    finished: float
    state: str
    tokens: int


@dataclass(frozen=True)
class RoomMember:
    """One request in the running batch, as the room view shows it."""

    id: int
    session: str | None
    phase: str                     # "prefill", "decode" or the job's label
    prompt_tokens: int
    tokens: int                    # generated so far
    max_new_tokens: int
    seconds: float                 # since it joined the batch
    run_id: str = ""               # the service's name for it (GET /v1/playground/runs/{run_id})


@dataclass(frozen=True)
class RoomState:
    """The live batch: who is in it, the recent steps, and the queue (measured, this server)."""

    members: tuple[RoomMember, ...]
    steps: tuple[StepInfo, ...]    # oldest first
    queued: int
    max_batch: int
    sessions: int
    t0: float                      # perf_counter of the scheduler's start (steps' `at` is relative to it)
    threads: ThreadChoice | None = None   # torch's CPU threads for the steps, and how they were chosen (None: GPU)


class Scheduler:
    """A bounded queue, a continuous batch and one worker thread over one shared model."""

    def __init__(self, lm: LoadedModel, limits: Limits | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        self.lm = lm
        self.limits = limits or Limits.for_device(lm.device).with_env()
        self.clock = clock          # what the time limit reads (a test passes one that ticks once per reading)
        self._cond = threading.Condition()
        self._queue: deque[Handle] = deque()
        self._running: dict[Handle, Slot | None] = {}    # in the batch (a Slot) or the exclusive job (None)
        self.prefix = PrefixCache(self.limits.prefix_cache_mb * 2**20)
        self._batchable = batchable(lm)
        self.threads = ThreadTuner.for_device(lm.device)   # CPU threads measured under the live load
        self._runner = self._new_runner()
        self._by_session: dict[str, Handle] = {}
        self.people = People(lambda: self.limits.max_sessions, busy=lambda session: session in self._by_session)
        self._service: deque[float] = deque(maxlen=SERVICE_HISTORY)
        self._waits: deque[float] = deque(maxlen=SERVICE_HISTORY)
        self._steps: deque[StepInfo] = deque(maxlen=STEP_HISTORY)
        self._spans: deque[Span] = deque(maxlen=TIMELINE_LENGTH)
        self._stories: deque[RequestTimeline] = deque(maxlen=STORIES_KEPT)
        self._one_row: deque[float] = deque(maxlen=RATE_HISTORY)              # one-row decode-only steps' seconds
        self._prefill_rate: deque[tuple[int, float]] = deque(maxlen=RATE_HISTORY)   # (tokens, seconds) per prefill
        self._step_index = 0
        # False (PLAYGROUND_TIMELINES=0): no per-request timeline, only to measure what keeping one costs (bench/timings.py)
        self.keep_timelines = settings.current().timelines
        self._t0 = time.perf_counter()
        self._ids = itertools.count(1)
        self._stats = SchedulerStats()
        self._closed = False
        self._worker: threading.Thread | None = None
        self.warmed: tuple[StepInfo, ...] = ()     # the warm-up's steps (`warm_up`), before any request

    def _new_runner(self) -> BatchRunner:
        return BatchRunner(self.lm, max_batch=self.limits.max_batch, prefix=self.prefix,
                           graphs=graphed_decode(self.lm, self.limits))

    # --- sessions --------------------------------------------------------------------------------

    def join(self, session: str, person: str | None = None) -> None:
        """Count a person as present (all of one browser's tabs and reloads are one person, when the app
        says who it is); SessionLimitError when the room is full."""
        with self._cond:
            self.people.join(session, person)

    def leave(self, session: str) -> None:
        with self._cond:
            self.people.leave(session)
            handle = self._by_session.pop(session, None)
        if handle is not None:
            handle.cancel()

    @property
    def presence(self) -> Callable[[str], bool] | None:
        return self.people.presence

    @presence.setter
    def presence(self, value: Callable[[str], bool] | None) -> None:
        self.people.presence = value

    # --- submitting ------------------------------------------------------------------------------

    def submit(self, request: GenerationRequest | CheckedRequest, policy: CapturePolicy | None = None,
               session: str | None = None, draft: Draft | None = None, k: int = 4, run_id: str = "",
               listeners: tuple[Callable[[Handle, Any], None], ...] = (), kept: KeptInputs | None = None) -> Handle:
        """Queue a request; raises an EngineError subclass when it cannot be accepted.

        A `CheckedRequest` from `check` is not validated or tokenized again: only what may have changed since
        is checked (a `policy` given here against the capture limits, and the memory free now). A bare request
        is checked here, once. A session has at most one request in flight: submitting again cancels its
        previous one. `draft` runs speculative decoding with `k` drafted tokens per round, exclusively (the
        batch drains first). `run_id` names it for the caller; each of `listeners` is called as `listener(handle, record)`
        for every record (and the end marker `Handle.END`, once the handle's state is final) in the worker's thread
        as it is made, whether or not anyone reads the handle. `kept` receives the residual stream the policy keeps
        (its hidden states), at every position; without one, a policy that captures keeps it in buffers made here.
        """
        try:
            checked = self._recheck(request, policy) if isinstance(request, CheckedRequest) else self.check(
                request, CAPTURE_OFF if policy is None else policy)
            with self._cond:
                handle = self._new_handle(checked.request, checked.policy, session, draft=draft, k=k,
                                          ids=list(checked.ids), run_id=run_id, listeners=listeners,
                                          kept=self._kept(checked, kept))
                return self._enqueue(handle)
        except EngineError:
            with self._cond:
                self._stats.refused += 1
            raise

    def submit_job(self, job: Callable[[Callable[[float, str], None]], Any], label: str,
                   session: str | None = None, run_id: str = "",
                   listeners: tuple[Callable[[Handle, Any], None], ...] = ()) -> Handle:
        """Queue work that needs the model to itself (a speed-lab measurement): `job(progress)` -> value.

        It runs in its turn, alone; its handle streams JobProgress records and ends with a JobResult.
        `progress(fraction, text)` raises JobCancelled once the handle is cancelled.
        """
        try:
            with self._cond:
                return self._enqueue(self._new_handle(None, CAPTURE_OFF, session, job=job, label=label, run_id=run_id,
                                                      listeners=listeners))
        except EngineError:
            with self._cond:
                self._stats.refused += 1
            raise

    def _kept(self, checked: CheckedRequest, kept: KeptInputs | None) -> KeptInputs | None:
        """Where a request's residual goes: the caller's buffers, or new ones when its policy captures."""
        if not checked.policy.enabled:
            return None
        return kept if kept is not None else kept_for(self.lm, checked.policy,
                                                      checked.n_prompt + checked.request.max_new_tokens)

    def check(self, request: GenerationRequest, policy: CapturePolicy = CAPTURE_OFF) -> CheckedRequest:
        """Every check made at submit, without queueing: validated and tokenized once, here at the door."""
        validate(request)
        check_prompt_chars(self.limits, request.prompt, request.system,      # before the tokenizer runs
                           history_chars(request))
        ids = encode_prompt(self.lm, request)
        check_request(self.limits, self.lm.spec, self.lm.dtype_name, len(ids), request.max_new_tokens, policy)
        check_context(self.lm, len(ids), request.max_new_tokens)
        self._check_memory(request, policy, len(ids))
        return CheckedRequest(request, policy, tuple(ids), door=self)

    def _recheck(self, checked: CheckedRequest, policy: CapturePolicy | None) -> CheckedRequest:
        """A checked request at submit: its capture policy (when one is given) and the memory free now."""
        if checked.door is not self:
            raise InvalidRequestError("this request was checked for another model; check it again")
        if policy is not None and policy != checked.policy:
            checked = replace(checked, policy=policy)
            check_capture(self.limits, self.lm.spec, policy, checked.n_prompt, checked.request.max_new_tokens,
                          self.lm.dtype.itemsize)
        self._check_memory(checked.request, checked.policy, checked.n_prompt)
        return checked

    def _check_memory(self, request: GenerationRequest, policy: CapturePolicy, n_prompt: int) -> None:
        """Enough memory for this request's cache and captures, after what the batch and the queue will still take."""
        spec, new = self.lm.spec, request.max_new_tokens
        with self._cond:
            promised = sum(self._still_needs(h) for h in [*self._queue, *self._running])
        check_memory(spec, self.lm.dtype_name, n_prompt + new, device_free_bytes(self.lm.device) - promised,
                     capture_bytes(spec, policy, n_prompt, new, self.lm.dtype.itemsize), self.limits.reserve_mb * 2**20)

    def _still_needs(self, handle: Handle) -> float:
        if handle.request is None:
            return 0.0
        total = len(handle.ids) + handle.request.max_new_tokens
        held = len(handle.ids) + handle.tokens if handle.state == "running" else 0
        return kv_bytes(self.lm.spec, self.lm.dtype_name, max(total - held, 0))

    def _new_handle(self, request: GenerationRequest | None, policy: CapturePolicy, session: str | None,
                    **kw: Any) -> Handle:
        return Handle(next(self._ids), request, policy, session, self, **kw)

    def _enqueue(self, handle: Handle) -> Handle:
        if self._closed:
            raise EngineError("the server is shutting down; no new requests are taken")
        session = handle.session
        previous = self._by_session.get(session) if session is not None else None
        if session is not None:
            self.people.join(session)
        frees_a_place = previous is not None and previous.state == "queued"   # it is replaced below
        waiting = len(self._queue) - frees_a_place - self._free_places()       # beyond the places free now
        if waiting >= self.limits.max_queue:
            many = f"{waiting} requests are" if waiting != 1 else "1 request is"
            hint, seconds = self._retry_hint()
            raise retry_after(QueueFullError(f"{many} already waiting for a place in the batch, the most this server "
                                             f"queues; try again in {hint}"), seconds)
        if previous is not None and not previous.done:
            self._cancel_locked(previous)
        if self.keep_timelines:
            handle.timeline = self._story(handle)
        self._queue.append(handle)
        if session is not None:
            self._by_session[session] = handle
        self._stats.submitted += 1
        self._ensure_worker()
        self._cond.notify_all()
        return handle

    def _story(self, handle: Handle) -> RequestTimeline:
        """A new request's timeline, with why it will wait (if it will) as things stand now."""
        if any(h.exclusive for h in self._running):
            reason = "a request running alone (a job or speculative decoding)"
        elif self._queue:
            reason = "the queue ahead"
        elif self._free_places() <= 0:
            reason = "the batch full"
        elif not self._runner.idle:
            reason = "the server busy with a step"
        else:
            reason = ""
        return RequestTimeline(handle.id, handle.submitted, handle.run_id, len(handle.ids), reason, len(self._queue),
                               waited_steps=self._step_index, alone=handle.exclusive)

    def _free_places(self) -> int:
        """Places in the batch the queue's first requests take at the next step (none while a job runs)."""
        if any(h.exclusive for h in self._running):
            return 0
        return max(self.limits.max_batch - len(self._running), 0)

    def _retry_hint(self) -> tuple[str, float]:
        """When a place should free, in words and in seconds (from the measured step time)."""
        step = self._step_seconds()
        if step is None:
            return "a minute", 60.0
        soonest = min((h.request.max_new_tokens - h.tokens for h in self._running if h.request), default=0)
        seconds = max(1, round(soonest * step))
        return f"about {seconds} s, when a place in the batch frees", float(seconds)

    # --- status and cancelling -------------------------------------------------------------------

    def status(self, handle: Handle) -> QueueStatus:
        with self._cond:
            now = time.perf_counter()
            waited = (handle.started or now) - handle.submitted
            running, batch = len(self._running), self.limits.max_batch
            if handle.state != "queued":
                return QueueStatus(handle.state, 0, 0, 0.0 if handle.state == "running" else None, waited,
                                   running, batch)
            position = next((i for i, h in enumerate(self._queue, 1) if h is handle), 0)
            return QueueStatus("queued", position, position - 1, self._estimate(position), waited, running, batch)

    def _step_seconds(self) -> float | None:
        """Median of the recent decode steps (measured), or None before any."""
        recent = [s.seconds for s in list(self._steps)[-50:] if s.decode_rows]
        return statistics.median(recent) if recent else None

    def _estimate(self, position: int) -> float | None:
        """Seconds until the request at `position` joins the batch, if everyone uses all their tokens.

        Each place in the batch frees when its request has generated its last allowed token; the
        requests ahead take the places in order. Steps are timed from the batch as it runs now.
        """
        step = self._step_seconds()
        if step is None:
            return None
        free_at = [self._steps_left(h) for h in self._running]                    # steps until each place frees
        free_at += [0] * max(self.limits.max_batch - len(free_at), 0)
        heapq.heapify(free_at)
        for handle in list(self._queue)[:position - 1]:
            start = max(free_at) if handle.exclusive else heapq.heappop(free_at)
            if handle.exclusive:
                free_at = [start + self._steps_left(handle)] * self.limits.max_batch
            else:
                heapq.heappush(free_at, start + self._steps_left(handle))
        return free_at[0] * step if free_at else 0.0

    def _steps_left(self, handle: Handle) -> int:
        if handle.request is None:
            mean = statistics.fmean(self._service) if self._service else 10.0
            return max(1, round(mean / (self._step_seconds() or 0.1)))
        chunks = -(-len(handle.ids) // self._runner.prefill_chunk) if handle.state == "queued" else 0
        return chunks + handle.request.max_new_tokens - handle.tokens

    def cancel(self, handle: Handle) -> None:
        with self._cond:
            self._cancel_locked(handle)

    def _cancel_locked(self, handle: Handle) -> None:
        if handle._ended:                  # its final record is made (perhaps read): nothing left to stop
            return
        if handle.timeline is not None and handle.timeline.stop_pressed is None and not handle.done:
            handle.timeline.stop_pressed = time.perf_counter()
        handle._cancel.set()
        if handle.state == "queued":
            self._queue.remove(handle)
            self._finish(handle, "cancelled")
            self._stats.cancelled += 1

    def stats(self) -> SchedulerStats:
        with self._cond:
            return replace(self._stats, queued=len(self._queue), running=len(self._running),
                           max_batch=self.limits.max_batch, sessions=len(self.people),
                           mean_service=statistics.fmean(self._service) if self._service else None,
                           mean_wait=statistics.fmean(self._waits) if self._waits else None,
                           step_seconds=self._step_seconds())

    def timeline(self) -> list[Span]:
        """The last finished requests, oldest first: real queueing data for a page to draw."""
        with self._cond:
            return list(self._spans)

    def room(self) -> RoomState:
        """The live batch and its recent steps, for the room view."""
        with self._cond:
            now = time.perf_counter()
            members = tuple(self._member(h, slot, now) for h, slot in self._running.items())
            return RoomState(members, tuple(self._steps), len(self._queue), self.limits.max_batch,
                             len(self.people), self._t0, self.threads.choice() if self.threads else None)

    def _member(self, handle: Handle, slot: Slot | None, now: float) -> RoomMember:
        if handle.request is None or slot is None:
            phase = handle.label or ("speculative" if handle.draft is not None else "job")
        else:
            phase = "prefill" if not slot.generated else "decode"
        return RoomMember(handle.id, handle.session, phase, len(handle.ids), handle.tokens,
                          handle.request.max_new_tokens if handle.request else 0, now - (handle.started or now),
                          handle.run_id)

    def close(self, timeout: float = 10.0) -> None:
        """Cancel everything and stop the worker (tests and shutdown)."""
        with self._cond:
            self._closed = True
            for handle in list(self._queue):
                self._cancel_locked(handle)
            for handle in self._running:
                handle._cancel.set()
            self._cond.notify_all()
        if self._worker is not None:
            self._worker.join(timeout)

    # --- warming up ---------------------------------------------------------------------------

    def warm_up(self) -> tuple[StepInfo, ...]:
        """One short prefill and one decode step of two rows (the room's usual shapes: an API client's request and a
        page's, which keeps its residual), run by the scheduler's own worker thread on its own batch runner before it
        takes a request: a fresh process's first passes pay one-off costs (on a CPU, seconds for a prefill that takes
        a tenth of a second warm: memory first touched by the thread that steps, the first batched step's packed
        weights), which the first person's timeline would otherwise blame on their prefill. Not a request: no step
        log, timeline, pace or count keeps it, and the prefix cache forgets its prompts. Returns once it has run;
        `scheduler_for` calls it, so a server is ready after it."""
        failed: list[Exception] = []
        with self._cond:
            if self._worker is not None or self._queue or not self._runner.idle:
                return self.warmed                     # requests came first: they warmed it
            try:
                groups = self._warm_up_slots(failed)
            except EngineError as err:                 # limits that refuse it (a prompt cap of a few tokens)
                log.info("no warm-up: %s", err)
                return self.warmed
            done = threading.Event()
            self._worker = threading.Thread(target=self._work, args=(groups, failed, done), name="playground-scheduler",
                                            daemon=True)
            self._worker.start()
        done.wait()
        return self.warmed

    def _run_warm_up(self, groups: list[list[Slot]], failed: list[Exception]) -> None:
        """The warm-up's steps, in the worker's thread (the thread every later step runs in), kept by nothing."""
        steps: list[StepInfo] = []
        with self.lm.lock:
            try:
                for group in groups:
                    for slot in group:
                        self._runner.add(slot)
                    while not self._runner.idle and len(steps) < 12:  # 2 or 3 steps a group: a bound, not a guess
                        steps.append(self._runner.step())
                    self.prefix.clear()                                # the next group prefills its prompts whole
            except Exception as err:  # noqa: BLE001 - a failed warm-up leaves the server to serve as before
                failed.append(err)
        with self._cond:
            self.prefix.clear()
            self.prefix.stats = type(self.prefix.stats)()           # its lookups are no one's
            if failed or not self._runner.idle:
                log.warning("the warm-up did not finish (%s): the first request pays the first call",
                            failed[0] if failed else "still running")
                self._runner = self._new_runner()
            self.warmed = tuple(steps)

    def _warm_up_slots(self, failed: list[Exception]) -> list[list[Slot]]:
        """What the warm-up runs, group after group: one request alone (one row: the lone prefill and decode step),
        then two together (where the batch takes two: the batched prefill and decode step). Checked at the door like
        any; one of each keeps its residual as a page's run does, where the limits allow; the records go nowhere."""
        def slot(prompt: str, pages: bool) -> Slot:
            c = self.check(GenerationRequest(prompt, max_new_tokens=2))
            c = self._pages_capture(c) if pages else c
            return Slot(c.request, list(c.ids), c.policy, lambda record: None, failed.append, kept=self._kept(c, None))

        first, second = WARM_UP_PROMPTS
        groups = [[slot(first, True)]]
        if self._batchable and self._runner.room >= 2:
            groups.append([slot(second, False), slot(second, True)])     # in one step: both prefill it whole
        return groups

    def _pages_capture(self, checked: CheckedRequest) -> CheckedRequest:
        """The request with the capture a page asks for (engine.serving.capture), or as it was where it is refused."""
        policy, _ = capture_policy(self.lm.spec, checked.n_prompt, checked.request.max_new_tokens,
                                   budget=self.limits.max_capture_bytes, max_layers=self.limits.max_capture_layers,
                                   value_bytes=self.lm.dtype.itemsize)
        try:
            return self._recheck(checked, policy)
        except EngineError:                             # capture over the limits: the warm-up runs without it
            return checked

    # --- the worker ------------------------------------------------------------------------------

    def _ensure_worker(self) -> None:
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._work, name="playground-scheduler", daemon=True)
            self._worker.start()

    def _work(self, warm: list[list[Slot]] | None = None, failed: list[Exception] | None = None,
              warmed: threading.Event | None = None) -> None:
        self._warm_graphs()
        if warm and warmed is not None:
            try:
                self._run_warm_up(warm, failed if failed is not None else [])
            finally:
                warmed.set()
        while True:
            with self._cond:
                while not self._queue and self._runner.idle and not self._closed:
                    self._cond.wait()
                if self._closed and self._runner.idle:
                    return
                exclusive = self._admit()
            if exclusive is not None:
                self._serve_exclusive(exclusive)
            elif not self._runner.idle:
                self._step()

    def _warm_graphs(self) -> None:
        """The graphed step compiled and recorded before the worker serves (on the graphs' own thread, which
        replays them: engine/serving/graphed.py `on_own_thread`)."""
        graphs = self._runner.graphs
        if graphs is not None:
            with self.lm.lock:
                graphs.ensure_warm()

    def _admit(self) -> Handle | None:
        """Move waiting requests into the batch while it has room; an exclusive one waits for it to drain."""
        while self._queue and not self._closed:
            head = self._queue[0]
            if head.exclusive:
                if not self._runner.idle:
                    return None
                self._start(self._queue.popleft(), None)
                return head
            self._runner.max_batch = self.limits.max_batch if self._batchable else 1   # limits may change
            if self._runner.room <= 0:
                return None
            handle = self._queue.popleft()
            self._start(handle, None)
            try:
                self._running[handle] = slot = self._slot(handle)
                self._runner.add(slot)
            except Exception as err:  # noqa: BLE001 - this request fails alone
                self._failed(handle, err)
                self._settle(handle)
        return None

    def _start(self, handle: Handle, slot: Slot | None) -> None:
        handle.state, handle.started = "running", time.perf_counter()
        self._running[handle] = slot
        if handle.timeline is not None:
            handle.timeline.admitted = handle.started
            handle.timeline.waited_steps = self._step_index - handle.timeline.waited_steps
        self._waits.append(handle.started - handle.submitted)

    def _slot(self, handle: Handle) -> Slot:
        deadline = self._deadline()
        stop = lambda: handle._cancel.is_set() or self.clock() > deadline  # noqa: E731
        emit = lambda record: handle._put(self._final(handle, record, deadline))  # noqa: E731
        return Slot(handle.request, handle.ids, handle.policy, emit, lambda err: self._failed(handle, err), stop,
                    kept=handle.kept, tag=handle, label=handle.id)

    def _deadline(self) -> float:
        """When a request starting now must stop: `request_seconds` later on the scheduler's clock."""
        return self.clock() + self.limits.request_seconds

    def _failed(self, handle: Handle, err: Exception) -> None:
        handle.error = err if isinstance(err, EngineError) else EngineError(
            f"the generation failed ({type(err).__name__}: {err}); the server is fine, try again")

    def _step(self) -> None:
        """One batch step under the model's lock, with the threads the tuner wants; then settle the requests that
        finished in it."""
        try:
            with self.lm.lock:
                if self.threads is not None:
                    self.threads.before_step(prefill=bool(self._runner.prefilling))
                info = self._runner.step()
            if self.threads is not None:
                self.threads.after_step(info.seconds, info.decode_rows, info.prefill_tokens)
        except Exception as err:  # noqa: BLE001 - a bug in a step must not stop the worker
            for slot in self._runner.slots:
                self._failed(slot.tag, err)
                slot.finished = True
            self._runner = self._new_runner()
            self.prefix.clear()
            info = None
        with self._cond:
            if info is not None and (info.decode_rows or info.prefill_tokens):
                self._steps.append(info)
                self._lived(info)
            for handle, slot in list(self._running.items()):
                if slot is not None and slot.finished:
                    self._settle(handle)

    def _lived(self, info: StepInfo) -> None:
        """One step into the timeline of every request in the batch (one shared record), and into the measured pace."""
        self._step_index += 1
        if not info.mixed:               # one forward for prompt and rows measures neither rate: left out
            self._measured(info)
        if not self.keep_timelines:
            return
        seen = StepSeen(self._step_index, info.started, info.seconds, info.prefill_seconds, info.tags, info.prefills)
        for handle, slot in self._running.items():
            timeline = handle.timeline
            if slot is not None and timeline is not None and timeline.stopped is None:
                timeline.steps.append(seen)

    def _measured(self, info: StepInfo) -> None:
        """A step into the measured pace: the prefill rate, or the one-row decode-only step."""
        if info.prefill_tokens and info.prefills:
            self._prefill_rate.append((sum(n for _, n in info.prefills), info.prefill_seconds))
        elif info.decode_rows == 1:
            self._one_row.append(info.seconds)

    def rates(self) -> Rates:
        """This server's measured pace: its one-row decode-only step and its prefill rate (recent steps)."""
        with self._cond:
            return rates_of(self._one_row, self._prefill_rate, self._runner.prefill_chunk)

    def story(self, request_id: int) -> RequestTimeline | None:
        """A running or recently finished request's timeline, by the scheduler's id (None: not kept)."""
        with self._cond:
            live = [h.timeline for h in [*self._running, *self._queue] if h.id == request_id]
            return next((t for t in [*live, *self._stories] if t is not None and t.id == request_id), None)

    def _settle(self, handle: Handle) -> None:
        """A request left the batch: count it, time it, end its stream."""
        del self._running[handle]
        state = "failed" if handle.error is not None and not isinstance(handle.error, RequestTimeoutError) else "done"
        self._service.append(time.perf_counter() - handle.started)
        self._count(handle, state)
        self._finish(handle, "cancelled" if state == "done" and handle._cancel.is_set()
                     and handle.error is None else state)
        self._cond.notify_all()

    def _serve_exclusive(self, handle: Handle) -> None:
        """A speculative request or a job, alone on the model (and its draft's), in its turn."""
        try:
            self._run_exclusive(handle)
        except JobCancelled:
            pass
        except EngineError as err:
            handle.error = err
        except Exception as err:  # noqa: BLE001 - one request's failure must not stop the worker
            self._failed(handle, err)
        finally:
            self._release_memory()
        with self._cond:
            self._settle(handle)

    def _run_exclusive(self, handle: Handle) -> None:
        deadline = self._deadline()
        stop = lambda: handle._cancel.is_set() or self.clock() > deadline  # noqa: E731
        with ExitStack() as locks:
            for lock in self._locks(handle):
                locks.enter_context(lock)
            if handle.job is not None:
                handle._put(JobResult(handle.job(self._progress(handle))))
                return
            records = speculative_generate(self.lm, handle.request, handle.draft, handle.k, handle.policy,
                                           should_stop=stop, ids=handle.ids, kept=handle.kept)
            try:
                for record in records:
                    handle._put(self._final(handle, record, deadline))
            finally:
                records.close()

    def _progress(self, handle: Handle) -> Callable[..., None]:
        def report(fraction: float, text: str, partial: Any = None) -> None:
            if handle._cancel.is_set():
                raise JobCancelled("cancelled")
            handle._put(JobProgress(float(fraction), str(text), partial=partial))
        return report

    def _count(self, handle: Handle, state: str) -> None:
        if isinstance(handle.error, RequestTimeoutError):
            self._stats.timed_out += 1
        elif state == "failed":
            self._stats.failed += 1
        elif handle._cancel.is_set():
            self._stats.cancelled += 1
        else:
            self._stats.served += 1

    def _locks(self, handle: Handle) -> list[threading.Lock]:
        draft_lm = getattr(handle.draft, "lm", None)
        return [self.lm.lock] + ([draft_lm.lock] if draft_lm is not None and draft_lm is not self.lm else [])

    def _final(self, handle: Handle, record: Any, deadline: float) -> Any:
        """A record as the session receives it; a run stopped by the time limit ends as 'timeout'."""
        record = self._timed(handle, record, deadline)
        if handle.timeline is not None:
            self._note(handle.timeline, record)
        return record

    @staticmethod
    def _note(timeline: RequestTimeline, record: Any) -> None:
        """What a record tells the timeline: the first token, the prefix reused, how it ended."""
        if timeline.first_token is None and isinstance(record, PrefillRecord):
            timeline.first_token = time.perf_counter()
            timeline.reused_tokens = getattr(record, "reused_tokens", 0)
        elif isinstance(record, DoneRecord):
            timeline.finish_reason = record.finish_reason
            if record.finish_reason in STOPPED:
                timeline.stopped = time.perf_counter()

    def _timed(self, handle: Handle, record: Any, deadline: float) -> Any:
        if not isinstance(record, DoneRecord):
            handle.tokens += len(record.emitted) if hasattr(record, "emitted") else int(hasattr(record, "token"))
            return record
        handle.tokens = record.generated_tokens
        if record.finish_reason == "cancelled" and not handle._cancel.is_set() and self.clock() > deadline:
            handle.error = RequestTimeoutError(
                f"stopped after {self.limits.request_seconds:g} s, the time limit for one request on this server; "
                f"the {record.generated_tokens} tokens generated so far are kept")
            return replace(record, finish_reason="timeout")
        return record

    def _finish(self, handle: Handle, state: str) -> None:
        handle.state, handle.finished = state, time.perf_counter()
        self._end_story(handle)
        rel = lambda t: None if t is None else t - self._t0  # noqa: E731
        self._spans.append(Span(handle.id, handle.session, rel(handle.submitted), rel(handle.started),
                                rel(handle.finished), state, handle.tokens))
        if handle.session is not None and self._by_session.get(handle.session) is handle:
            del self._by_session[handle.session]
        handle._put(_END)

    def _end_story(self, handle: Handle) -> None:
        """Close a request's timeline and take its time apart, before its stream's end marker goes out."""
        timeline = handle.timeline
        if timeline is None:
            return
        timeline.state, timeline.finished, timeline.generated = handle.state, handle.finished, handle.tokens
        if timeline.admitted is None:                        # cancelled while queued: its Stop ends it there
            timeline.stopped = timeline.stopped or handle.finished
        try:
            handle.timings = timings_of(timeline, rates_of(self._one_row, self._prefill_rate,
                                                           self._runner.prefill_chunk))
        except Exception:  # noqa: BLE001 - a bug in the accounting must not fail the request
            log.exception("the timings of request %s failed", handle.id)
        self._stories.append(timeline)

    def _release_memory(self) -> None:
        if self.lm.device.type == "cuda":
            torch.cuda.empty_cache()


def device_free_bytes(device: torch.device) -> float:
    """Memory a new request can still use: free device memory plus what PyTorch's allocator holds unused."""
    free = free_memory(device)
    if device.type == "cuda":
        free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return free


_SCHEDULERS: dict[int, tuple[LoadedModel, Scheduler]] = {}
_SCHEDULERS_LOCK = threading.Lock()


def scheduler_for(lm: LoadedModel, limits: Limits | None = None) -> Scheduler:
    """The process-wide scheduler of a loaded model (created on first use, or after the last one was closed;
    `limits` only then), warmed up before anyone gets it: every server (one process, the model server, each
    replica) builds its service through here before it says it is ready."""
    with _SCHEDULERS_LOCK:
        entry = _SCHEDULERS.get(id(lm))
        if entry is None or entry[0] is not lm or entry[1]._closed:
            entry = (lm, Scheduler(lm, limits))
            entry[1].warm_up()
            _SCHEDULERS[id(lm)] = entry
        return entry[1]
