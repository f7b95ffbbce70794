"""The one live path from a page to the shared model: a generation streamed into the page (plain or
speculative), with its place in the queue and its messages, and a measurement job run alone in its turn.
Both go through the model's scheduler (queue position, limits, cancel on Stop or on leaving the page).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx
from streamlit.runtime.scriptrunner_utils.script_requests import ScriptRequestType

from app.ui.nav import page_info
from app.room.presenter import SETTINGS, TOKEN_KEY, Push, is_presenter, presenter_board
from app.runs.request import Prepared
from app.runs.recent import remember
from app.runs.run import LAST_RUN, Draft, Run, capture_policy, new_run, run_from_slice, settle, stream_generation
from app.room.session import session_id
from app.runs.widgets import stopped_in_line
from app.runs.watch import FORM_KEY
from engine.errors import EngineError
from engine.service.client import ModelClient, run_id as api_run_id
from engine.service.jobs import JOBS
from engine.serving.scheduler import CheckedRequest, JobProgress, JobResult, QueueStatus


def run_live(lm: ModelClient, prepared: Prepared, ns: str, stop_slot: st.delta_generator.DeltaGenerator,
             on_record: Callable[[Run], None], capture: bool = True,
             notice: st.delta_generator.DeltaGenerator | None = None, draft: Draft | None = None,
             k: int = 0) -> Run | None:
    """Stream one generation into the page through the model's scheduler; the run becomes LAST_RUN at its first
    record.

    With a `draft` (its spec and label), speculative decoding drafting `k` tokens a round, then plain decoding of
    the same request for the measured speedup (`run.speculation`); `on_record` follows both.

    `notice` (a slot under the Generate button) shows the queue position while waiting, and a refusal
    or failure as a message. Returns the run, or None when the server refused the request.
    """
    run, checked = new_live_run(lm, prepared, capture, draft, k)
    notice = notice if notice is not None else st.empty()
    stop_slot.button("Stop", key=f"{ns}.stop", help="Stops the answer where it is (or leaves the queue); what "
                                                    "streamed so far stays.")

    def record(r: Run) -> None:
        stop_point()
        make_current(r, notice)
        on_record(r)

    def wait(status: QueueStatus) -> None:
        stop_point()
        if run.prefill is None:                  # after the first token the answer itself shows progress
            show_wait(notice, status)

    interrupted = True                           # until the stream ends: Stop (a rerun) or leaving the page
    left_line = stopped_in_line()
    try:
        stream_generation(lm, run, record, wait, session_id(), draft, checked)
        interrupted = False
    except EngineError as err:
        interrupted = False
        notice.error(str(err))
        return None
    finally:                   # after Stop, every st call here raises again (the stopped runner's STOP stays set)
        if interrupted and run.prefill is not None:
            settle(lm, run)                      # its link is shown once the server has its file
        elif interrupted:                        # the rerun says so (else it shows the run before, as if unheard)
            left_line.add(ns)
        stop_slot.empty()
    if run.warning:
        notice.warning(run.warning)
    elif run.prefill is None:
        notice.empty()
    remember(run, lm.limits)                     # a reload or a second tab of this person opens it again
    return run if run.prefill is not None else None


def new_live_run(lm: ModelClient, prepared: Prepared, capture: bool, draft: Draft | None,
                 k: int) -> tuple[Run, CheckedRequest]:
    """A run about to stream, capturing as much as the server's capture limits allow, and the checked request
    to submit with that capture policy (its ids as the page's check encoded them)."""
    limits = lm.limits
    policy, note = capture_policy(lm.spec, len(prepared.ids), prepared.request.max_new_tokens, capture,
                                  limits.max_capture_bytes, limits.max_capture_layers, lm.dtype.itemsize)
    return new_run(lm, prepared.request, policy, note, draft, k), replace(prepared.checked, policy=policy)


def stop_point() -> None:
    """End this script now if Stop (or any press: with fastReruns every press stops the running script) is pending,
    drawing nothing. Streamlit raises its StopException only inside an st call, and a loaded room's page redraws its
    answer every 0.5 s x the requests running (`Throttle`), so a Stop was noticed up to ~15 s late: past the 10 s the
    next run waits for this one (app/hosting/runner_fixes.py), which then drew the run still streaming, with neither its
    Stop line nor its link (the hosted hour, 89bf3d8). Peeks at Streamlit's request state (internal: STOP is
    terminal, set by `request_stop`), then makes the st call that lets Streamlit raise as it always does."""
    requests = getattr(get_script_run_ctx(), "script_requests", None)
    if requests is not None and getattr(requests, "_state", None) is ScriptRequestType.STOP:
        st.empty()


def make_current(run: Run, notice: st.delta_generator.DeltaGenerator) -> None:
    """At its first record a run becomes this session's run (every page draws it), and every follower's when
    the presenter made it."""
    if st.session_state.get(LAST_RUN) is run:
        return
    st.session_state[LAST_RUN] = run
    notice.empty()
    board = presenter_board()
    if is_presenter(st.session_state, board):
        board.broadcast(st.session_state.get(TOKEN_KEY), run.id)  # every follower streams this run from the server


def show_wait(slot: st.delta_generator.DeltaGenerator, status: QueueStatus) -> None:
    """The queue position and estimated wait, and a way to a recording meanwhile."""
    if status.state != "queued":
        slot.info(wait_message(status), icon=":material/hourglass_top:")
        return
    with slot.container():
        st.info(wait_message(status), icon=":material/group:")
        st.page_link(str(page_info("recordings").path), label="Open a recording meanwhile",
                     icon=":material/play_circle:")


def wait_message(status: QueueStatus) -> str:
    if status.state != "queued":
        return "Your request joined the batch: the model is reading your prompt (prefill)…"
    place = "next in line" if status.ahead == 0 else f"number {status.position} in line ({status.ahead} before you)"
    eta = ("no estimate yet" if status.estimated_wait is None
           else f"at most about {status.estimated_wait:.0f} s to go, from the batch's measured step time")
    why = (f"All {status.batch} places in the batch are taken." if status.running >= status.batch else
           f"{status.running} of {status.batch} places in the batch are in use; a request joins between two steps, "
           "once the step running now ends.")
    return f"{why} You are {place}: {eta}; waited {status.waited:.0f} s. Stop leaves the line."


LINK_KEY = "run_link.opened"        # the ?run= id this session has opened already


def open_run_link(lm: ModelClient | None) -> None:
    """`?run=<id>` in the address (a run id, or the API's reply id: `chatcmpl-...`): the run with that id on the model
    server becomes this session's run (once per link), so a request made with curl or the `openai` package, with
    captures, opens on every page."""
    run_id = st.query_params.get("run")
    if not run_id or lm is None or st.session_state.get(LINK_KEY) == run_id:
        return
    st.session_state[LINK_KEY] = run_id
    try:
        part = lm.run_slice(api_run_id(run_id[:80]))      # the API's reply id names the same run
    except EngineError as err:
        st.warning(f"The run in the link cannot be opened: {err}")
        return
    run = run_from_slice(part, lm.spec)
    st.session_state[LAST_RUN] = run
    if run.request is not None:
        settings = {name: getattr(run.request, name) for name in SETTINGS}
        if not 0 <= settings.get("seed", 0) < 2**31:     # an API client's random seed: the form keeps its own
            settings.pop("seed")
        st.session_state[FORM_KEY] = (Push(0, prompt=run.request.prompt, settings=settings), run.request.chat)


def last_run() -> Run | None:
    run = st.session_state.get(LAST_RUN)
    return run if isinstance(run, Run) else None


# --- measurements on the shared model -----------------------------------------------------------------------

def run_on_model(lm: ModelClient, name: str, params: dict[str, Any], report: Callable[[float, str], None],
                 partial: Callable[[Any], None] | None = None) -> Any:
    """Run the named measurement (engine/service/jobs.py) where the model is: alone, in its turn, with progress
    (and, for a job that sends them, its results so far to `partial`).

    While it waits the page shows its place in line; leaving the page or pressing Stop cancels it.
    Raises the job's EngineError when it fails or is cancelled.
    """
    what = JOBS[name].what
    handle = lm.submit_job(name, params, session=session_id())
    note = st.empty()
    value, got = None, False
    try:
        for record in handle.records(on_wait=lambda status: note.info(_turn_message(status, what))):
            note.empty()
            if isinstance(record, JobProgress):
                report(record.fraction, record.text)
                if partial is not None and getattr(record, "partial", None) is not None:
                    partial(record.partial)
            elif isinstance(record, JobResult):
                value, got = record.value, True
    finally:
        handle.cancel()
    if handle.error is not None:
        raise handle.error
    if not got:
        raise EngineError(f"{what} was stopped before it finished")
    return value


def run_alone(lm: ModelClient, name: str, params: dict[str, Any] | None = None) -> Any:
    """`run_on_model` for work without progress steps (a forward pass or two)."""
    return run_on_model(lm, name, params or {}, lambda fraction, text: None)


def _turn_message(status: QueueStatus, what: str) -> str:
    """The line shown while a job waits for its turn or its first result. `what` is the job's own noun phrase ("the
    precision measurement", "rebuilding a layer's input"), its capitals kept ("the GPTQ/AWQ comparison")."""
    if status.state != "queued":
        return f"{upper_first(what)}: running on the model…"
    return (f"{upper_first(what)} needs the model to itself: it starts when the {status.running} running request(s) "
            f"finish ({status.ahead} waiting before it). Stop leaves the line.")


def upper_first(text: str) -> str:
    """The first letter in capitals, the rest as written (str.capitalize would lower 'GPTQ' and 'Q, K, V')."""
    return text[:1].upper() + text[1:]


def measure_in_box(lm: ModelClient, label: str, name: str, params: dict[str, Any] | None = None) -> Any | None:
    """`run_on_model` inside an st.status box that shows the job's progress: its value, or None once the box says
    it stopped and why."""
    with st.status(label, expanded=True) as box:
        try:
            value = run_on_model(lm, name, params or {}, status_progress(box))
        except EngineError as err:
            box.update(label="Stopped", state="error")
            st.error(str(err))
            return None
        box.update(label="Measured", state="complete", expanded=False)
        return value


def status_progress(box):
    """A progress callback (fraction, message) writing into an st.status box."""
    bar = box.progress(0.0)

    def report(fraction: float, message: str) -> None:
        bar.progress(min(max(fraction, 0.0), 1.0), text=message)
    return report
