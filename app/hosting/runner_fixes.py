"""Three fixes to how Streamlit 1.67 starts a session's script runs, for a room on one server.

Every `st.fragment(run_every=...)` timer in a browser keeps sending reruns until the browser hears that its
page changed. A follower's strip (app/runs/watch.py) ticks twice a second, and when the presenter's run ends
thirty followers move to another page at once, so the server is seconds behind. Measured with 30 followers
(bench/watch.py, docs/serving.md), two things then went wrong in Streamlit itself:

1. **A tick from a page the session has left ran with that page's hash.** Ticks sent from the old page
   queue up behind the move, and Streamlit runs each of them as a fragment run naming the old page. The
   run's `new_session` message names the old page, the browser takes that as a change of page and clears
   everything the new page drew: two of three Chromium followers were left blank (before the strip, one
   run in five, seen as "Bad delta path index" errors). Fix: the runner skips a fragment rerun whose page
   is not the page the session's last run drew (kept by the session's pages manager, which outlives each
   runner). Any other rerun runs as before.

2. **A request just after a run had ended dropped that run's last messages.** A run's messages reach the
   browser through the server's event loop. When a request arrives after a runner has stopped but before
   the loop has handled the runner's last events, Streamlit starts a new runner at once and ignores every
   event still queued from the old one (streamlit/streamlit#9921 is one face of it): a follower's journey
   page stopped half-drawn, with no error, for 2 to 8 of 27 followers per run. Fix: while the old runner
   has not reported that it shut down (its last event, after all its messages), the request is retried on
   the event loop a moment later. No message is dropped and no request is lost; a run may start a few
   milliseconds later.

3. **A press during a run started the next run beside it.** With `runner.fastReruns` (on by default), a
   widget's rerun tells the running runner to stop and starts a new one at once, in a new thread, while the
   old one is still inside its script until its next `st` call. Stop pressed while an answer streams: the old
   run waits for the model's next token (300 ms a step in a loaded room), and the new run meanwhile draws the
   session's run as still generating, with nothing left to redraw it: 3 of 91 Stops in the hosted soak's
   stop-only run ended on "Generating with SmolLM2…" (bench/soak_hosted.py). Two runs of one session at once
   also write its state at once. Fix: a new runner waits until the one it replaces has left its script (its
   thread has ended: every `finally` has run), as Streamlit does with fastReruns off, for at most
   STOP_WAIT_SECONDS; a runner stuck longer than that (a read with no timeout) no longer holds the page. Requests
   that come meanwhile wait behind the first, and reach the new runner in the order they were sent.

`install()` is idempotent; app/main.py calls it at the top of every run. The fixes read private attributes of
Streamlit 1.67 (`_pages_manager`, `_scriptrunner`, `_event_loop`, `_state`, `_script_thread`): on any other minor
release they are not installed, the log says so once, and the app runs on Streamlit's own runner. pyproject.toml
pins the same fence (`streamlit~=1.67.0`). docs/app.md ("Streamlit's runner") writes each race up as an upstream
report, with a minimal script and its steps: races 1 and 3 reproduce every time (tests/test_runner_fixes.py); race 2
needs a lagging event loop (a stand-in for a busy server) and shows in the page in some tries, not all
(bench/streamlit_races.py --race 2), so the suite checks it by the server's own count.
"""
from __future__ import annotations

import logging
import threading
import time

import streamlit
from streamlit.runtime.app_session import AppSession, AppSessionState
from streamlit.runtime.scriptrunner import RerunData
from streamlit.runtime.scriptrunner.script_runner import ScriptRunner

from app.hosting.fence import FENCE, fence_line, fits  # noqa: F401 - FENCE and fits: also read from here

RETRY_SECONDS = 0.02
STOP_WAIT_SECONDS = 10.0        # the longest a new run waits for the one it replaces to leave its script
_run_script = ScriptRunner._run_script
_create_scriptrunner = AppSession._create_scriptrunner


def stale(rerun_data: RerunData, shown_page: str) -> bool:
    """A fragment rerun asked for from another page than the one the session's last run drew."""
    return bool(rerun_data.fragment_id_queue and rerun_data.page_script_hash and shown_page
                and rerun_data.page_script_hash != shown_page)


def run_unless_stale(runner: ScriptRunner, rerun_data: RerunData) -> None:
    """Streamlit's runner calls this for each request it takes from its queue, one after another."""
    if stale(rerun_data, runner._pages_manager.current_page_script_hash):   # the page the last run drew
        return                                  # the runner takes its next request, or stops
    _run_script(runner, rerun_data)


def create_runner_in_turn(session: AppSession, rerun_data: RerunData) -> None:
    """Streamlit calls this when the current runner refused a rerun (it has stopped), when there is none, and when
    fastReruns has just told the running one to stop. The request waits, behind any that wait already (in the order
    the browser sent them), until the old runner is out of the way."""
    if session._state == AppSessionState.SHUTDOWN_REQUESTED:
        _create_scriptrunner(session, rerun_data)
        return
    queued = getattr(session, "_playground_queued", None)
    if queued:
        queued.append(rerun_data)
        return
    session._playground_queued = [rerun_data]
    hand_over(session, time.monotonic())


def hand_over(session: AppSession, since: float) -> None:
    """The waiting requests, oldest first: the first starts a new runner once the old one has left its script (or
    `STOP_WAIT_SECONDS` after the first request), the rest go to that runner as reruns; else try again shortly."""
    queued = session._playground_queued
    if session._state == AppSessionState.SHUTDOWN_REQUESTED:
        queued.clear()
        return
    runner = session._scriptrunner
    if runner is None and not replaced_still_running(session, since):
        try:
            _create_scriptrunner(session, queued.pop(0))
        except Exception:
            queued.clear()                   # as Streamlit does: this request fails with its error, the next starts anew
            raise
        runner = session._playground_runner = session._scriptrunner   # the runner the next one may wait for
    while queued and runner is not None and runner.request_rerun(queued[0]):
        queued.pop(0)
    if queued:
        session._event_loop.call_later(RETRY_SECONDS, hand_over, session, since)


def replaced_still_running(session: AppSession, since: float) -> bool:
    """The session's last runner, told to stop (fastReruns), is still inside its script, and not for too long."""
    runner = getattr(session, "_playground_runner", None)
    thread = getattr(runner, "_script_thread", None)
    return (thread is not None and thread.is_alive() and thread is not threading.current_thread()
            and time.monotonic() - since < STOP_WAIT_SECONDS)


def install(version: str = streamlit.__version__) -> bool:
    """Patch the runner when Streamlit is inside the fence; say once, and patch nothing, when it is not."""
    if not fits(version):
        _warn_unfenced(version)
        return False
    ScriptRunner._run_script = run_unless_stale
    AppSession._create_scriptrunner = create_runner_in_turn
    return True


_warned: set[str] = set()


def _warn_unfenced(version: str) -> None:
    if version not in _warned:
        _warned.add(version)
        logging.getLogger(__name__).warning("%s", fence_line(version))


def installed() -> bool:
    return ScriptRunner._run_script is run_unless_stale and AppSession._create_scriptrunner is create_runner_in_turn
