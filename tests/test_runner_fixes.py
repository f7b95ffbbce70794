"""app/hosting/runner_fixes.py: a tick from a page the session left is skipped; a new runner waits for the old one's
last messages; a press during a run starts the next run only once that run has left its script. The first two
races need a loaded server (bench/watch.py): here, the rules each fix applies. The third is shown for real: a
Streamlit server process and the browser's own protocol (bench/st_client.py)."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from types import SimpleNamespace

import streamlit
from streamlit.runtime.app_session import AppSession, AppSessionState
from streamlit.runtime.scriptrunner import RerunData
from streamlit.runtime.scriptrunner.script_runner import ScriptRunner

from app.hosting import runner_fixes
from app.hosting.runner_fixes import create_runner_in_turn, install, installed, stale
from servers import ROOT, free_port, python, wait_ready

sys.path.insert(0, str(ROOT / "bench"))
from st_client import Person  # noqa: E402

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


def test_the_fixes_stay_off_outside_the_streamlit_release_they_are_written_for(monkeypatch, caplog):
    monkeypatch.setattr(ScriptRunner, "_run_script", runner_fixes._run_script)
    monkeypatch.setattr(AppSession, "_create_scriptrunner", runner_fixes._create_scriptrunner)
    for version in ("1.68.0", "1.66.2", "2.0.0"):
        assert not install(version)
        assert not installed()                                                # Streamlit's own runner, untouched
    assert sum("fixes (app/hosting/runner_fixes.py)" in r.getMessage() for r in caplog.records) == 3  # once a version
    assert install("1.67.3") and installed()


def test_the_lock_and_pyproject_keep_streamlit_inside_the_fence():
    import tomllib

    from packaging.specifiers import SpecifierSet

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = SpecifierSet(next(d for d in deps if d.startswith("streamlit"))[len("streamlit"):])
    locked = next(line.split("==")[1] for line in (ROOT / "constraints.txt").read_text().splitlines()
                  if line.startswith("streamlit=="))
    assert runner_fixes.fits(locked) and locked in spec
    assert all(runner_fixes.fits(v) for v in spec.filter(["1.66.9", "1.67.0", "1.67.9", "1.68.0", "2.0.0"]))
    assert runner_fixes.fits(streamlit.__version__)                           # what `make install` put here


def test_the_launcher_says_at_start_when_streamlit_is_outside_the_fence():
    """One line at start, from the package's metadata (the launcher does not import Streamlit); none inside it."""
    from app.hosting.fence import fence_line
    from app.launch import streamlit_fence_line

    assert streamlit_fence_line() is None and fence_line("1.67.9") is None
    line = fence_line("1.68.0")
    assert line.startswith("Streamlit 1.68.0 is installed;") and "are off" in line and "\n" not in line


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


class Runner:
    """A runner as the session sees one: its script thread, and the reruns it was handed."""

    def __init__(self, first: RerunData, thread: threading.Thread | None = None):
        self.runs, self._script_thread = [first], thread

    def request_rerun(self, rerun_data) -> bool:
        self.runs.append(rerun_data)
        return True


def test_presses_during_a_run_wait_for_it_to_leave_its_script_then_arrive_in_order(monkeypatch):
    """fastReruns stopped the running runner and dropped it; its script is still inside a read (a thread that has
    not ended). Two presses meanwhile start nothing; once it ends, the first starts the new runner and the second
    reaches it after, as the browser sent them."""
    monkeypatch.setattr(runner_fixes, "_create_scriptrunner",
                        lambda session, data: setattr(session, "_scriptrunner", Runner(data)))
    leave = threading.Event()
    old = threading.Thread(target=leave.wait, args=(30,))
    old.start()

    async def scenario() -> None:
        session = SimpleNamespace(_scriptrunner=None, _state=AppSessionState.APP_NOT_RUNNING,
                                  _event_loop=asyncio.get_running_loop(), _playground_runner=Runner(None, old))
        stop, generate = RerunData(page_name="stop"), RerunData(page_name="generate")
        create_runner_in_turn(session, stop)
        create_runner_in_turn(session, generate)
        await asyncio.sleep(5 * runner_fixes.RETRY_SECONDS)
        assert session._scriptrunner is None                  # the old script has not left: nothing runs beside it
        leave.set()
        old.join(5)
        await asyncio.sleep(5 * runner_fixes.RETRY_SECONDS)
        assert session._scriptrunner.runs == [stop, generate]

    asyncio.run(scenario())


def test_without_a_runner_one_starts_at_once(monkeypatch):
    created = []
    monkeypatch.setattr(runner_fixes, "_create_scriptrunner", lambda session, data: created.append(data))
    session = SimpleNamespace(_scriptrunner=None, _state=AppSessionState.APP_NOT_RUNNING, _event_loop=None)
    create_runner_in_turn(session, RerunData())
    assert len(created) == 1


# A page whose run, once Go is pressed, blocks with no `st` call (as the journey page waits for the model's next
# token) and marks its run no longer live in its `finally`, on the object, as app/runs/run.py's follow() does (a stopped
# run's `st.session_state` refuses writes: StopException). Stop pressed meanwhile: the next run must see it done.
# The block ends on events, never on the machine's speed: first when Stop has told the run to stop (its script
# requests leave CONTINUE), then when a run beside it has drawn its line (the DREW file: Streamlit alone) or, with
# the fix, where no run can start beside it, after HOLD seconds, well inside the fix's STOP_WAIT_SECONDS.
BLOCKING_PAGE = """
import os
import time
import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx
from app.hosting.runner_fixes import install

if "fixed" not in st.session_state:   # the address, as the first run got it (a widget's rerun sends no query)
    st.session_state.fixed = bool(st.query_params.get("fixed"))
fixed = st.session_state.fixed
if fixed:
    install()                       # for every session from now on: the session without it goes first
go = st.button("Go", key="go")
st.button("Stop", key="stop")
if go:
    run = st.session_state.run = {"live": True}
    if os.path.exists(DREW):
        os.remove(DREW)
    try:
        st.write("started")
        requests = get_script_run_ctx().script_requests
        while requests._state.value == "CONTINUE":          # until Stop's rerun tells this run to stop
            time.sleep(0.01)
        held = time.monotonic()
        while not os.path.exists(DREW) and time.monotonic() - held < (HOLD if fixed else 300):
            time.sleep(0.01)
    finally:
        run["live"] = False
st.write(f"live: {st.session_state.get('run', {}).get('live')}")
open(DREW, "w").close()
"""
HOLD = 3.0


def test_a_press_during_a_run_starts_the_next_run_after_it_not_beside_it(tmp_path):
    """Streamlit alone starts the next run while the stopped one still blocks, so it draws the run as live (the
    journey page drew a stopped answer as still generating); with the fix, after the stopped run's `finally`."""
    script, port, log = tmp_path / "page.py", free_port(), tmp_path / "streamlit.log"
    assert HOLD < runner_fixes.STOP_WAIT_SECONDS
    script.write_text(BLOCKING_PAGE.replace("DREW", repr(str(tmp_path / "drew"))).replace("HOLD", repr(HOLD)))
    with open(log, "w") as out:
        proc = subprocess.Popen([python(), "-m", "streamlit", "run", str(script), "--server.port", str(port),
                                 "--server.headless", "true", "--browser.gatherUsageStats", "false"],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, log, timeout=60, path="/_stcore/health")
        assert asyncio.run(press_go_then_stop(url, "")) == ["live: True"]       # the race, as Streamlit 1.67 runs it
        assert asyncio.run(press_go_then_stop(url, "fixed=1")) == ["live: False"]
    finally:
        proc.terminate()
        proc.wait(30)


async def press_go_then_stop(url: str, query: str) -> list[str]:
    """What the run after Stop drew (fastReruns on, as by default)."""
    person = Person(url)
    await person.open(query=query)
    try:
        assert await person.until(lambda p: p.runs >= 1 and "stop" in p.widgets, 30)
        await person.press("go")
        assert await person.until(lambda p: p.shows("started"), 30)
        runs = person.runs
        await person.press("stop")
        assert await person.until(lambda p: p.runs > runs and p.shows("live:"), 30)
        return [t for t in person.texts if t.startswith("live:")]
    finally:
        await person.close()
