"""Watching the presenter's run: a strip at the top of whatever page a follower has open.

The strip is one fragment, drawn last in every run of a follower's page (main.py) into a slot kept at the top
of the main area. Twice a second it reruns alone: it adopts a new push (a whole-page rerun, as before), and
while the presenter's run streams it draws that run in four elements. Starting to watch costs no page switch
and no whole-page run: with 30 followers, those were seconds of the server's two cores in the first moments
of every run (the stream fell seconds behind), and a whole-page run started while another one's messages were
still on their way could blank a follower's page (docs/serving.md). When the run is done, the follower's page
reruns once and every page draws it; a follower on the home page moves to the journey page.

    slot = watch_slot()                    # main.py, before the page runs
    ...
    watch_strip(slot, here, switch)        # main.py, last of the run
"""
from __future__ import annotations

from typing import Any, Callable, MutableMapping

import streamlit as st

from app.ui.format import fmt_ms, fmt_rate
from app.hosting.model import away_safe, current_client
from app.room.presenter import (SETTINGS, SEEN_KEY, Push, apply_push, following, is_presenter, new_broadcast,
                           PresenterBoard, presenter_board)
from app.runs.run import LAST_RUN, Run, run_from_slice
from engine.errors import EngineError
from engine.service.client import ModelClient

WATCH_SECONDS = 0.5                  # how often a follower's strip looks at the board and redraws a live run
WATCHING_KEY = "presenter.watching"  # the presenter's run this session shows in its strip, until it is done
READ_KEY = "presenter.watch_read"    # how many of that run's records the strip has read from the server
ENDED_KEY = "presenter.watch_ended"  # the watched run whose end the strip has drawn
ANSWER_LINK = " Its answer is in [3. The answer, token by token](#3-the-answer-token-by-token), below."
RUN_PAGE = "journey"                 # where a follower on a page without runs (the home page) sees a run
FORM_KEY = "presenter.form"          # the adopted run's request, for the journey page's form at the next run


def fill_form() -> None:
    """Before any widget is drawn (main.py): the journey page's form takes the request of the run just adopted.
    (Written at adoption, it could meet the form's widgets already drawn in the same run.)"""
    form = st.session_state.pop(FORM_KEY, None)
    if form is not None:
        push, chat = form
        apply_push(st.session_state, push, RUN_PAGE)
        st.session_state[f"{RUN_PAGE}.chat"] = chat


def watch_slot() -> st.delta_generator.DeltaGenerator | None:
    """The place at the top of the page for the strip, when this session follows a presenter."""
    board = presenter_board()
    if not board.enabled or is_presenter(st.session_state, board):
        return None
    return st.container()


def watch_strip(slot: st.delta_generator.DeltaGenerator | None, here: str, switch: Callable[[str], None]) -> None:
    """Called last of all in a page's run: its timer's first tick comes after the page is drawn, so the tick
    never starts while the page's own messages are still being sent."""
    if slot is None:
        return
    with slot:
        strip(here, switch)


@st.fragment(run_every=WATCH_SECONDS)
@away_safe
def strip(here: str, switch: Callable[[str], None]) -> None:
    """Adopt a new push (the whole page reruns for it); draw the presenter's run while it streams; when it is
    done, make it this session's run and draw the page again. A tick runs outside the page's guard (app/main.py):
    a model server gone between ticks is noted, and the next run of the page says so, never a traceback (seen in
    the hosted soak: a reload showed ServerUnavailableError)."""
    board, state = presenter_board(), st.session_state
    push = board.latest()
    if push is not None and following(state) and push.version > state.get(SEEN_KEY, 0):
        st.rerun(scope="app")
    if push is not None and push.note:
        st.caption(f"Presenter: {push.note}")
    run, watched = watched_run(state, board)
    if run is not None:
        show_or_adopt(run, watched, here, switch)
    elif isinstance(state.get(LAST_RUN), Run) and state[LAST_RUN].id == board.live()[1]:   # the presenter's run
        st.caption("The run on this page is the presenter's: explore its layers and heads on every page."
                   + (ANSWER_LINK if here == RUN_PAGE else ""))


def show_or_adopt(run: Run, watched: bool, here: str, switch: Callable[[str], None]) -> None:
    """While it streams (and once more when it has ended), draw it here; then make it this session's run."""
    state = st.session_state
    streaming = run.live and run.done is None
    if streaming or (watched and state.get(ENDED_KEY) is not run):
        if not streaming:
            state[ENDED_KEY] = run            # its end drawn here at once; the next tick the page takes it over
        with st.container(border=True):
            st.caption("The presenter's run, live. When it is done, every page draws it: explore the layers and "
                       "heads on your own." if streaming else "The presenter's run is done: the page draws it now.")
            if run.prefill is not None:
                watch_view(run)
        return
    state.pop(WATCHING_KEY, None)
    state.pop(ENDED_KEY, None)
    state[LAST_RUN] = run
    if run.request is not None:                 # the journey page's form shows the request this run answered
        settings = {name: getattr(run.request, name) for name in SETTINGS}
        state[FORM_KEY] = (Push(0, prompt=run.request.prompt, settings=settings), run.request.chat)
    if here == "" and watched:                  # watched it stream on the home page: see it on the journey's
        switch(RUN_PAGE)
    st.rerun(scope="app")


def watched_run(state: MutableMapping[str, Any], board: PresenterBoard) -> tuple[Run | None, bool]:
    """The presenter's run for this session: the one it is watching (grown by the records made since the last tick),
    or a new broadcast when it follows; and whether it was watched while it streamed. Runs are read from the model
    server by id, so a follower in any web process sees the same run."""
    client = current_client()
    run = state.get(WATCHING_KEY)
    if client is None:
        return None, False
    try:
        if isinstance(run, Run):
            return read_more(client, state, run), True
        run_id = new_broadcast(state, board) if following(state) else None
        if run_id is None:
            return None, False
        state[READ_KEY] = 0
        run = read_more(client, state, None, run_id)
    except EngineError as err:                  # the run was dropped from the server's store, or the server is gone
        state.pop(WATCHING_KEY, None)
        st.caption(f"The presenter's run cannot be shown: {err}")
        return None, False
    if run.live and run.done is None:
        state[WATCHING_KEY] = run
    elif run.speculation is not None:
        attach_baseline(client, run)
    return run, False


def read_more(client: ModelClient, state: MutableMapping[str, Any], run: Run | None, run_id: str | None = None) -> Run:
    """The run with every record the server made since this session last read it."""
    part = client.run_slice(run.id if run is not None else run_id, state.get(READ_KEY, 0))
    state[READ_KEY] = part.end
    run = run_from_slice(part, client.spec, run)
    if not run.live and run.speculation is not None:
        attach_baseline(client, run)
    return run


def attach_baseline(client: ModelClient, run: Run) -> None:
    """A speculative run's plain decoding of the same request (its measured speedup), when the server has it."""
    if run.speculation.baseline is not None:
        return
    child = next((info for info in client.run_list() if info.parent == run.id and not info.live), None)
    if child is not None:
        baseline = run_from_slice(client.run_slice(child.id), client.spec)
        run.speculation.baseline = baseline


def watch_view(run: Run) -> None:
    """The streaming run in four elements: status, token count, the other numbers in one line, the text.

    A room of followers redraws this twice a second each: every element is a message the one server process
    sends (30 followers drawing the presenter's full view of twenty took most of the server's time and slowed
    the presenter's own tokens; docs/serving.md).
    """
    m = run.metrics()
    st.caption(run.status_line())
    st.metric("Generated tokens", f"{m.generated_tokens:,}")
    st.caption(f"Time to first token {fmt_ms(m.ttft)} · inter-token latency {fmt_ms(m.itl)} · "
               f"decode speed {fmt_rate(m.tokens_per_second)} · {m.prompt_tokens:,} prompt tokens")
    st.text(run.text or "…")
