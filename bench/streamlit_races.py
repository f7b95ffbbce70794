"""Race 1 of docs/app.md ("Streamlit's runner"), as a person sees it: a tick from the page a session left clears
the new page in Chromium on stock Streamlit, not with app/hosting/runner_fixes.py installed.

    python bench/streamlit_races.py --tries 3

Each try starts a fresh Streamlit server on RACE1_PAGE (the report's script, plus the two lines that install the
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


def start_server(script: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([str(ROOT / ".venv" / "bin" / "python"), "-m", "streamlit", "run", str(script),
                             "--server.port", str(port), "--server.headless", "true",
                             "--browser.gatherUsageStats", "false"], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
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


def main(argv: list[str] | None = None) -> None:
    run = provenance.start("streamlit_races", argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tries", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "race1.py"
        script.write_text(RACE1_PAGE)
        tries = [asyncio.run(one_try(i, script)) for i in range(args.tries)]
    report = {"race": 1, "delay_s": DELAY, "tries": tries,
              "stock_blank": sum(not t["stock"]["last_line_shown"] for t in tries),
              "fixed_blank": sum(not t["fixed"]["last_line_shown"] for t in tries),
              "note": "shared 2-core machine; the outcome is read from the page and the messages, not from timing"}
    path = run.save(report)
    print(f"race 1 in Chromium, {args.tries} tries: stock blank {report['stock_blank']}, "
          f"fixed blank {report['fixed_blank']} -> {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
