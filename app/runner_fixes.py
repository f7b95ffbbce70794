"""Two fixes to how Streamlit 1.67 starts a session's script runs, for a room of followers on one server.

Every `st.fragment(run_every=...)` timer in a browser keeps sending reruns until the browser hears that its
page changed. A follower's strip (app/watch.py) ticks twice a second, and when the presenter's run ends
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

`install()` is idempotent; app/main.py calls it at the top of every run.
"""
from __future__ import annotations

from streamlit.runtime.app_session import AppSession, AppSessionState
from streamlit.runtime.scriptrunner import RerunData
from streamlit.runtime.scriptrunner.script_runner import ScriptRunner

RETRY_SECONDS = 0.02
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
    """Streamlit calls this when the current runner refused a rerun (it has stopped), or when there is none."""
    if session._scriptrunner is None or session._state == AppSessionState.SHUTDOWN_REQUESTED:
        _create_scriptrunner(session, rerun_data)
        return
    session._event_loop.call_later(RETRY_SECONDS, retry, session, rerun_data)


def retry(session: AppSession, rerun_data: RerunData) -> None:
    """The request again: to a runner that takes it, or to a new runner once the stopped one is gone."""
    if session._state == AppSessionState.SHUTDOWN_REQUESTED:
        return
    runner = session._scriptrunner
    if runner is not None and runner.request_rerun(rerun_data):
        return
    create_runner_in_turn(session, rerun_data)


def install() -> None:
    ScriptRunner._run_script = run_unless_stale
    AppSession._create_scriptrunner = create_runner_in_turn


def installed() -> bool:
    return ScriptRunner._run_script is run_unless_stale and AppSession._create_scriptrunner is create_runner_in_turn
