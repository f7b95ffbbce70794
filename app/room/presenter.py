"""Presenter mode on the page: one person at the front pushes a prompt, settings and a view; every follower picks
it up. The board itself (engine/service/board.py) lives with the model: one per model server, shared by every
browser session of every web process. The presenter unlocks it with the token given to
`playground --presenter-token`. A follower's page adopts a push once, when it sees a version newer than the last
one it adopted, so between pushes followers explore on their own.

    board = presenter_board()                                    # the model server's board
    board.push(token, prompt="Why is the sky blue?", settings={"temperature": 0.7}, page="attention",
               view={"layer": 12, "head": 3})
    push = new_push(st.session_state, board)                     # on a follower's page: None, or a Push to adopt
    if push: apply_push(st.session_state, push, "journey")       # fills the page's widget keys
    board.push(token, page="room", run="run-3f2a...")            # the room page picks that request's story

Everything a push carries is plain data, bounded and checked here: followers' pages never render it
as HTML.
"""
from __future__ import annotations

import hashlib
import time
from typing import Any, Callable, Mapping, MutableMapping

import streamlit as st

from app.hosting.model import current_client, settings
from engine.service.board import (MAX_NOTE_CHARS, SETTINGS, BoardState, PresenterBoard, PresenterError,  # noqa: F401
                                  Push)
from engine.settings import PLAYGROUND, as_started
from engine.settings import rows as settings_rows

WIDGET_KEYS = {"prompt": "prompt", "temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
               "seed": "seed", "max_new_tokens": "max_new"}   # push field -> widget key after "<page>."
FOLLOW_KEY, SEEN_KEY, TOKEN_KEY, VIEW_KEY, PENDING_KEY = (
    "presenter.follow", "presenter.seen", "presenter.token", "presenter.view", "presenter.pending")
RUN_KEY = "presenter.run"             # a pushed request's run, until the room page's pick takes it up
GUESSES_KEY = "presenter.guesses"     # (wrong tokens tried, time of the last one, digest of the last one)
FREE_GUESSES = 3                      # wrong tokens a session may try before each next try waits
GUESS_DELAY_SECONDS, MAX_GUESS_DELAY_SECONDS = 2.0, 300.0    # 2, 4, 8 ... seconds, at most 5 minutes


# --- the model server's board -----------------------------------------------------------------------

_OFF = PresenterBoard(None)


def presenter_board() -> PresenterBoard:
    """The board of the model this process serves (in-process or remote); a board that is off when there is none."""
    client = current_client()
    return client.board if client is not None else _OFF


# --- what a session does (state: st.session_state, or any dict in tests) ----------------------------

def unlock(state: MutableMapping[str, Any], board: PresenterBoard, token: str, now: float | None = None) -> bool:
    """Make this session the presenter's when `token` is right; the token stays server-side.

    After FREE_GUESSES wrong tokens, each further try must wait twice as long as the one before
    (2 s, 4 s, ... up to 5 minutes): PresenterError says how long. The same wrong token again (a page
    rerun with the box still filled) is not a new try and is refused without comparing.
    """
    now = time.monotonic() if now is None else now
    wrong, last, digest = state.get(GUESSES_KEY, (0, 0.0, ""))
    if wrong and _digest(token) == digest:
        return False
    if (wait := guess_wait(wrong, last, now)) > 0:
        raise PresenterError(f"too many wrong presenter tokens from this browser: wait {wait:.0f} s, "
                             "then enter the token again")
    if board.check(token):
        state[TOKEN_KEY] = token
        state.pop(GUESSES_KEY, None)
        return True
    state.pop(TOKEN_KEY, None)
    state[GUESSES_KEY] = (wrong + 1, now, _digest(token))
    return False


def guess_wait(wrong: int, last: float, now: float) -> float:
    """Seconds before the next try, after `wrong` wrong tokens, the last at `last`."""
    if wrong < FREE_GUESSES:
        return 0.0
    delay = min(GUESS_DELAY_SECONDS * 2 ** (wrong - FREE_GUESSES), MAX_GUESS_DELAY_SECONDS)
    return max(0.0, last + delay - now)


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "replace")).hexdigest()


def is_presenter(state: Mapping[str, Any], board: PresenterBoard) -> bool:
    return board.check(state.get(TOKEN_KEY))


def push_from(state: MutableMapping[str, Any], board: PresenterBoard, **fields_: Any) -> Push:
    """Push as this session's presenter; the presenter's own page does not adopt it again."""
    push = board.push(state.get(TOKEN_KEY), **fields_)
    state[SEEN_KEY] = push.version
    return push


def following(state: Mapping[str, Any]) -> bool:
    return bool(state.get(FOLLOW_KEY, True))


def new_push(state: MutableMapping[str, Any], board: PresenterBoard) -> Push | None:
    """The latest push when this session follows and has not adopted it yet (it is marked adopted)."""
    push = board.latest()
    if push is None or not following(state) or push.version <= state.get(SEEN_KEY, 0):
        return None
    state[SEEN_KEY] = push.version
    return push


def apply_push(state: MutableMapping[str, Any], push: Push, ns: str) -> list[str]:
    """Write the pushed prompt and settings into page `ns`'s widget keys; returns the keys written.

    The pushed view (layer, head, ...) is kept under `presenter.view` for the views to start from.
    Call before the page draws its widgets.
    """
    written = []
    values = {"prompt": push.prompt, **push.settings}
    for name, value in values.items():
        if value is not None:
            key = f"{ns}.{WIDGET_KEYS[name]}"
            state[key] = value
            written.append(key)
    if push.view:
        state[VIEW_KEY] = dict(push.view)
    if push.run:
        state[RUN_KEY] = push.run
    return written


def pushed_view(state: Mapping[str, Any], name: str, default: int | None = None) -> int | None:
    """A view value (layer, head, step, token) the presenter pushed, for a view's default."""
    return state.get(VIEW_KEY, {}).get(name, default)


def follow_page(state: MutableMapping[str, Any], board: PresenterBoard, ns: str, here: str,
                switch: Callable[[str], None] | None = None) -> Push | None:
    """One call at the top of a page (`here`: its url path): adopt a new push, moving to its page first."""
    push = state.pop(PENDING_KEY, None) or new_push(state, board)
    if push is None:
        return None
    if push.page and push.page != here and switch is not None:
        state[PENDING_KEY] = push          # the target page applies it after the switch
        switch(push.page)
        return push
    apply_push(state, push, ns)
    return push


def page_values(state: Mapping[str, Any], ns: str) -> dict[str, Any]:
    """The prompt and settings page `ns` shows now, read from its widget keys (what a push would send)."""
    values = {name: state.get(f"{ns}.{key}") for name, key in WIDGET_KEYS.items()}
    settings = {k: v for k, v in values.items() if k in SETTINGS and v is not None}
    return {"prompt": values["prompt"], "settings": settings}


# --- widgets -----------------------------------------------------------------------------------------

def presenter_box(board: PresenterBoard) -> None:
    """Sidebar block: follow on/off for everyone; the token box that turns a session into the presenter."""
    if not board.enabled:
        return
    state = st.session_state
    with st.expander("Presenter mode", expanded=False):
        st.toggle("Follow the presenter", value=True, key=FOLLOW_KEY,
                  help="When on, your page takes up what the presenter pushes; you can still change anything.")
        if is_presenter(state, board):
            st.caption("You are the presenter: every run you generate streams to everyone who follows; the Push "
                       "button on a page shares its prompt, settings and view.")
            allowed = st.toggle("Followers may generate their own runs", value=board.followers_may_generate,
                                key="presenter.allow_generate")
            board.allow_generate(state.get(TOKEN_KEY), allowed)
            return
        token = st.text_input("Presenter token", type="password", key="presenter.token_input")
        if token:
            try_token(state, board, token)


def try_token(state: MutableMapping[str, Any], board: PresenterBoard, token: str) -> None:
    """Unlock with `token`, or say why not under the box."""
    try:
        ok = unlock(state, board, token)
    except PresenterError as err:
        st.error(str(err)[0].upper() + str(err)[1:] + ".")
        return
    if not ok:
        st.error("That is not the presenter token.")


def push_button(board: PresenterBoard, ns: str, here: str, view: Mapping[str, Any] | None = None,
                run: str | None = None, label: str = "Push to everyone") -> Push | None:
    """For the presenter only: a button that pushes this page's prompt, settings and view (and a request's story,
    `run`) to every follower."""
    state = st.session_state
    if not is_presenter(state, board):
        return None
    note = st.text_input("Note for the room (optional)", key=f"{ns}.presenter_note", max_chars=MAX_NOTE_CHARS)
    if not st.button(label, key=f"{ns}.presenter_push", icon=":material/campaign:"):
        return None
    try:
        push = push_from(state, board, page=here, view=view, note=note, run=run, **page_values(state, ns))
    except PresenterError as err:
        st.error(str(err))
        return None
    st.success(f"Pushed (version {push.version}).")
    return push


# --- watching the presenter's run ------------------------------------------------------------------------

WATCHED_KEY = "presenter.watched"


def new_broadcast(state: MutableMapping[str, Any], board: PresenterBoard) -> Any:
    """The presenter's run id when this session follows and has not taken it up yet (it is marked taken)."""
    version, run = board.live()
    if run is None or not following(state) or is_presenter(state, board) or version <= state.get(WATCHED_KEY, 0):
        return None
    state[WATCHED_KEY] = version
    return run


def may_generate(state: Mapping[str, Any], board: PresenterBoard) -> bool:
    """Followers run the model themselves unless the presenter keeps it for the room's one run."""
    return not board.enabled or is_presenter(state, board) or board.followers_may_generate


def settings_panel() -> None:
    """The presenter's look at what this room runs with: `playground --print-settings`'s rows, secrets masked, each
    with where it came from as the launcher read it (engine.settings.as_started)."""

    with st.expander("Settings this room runs with", icon=":material/tune:"):
        st.caption("As `playground --print-settings` shows them (every one in docs/settings.md); secrets stay hidden. "
                   "Came from: a flag, a variable, the settings file or the default, as the launcher read them; "
                   "'launcher': made up or set by it at start (a secret, the join link's address).")
        settings()                                   # a setting that cannot be read: said on the page, which stops
        started, came_from = as_started()
        shown = settings_rows(started, PLAYGROUND, came_from)
        st.table({column: {r["setting"]: r[column] for r in shown} for column in ("value", "came from", "set by")})
