"""app/runner_fixes.py: a tick from a page the session left is skipped; a new runner waits for the old one's
last messages. The race itself needs a loaded server (bench/watch.py); here, the rules each fix applies."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

from streamlit.runtime.app_session import AppSession, AppSessionState
from streamlit.runtime.scriptrunner import RerunData
from streamlit.runtime.scriptrunner.script_runner import ScriptRunner

from app import runner_fixes
from app.runner_fixes import create_runner_in_turn, install, installed, stale

HOME, JOURNEY = "home-hash", "journey-hash"


def test_only_a_fragment_rerun_from_another_page_is_stale():
    tick_from_home = RerunData(page_script_hash=HOME, fragment_id_queue=["strip"], is_auto_rerun=True)
    assert stale(tick_from_home, JOURNEY)
    assert not stale(tick_from_home, HOME)                                      # a tick of the page shown
    assert not stale(RerunData(page_script_hash=HOME), JOURNEY)                 # a whole-page run: someone navigates
    assert not stale(tick_from_home, "")                                        # nothing drawn yet: nothing to compare
    assert not stale(RerunData(fragment_id_queue=["strip"]), JOURNEY)           # a request naming no page


def test_install_patches_the_runner_and_the_session_once():
    install()
    install()
    assert installed()
    assert ScriptRunner._run_script is runner_fixes.run_unless_stale
    assert AppSession._create_scriptrunner is runner_fixes.create_runner_in_turn
    assert "_pages_manager" in ScriptRunner.__init__.__code__.co_names          # what the fixes read (Streamlit 1.67)
    assert {"_scriptrunner", "_event_loop", "_state"} <= set(AppSession.__init__.__code__.co_names)


class StoppedRunner:
    """A runner that has ended its script: it refuses reruns, as Streamlit's does once stopped."""

    def request_rerun(self, rerun_data) -> bool:
        return False


def test_a_new_runner_waits_until_the_stopped_one_has_shut_down(monkeypatch):
    created = []
    monkeypatch.setattr(runner_fixes, "_create_scriptrunner", lambda session, data: created.append(data))

    async def scenario() -> None:
        session = SimpleNamespace(_scriptrunner=StoppedRunner(), _state=AppSessionState.APP_NOT_RUNNING,
                                  _event_loop=asyncio.get_running_loop())
        tick = RerunData(fragment_id_queue=["strip"])
        create_runner_in_turn(session, tick)
        await asyncio.sleep(5 * runner_fixes.RETRY_SECONDS)
        assert created == []                          # the old runner's last events are still on their way
        session._scriptrunner = None                  # its SHUTDOWN event was handled: all its messages are out
        await asyncio.sleep(5 * runner_fixes.RETRY_SECONDS)
        assert created == [tick]                      # the request was kept, and runs now, once

    asyncio.run(scenario())


def test_without_a_runner_one_starts_at_once(monkeypatch):
    created = []
    monkeypatch.setattr(runner_fixes, "_create_scriptrunner", lambda session, data: created.append(data))
    session = SimpleNamespace(_scriptrunner=None, _state=AppSessionState.APP_NOT_RUNNING, _event_loop=None)
    create_runner_in_turn(session, RerunData())
    assert len(created) == 1
