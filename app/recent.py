"""A person's last runs survive a reload: kept in this web process by person (app.session.person_id: the browser's
cookie, the same across reloads and tabs), so that a new Streamlit session of the same person, after a reload or in
a second tab, draws the run that person last looked at, and the Recordings page lists the others.

Bounded by the server's limits for kept recordings: at most `max_saved_per_session` runs per person (0: none kept)
and `max_saved_mb` for everyone together; the oldest go first.

    remember(run, limits)       # a finished run this session made or opened
    reopen_last(limits)         # once per session, before the page draws: the person's newest run, if any
    recent(limits)              # this person's runs, newest first (the Recordings page lists them)
"""
from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np
import streamlit as st

from app.run import LAST_RUN, Run
from app.session import person_id
from engine.serving.limits import MiB, Limits, server_limits

REOPENED_KEY = "recent.reopened"      # set once this session has looked for the person's last run
RECORD_BYTES = 4096                   # a record's own fields, beside its captured arrays


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
    """Finished runs by person, newest first: at most `per_person` each and `total_bytes` for all; thread-safe."""

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
    """The one store of this web process, bounded by the launch variables until the model's limits are known."""
    limits = server_limits()
    return RecentRuns(limits.max_saved_per_session, limits.max_saved_mb * MiB)


def store(limits: Limits | None = None) -> RecentRuns:
    """The store, its bounds the model server's own limits when given."""
    runs = recent_runs()
    if limits is not None:
        runs.per_person, runs.total_bytes = limits.max_saved_per_session, limits.max_saved_mb * MiB
    return runs


def remember(run: Run | None, limits: Limits | None = None) -> None:
    """Keep a finished run for this person (a run still streaming, or one with no first token, is not kept)."""
    if run is not None and run.prefill is not None and run.done is not None:
        store(limits).add(person_id(), run)


def recent(limits: Limits | None = None) -> list[Run]:
    """This person's kept runs, newest first."""
    return store(limits).runs(person_id())


def reopen_last(limits: Limits | None = None) -> Run | None:
    """Once per session: with no run yet (a reload, a second tab), the person's newest run becomes the session's."""
    if st.session_state.get(REOPENED_KEY) or st.session_state.get(LAST_RUN) is not None:
        st.session_state[REOPENED_KEY] = True
        return None
    st.session_state[REOPENED_KEY] = True
    runs = recent(limits)
    if not runs:
        return None
    from app.recordings import make_current            # here: app.recordings imports this module

    make_current(runs[0])
    return runs[0]
