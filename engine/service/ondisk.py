"""The service's finished runs on disk (engine/store), and back.

    writer = RunWriter(service.runs, disk, file_of=lambda part: ...)   # a thread of its own
    writer.ending(run_id); ...close it...; writer.finished(run_id)   # its run file, written in the background
    writer.flush(timeout=10)              # every finished run so far is on disk (or waits for space)
    part = slice_from_disk(disk, run_id, limits)   # a kept run as the service's RunSlice, its records from the file

Every finished generation (pages' and the API's alike: every one goes through the service) is written once, as the
run file `GET /v1/playground/runs/{id}/file` serves. Once it is on disk the live runs (LiveRuns) let go of its records (a
run whose kept layer inputs recompute its attention stays whole, within their budget), so memory
holds the live runs and little else, and a run read by id after that, or after a restart, comes from its file.

A write that fails (a full disk, a quota) gets one line in the log and keeps the run in memory, held there and
tried again every RETRY_SECONDS while the files of the runs waiting come to at most PENDING_BYTES, so a run that
finished for its client can still be opened by its id; serving goes on throughout. (A count of 512 was the bound
before: an hour's soak with the disk full for 7.5 minutes finished about 630 small runs meanwhile, and the oldest
117 were let go of; 256 MiB holds several thousand answers of the API, or a few hundred captured ones.)
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from typing import Any, Callable

from engine.core.records import DoneRecord, SpecDoneRecord
from engine.errors import EngineError
from engine.runs import RunFileError, loads, unpacked_cap
from engine.service.runs import RunInfo, RunNotFoundError, RunSlice, LiveRuns
from engine.serving.limits import Limits
from engine.store import RunDisk, StoredRun, StoreError, StoreWriteError

RETRY_SECONDS = 5.0
DRAIN_SLICE_SECONDS = 0.25             # once the disk takes files again, the backlog is written in slices this long,
                                       # each run finished meanwhile first (a page waits for its Stop's file)
WAIT_SECONDS = 10.0                    # the longest an answer's end waits for its file to be written
PENDING_BYTES = 256 * 2**20           # runs held in memory while the disk refuses them, by their files' sizes
log = logging.getLogger("engine.service")


class RunWriter:
    """Writes each finished run's file to the store from one thread; holds the ones the disk refused."""

    def __init__(self, runs: LiveRuns, disk: RunDisk, file_of: Callable[[RunSlice], bytes]):
        self.runs, self.disk, self.file_of = runs, disk, file_of
        self.pending: OrderedDict[str, int] = OrderedDict()      # refused by the disk, oldest first: its file's bytes
        self.n_written = self.failed = self.dropped = 0
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._idle = threading.Condition()
        self._busy = 0
        self._waiting: dict[str, threading.Event] = {}          # run id -> set once its file is written (or held)
        self._thread = threading.Thread(target=self._loop, name="playground-run-writer", daemon=True)
        self._thread.start()

    def ending(self, run_id: str) -> None:
        """Before a run closes: held in memory until its file is on disk (closing a captured run settles its kept
        inputs and may evict), and waited for by `written` from the moment a reader can see it ended."""
        with self._idle:
            self._busy += 1
            self._waiting[run_id] = threading.Event()
        self.runs.hold(run_id)

    def finished(self, run_id: str) -> None:
        """After it closed (`ending` first): its file is written in the writer's thread."""
        self._queue.put(run_id)

    def written(self, run_id: str, timeout: float = WAIT_SECONDS) -> None:
        """Return once the run's file is on disk (or the disk refused it and memory holds it), at most `timeout`."""
        with self._idle:
            event = self._waiting.get(run_id)
        if event is not None:
            event.wait(timeout)

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every run handed over so far was written or set pending; True when it was."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._busy and time.monotonic() < deadline:
                self._idle.wait(deadline - time.monotonic())
            return self._busy == 0

    def close(self, timeout: float = 10.0) -> None:
        self.flush(timeout)
        self._queue.put(None)

    def _loop(self) -> None:
        draining = False                     # the disk took the last held file and more wait: go on at once
        while True:
            try:
                run_id = self._queue.get(timeout=(0.0 if draining else RETRY_SECONDS) if self.pending else None)
            except queue.Empty:
                draining = self._retry()
                continue
            if run_id is None:
                return
            try:
                self._write(run_id)
            finally:
                with self._idle:
                    self._busy -= 1
                    event = self._waiting.pop(run_id, None)
                    self._idle.notify_all()
                if event is not None:
                    event.set()

    def _write(self, run_id: str) -> bool:
        """One run's file on disk; False when the disk refused it (it waits in `pending`)."""
        data = b""
        try:
            part = self.runs.slice(run_id)
            data = self.file_of(part)
            self.disk.put(stored_row(part), data)
        except (RunFileError, RunNotFoundError):
            self.runs.release(run_id)        # a job, a run stopped before its first token, a run already gone
            return True
        except StoreWriteError:
            self.failed += 1
            self._hold(run_id, len(data))
            return False
        except Exception as err:  # noqa: BLE001 - a run that cannot be written must not stop the writer
            log.warning("run store: run %s could not be written (%s: %s)", run_id, type(err).__name__, err)
            self.runs.release(run_id)
            return True
        self.n_written += 1
        self.pending.pop(run_id, None)
        self.runs.release(run_id, on_disk=True)
        return True

    def _hold(self, run_id: str, size: int) -> None:
        self.pending[run_id] = size
        self.pending.move_to_end(run_id)
        while len(self.pending) > 1 and sum(self.pending.values()) > PENDING_BYTES:
            oldest, _ = self.pending.popitem(last=False)
            self.runs.release(oldest)
            self.dropped += 1
            log.warning("run store: %d runs (%.0f MiB) wait for disk space; run %s is held in memory no longer",
                        len(self.pending), sum(self.pending.values()) / 2**20, oldest)

    def _retry(self) -> bool:
        """Write held runs, oldest first, for at most DRAIN_SLICE_SECONDS; True when the disk took them and more wait
        (the writer looks at newly finished runs, then goes on). An hour's backlog written in one go kept a Stop's
        page waiting past the 10 s Streamlit gives it, so its run was drawn without its link."""
        deadline = time.monotonic() + DRAIN_SLICE_SECONDS
        for run_id in list(self.pending):
            if not self._write(run_id):
                return False                 # still refused: the rest wait for the next try
            if time.monotonic() > deadline:
                break
        return bool(self.pending)


def stored_row(part: RunSlice) -> StoredRun:
    """The index row of a finished run (all its records in `part`)."""
    info, request = part.info, part.info.request
    return StoredRun(info.id, info.created, info.model, info.kind, info.source, info.parent,
                     (request.prompt if request is not None else info.label)[:200], answer_of(part.records)[:200])


def slice_from_disk(disk: RunDisk, run_id: str, limits: Limits) -> RunSlice:
    """A kept run as the service's RunSlice: its info and every record, read from its run file.
    RunNotFoundError (with the store's reason) when the store has no readable file for it."""
    try:
        row = disk.row(run_id)
        run = loads(disk.read(run_id), f"run {run_id}", limits, max_bytes=unpacked_cap(limits))
    except (StoreError, RunFileError) as err:
        raise RunNotFoundError(str(err)) from None
    rec = run.recording
    done = rec.done if isinstance(rec.done, DoneRecord) else None
    info = RunInfo(run_id, "speculative" if isinstance(done, SpecDoneRecord) else "generation",
                   row.source or "page", rec.model, None, rec.request, rec.policy, parent=row.parent,
                   created=row.created, state="cancelled" if done and done.finish_reason == "cancelled" else "done",
                   finished=row.created, n_records=len(rec.records), bytes=row.size, timeline=rec.timeline)
    if isinstance(done, SpecDoneRecord):
        info.draft, info.k, info.label = done.draft, done.k, done.draft
    return RunSlice(info, 0, list(rec.records))


def info_of_row(row: StoredRun) -> RunInfo:
    """A kept run as a list entry (its request and records stay in the file)."""
    return RunInfo(row.id, row.kind if row.kind in ("generation", "speculative") else "generation",
                   row.source or "page", row.model, parent=row.parent, created=row.created, state="done",
                   finished=row.created, bytes=row.size, label=row.title[:60])


def open_disk(open_store: Callable[[], RunDisk]) -> tuple[RunDisk | None, str | None]:
    """The run store, or None and the line that says why runs are not kept on disk (the service serves on)."""
    try:
        return open_store(), None
    except EngineError as err:
        log.warning("run store: %s", err)
        return None, str(err)


def answer_of(records: list[Any]) -> str:
    done = records[-1] if records else None
    return done.text if isinstance(done, DoneRecord) else ""
