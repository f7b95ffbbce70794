"""A person's runs survive a reload, a second tab, and a restart of their web process, of the model server or of the
whole room: every finished run is a file in the run store (engine/store; the model server writes the runs it makes,
this module the runs a person opened from a file), and the store's index lists, for each person (the browser's
cookie: app.room.session.person_id, the same across reloads, tabs and web processes), the runs they made or opened.

    remember(run, limits)         # a finished run this session made or opened: listed for this person
    recent(limits)                # this person's runs (`Recent`), newest first: the Recordings page lists them
    open_recent(item, limits, lm) # one of them as a Run: from its file in the store, else from the model server
    reopen_last(limits, lm)       # once per session, before the page draws: the person's newest run, if any
    make_current(run)             # the run every page shows from now on (and remembered)

At most `max_saved_per_session` runs per person are listed (0: none). When the store cannot be used (turned off,
written by a newer playground, a full disk) this process keeps them in memory instead, within `max_saved_mb` for
everyone, and the Recordings page says so.
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import streamlit as st

from app.runs.recorded import recording_from_run, run_from_recording
from app.runs.request import SETTING_RANGES, in_range
from app.runs.run import LAST_RUN, Run, run_from_slice
from app.room.session import person_id
from engine import runs as run_files
from engine.errors import EngineError
from engine.runs.kept import import_shelf
from engine.service.client import ModelClient
from engine.serving.limits import MiB, Limits, server_limits
from engine.store import RunDisk, RunGoneError, StoredRun, StoreError, open_store

REOPENED_KEY = "recent.reopened"      # set once this session has looked for the person's last run
RECORD_BYTES = 4096                   # a record's own fields, beside its captured arrays
log = logging.getLogger("app.runs.recent")


@dataclass(frozen=True)
class Recent:
    """One of a person's runs as the Recordings page lists it."""

    id: str
    at: float                         # when the person made or opened it
    title: str                        # the prompt's start
    answer: str
    model: str
    kept: bool                        # its file is in the store (or this process holds the run)
    run: Run | None = None            # held in this process's memory (the store could not take it)


# --- the store, and this process's memory when the store cannot be used ----------------------------------------

@st.cache_resource(show_spinner=False)
def run_store() -> tuple[RunDisk | None, str | None]:
    """This process's handle on the run store, or None and the line that says why runs are not kept on disk."""
    try:
        disk = open_store()
    except StoreError as err:
        log.warning("run store: %s", err)
        return None, str(err)
    import_shelf(disk)                         # recordings people kept before run files: kept runs from now on
    return disk, None


def store_note() -> str | None:
    return run_store()[1]


def run_bytes(run: Run) -> int:
    """Memory a run holds: its records and every array they captured (a speculative run's baseline included)."""
    records = [r for r in (run.prefill, *run.steps, run.done) if r is not None]
    total = RECORD_BYTES * len(records)
    for record in records:
        for cap in (getattr(record, "captures", None) or {}).values():
            total += sum(v.nbytes for v in vars(cap).values() if isinstance(v, np.ndarray))
    base = run.speculation.baseline if run.speculation is not None else None
    return total + (run_bytes(base) if base is not None else 0)


class RecentRuns:
    """Finished runs by person, newest first: at most `per_person` each and `total_bytes` for all; thread-safe.
    Used only while the run store cannot take them."""

    def __init__(self, per_person: int, total_bytes: int):
        self.per_person, self.total_bytes = per_person, total_bytes
        self._runs: OrderedDict[str, list[tuple[Run, int]]] = OrderedDict()    # person -> [(run, bytes)], newest 1st
        self._lock = threading.Lock()

    def add(self, person: str, run: Run) -> None:
        if self.per_person <= 0 or self.total_bytes <= 0:
            return
        size = run_bytes(run)
        with self._lock:
            kept = [(r, n) for r, n in self._runs.pop(person, []) if r.id != run.id]
            self._runs[person] = [(run, size), *kept][: self.per_person]
            self._trim()

    def runs(self, person: str) -> list[Run]:
        with self._lock:
            return [r for r, _ in self._runs.get(person, [])]

    @property
    def bytes(self) -> int:
        return sum(n for runs in self._runs.values() for _, n in runs)

    def _trim(self) -> None:
        """Drop the oldest runs of the people seen longest ago until everything fits."""
        while self._runs and self.bytes > self.total_bytes:
            person, runs = next(iter(self._runs.items()))
            runs.pop()
            if not runs:
                del self._runs[person]


@st.cache_resource(show_spinner=False)
def recent_runs() -> RecentRuns:
    limits = server_limits()
    return RecentRuns(limits.max_saved_per_session, limits.max_saved_mb * MiB)


def in_memory(limits: Limits | None = None) -> RecentRuns:
    """This process's memory of runs the store could not take, bounded by the model server's limits when given."""
    runs = recent_runs()
    if limits is not None:
        runs.per_person, runs.total_bytes = limits.max_saved_per_session, limits.max_saved_mb * MiB
    return runs


# --- what the pages call ------------------------------------------------------------------------------------------

def remember(run: Run | None, limits: Limits | None = None) -> None:
    """List a finished run for this person (a run still streaming, or one with no first token, is not listed). A run
    opened from a file gets its file written here; the model server wrote the runs it made."""
    limits = limits or server_limits()
    if run is None or run.prefill is None or run.done is None or limits.max_saved_per_session <= 0:
        return
    disk = run_store()[0]
    try:
        if disk is None:
            raise StoreError(store_note() or "no run store")
        if run.source is not None:
            keep_file(disk, run)
        disk.claim(person_id(), run.id, run.request.prompt, run.text, run.model, keep=limits.max_saved_per_session)
    except StoreError:
        in_memory(limits).add(person_id(), run)          # this process keeps it: the Recordings page says why


def keep_file(disk: RunDisk, run: Run) -> None:
    """A run opened from a file (a recording, an upload) into the store, once."""
    try:
        disk.row(run.id)
        return
    except RunGoneError:
        pass
    data = run_files.dumps(recording_from_run(run))
    disk.put(StoredRun(run.id, run.started, run.model, "recording", "upload", None, run.request.prompt[:200],
                       run.text[:200]), data)


def recent(limits: Limits | None = None) -> list[Recent]:
    """This person's runs, newest first: those the store lists, and any this process holds in memory."""
    limits = limits or server_limits()
    disk, person = run_store()[0], person_id()
    rows = [Recent(c.id, c.at, c.title, c.answer, c.model, c.kept)
            for c in (disk.claims(person, limits.max_saved_per_session) if disk is not None else [])]
    held = [Recent(r.id, r.started, r.request.prompt, r.text, r.model, True, r) for r in in_memory(limits).runs(person)]
    merged = {item.id: item for item in rows}
    merged.update({item.id: item for item in held})
    return sorted(merged.values(), key=lambda item: item.at, reverse=True)[: max(limits.max_saved_per_session, 0)]


def open_recent(item: Recent, limits: Limits | None = None, lm: ModelClient | None = None) -> Run:
    """One of the person's runs as a Run: held here, else from its file in the store, else (a run the model server
    has not written yet) from the server by id. An EngineError says why it cannot be opened."""
    if item.run is not None:
        return item.run
    disk = run_store()[0]
    if disk is not None:
        try:
            return run_from_disk(disk, item.id, limits or server_limits())
        except RunGoneError:
            if lm is None:
                raise
    if lm is None:
        raise RunGoneError(f"run {item.id} is not in the run store, and no model server is at hand to ask")
    return run_from_slice(lm.run_slice(item.id), lm.spec)


def run_from_disk(disk: RunDisk, run_id: str, limits: Limits) -> Run:
    """A run read back from its file in the store (a speculative run with its plain baseline, when that was kept)."""
    row = disk.row(run_id)
    run = run_from_file(disk, run_id, limits, row.kind)
    run.started = row.created
    if run.speculation is not None and run.speculation.baseline is None:
        child = next(iter(disk.rows(1, parent=run_id)), None)
        if child is not None:
            run.speculation.baseline = run_from_file(disk, child.id, limits, child.kind)
    return run


def run_from_file(disk: RunDisk, run_id: str, limits: Limits, kind: str) -> Run:
    data = disk.read(run_id)
    run = run_from_recording(run_files.loads(data, f"run {run_id}", limits,
                                             max_bytes=run_files.unpacked_cap(limits)).recording)
    run.id = run_id
    if kind != "recording":
        run.source = None                     # the person's own run, not a recording they opened
    return run


def reopen_last(limits: Limits | None = None, lm: ModelClient | None = None) -> Run | None:
    """Once per session: with no run yet (a reload, a second tab, a restarted web process), the person's newest
    run becomes the session's."""
    if st.session_state.get(REOPENED_KEY) or st.session_state.get(LAST_RUN) is not None:
        st.session_state[REOPENED_KEY] = True
        return None
    st.session_state[REOPENED_KEY] = True
    items = recent(limits)
    if not items:
        return None
    try:
        run = open_recent(items[0], limits, lm)
    except EngineError as err:                       # evicted, set aside, the model server away: the page goes on
        log.info("the last run of this person did not reopen: %s", err)
        return None
    make_current(run, limits)
    return run


def make_current(run: Run, limits: Limits | None = None) -> None:
    """The run every page shows from now on; the pages' prompt boxes and sampling controls follow it."""
    st.session_state[LAST_RUN] = run
    remember(run, limits)
    req = run.request
    for ns in ("journey", "attention", "kv"):
        st.session_state[f"{ns}.prompt"] = req.prompt
    for name, value in (("temperature", req.temperature), ("top_k", req.top_k), ("top_p", req.top_p),
                        ("seed", req.seed)):
        _, kind, low, high = SETTING_RANGES[name]
        st.session_state[f"journey.{name}"] = in_range(value, kind, low, high)
    st.session_state["journey.chat"] = req.chat
