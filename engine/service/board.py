"""The presenter's board: one person at the front pushes a prompt, settings, a view or a request's story (a run, by
its id), and broadcasts their runs; every follower picks them up. State and rules only (no UI): the app draws it
(app/room/presenter.py), the model server keeps it (one board for every web process), clients reach it through their
ModelClient.

The presenter unlocks it with the token given at launch (compared in constant time). Each push gets a new version
number; a follower adopts a push once, when it sees a version newer than the last one it adopted. A broadcast
names the presenter's run by its id in the run store: followers stream that run from the server.

Everything a push carries is plain data, bounded and checked here: followers' pages never render it as HTML.
"""
from __future__ import annotations

import hmac
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

MAX_PROMPT_CHARS = 20_000
MAX_NOTE_CHARS = 500
SETTINGS = {"temperature": float, "top_k": int, "top_p": float, "seed": int, "max_new_tokens": int}
VIEW_KEYS = {"layer": int, "head": int, "step": int, "token": int}


class PresenterError(Exception):
    """A push that is refused: presenter mode off, a wrong token, or a value out of bounds."""


@dataclass(frozen=True)
class Push:
    """What the presenter pushed, version-numbered."""

    version: int
    prompt: str | None = None
    settings: dict[str, float | int] = field(default_factory=dict)
    page: str | None = None          # url path of the page to show ("attention", "kv-cache", ...)
    view: dict[str, int] = field(default_factory=dict)   # layer, head, step, token
    note: str = ""                   # one line for followers ("Look at head 3 of layer 12")
    at: float = field(default_factory=time.time)
    run: str | None = None           # a run whose story to show (the room page's pick of a request), by its id


@dataclass(frozen=True)
class BoardState:
    enabled: bool
    latest: Push | None
    live_version: int
    live_run: str | None
    followers_may_generate: bool


class PresenterBoard:
    """The latest push, behind a lock; only the holder of the token can write it."""

    def __init__(self, token: str | None):
        self._token = token.encode() if token else None
        self._lock = threading.Lock()
        self._latest: Push | None = None
        self._version = 0
        self._live: str | None = None      # the id of the presenter's latest run (in the run store), for watchers
        self._live_version = 0
        self.followers_may_generate = True

    def broadcast(self, token: str | None, run_id: str) -> int:
        """Share the presenter's run with every watcher, by its id: they stream it from the run store."""
        self._authorize(token)
        with self._lock:
            self._live_version += 1
            self._live = str(run_id)
            return self._live_version

    def live(self) -> tuple[int, str | None]:
        """(version, run id) of the presenter's latest run, or (0, None)."""
        with self._lock:
            return self._live_version, self._live

    def allow_generate(self, token: str | None, allowed: bool) -> None:
        self._authorize(token)
        self.followers_may_generate = bool(allowed)

    @property
    def enabled(self) -> bool:
        return self._token is not None

    def check(self, token: str | None) -> bool:
        """True when `token` is the presenter's (constant-time comparison)."""
        if self._token is None or not token:
            return False
        return hmac.compare_digest(self._token, token.encode())

    def push(self, token: str | None, prompt: str | None = None, settings: Mapping[str, Any] | None = None,
             page: str | None = None, view: Mapping[str, Any] | None = None, note: str = "",
             run: str | None = None) -> Push:
        """Publish a new push to every follower; PresenterError when refused."""
        self._authorize(token)
        fields_ = dict(prompt=_prompt(prompt), settings=_settings(settings or {}), page=_page(page),
                       view=_view(view or {}), note=_text(note, MAX_NOTE_CHARS, "the note"), run=_run(run))
        with self._lock:
            self._version += 1
            self._latest = Push(self._version, **fields_)
            return self._latest

    def clear(self, token: str | None) -> None:
        """Stop leading: followers keep what they have and see no new push."""
        self._authorize(token)
        with self._lock:
            self._latest = None

    def latest(self) -> Push | None:
        with self._lock:
            return self._latest

    def state(self) -> "BoardState":
        """Everything a follower's page reads, in one consistent snapshot (one request for a remote client)."""
        with self._lock:
            return BoardState(self.enabled, self._latest, self._live_version, self._live,
                              self.followers_may_generate)

    def _authorize(self, token: str | None) -> None:
        if self._token is None:
            raise PresenterError("presenter mode is off on this server; start it with "
                                 "`playground --presenter-token auto`")
        if not self.check(token):
            raise PresenterError("that is not the presenter token")


def _text(value: Any, limit: int, what: str) -> str:
    if not isinstance(value, str):
        raise PresenterError(f"{what} must be text")
    if len(value) > limit:
        raise PresenterError(f"{what} is {len(value):,} characters; at most {limit:,} can be pushed")
    return value


def _prompt(prompt: str | None) -> str | None:
    return None if prompt is None else _text(prompt, MAX_PROMPT_CHARS, "the prompt")


def _page(page: str | None) -> str | None:
    if page is None:
        return None
    page = _text(page, 64, "the page")
    if not all(c.isalnum() or c in "-_" for c in page):
        raise PresenterError(f"{page!r} is not a page name")
    return page


def _run(run: str | None) -> str | None:
    """A run id as the run store makes them (engine.service.runs.new_run_id: "run-" and hex digits)."""
    if run is None:
        return None
    run = _text(run, 64, "the run")
    if not (run.startswith("run-") and len(run) > 4 and all(c in "0123456789abcdef" for c in run[4:])):
        raise PresenterError(f"{run!r} is not a run id")
    return run


def _numbers(values: Mapping[str, Any], allowed: Mapping[str, type], what: str) -> dict[str, Any]:
    out = {}
    for key, value in values.items():
        kind = allowed.get(key)
        if kind is None:
            raise PresenterError(f"{key!r} is not a {what} that can be pushed ({', '.join(allowed)})")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or abs(value) > 2**62:
            raise PresenterError(f"{key} must be a number")
        out[key] = kind(value)
    return out


def _settings(values: Mapping[str, Any]) -> dict[str, Any]:
    return _numbers(values, SETTINGS, "setting")


def _view(values: Mapping[str, Any]) -> dict[str, int]:
    return _numbers(values, VIEW_KEYS, "view field")
