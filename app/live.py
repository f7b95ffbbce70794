"""The one live path from a page to the shared model: a generation streamed into the page (plain or
speculative), with its place in the queue and its messages, and a measurement job run alone in its turn.
Both go through the model's scheduler (queue position, limits, cancel on Stop or on leaving the page).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import streamlit as st

from app.nav import page_info
from app.presenter import TOKEN_KEY, is_presenter, presenter_board
from app.request import Prepared
from app.run import LAST_RUN, Run, capture_policy, new_run, stream_generation
from app.session import session_id
from engine.speculative.drafts import Draft
from engine.errors import EngineError
from engine.core.loader import LoadedModel
from engine.serving.scheduler import CheckedRequest, JobProgress, JobResult, QueueStatus, scheduler_for


def run_live(lm: LoadedModel, prepared: Prepared, ns: str, stop_slot: st.delta_generator.DeltaGenerator,
             on_record: Callable[[Run], None], capture: bool = True,
             notice: st.delta_generator.DeltaGenerator | None = None, draft: Draft | None = None,
             k: int = 0) -> Run | None:
    """Stream one generation into the page through the scheduler; the run becomes LAST_RUN at its first record.

    With a `draft`, speculative decoding drafting `k` tokens a round, then plain decoding of the same request
    for the measured speedup (`run.speculation`); `on_record` follows both.

    `notice` (a slot under the Generate button) shows the queue position while waiting, and a refusal
    or failure as a message. Returns the run, or None when the server refused the request.
    """
    run, checked = new_live_run(lm, prepared, capture, draft, k)
    notice = notice if notice is not None else st.empty()
    stop_slot.button("Stop", key=f"{ns}.stop", help="Stops the answer where it is (or leaves the queue); what "
                                                    "streamed so far stays.")

    def record(r: Run) -> None:
        make_current(r, notice)
        on_record(r)

    def wait(status: QueueStatus) -> None:
        if run.prefill is None:                  # after the first token the answer itself shows progress
            show_wait(notice, status)

    try:
        stream_generation(lm, run, record, wait, session_id(), draft, checked)
    except EngineError as err:
        notice.error(str(err))
        return None
    finally:
        stop_slot.empty()
    if run.warning:
        notice.warning(run.warning)
    elif run.prefill is None:
        notice.empty()
    return run if run.prefill is not None else None


def new_live_run(lm: LoadedModel, prepared: Prepared, capture: bool, draft: Draft | None,
                 k: int) -> tuple[Run, CheckedRequest]:
    """A run about to stream, capturing as much as the server's capture limits allow, and the checked request
    to submit with that capture policy (its ids as the page's check encoded them)."""
    limits = scheduler_for(lm).limits
    policy, note = capture_policy(lm.spec, len(prepared.ids), prepared.request.max_new_tokens, capture,
                                  limits.max_capture_bytes, limits.max_capture_layers)
    return new_run(lm, prepared.request, policy, note, draft, k), replace(prepared.checked, policy=policy)


def make_current(run: Run, notice: st.delta_generator.DeltaGenerator) -> None:
    """At its first record a run becomes this session's run (every page draws it), and every follower's when
    the presenter made it."""
    if st.session_state.get(LAST_RUN) is run:
        return
    st.session_state[LAST_RUN] = run
    notice.empty()
    board = presenter_board()
    if is_presenter(st.session_state, board):
        board.broadcast(st.session_state.get(TOKEN_KEY), run)     # every follower watches this run


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
    return (f"All {status.batch} places in the batch are taken. You are {place}: {eta}; waited "
            f"{status.waited:.0f} s. Stop leaves the line.")


def last_run() -> Run | None:
    run = st.session_state.get(LAST_RUN)
    return run if isinstance(run, Run) else None


# --- measurements on the shared model -----------------------------------------------------------------------

def run_on_model(lm: LoadedModel, what: str, job: Callable[[Callable[[float, str], None]], Any],
                 report: Callable[[float, str], None]) -> Any:
    """Run `job(progress)` on the shared model through its scheduler: alone, in its turn, with progress.

    While it waits the page shows its place in line; leaving the page or pressing Stop cancels it.
    Raises the job's EngineError when it fails or is cancelled.
    """
    handle = scheduler_for(lm).submit_job(job, what, session=session_id())
    note = st.empty()
    value = None
    try:
        for record in handle.records(on_wait=lambda status: note.info(_turn_message(status, what))):
            note.empty()
            if isinstance(record, JobProgress):
                report(record.fraction, record.text)
            elif isinstance(record, JobResult):
                value = record.value
    finally:
        handle.cancel()
    if handle.error is not None:
        raise handle.error
    if value is None:
        raise EngineError(f"{what} was stopped before it finished")
    return value


def run_alone(lm: LoadedModel, what: str, work: Callable[[], Any]) -> Any:
    """`run_on_model` for work without progress steps (a forward pass or two)."""
    return run_on_model(lm, what, lambda progress: work(), lambda fraction, text: None)


def _turn_message(status: QueueStatus, what: str) -> str:
    if status.state != "queued":
        return f"Measuring {what}…"
    return (f"{what.capitalize()} needs the model to itself: it starts when the {status.running} running request(s) "
            f"finish ({status.ahead} waiting before it). Stop leaves the line.")


def measure_in_box(lm: LoadedModel, label: str, what: str,
                   job: Callable[[Callable[[float, str], None]], Any]) -> Any | None:
    """`run_on_model` inside an st.status box that shows the job's progress: its value, or None once the box says
    it stopped and why."""
    with st.status(label, expanded=True) as box:
        try:
            value = run_on_model(lm, what, job, status_progress(box))
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
