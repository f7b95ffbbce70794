"""app/hosting/runner_fixes.py: a tick from a page the session left is skipped; a new runner waits for the old one's
last messages; a press during a run starts the next run only once that run has left its script. Each race is
shown for real, stock and fixed: a Streamlit server process and the browser's own protocol (bench/st_client.py);
race 2 on a server whose event loop lags on purpose, counted by the server (docs/app.md). And the rules each fix
applies, on stand-ins."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

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
    assert HOLD < runner_fixes.STOP_WAIT_SECONDS
    page = BLOCKING_PAGE.replace("DREW", repr(str(tmp_path / "drew"))).replace("HOLD", repr(HOLD))
    with streamlit_server(page, tmp_path) as url:
        assert asyncio.run(press_go_then_stop(url, "")) == ["live: True"]       # the race, as Streamlit 1.67 runs it
        assert asyncio.run(press_go_then_stop(url, "fixed=1")) == ["live: False"]


@contextmanager
def streamlit_server(page: str, tmp_path: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """A real Streamlit server process running `page` (fastReruns on, as by default), on a loopback port."""
    script, port, log = tmp_path / "page.py", free_port(), tmp_path / "streamlit.log"
    script.write_text(page)
    with open(log, "w") as out:
        proc = subprocess.Popen([python(), "-m", "streamlit", "run", str(script), "--server.port", str(port),
                                 "--server.headless", "true", "--browser.gatherUsageStats", "false"],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, log, timeout=60, path="/_stcore/health")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:       # a server whose event loop is kept busy may not get to its signal
            proc.kill()
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


# Race 1. A page whose fragment moves the session to another page (as a follower's strip does when the presenter's
# run ends), and a page that runs until a tick sent from the first page has reached its run. The browser's timer
# keeps ticking until it hears of the move, so a tick naming the old page can reach the server while the new page
# runs; the test sends that tick itself, the moment it hears of the move (the timer's interval is out of the way).
# The new page waits for the tick on an event (its run's requests leave CONTINUE), never on the machine's speed.
MOVING_PAGE = """
import threading
import time
import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx
from app.hosting.runner_fixes import install

if "fixed" not in st.session_state:   # the address, as the first run got it
    st.session_state.fixed = bool(st.query_params.get("fixed"))
if st.session_state.fixed:
    install()                       # for every session from now on: the session without it goes first


def home():
    @st.fragment(run_every=600)     # its timer: the test sends each tick itself
    def tick():
        st.caption("tick")
        if st.session_state.get("ticked"):
            st.switch_page(OTHER)   # the server moves the session, as a follower's strip does
        st.session_state.ticked = True
    tick()


def other():
    st.write("other: first line")
    if not st.session_state.get("waited"):       # the file ENDED says this page's runner has ended (its thread)
        script = threading.current_thread()
        threading.Thread(target=lambda: (script.join(60), open(ENDED, "w").close())).start()
    requests = get_script_run_ctx().script_requests
    held = time.monotonic()
    while not st.session_state.get("waited") and requests._state.value == "CONTINUE" and time.monotonic() - held < 60:
        time.sleep(0.01)            # until the late tick has reached this run (its rerun is queued behind it)
    st.session_state.waited = True
    st.write("other: last line")

    @st.fragment(run_every=600)     # the test's marker: a run asked for after everything else
    def mark():
        st.caption("mark")
    mark()


OTHER = st.Page(other)
st.navigation([st.Page(home, default=True), OTHER]).run()
"""


def test_a_tick_from_the_page_the_session_left_does_not_run_naming_that_page(tmp_path):
    """Streamlit alone runs the late tick after the new page, as a fragment run naming the page the session left:
    its `new_session` names that page, and a browser takes it as a move back and clears the new page (docs/app.md,
    race 1). With the fix the tick is skipped: after the move, every run names the new page."""
    ended = tmp_path / "ended"
    with streamlit_server(MOVING_PAGE.replace("ENDED", repr(str(ended))), tmp_path) as url:
        home, stale = asyncio.run(move_then_tick_late(url, ended, fixed=False))
        assert stale == [home]                                          # the race, as Streamlit 1.67 runs it
        assert asyncio.run(move_then_tick_late(url, ended, fixed=True))[1] == []


async def move_then_tick_late(url: str, ended: Path, fixed: bool) -> tuple[str, list[str]]:
    """The home page's hash, and the page each fragment run after the move named, where not the page moved to.
    Streamlit alone: read until the stale run has come. With the fix: once the runner that took the late tick has
    ended, a tick of the new page's own fragment; read until its run starts: any run before it has been sent (the
    fix keeps a new runner from dropping an old one's last messages: race 2)."""
    person = Person(url, ticking=False)
    await person.open(query="fixed=1" if fixed else "")
    try:
        assert await person.until(lambda p: p.runs >= 1 and p.fragments and p.pages, 30)
        home, other, tick = person.pages["home"], person.pages["other"], person.fragments[0]
        ended.unlink(missing_ok=True)
        await person.rerun(fragment=tick)                               # the tick that moves the session
        assert await person.until(lambda p: p.page_hash == other, 30)
        moved = len(person.started)

        def stale(p: Person) -> list[str]:
            return [page for page, fragments in p.started[moved:] if fragments and page != other]
        await person.rerun(fragment=tick, page_hash=home)               # a tick sent before the browser heard of it
        assert await person.until(lambda p: p.runs >= 2 and p.shows("other: last line"), 60)
        if not fixed:
            assert await person.until(stale, 60)
            return home, stale(person)
        assert await appears(ended, 60)                                 # the late tick was taken (and skipped)
        mark = person.fragments[-1]                                     # the new page's own fragment
        await person.rerun(fragment=mark)
        assert await person.until(lambda p: (other, (mark,)) in p.started[moved:], 60)
        return home, stale(person)
    finally:
        await person.close()


async def appears(path: Path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return path.exists()


# Race 2. A page with a `run_every` fragment on a server whose event loop lags on purpose (a callback that sleeps
# LAG s every turn stands in for a server busy with other sessions), so ticks are read before a runner's last events
# are handled. The page counts, in files, each rerun a runner refused because it had stopped (the race's opening:
# Streamlit then starts a new runner at once, the fix holds the request) and each forward message the session
# ignored because its runner was no longer the current one (what the race loses). It changes nothing it counts.
LAGGING_PAGE = """
import os
import time
import streamlit as st
from streamlit.runtime import Runtime
from streamlit.runtime.app_session import AppSession
from streamlit.runtime.scriptrunner.script_runner import ScriptRunner
from app.hosting.runner_fixes import install

if os.environ.get("RACE2_FIXED"):
    install()


def note(path):
    with open(path, "a") as f:
        f.write("x")


@st.cache_resource
def count_and_lag():
    handle, request = AppSession._handle_scriptrunner_event_on_event_loop, ScriptRunner.request_rerun

    def counted_handle(self, sender, event, *args, **kwargs):
        if sender is not None and sender is not self._scriptrunner and event.name == "ENQUEUE_FORWARD_MSG":
            note(IGNORED)
        return handle(self, sender, event, *args, **kwargs)

    def counted_request(self, rerun_data):
        taken = request(self, rerun_data)
        if not taken:
            note(REFUSED)
        return taken
    AppSession._handle_scriptrunner_event_on_event_loop = counted_handle
    ScriptRunner.request_rerun = counted_request
    loop = Runtime.instance()._get_async_objs().eventloop

    def other_work():
        time.sleep(LAG)
        loop.call_soon(other_work)
    loop.call_soon_threadsafe(other_work)


count_and_lag()


@st.fragment(run_every=0.05)
def tick():
    st.caption("tick")


tick()
"""
LAG = 0.1


def test_a_request_after_a_runner_stopped_no_longer_drops_its_last_messages(tmp_path):
    """Streamlit alone starts a new runner for a tick that finds the last one stopped but its events not yet handled,
    and ignores those events: messages the browser never gets (docs/app.md, race 2). With the fix the tick waits
    until the old runner has shut down: as many refused ticks, no message ignored."""
    stock_refused, stock_ignored = lagging_session(tmp_path / "stock", fixed=False, until_ignored=True)
    assert stock_refused >= 1 and stock_ignored >= 1                    # the race, as Streamlit 1.67 runs it
    fixed_refused, fixed_ignored = lagging_session(tmp_path / "fixed", fixed=True, until_ignored=False)
    assert fixed_refused >= FIXED_REFUSALS and fixed_ignored == 0


FIXED_REFUSALS = 20


def lagging_session(folder: Path, fixed: bool, until_ignored: bool) -> tuple[int, int]:
    """One session ticking on LAGGING_PAGE's server: stock, until a message was ignored (or 500 refusals); with the
    fix, until FIXED_REFUSALS ticks were refused. The refusals and ignored messages counted."""
    folder.mkdir()
    refused, ignored = folder / "refused", folder / "ignored"
    page = LAGGING_PAGE.replace("IGNORED", repr(str(ignored))).replace("REFUSED", repr(str(refused)))
    with streamlit_server(page.replace("LAG", repr(LAG)), folder, {"RACE2_FIXED": "1" if fixed else ""}) as url:
        asyncio.run(tick_until(url, lambda: (size(ignored) >= 1 or size(refused) >= 500) if until_ignored
                               else size(refused) >= FIXED_REFUSALS))
    return size(refused), size(ignored)


def size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


async def tick_until(url: str, done) -> None:
    person = Person(url)                                                # ticks as the page asks, as a browser does
    await person.open()
    try:
        deadline = time.monotonic() + 120
        while not done() and time.monotonic() < deadline and person.closed_reason is None:
            await asyncio.sleep(0.05)
    finally:
        await person.close()
