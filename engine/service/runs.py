"""The live runs: every run the service made, held in memory for a while so that anyone can look at it by id: its
request, its state and its records (tokens, timings, captures), growing while it streams. Not the run store: that is
engine/store, on disk; a finished run is held here until its file is written there (engine/service/ondisk.py).

    store = LiveRuns(max_runs=256, max_bytes=1 << 30)
    info = store.open(RunInfo(id=new_run_id(), kind="generation", ...))
    store.append(info.id, record)                  # from the scheduler's worker, as each record is made
    store.close(info.id, "done")
    part = store.slice(info.id, since=0)           # RunSlice: the info and the records from `since` on
    part = store.wait(info.id, since=3, timeout=1) # the same, once there is something new (a follower's stream)

Bounded: at most `max_runs` runs and `max_bytes` of records; the oldest finished runs go first. A run asked for
after it went is a clear `RunNotFoundError`, never a stale answer. With the run store on disk (engine/store,
engine/service/ondisk.py) a finished run is `hold`-ed until its file is written, then `release`-d: from then on
its file answers for it (the service reads it back), and memory keeps only what recomputes attention.
"""
from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from engine.core.generate import GenerationRequest
from engine.core.hooks import CAPTURE_OFF, CapturePolicy
from engine.errors import EngineError, InvalidRequestError

OPENED_KEPT = 4096             # run ids remembered as made here (engine/cluster/replica.py reports the newest)
STORIES_KEPT = 64              # timelines of runs gone to their files, for the listing (about 0.5 kB a step each)
RECORD_BYTES = 4096            # a record without its captures: the token, 256 kept logits, 10 candidates
FINISHED = ("done", "cancelled", "failed")


class RunNotFoundError(EngineError):
    """No run with that id: never made here, or dropped to make room for newer ones."""


class NothingKeptError(InvalidRequestError):
    """The run exists but kept nothing to recompute its attention from."""


def new_run_id() -> str:
    return "run-" + secrets.token_hex(8)


@dataclass
class RunInfo:
    """What a run is: who asked for what, and where it stands."""

    id: str
    kind: str                                  # "generation", "speculative" or "job"
    source: str                                # "api" (an HTTP client), "page" (a browser session), "cli"
    model: str = ""                            # the model's label
    session: str | None = None
    request: GenerationRequest | None = None
    policy: CapturePolicy = CAPTURE_OFF
    draft: str | None = None                   # speculative: the draft's spec ("ngram", "early-exit:8", a model)
    k: int = 0
    label: str = ""                            # a job's name; a speculative run's draft, as people read it
    parent: str | None = None                  # the run this one measures against (a speculative run's baseline)
    created: float = field(default_factory=time.time)
    state: str = "queued"                      # queued, running, done, cancelled, failed
    error: str | None = None
    finished: float | None = None
    n_records: int = 0
    bytes: int = 0
    timeline: dict[str, Any] | None = None     # once ended: its story and `timings` (engine.serving.timeline.story)

    @property
    def live(self) -> bool:
        return self.state not in FINISHED


@dataclass(frozen=True)
class RunSlice:
    """A run's info and its records from `start` on (all of them when start is 0)."""

    info: RunInfo
    start: int
    records: list[Any]

    @property
    def end(self) -> int:
        return self.start + len(self.records)


@dataclass
class _Entry:
    info: RunInfo
    records: list[Any] = field(default_factory=list)
    kept: Any = None                           # the run's KeptInputs: what recomputes its attention on demand
    kept_bytes: int = 0                        # what the store counts for them
    held: bool = False                         # its file is being written to disk (or waits for space): kept here


class LiveRuns:
    """The service's runs in memory by id (the live and the just finished), bounded in number and bytes; thread-safe."""

    def __init__(self, max_runs: int = 256, max_bytes: int = 1 << 30):
        self.max_runs, self.max_bytes = max_runs, max_bytes
        self._runs: OrderedDict[str, _Entry] = OrderedDict()
        self._bytes = 0
        self._cond = threading.Condition()
        self.on_disk: Callable[[str], bool] = lambda run_id: False     # is a run no longer here kept on disk?
        self._opened: deque[str] = deque(maxlen=OPENED_KEPT)             # ids this store opened, oldest first
        self._stories: OrderedDict[str, dict[str, Any]] = OrderedDict()  # timelines of runs gone to their files

    def open(self, info: RunInfo) -> RunInfo:
        with self._cond:
            self._runs[info.id] = _Entry(info)
            self._opened.append(info.id)
            self._evict()
        return info

    def attach(self, run_id: str, kept: Any, reserved: int) -> None:
        """A run's kept layer inputs, counted in the store's bytes (`reserved` while it runs, what it holds after)."""
        with self._cond:
            entry = self._runs.get(run_id)
            if entry is not None:
                entry.kept, entry.kept_bytes = kept, reserved
                self._grow(entry, reserved)
                self._evict()

    def kept(self, run_id: str) -> tuple[RunInfo, Any, list[Any]]:
        """A run's info, its kept layer inputs and its records; RunNotFoundError when it went, a clear message when it
        kept nothing to recompute attention from."""
        with self._cond:
            if run_id not in self._runs and self.on_disk(run_id):
                raise NothingKeptError(f"run {run_id[:40]!r} is kept on disk, but the layers' inputs that recompute "
                                       "its attention stay only in the memory of the server that made it, which has "
                                       "let go of them (newer runs, or a restart); its tokens, text and timings are "
                                       "on disk, and a file downloaded while it was held carries its maps")
            entry = self._entry(run_id)
            if entry.kept is None:
                raise NothingKeptError(f"run {run_id[:40]!r} kept nothing to compute its attention from: it ran with "
                                       "capture off, or its maps ride in its records")
            return replace(entry.info), entry.kept, list(entry.records)

    def _grow(self, entry: _Entry, size: int) -> None:
        entry.info.bytes += size
        self._bytes += size

    def append(self, run_id: str, record: Any) -> None:
        """One more record (from the worker thread): counted, kept, and any follower woken."""
        size = record_bytes(record)
        with self._cond:
            entry = self._runs.get(run_id)
            if entry is None:
                return                                 # dropped while running: nobody can ask for it any more
            entry.records.append(record)
            entry.info.n_records += 1
            entry.info.bytes += size
            if entry.info.state == "queued":
                entry.info.state = "running"
            self._bytes += size
            self._evict()
            self._cond.notify_all()

    def close(self, run_id: str, state: str, error: str | None = None,
              timeline: dict[str, Any] | None = None) -> None:
        with self._cond:
            entry = self._runs.get(run_id)
            if entry is not None and entry.info.live:
                entry.info.state, entry.info.error, entry.info.finished = state, error, time.time()
                entry.info.timeline = timeline
                self._settle_kept(entry)
            self._cond.notify_all()

    def _settle_kept(self, entry: _Entry) -> None:
        """A finished run's kept inputs shrink to the positions it holds; the store counts what they take now."""
        if entry.kept is None:
            return
        entry.kept.truncate(min(entry.kept.length, positions(entry.records)))
        self._grow(entry, entry.kept.nbytes - entry.kept_bytes)
        entry.kept_bytes = entry.kept.nbytes
        self._evict()

    def hold(self, run_id: str) -> None:
        """Keep a finished run in memory, whatever the bounds, until `release` (its file is being written)."""
        with self._cond:
            entry = self._runs.get(run_id)
            if entry is not None:
                entry.held = True

    def release(self, run_id: str, on_disk: bool = False) -> None:
        """A held run may go again; `on_disk`: its run file is written, so unless its kept layer inputs are needed
        here (to recompute its attention) it leaves memory now and is read back from the file."""
        with self._cond:
            entry = self._runs.get(run_id)
            if entry is None:
                return
            entry.held = False
            if on_disk and entry.kept is None and not entry.info.live:
                self._bytes -= self._runs.pop(run_id).info.bytes
                self._keep_story(run_id, entry.info.timeline)
            self._evict()

    def _keep_story(self, run_id: str, timeline: dict[str, Any] | None) -> None:
        """A run that left memory for its file keeps its timeline here (the last STORIES_KEPT), so the listing of
        runs on disk still says why each took its time (the room page's pick) without reading their files."""
        if timeline:
            self._stories[run_id] = timeline
            while len(self._stories) > STORIES_KEPT:
                self._stories.popitem(last=False)

    def story(self, run_id: str) -> dict[str, Any] | None:
        """The timeline of a run that has gone to its file, while it is among the last STORIES_KEPT; else None."""
        with self._cond:
            return self._stories.get(run_id)

    def __contains__(self, run_id: str) -> bool:
        with self._cond:
            return run_id in self._runs

    def info(self, run_id: str) -> RunInfo:
        with self._cond:
            return replace(self._entry(run_id).info)

    def slice(self, run_id: str, since: int = 0) -> RunSlice:
        with self._cond:
            entry = self._entry(run_id)
            since = min(max(since, 0), len(entry.records))
            return RunSlice(replace(entry.info), since, entry.records[since:])

    def wait(self, run_id: str, since: int, timeout: float) -> RunSlice:
        """The records after `since`, waiting up to `timeout` seconds for one when there are none yet."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                entry = self._entry(run_id)
                left = deadline - time.monotonic()
                if len(entry.records) > since or not entry.info.live or left <= 0:
                    return self.slice(run_id, since)
                self._cond.wait(left)

    def made(self, limit: int = 200) -> list[str]:
        """The ids of the runs this store opened, newest first, whether memory still holds them or their files do
        (a replica names its own runs with it: the folder on disk is every replica's)."""
        with self._cond:
            return list(reversed(self._opened))[:limit]

    def list(self, limit: int = 50) -> list[RunInfo]:
        """The newest runs first."""
        with self._cond:
            return [replace(e.info) for e in reversed(self._runs.values())][:limit]

    @property
    def bytes(self) -> int:
        return self._bytes

    def _entry(self, run_id: str) -> _Entry:
        entry = self._runs.get(run_id)
        if entry is None:
            raise RunNotFoundError(f"no run {str(run_id)[:40]!r} on this server: it was never made here, or it was "
                                   f"dropped to make room for newer runs (the server keeps the last {self.max_runs} "
                                   "runs and a bounded amount of their records)")
        return entry

    def _evict(self) -> None:
        """Drop the oldest finished runs while over either bound (running runs and held ones stay)."""
        while len(self._runs) > self.max_runs or self._bytes > self.max_bytes:
            victim = next((k for k, e in self._runs.items() if not e.info.live and not e.held), None)
            if victim is None:
                return
            self._bytes -= self._runs.pop(victim).info.bytes


def positions(records: list[Any]) -> int:
    """Positions a run's model read: its prompt, then every token it generated but the last (a speculative round's
    rejected drafts are not among them)."""
    n_prompt = next((len(r.prompt) for r in records if getattr(r, "kind", "") == "prefill"), 0)
    tokens = sum(1 if getattr(r, "kind", "") in ("prefill", "decode") else len(getattr(r, "emitted", ()))
                 for r in records if getattr(r, "kind", "") in ("prefill", "decode", "spec_round"))
    return n_prompt + max(tokens - 1, 0)


def record_bytes(record: Any) -> int:
    """Memory a record holds: a fixed share for the token and its logits, plus every captured array."""
    total = RECORD_BYTES
    for cap in (getattr(record, "captures", None) or {}).values():
        for value in vars(cap).values():
            if isinstance(value, np.ndarray):
                total += value.nbytes
    return total
