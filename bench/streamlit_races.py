"""Races 1 and 2 of docs/app.md ("Streamlit's runner"), stock Streamlit against app/hosting/runner_fixes.py.

    python bench/streamlit_races.py --tries 3                      # race 1, in Chromium
    python bench/streamlit_races.py --race 2 --tries 20            # race 2 as the page shows it
    python bench/streamlit_races.py --race 2 --counts --tries 3    # race 2 as the server counts it

Race 2 as the page shows it: one server stock, one with the fixes (RACE2_VISIBLE_PAGE: a page whose last element is
its run's number, on a server whose event loop lags LAG2 s a turn); one session each, a client of the browser's
protocol that --tries times reruns the page and sends its fragment's tick a moment later. Per try: whether the page
received "run n" and the run's `script_finished` before the tick's fragment run began (after it they never come).

Race 2 counted (--counts): one server stock, one with the fixes (RACE2_PAGE: a `run_every` fragment over a page of 20 lines drawn in
about a second, on a server whose event loop is made to lag on purpose: a callback that sleeps LAG s every turn
stands in for a server busy with other sessions). Per server, --tries sessions one after another, each a client of
the browser's protocol (bench/st_client.Person, ticking every 0.05 s as the page asks) reading for READ_S s: the
lines it received and whether the whole run's `script_finished` came; and from the server's own log (the page wraps
two of AppSession's methods to count, and changes nothing): how often a request would start a runner while the
session's previous runner had not reported SHUTDOWN (the race's opening), and how many events the session ignored
because they came from a runner no longer current (what the race loses).

Race 1: each try starts a fresh Streamlit server on RACE1_PAGE (the report's script, plus the two lines that install the
fixes for a session opened with `?fixed=1`; installing patches the whole process, so the stock tab goes first),
then opens it in headless Chromium twice: stock, then fixed. The page's fragment moves the session to `other` on
its third tick; the server's replies reach the tab DELAY seconds late (a slow link, through playwright's websocket
route), so the tab's timer ticks from `home` after the server has moved it. Per tab: whether `other`'s last line is
on the page a few seconds after its first line showed, the `new_session` messages the server sent (page, fragment
run or not), and a screenshot in /tmp. Writes bench/results/streamlit_races/<UTC time>-<commit>.json.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
from room_browser import ARGS, CHROMIUM, free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DELAY = 1.0                     # s: how late the server's messages reach the tab
RACE1_PAGE = '''
import time

import streamlit as st

if st.query_params.get("fixed"):          # the bench's switch, not part of the report
    from app.hosting.runner_fixes import install
    install()


def home():
    @st.fragment(run_every=0.5)
    def tick():
        st.session_state.ticks = st.session_state.get("ticks", 0) + 1
        st.caption(f"tick {st.session_state.ticks}")
        if st.session_state.ticks == 3:
            st.switch_page(OTHER)         # the server moves the session, as when a presenter's run ends
    tick()


def other():
    st.write("other: first line")
    time.sleep(2.0)                       # the window: ticks the browser sent from home arrive while this runs
    st.write("other: last line")


OTHER = st.Page(other)
st.navigation([st.Page(home, default=True), OTHER]).run()
'''


LAG, READ_S = 0.1, 12.0
RACE2_PAGE = '''
import sys
import time

import streamlit as st
from streamlit.runtime import Runtime
from streamlit.runtime.app_session import AppSession

if st.query_params.get("fixed"):          # the bench's switch, not part of the report
    from app.hosting.runner_fixes import install
    install()


@st.cache_resource
def count() -> None:
    """The bench's eyes, not part of the report: log each request that would start a runner while the session's last
    one has not shut down (stock starts it at once; the fix holds it), and each event the session ignored because
    its runner is no longer the current one."""
    handle, create = AppSession._handle_scriptrunner_event_on_event_loop, AppSession._create_scriptrunner

    def counted_handle(self, sender, event, *args, **kwargs):
        if sender is not None and sender is not self._scriptrunner:
            print("RACE2 ignored", event.name, file=sys.stderr, flush=True)
        return handle(self, sender, event, *args, **kwargs)

    def counted_create(self, rerun_data):
        if self._scriptrunner is not None:
            print("RACE2 request before shutdown", file=sys.stderr, flush=True)
        return create(self, rerun_data)
    AppSession._handle_scriptrunner_event_on_event_loop = counted_handle
    AppSession._create_scriptrunner = counted_create


@st.cache_resource
def busy_server(lag: float = LAG) -> None:
    """Stands in for a server busy with other sessions: every turn of its event loop takes `lag` s more."""
    loop = Runtime.instance()._get_async_objs().eventloop

    def other_work() -> None:
        time.sleep(lag)
        loop.call_soon(other_work)
    loop.call_soon_threadsafe(other_work)


count()
busy_server()


@st.fragment(run_every=0.05)
def tick():
    st.caption("tick")


tick()
for i in range(20):
    time.sleep(0.05)                      # a page that takes a second to draw
    st.write(f"line {i}")
'''.replace("LAG", repr(LAG))


async def race2_session(url: str, query: str) -> dict:
    from st_client import Person  # here: only race 2 speaks the protocol

    person = Person(url)
    await person.open(query=query)
    await asyncio.sleep(READ_S)                         # ticking as the page asks, reading what comes
    lines = sorted({int(t[5:]) for t in person.texts if t.startswith("line ")})
    await person.close()
    return {"lines": len(lines), "whole_run_finished": person.runs >= 1}


def race2_server(script: Path, query: str, tries: int) -> dict:
    log = script.with_suffix(".log")
    proc, url = start_server(script, log)
    try:
        sessions = [asyncio.run(race2_session(url, query)) for _ in range(tries)]
    finally:
        proc.kill()                                     # its event loop sleeps: SIGTERM would wait its turn
        proc.wait(30)
    text = log.read_text()
    return {"sessions": sessions, "short": sum(s["lines"] < 20 or not s["whole_run_finished"] for s in sessions),
            "requests_before_shutdown": text.count("RACE2 request before shutdown"),
            "ignored_forward_msgs": text.count("RACE2 ignored ENQUEUE_FORWARD_MSG"),
            "ignored_events": text.count("RACE2 ignored")}


def race2(tries: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "race2.py"
        script.write_text(RACE2_PAGE)
        return {"race": 2, "lag_s": LAG, "read_s": READ_S, "stock": race2_server(script, "", tries),
                "fixed": race2_server(script, "fixed=1", tries)}


# Race 2 as a person sees it: a page whose last element is the number of its run. The client reruns the page (as
# pressing "R" or a button does) and its fragment's timer ticks once, TICK_AFTER s later (one of five offsets, in
# turn: where the window falls depends on the machine's speed); the server's event loop lags LAG2 s a turn (the busy
# server). Stock: when the tick is handled after the run's runner
# stopped but before its last events, the page never gets "run n" nor its script_finished, and the next thing it
# receives is the tick's fragment run. Told apart by the order of what the client receives, never by time.
LAG2, TICK_AFTER = 0.2, (0.2, 0.25, 0.3, 0.35, 0.4)
RACE2_VISIBLE_PAGE = '''
import time

import streamlit as st
from streamlit.runtime import Runtime

if st.query_params.get("fixed"):          # the bench's switch, not part of the report
    from app.hosting.runner_fixes import install
    install()


@st.cache_resource
def busy_server():
    """Stands in for a server busy with other sessions: every turn of its event loop takes LAG s more."""
    loop = Runtime.instance()._get_async_objs().eventloop

    def other_work():
        time.sleep(LAG)
        loop.call_soon(other_work)
    loop.call_soon_threadsafe(other_work)


busy_server()


@st.fragment(run_every=600)               # a timer; the client sends its tick itself, once per try
def tick():
    st.caption("tick")


tick()
st.session_state.runs = st.session_state.get("runs", 0) + 1
st.write(f"run {st.session_state.runs}")  # the page's last element: the number of this run
'''.replace("LAG", repr(LAG2))


async def race2_visible_session(url: str, query: str, tries: int) -> list[dict]:
    """One session: the first load, then `tries` times a rerun of the page and a tick one of TICK_AFTER s later (the
    tick lands, not what is counted); per try, what the page held when the tick's fragment run began (everything the rerun sends comes before it, or never)."""
    from st_client import Person  # here: only race 2 speaks the protocol

    person = Person(url, ticking=False)
    await person.open(query=query)
    outcomes = []
    try:
        assert await person.until(lambda p: p.runs >= 1 and p.fragments and p.shows("run 1"), 60), "no first run"
        for n in range(2, tries + 2):
            runs, started = person.runs, len(person.started)
            await person.rerun(query=query)                            # the whole page, as a rerun from the browser
            after = TICK_AFTER[n % len(TICK_AFTER)]
            await asyncio.sleep(after)                                 # the timer fires (where it lands, only)
            await person.rerun(fragment=person.fragments[0])
            tick_ran = await person.until(lambda p: any(f for _, f in p.started[started:]), 60)
            outcomes.append({"run": n, "tick_after_s": after, "tick_ran": tick_ran,
                             "last_line": person.shows(f"run {n}"), "finished": person.runs > runs})
    finally:
        await person.close()
    return outcomes


def race2_visible_server(script: Path, query: str, tries: int) -> dict:
    proc, url = start_server(script, script.with_suffix(".log"))
    try:
        outcomes = asyncio.run(race2_visible_session(url, query, tries))
    finally:
        proc.kill()                                     # its event loop sleeps: SIGTERM would wait its turn
        proc.wait(30)
    return {"tries": len(outcomes), "tick_ran": sum(o["tick_ran"] for o in outcomes),
            "last_line_missing": sum(not o["last_line"] for o in outcomes),
            "script_finished_missing": sum(not o["finished"] for o in outcomes), "outcomes": outcomes}


def race2_visible(tries: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "race2.py"
        script.write_text(RACE2_VISIBLE_PAGE)
        return {"race": 2, "what": "page", "lag_s": LAG2, "tick_after_s": TICK_AFTER,
                "stock": race2_visible_server(script, "", tries), "fixed": race2_visible_server(script, "fixed=1", tries)}


def start_server(script: Path, log: Path | None = None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    out = open(log, "w") if log else subprocess.DEVNULL
    proc = subprocess.Popen([str(ROOT / ".venv" / "bin" / "python"), "-m", "streamlit", "run", str(script),
                             "--server.port", str(port), "--server.headless", "true",
                             "--browser.gatherUsageStats", "false"], cwd=ROOT, stdout=out,
                            stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            urllib.request.urlopen(url + "/_stcore/health", timeout=2)
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.terminate()
    raise SystemExit(f"Streamlit did not start on {url}")


async def one_tab(browser, url: str, shot: str) -> dict:
    """Open the page in a tab whose server messages arrive DELAY s late; what the tab shows, what the server sent."""
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg  # here: the bench's only use of Streamlit's protos

    page = await browser.new_page(viewport={"width": 1024, "height": 768})
    runs, errors, loop = [], [], asyncio.get_running_loop()
    page.on("console", lambda m: errors.append(m.text[:200]) if m.type == "error" else None)

    def route(ws) -> None:
        server = ws.connect_to_server()
        ws.on_message(server.send)

        def down(raw) -> None:
            msg = ForwardMsg()
            msg.ParseFromString(raw)
            if msg.WhichOneof("type") == "new_session":
                runs.append({"page": msg.new_session.page_script_hash, "fragment": bool(msg.metadata.run.fragment_ids)})
            loop.call_later(DELAY, ws.send, raw)
        server.on_message(down)
    await page.route_web_socket("**/_stcore/stream", route)
    await page.goto(url)
    await page.get_by_text("other: first line").wait_for(timeout=60_000)
    await page.wait_for_timeout(8_000)                  # other's run (2 s) and the late ticks, DELAY late
    await page.screenshot(path=shot)
    body = await page.inner_text("body")
    await page.close()
    return {"last_line_shown": "other: last line" in body, "runs": runs, "console_errors": errors[:5],
            "screenshot": shot}


async def one_try(i: int, script: Path) -> dict:
    from playwright.async_api import async_playwright  # here: only this bench drives a browser

    proc, url = start_server(script)
    try:
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            stock = await one_tab(browser, url, f"/tmp/streamlit_race1-stock-{i}.png")
            fixed = await one_tab(browser, url + "/?fixed=1", f"/tmp/streamlit_race1-fixed-{i}.png")
            await browser.close()
    finally:
        proc.terminate()
        proc.wait(30)
    return {"stock": stock, "fixed": fixed}


def race1(tries: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "race1.py"
        script.write_text(RACE1_PAGE)
        done = [asyncio.run(one_try(i, script)) for i in range(tries)]
    return {"race": 1, "delay_s": DELAY, "tries": done,
            "stock_blank": sum(not t["stock"]["last_line_shown"] for t in done),
            "fixed_blank": sum(not t["fixed"]["last_line_shown"] for t in done)}


def main(argv: list[str] | None = None) -> None:
    run = provenance.start("streamlit_races", argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--race", type=int, choices=(1, 2), default=1)
    parser.add_argument("--tries", type=int, default=3)
    parser.add_argument("--counts", action="store_true", help="race 2: the server's own counts, not the page")
    args = parser.parse_args(argv)
    if args.race == 1:
        report = race1(args.tries)
    else:
        report = race2(args.tries) if args.counts else race2_visible(args.tries)
    report["note"] = "shared 2-core machine; outcomes are read from the page, the messages and the server's log"
    path = run.save(report)
    short = {k: ({a: b for a, b in v.items() if a not in ("outcomes", "sessions")} if isinstance(v, dict) else v)
             for k, v in report.items() if k not in ("tries", "note")}
    print(short, "->", path.relative_to(ROOT))


if __name__ == "__main__":
    main()
