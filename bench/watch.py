"""Watchers: how many followers one server holds while they watch the presenter's run live.

    python bench/watch.py --followers 30 --browsers 3 --tokens 48

The app starts with a presenter token. The presenter (a headless Chromium tab) unlocks presenter mode and
generates on the journey page; every follower (already open on the home page) watches the run stream in the
strip at the top of its page (app/runs/watch.py), then moves to the journey page, which draws the finished run. `--browsers` of the followers are Chromium tabs; the rest are tabs without a
browser (bench/st_client.py: the same websocket protocol, nothing rendered), because thirty browsers
rendering on this machine's two cores would measure the browsers, not the server: in a room each person's
browser renders on their own laptop.

Every tab logs the moment its "Generated tokens" metric first shows each count (Chromium tabs with a 100 ms
poll in the page; the others when the delta arrives; one machine clock). Per token count and follower: how
long after the presenter's tab the follower's showed it (the stream lag); how long after the presenter's
"Done" its own tab said done, and how long until it showed the finished run's whole page (the page lag; a
follower whose page never came is counted, with a screenshot in /tmp). Also the server's and the browsers' CPU seconds. Writes
a new bench/results/watch/<UTC time>-<commit>.json (bench/provenance.py).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
from room_browser import ARGS, CHROMIUM, cpu_seconds, spent, start_app  # noqa: E402
from st_client import UP_CLOSE, Tab, first_seen  # noqa: E402

TOKEN = "watch-bench-token-123"
PAGE_ERRORS: list[str] = []                      # errors thrown in any Chromium tab, and renderer crashes
# Timers of pages that are not in front must not be slowed, or the log would lag for the browser's sake.
WATCH_ARGS = ARGS + ["--disable-background-timer-throttling", "--disable-renderer-backgrounding",
                     "--disable-backgrounding-occluded-windows"]
COUNT_LOG = """() => {
  window.__counts = [];
  window.__ends = {};
  let last = 0;
  setInterval(() => {
    const m = [...document.querySelectorAll('[data-testid="stMetric"]')]
      .find(e => e.innerText.startsWith('Generated tokens'));
    const n = m ? parseInt(m.innerText.split('\\n').pop().replace(/,/g, '')) || 0 : 0;
    if (n > last) { window.__counts.push([n, Date.now()]); last = n; }
    const text = Object.keys(window.__ends).length < 2 ? document.body.innerText : '';
    for (const mark of ['Done:', 'UP_CLOSE']) {
      if (!(mark in window.__ends) && text.includes(mark)) window.__ends[mark] = Date.now();
    }
  }, 100);
}""".replace("UP_CLOSE", UP_CLOSE)


def open_page(browser, url: str, path: str = ""):
    context = browser.new_context(viewport={"width": 1024, "height": 768})
    page = context.new_page()
    page.on("pageerror", lambda err: PAGE_ERRORS.append(str(err)[:300]))
    page.on("crash", lambda _: PAGE_ERRORS.append("renderer crashed"))
    page.add_init_script(f"({COUNT_LOG})()")
    page.goto(f"{url}/{path}", timeout=180_000)
    page.get_by_role("heading").first.wait_for(timeout=180_000)
    return page


def unlock(page) -> None:
    page.get_by_text("Presenter mode", exact=True).click()
    box = page.get_by_label("Presenter token")
    box.fill(TOKEN)
    box.press("Enter")
    page.get_by_text("You are the presenter", exact=False).wait_for(timeout=60_000)


def browser_seen(page) -> dict[int, float]:
    """Token count -> when the Chromium tab first showed it (s)."""
    return first_seen([(n, ms / 1000) for n, ms in page.evaluate("window.__counts")])


def open_tabs(url: str, n: int) -> tuple[list[Tab], callable]:
    """`n` browserless tabs on a thread of their own; returns them and a function that closes them."""
    tabs = [Tab(url) for _ in range(n)]
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def run_all() -> None:
        await asyncio.gather(*(tab.run(stop) for tab in tabs))
    thread = threading.Thread(target=loop.run_until_complete, args=(run_all(),), daemon=True)
    thread.start()

    def close() -> None:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
    return tabs, close


def stream_lags(lead: dict[int, float], followers: list[dict[int, float]]) -> tuple[list[float], int]:
    """Seconds each follower showed each count after the presenter did; and how many counts were never shown
    by a follower (it jumped straight to the end)."""
    lags, missed = [], 0
    for seen in followers:
        for k, ms in lead.items():
            if k in seen:
                lags.append(max(0.0, seen[k] - ms))
            else:
                missed += 1
    return lags, missed


def percentile(values: list[float], q: float) -> float | None:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else (values[0] if values else None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--followers", type=int, default=30, help="followers in all")
    parser.add_argument("--browsers", type=int, default=3, help="how many of them are Chromium tabs")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--out", type=Path, help="default: a new file under bench/results/watch/")
    args = parser.parse_args(argv)
    run = provenance.start("watch", argv)
    browsers = min(args.browsers, args.followers)
    proc, url = start_app({"PLAYGROUND_PRESENTER_TOKEN": TOKEN})
    try:
        report = watch(proc, url, args.followers, browsers, args.tokens)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    run.save(report, out=args.out)
    print(json.dumps(report, indent=2))
    return 0


def browser_ends(pages, wall_done: float) -> list[tuple[float | None, float | None]]:
    """Per Chromium follower: seconds after the presenter's "Done" until its tab said "Done", and until it showed
    the finished run's whole page (None: not within 120 s; a screenshot is kept). From the tab's own log."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    ends = []
    for i, page in enumerate(pages):
        try:
            page.get_by_text(UP_CLOSE).first.wait_for(timeout=max(1.0, 120 - (time.time() - wall_done)) * 1000)
        except PlaywrightTimeout:
            page.screenshot(path=f"/tmp/watch-follower-{i}.png", full_page=True)
        marks = page.evaluate("window.__ends")
        ends.append(tuple(max(0.0, marks[m] / 1000 - wall_done) if m in marks else None for m in ("Done:", UP_CLOSE)))
    return ends


def tab_ends(tabs: list[Tab], wall_done: float) -> list[tuple[float | None, float | None]]:
    """The same for the browserless followers, from the moments their messages arrived."""
    deadline = time.perf_counter() + 120
    while any(t.page_at is None for t in tabs) and time.perf_counter() < deadline:
        time.sleep(0.2)
    return [tuple(None if at is None else max(0.0, at - wall_done) for at in (t.done_at, t.page_at)) for t in tabs]


def end_figures(ends: list[tuple[float | None, float | None]]) -> dict:
    done = [d for d, _ in ends if d is not None]
    page = [p for _, p in ends if p is not None]
    return {"done_lag_p50_s": statistics.median(done) if done else None, "done_lag_max_s": max(done, default=None),
            "page_lag_p50_s": statistics.median(page) if page else None, "page_lag_max_s": max(page, default=None),
            "never_done_in_120_s": len(ends) - len(done), "page_never_drawn_in_120_s": len(ends) - len(page)}


def watch(proc, url: str, followers: int, browsers: int, tokens: int) -> dict:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=WATCH_ARGS)
        lead = open_page(browser, url, "journey")
        unlock(lead)
        box = lead.get_by_role("spinbutton", name="Max new tokens").first
        box.fill(str(tokens))
        box.press("Enter")
        pages = [open_page(browser, url) for _ in range(browsers)]
        tabs, close_tabs = open_tabs(url, followers - browsers)
        lead.wait_for_timeout(3000 + 100 * len(tabs))                  # every tab has drawn its first page
        cpu_before = cpu_seconds(proc)
        lead.get_by_test_id("stMainBlockContainer").get_by_role("button", name="Generate").click()
        t_click = time.perf_counter()
        lead.get_by_text("Done:", exact=False).first.wait_for(timeout=600_000)
        t_done, wall_done = time.perf_counter(), time.time()
        ends = browser_ends(pages, wall_done) + tab_ends(tabs, wall_done)     # (done lag, page lag) per follower
        close_tabs()
        cpu = spent(cpu_before, cpu_seconds(proc))
        seen = [browser_seen(page) for page in pages] + [first_seen(t.counts) for t in tabs]
        lags, missed = stream_lags(browser_seen(lead), seen)
        in_browsers, _ = stream_lags(browser_seen(lead), seen[:len(pages)])
        in_clients, _ = stream_lags(browser_seen(lead), seen[len(pages):])
        browser.close()
    return {"followers": followers, "browser_followers": browsers, "tokens": tokens,
            "presenter_done_s": round(t_done - t_click, 2),
            "stream_lag_p50_s": percentile(lags, 50), "stream_lag_p95_s": percentile(lags, 95),
            "stream_lag_max_s": max(lags, default=None), "counts_shown": len(lags), "counts_not_shown": missed,
            "lag_p50_p95_chromium_followers_s": [percentile(in_browsers, 50), percentile(in_browsers, 95)],
            "lag_p50_p95_browserless_followers_s": [percentile(in_clients, 50), percentile(in_clients, 95)],
            **end_figures(ends),
            "server_messages_per_tab": statistics.median([t.messages for t in tabs]) if tabs else None,
            "server_mb_per_tab": round(statistics.median([t.bytes for t in tabs]) / 1e6, 2) if tabs else None,
            "cpu_seconds": cpu, "page_errors": PAGE_ERRORS[:5],
            "tab_errors": sorted({t.error for t in tabs if t.error})[:5], "load_average": os.getloadavg()}


if __name__ == "__main__":
    sys.exit(main())
