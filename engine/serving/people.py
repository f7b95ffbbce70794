"""Who is in the room: browser sessions grouped by person, counted against the launch limit, and forgotten when
their tab is gone or they have been idle too long. One registry per server (the scheduler's), or one for a whole
cluster of replicas (its ingress's): the room's count of people is the same rule wherever it is kept.

    people = People(limit=lambda: 40, busy=lambda session: False)
    people.presence = is_still_connected          # set by whoever can tell (the web processes' reports)
    people.join("tab-1", person="p1")             # SessionLimitError when the room is full
    people.leave("tab-1")
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from engine.errors import QueueFullError

SESSION_IDLE_SECONDS = 900.0   # a person unseen this long no longer counts against the limit


class SessionLimitError(QueueFullError):
    """The server already serves as many browser sessions as it was launched for."""


def retry_after(err: Exception, seconds: float) -> Exception:
    """The error with the seconds after which trying again should work (an HTTP server's Retry-After)."""
    err.retry_after = seconds
    return err


class People:
    """Sessions and the people behind them; thread-safe. `busy(session)`: a session with a request in flight is
    never forgotten."""

    def __init__(self, limit: Callable[[], int], busy: Callable[[str], bool] = lambda session: False):
        self.limit, self.busy = limit, busy
        self.presence: Callable[[str], bool] | None = None      # is a browser session still connected?
        self._people: dict[str, float] = {}                      # person -> last seen (monotonic)
        self._person_of: dict[str, str] = {}                     # browser session -> the person it belongs to
        self._lock = threading.RLock()

    def __len__(self) -> int:
        return len(self._people)

    def join(self, session: str, person: str | None = None) -> None:
        """Count a person as present (all of one browser's tabs and reloads are one person, when the caller says
        who it is); SessionLimitError when the room is full."""
        with self._lock:
            now, limit = time.monotonic(), self.limit()
            person = person or self._person_of.get(session, session)
            self._prune(now)
            if person not in self._people and len(self._people) >= limit:
                back = max(1, round((min(self._people.values()) + SESSION_IDLE_SECONDS - now) / 60))
                who = "person" if limit == 1 else "people"
                raise retry_after(SessionLimitError(
                    f"this server already serves {limit} {who}, its limit of browser sessions; a place frees as soon "
                    f"as someone closes their tab, and at the latest in {back} minute(s); meanwhile follow the "
                    "presenter's screen"), 60.0 * back)
            self._person_of[session] = person
            self._people[person] = now

    def leave(self, session: str) -> None:
        with self._lock:
            person = self._person_of.pop(session, session)
            if person not in self._person_of.values():
                self._people.pop(person, None)

    def _prune(self, now: float) -> None:
        """Forget browser sessions that are gone, and people with no session left or idle too long."""
        if self.presence is not None:
            for s in [s for s in self._person_of if not self.busy(s) and not self.presence(s)]:
                del self._person_of[s]
        present = set(self._person_of.values())
        for p, seen in list(self._people.items()):
            idle = now - seen > SESSION_IDLE_SECONDS and not any(
                q == p and self.busy(s) for s, q in self._person_of.items())
            if p not in present or idle:
                del self._people[p]
                for s in [s for s, q in self._person_of.items() if q == p and not self.busy(s)]:
                    del self._person_of[s]
