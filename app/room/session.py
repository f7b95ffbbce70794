"""This browser tab on the shared server: its id for the scheduler, the person behind it, its seat in the
room (the session limit), and the presenter it follows.

Every widget key is namespaced by the page (`journey.temperature`, `kv.prompt`, ...), so a push fills
the keys of the page it names.
"""
from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
import uuid
from typing import Callable

import streamlit as st
from streamlit.runtime import Runtime
from streamlit.runtime.scriptrunner import get_script_run_ctx

from app.hosting.model import REFUSED_KEY
from app.ui.nav import page_info
from app.room.presenter import PENDING_KEY, SEEN_KEY, follow_page, presenter_board, push_button, pushed_view
from engine.service.client import ModelClient
from engine.serving.scheduler import SessionLimitError

XSRF_COOKIE = "_streamlit_xsrf"     # set by Streamlit's server on the first page load, kept by the browser
SESSION_KEY = "session.id"

_STREAMLIT_SESSIONS: dict[str, str] = {}     # our session id -> Streamlit's, to ask whether the tab is still there
PROCESS = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"   # this web process, for presence reports
PRESENCE_SECONDS = 5.0                        # a web process tells the model server its open tabs this often
_last_report = [0.0]
_REPORTER: list[threading.Thread] = []
_REPORTER_LOCK = threading.Lock()


def session_id() -> str:
    """This browser tab's id for the scheduler (one request in flight per tab)."""
    if SESSION_KEY not in st.session_state:
        st.session_state[SESSION_KEY] = uuid.uuid4().hex
        ctx = get_script_run_ctx()
        if ctx is not None:
            _STREAMLIT_SESSIONS[st.session_state[SESSION_KEY]] = ctx.session_id
    return st.session_state[SESSION_KEY]


def person_id() -> str:
    """Who is behind this tab: the browser's XSRF cookie (hashed), the same across reloads and tabs."""
    try:
        cookie = st.context.cookies.get(XSRF_COOKIE)
    except Exception:  # noqa: BLE001 - no cookies outside a browser (tests, scripts)
        cookie = None
    if not isinstance(cookie, str) or not cookie:
        return session_id()
    return "p" + hashlib.sha256(xsrf_token(cookie).encode()).hexdigest()[:16]


def xsrf_token(cookie: str) -> str:
    """What stays the same in the XSRF cookie: Tornado's version 2 (`2|mask|masked token|time`) is masked afresh
    on every page load (the token XOR a new random 4-byte mask), so the token itself, unmasked, names the browser."""
    parts = cookie.split("|")
    if len(parts) == 4 and parts[0] == "2":
        try:
            mask, masked = bytes.fromhex(parts[1]), bytes.fromhex(parts[2])
        except ValueError:
            return cookie
        if len(mask) == 4:
            return bytes(b ^ mask[i % 4] for i, b in enumerate(masked)).hex()
    return cookie


def connected(session: str) -> bool:
    """Is this Streamlit session still connected to the server? (True where there is no server to ask.)"""
    streamlit_id = _STREAMLIT_SESSIONS.get(session)
    if streamlit_id is None or not Runtime.exists() or Runtime.instance().is_active_session(streamlit_id):
        return True
    _STREAMLIT_SESSIONS.pop(session, None)
    return False


def open_sessions() -> list[str]:
    """This process's browser sessions that are still connected (the closed ones are forgotten here)."""
    return [s for s in list(_STREAMLIT_SESSIONS) if connected(s)]


def report_presence(client: ModelClient, force: bool = False) -> None:
    """Tell the model server which of its sessions this process still has open: a closed tab frees its place in
    the room at the next report (in every web process, whichever one the tab was on)."""
    now = time.monotonic()
    if force or now - _last_report[0] >= PRESENCE_SECONDS:
        _last_report[0] = now
        client.report_presence(PROCESS, open_sessions())


def keep_reporting(client: ModelClient) -> None:
    """Report this process's open sessions every PRESENCE_SECONDS, whether or not a page runs (a room of followers
    runs only fragments): a thread, started once per process."""
    with _REPORTER_LOCK:
        if _REPORTER:
            return
        _REPORTER.append(threading.Thread(target=_report_forever, args=(client,), name="playground-presence",
                                          daemon=True))
        _REPORTER[0].start()


def _report_forever(client: ModelClient) -> None:
    while True:
        time.sleep(PRESENCE_SECONDS)
        try:
            report_presence(client, force=True)
        except Exception:  # noqa: BLE001 - the server is away for a moment: the next report will do
            pass


def join_session(client: ModelClient | None) -> str | None:
    """Count this person against the server's limit; the refusal message when the room is full."""
    if client is None:
        return None
    session = session_id()
    keep_reporting(client)
    try:
        report_presence(client)
        client.join(session, person_id())
    except SessionLimitError as err:
        st.session_state[REFUSED_KEY] = True
        return f"The model is not available to this browser: {err}."
    st.session_state.pop(REFUSED_KEY, None)
    return None


# --- presenter mode ------------------------------------------------------------------------------------------

def follow_presenter(here: str, ns: str, switch: Callable[[str], None]) -> None:
    """Before a page draws: adopt a new push (moving to its page first), or nothing. `here`: the url path."""
    board = presenter_board()
    if not board.enabled:
        return

    def go(page: str) -> None:
        if page_info(page) is None:
            st.session_state.pop(PENDING_KEY, None)        # not a page of this app: stay, keep what is here
            return
        switch(page)

    follow_page(st.session_state, board, ns, here, go)


def presenter_push(ns: str, here: str, view: dict[str, int] | None = None) -> None:
    """For the presenter only: push this page's prompt, settings and view to every follower."""
    push_button(presenter_board(), ns, here, view)


def pushed_choice(key: str, name: str, options: list[int]) -> None:
    """Preset widget `key` to the presenter's pushed `name` (layer, head...) once per push and run."""
    marker = f"presenter.adopted.{key}"
    version = st.session_state.get(SEEN_KEY, 0)
    value = pushed_view(st.session_state, name)
    if value is None or st.session_state.get(marker) == version:
        return
    st.session_state[marker] = version
    if value in options:
        st.session_state[key] = value
