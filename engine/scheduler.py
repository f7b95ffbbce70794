"""One model, many sessions: a first-come-first-served queue in front of the generation loop.

    scheduler = scheduler_for(lm)                       # one per loaded model, shared by every session
    handle = scheduler.submit(GenerationRequest("Why is the sky blue?"), policy, session="a1b2")
    for record in handle.records(on_wait=lambda s: print(s.position, s.estimated_wait)):
        ...                                             # PrefillRecord, DecodeRecord..., DoneRecord
    handle.cancel()                                     # queued or running; a no-op once finished

A request is checked when it is submitted (settings, prompt length, the launch limits, the memory
its KV cache needs), then waits in a bounded queue. One worker thread takes requests in order and
runs the engine's generator for each under the model's lock, feeding its records into the
handle's own thread-safe queue. Every request gets its own cache and its own capture objects
(engine.generate makes both per call), so nothing one session sees can come from another.

Requests run one at a time rather than batched in one forward pass: see docs/serving.md.
"""
from __future__ import annotations

import itertools
import queue
import statistics
import threading
import time
from collections import deque
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator

import torch

from engine.errors import EngineError, QueueFullError, RequestTimeoutError
from engine.generate import (GenerationRequest, check_types, check_context, encode_prompt, generate,
                             validate)
from engine.hooks import CAPTURE_OFF, CapturePolicy
from engine.limits import Limits, check_memory, check_request, capture_bytes
from engine.loader import LoadedModel, free_memory
from engine.records import DoneRecord

SERVICE_HISTORY = 20           # finished requests the wait estimate averages over
SESSION_IDLE_SECONDS = 900.0   # a session unseen this long no longer counts against max_sessions
TIMELINE_LENGTH = 200          # finished requests kept for `timeline()`
_END = object()                # end of a handle's record stream


class SessionLimitError(QueueFullError):
    """The server already serves as many browser sessions as it was launched for."""


@dataclass(frozen=True)
class QueueStatus:
    """Where a request stands, for the page to show while it waits."""

    state: str                       # "queued", "running", "done", "cancelled", "failed"
    position: int                    # 1 = runs next; 0 once running or finished
    ahead: int                       # requests that start or finish before this one starts (running one included)
    estimated_wait: float | None     # seconds until it starts (None before any request has finished)
    waited: float                    # seconds since it was submitted (until it started)


@dataclass(eq=False)
class Handle:
    """A submitted request: iterate it for records, ask for its status, cancel it."""

    id: int
    request: GenerationRequest
    policy: CapturePolicy
    session: str | None
    scheduler: "Scheduler" = field(repr=False)
    draft: Any = None                # engine.speculative Draft, or None for plain decoding
    k: int = 4
    state: str = "queued"
    error: EngineError | None = None  # why it failed, or RequestTimeoutError when stopped by the time limit
    submitted: float = field(default_factory=time.perf_counter)
    started: float | None = None
    finished: float | None = None
    tokens: int = 0                   # tokens generated (from the final record)
    _records: queue.Queue = field(default_factory=queue.Queue, repr=False)
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)
    _got_done: bool = False

    @property
    def done(self) -> bool:
        return self.state in ("done", "cancelled", "failed")

    def status(self) -> QueueStatus:
        return self.scheduler.status(self)

    def cancel(self) -> None:
        """Stop this request: dropped from the queue, or stopped after the current step if running."""
        self.scheduler.cancel(self)

    def get(self, timeout: float | None = None) -> Any:
        """The next record, None on timeout, or the end marker `Handle.END` once the stream is over."""
        try:
            item = self._records.get(timeout=timeout)
        except queue.Empty:
            return None
        if item is _END:
            self._records.put(_END)          # keep the stream closed for later readers
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
                self._got_done = self._got_done or isinstance(item, DoneRecord)
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
    running: bool = False
    sessions: int = 0
    mean_service: float | None = None
    mean_wait: float | None = None


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


class Scheduler:
    """First come, first served over one shared model, with a bounded queue and one worker thread."""

    def __init__(self, lm: LoadedModel, limits: Limits | None = None):
        self.lm = lm
        self.limits = limits or Limits.for_device(lm.device).with_env()
        self._cond = threading.Condition()
        self._queue: deque[Handle] = deque()
        self._running: Handle | None = None
        self._by_session: dict[str, Handle] = {}
        self._sessions: dict[str, float] = {}
        self._service: deque[float] = deque(maxlen=SERVICE_HISTORY)
        self._waits: deque[float] = deque(maxlen=SERVICE_HISTORY)
        self._spans: deque[Span] = deque(maxlen=TIMELINE_LENGTH)
        self._t0 = time.perf_counter()
        self._ids = itertools.count(1)
        self._stats = SchedulerStats()
        self._closed = False
        self._worker: threading.Thread | None = None

    # --- sessions --------------------------------------------------------------------------------

    def join(self, session: str) -> None:
        """Count a browser session as present; SessionLimitError when the room is full."""
        with self._cond:
            self._join(session)

    def leave(self, session: str) -> None:
        with self._cond:
            self._sessions.pop(session, None)
            handle = self._by_session.pop(session, None)
        if handle is not None:
            handle.cancel()

    def _join(self, session: str) -> None:
        now = time.monotonic()
        for s, seen in list(self._sessions.items()):
            if now - seen > SESSION_IDLE_SECONDS and s not in self._by_session:
                del self._sessions[s]
        if session not in self._sessions and len(self._sessions) >= self.limits.max_sessions:
            raise SessionLimitError(
                f"this server is already serving {self.limits.max_sessions} sessions, its limit; "
                "try again in a few minutes or follow the presenter's screen")
        self._sessions[session] = now

    # --- submitting ------------------------------------------------------------------------------

    def submit(self, request: GenerationRequest, policy: CapturePolicy = CAPTURE_OFF, session: str | None = None,
               draft: Any = None, k: int = 4) -> Handle:
        """Check a request and queue it; raises an EngineError subclass when it cannot be accepted.

        A session has at most one request in flight: submitting again cancels its previous one.
        `draft` (an engine.speculative Draft) runs speculative decoding with `k` drafted tokens per round.
        """
        try:
            self.check(request, policy)
            with self._cond:
                return self._enqueue(request, policy, session, draft, k)
        except EngineError:
            with self._cond:
                self._stats.refused += 1
            raise

    def check(self, request: GenerationRequest, policy: CapturePolicy = CAPTURE_OFF) -> int:
        """Every check made at submit, without queueing; returns the prompt's token count."""
        check_types(request)
        validate(request)
        n_prompt = len(encode_prompt(self.lm, request))
        check_request(self.limits, self.lm.spec, self.lm.dtype_name, n_prompt, request.max_new_tokens, policy)
        check_context(self.lm, n_prompt, request.max_new_tokens)
        self._check_memory(request, policy, n_prompt)
        return n_prompt

    def _check_memory(self, request: GenerationRequest, policy: CapturePolicy, n_prompt: int) -> None:
        spec, new = self.lm.spec, request.max_new_tokens
        check_memory(spec, self.lm.dtype_name, n_prompt + new, device_free_bytes(self.lm.device),
                     capture_bytes(spec, policy, n_prompt, new), self.limits.reserve_mb * 2**20)

    def _enqueue(self, request: GenerationRequest, policy: CapturePolicy, session: str | None,
                 draft: Any, k: int) -> Handle:
        if self._closed:
            raise EngineError("the server is shutting down; no new requests are taken")
        previous = self._by_session.get(session) if session is not None else None
        if session is not None:
            self._join(session)
        frees_a_place = previous is not None and previous.state == "queued"   # it is replaced below
        if len(self._queue) - frees_a_place >= self.limits.max_queue:
            raise QueueFullError(
                f"{len(self._queue)} requests are already waiting, the most this server queues; "
                "try again in a moment")
        if previous is not None and not previous.done:
            self._cancel_locked(previous)
        handle = Handle(next(self._ids), request, policy, session, self, draft, k)
        self._queue.append(handle)
        if session is not None:
            self._by_session[session] = handle
        self._stats.submitted += 1
        self._ensure_worker()
        self._cond.notify_all()
        return handle

    # --- status and cancelling -------------------------------------------------------------------

    def status(self, handle: Handle) -> QueueStatus:
        with self._cond:
            now = time.perf_counter()
            waited = (handle.started or now) - handle.submitted
            if handle.state != "queued":
                return QueueStatus(handle.state, 0, 0, 0.0 if handle.state == "running" else None, waited)
            position = next((i for i, h in enumerate(self._queue, 1) if h is handle), 0)
            ahead = position - 1 + (self._running is not None)
            return QueueStatus("queued", position, ahead, self._estimate(position - 1, now), waited)

    def _estimate(self, queued_ahead: int, now: float) -> float | None:
        """Mean recent service time for each request ahead, less what the running one has already used."""
        if not self._service:
            return None
        mean = statistics.fmean(self._service)
        running = 0.0
        if self._running is not None and self._running.started is not None:
            running = max(mean - (now - self._running.started), 0.0)
        return running + queued_ahead * mean

    def cancel(self, handle: Handle) -> None:
        with self._cond:
            self._cancel_locked(handle)

    def _cancel_locked(self, handle: Handle) -> None:
        handle._cancel.set()
        if handle.state == "queued":
            self._queue.remove(handle)
            self._finish(handle, "cancelled")
            self._stats.cancelled += 1

    def stats(self) -> SchedulerStats:
        with self._cond:
            return replace(self._stats, queued=len(self._queue), running=self._running is not None,
                           sessions=len(self._sessions),
                           mean_service=statistics.fmean(self._service) if self._service else None,
                           mean_wait=statistics.fmean(self._waits) if self._waits else None)

    def timeline(self) -> list[Span]:
        """The last finished requests, oldest first: real queueing data for a page to draw."""
        with self._cond:
            return list(self._spans)

    def close(self, timeout: float = 10.0) -> None:
        """Cancel everything and stop the worker (tests and shutdown)."""
        with self._cond:
            self._closed = True
            for handle in list(self._queue):
                self._cancel_locked(handle)
            if self._running is not None:
                self._running._cancel.set()
            self._cond.notify_all()
        if self._worker is not None:
            self._worker.join(timeout)

    # --- the worker ------------------------------------------------------------------------------

    def _ensure_worker(self) -> None:
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._work, name="playground-scheduler", daemon=True)
            self._worker.start()

    def _work(self) -> None:
        while (handle := self._next()) is not None:
            self._serve(handle)

    def _next(self) -> Handle | None:
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            handle = self._queue.popleft()
            handle.state, handle.started, self._running = "running", time.perf_counter(), handle
            self._waits.append(handle.started - handle.submitted)
            return handle

    def _serve(self, handle: Handle) -> None:
        try:
            self._run(handle)
            state = "done"
        except EngineError as err:
            handle.error, state = err, "failed"
        except Exception as err:  # noqa: BLE001 - one request's failure must not stop the worker
            handle.error = EngineError(f"the generation failed ({type(err).__name__}: {err}); the server is fine, "
                                       "try again")
            state = "failed"
        finally:
            self._release_memory()
        with self._cond:
            self._running = None
            self._service.append(time.perf_counter() - handle.started)
            self._count(handle, state)
            self._finish(handle, "cancelled" if state == "done" and handle._cancel.is_set()
                         and handle.error is None else state)

    def _count(self, handle: Handle, state: str) -> None:
        if isinstance(handle.error, RequestTimeoutError):
            self._stats.timed_out += 1
        elif state == "failed":
            self._stats.failed += 1
        elif handle._cancel.is_set():
            self._stats.cancelled += 1
        else:
            self._stats.served += 1

    def _run(self, handle: Handle) -> None:
        """Generate under the model's lock (and a draft model's), feeding records to the handle."""
        deadline = handle.started + self.limits.request_seconds
        stop = lambda: handle._cancel.is_set() or time.perf_counter() > deadline  # noqa: E731
        with ExitStack() as locks:
            for lock in self._locks(handle):
                locks.enter_context(lock)
            records = self._generator(handle, stop)
            try:
                for record in records:
                    handle._records.put(self._final(handle, record, deadline))
            finally:
                records.close()

    def _locks(self, handle: Handle) -> list[threading.Lock]:
        draft_lm = getattr(handle.draft, "lm", None)
        return [self.lm.lock] + ([draft_lm.lock] if draft_lm is not None and draft_lm is not self.lm else [])

    def _generator(self, handle: Handle, stop: Callable[[], bool]) -> Iterator[Any]:
        if handle.draft is None:
            return generate(self.lm, handle.request, handle.policy, should_stop=stop)
        from engine.speculative import speculative_generate

        return speculative_generate(self.lm, handle.request, handle.draft, handle.k, handle.policy,
                                    should_stop=stop)

    def _final(self, handle: Handle, record: Any, deadline: float) -> Any:
        """A record as the session receives it; a run stopped by the time limit ends as 'timeout'."""
        if not isinstance(record, DoneRecord):
            return record
        handle.tokens = record.generated_tokens
        if record.finish_reason == "cancelled" and not handle._cancel.is_set() and time.perf_counter() > deadline:
            handle.error = RequestTimeoutError(
                f"stopped after {self.limits.request_seconds:g} s, the time limit for one request on this server; "
                f"the {record.generated_tokens} tokens generated so far are kept")
            return replace(record, finish_reason="timeout")
        return record

    def _finish(self, handle: Handle, state: str) -> None:
        handle.state, handle.finished = state, time.perf_counter()
        rel = lambda t: None if t is None else t - self._t0  # noqa: E731
        self._spans.append(Span(handle.id, handle.session, rel(handle.submitted), rel(handle.started),
                                rel(handle.finished), state, handle.tokens))
        if handle.session is not None and self._by_session.get(handle.session) is handle:
            del self._by_session[handle.session]
        handle._records.put(_END)

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
    """The process-wide scheduler of a loaded model (created on first use; `limits` only then)."""
    with _SCHEDULERS_LOCK:
        entry = _SCHEDULERS.get(id(lm))
        if entry is None or entry[0] is not lm:
            entry = (lm, Scheduler(lm, limits))
            _SCHEDULERS[id(lm)] = entry
        return entry[1]
