"""Watchers: how many followers one server holds while they watch the presenter's run live, in headless Chromium.

    python bench/watch.py --followers 30 --tokens 48

The app starts with a presenter token. The presenter unlocks presenter mode and generates on the journey page;
every follower's page (already open on the home page) moves to the journey page and redraws the run as it
streams. Measured per follower: how long after the presenter's page its page shows the same number of tokens
(sampled while streaming), and how long after the presenter's "Done" its own page says done. Writes
bench/results/watch.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from room_browser import ARGS, CHROMIUM, start_app  # noqa: E402

TOKEN = "watch-bench-token-123"
RESULTS = Path(__file__).resolve().parent / "results" / "watch.json"
COUNT_JS = """() => { const m = [...document.querySelectorAll('[data-testid="stMetric"]')]
  .find(e => e.innerText.startsWith('Generated tokens'));
  return m ? parseInt(m.innerText.split('\\n').pop().replace(/,/g, '')) || 0 : 0; }"""


def open_page(browser, url: str, path: str = ""):
    context = browser.new_context(viewport={"width": 1024, "height": 768})
    page = context.new_page()
    page.goto(f"{url}/{path}", timeout=180_000)
    page.get_by_role("heading").first.wait_for(timeout=180_000)
    return context, page


def unlock(page) -> None:
    page.get_by_text("Presenter mode", exact=True).click()
    box = page.get_by_label("Presenter token")
    box.fill(TOKEN)
    box.press("Enter")
    page.get_by_text("You are the presenter", exact=False).wait_for(timeout=60_000)


def sample_lag(lead, followers, until_s: float = 600) -> list[float]:
    """While streaming: each time the presenter's count moves, how long each follower takes to show it."""
    lags, deadline = [], time.perf_counter() + until_s
    while time.perf_counter() < deadline:
        target = lead.evaluate(COUNT_JS)
        if target >= 1:
            t0 = time.perf_counter()
            for f in followers:
                while f.evaluate(COUNT_JS) < target and time.perf_counter() - t0 < 30:
                    f.wait_for_timeout(50)
                lags.append(time.perf_counter() - t0)
            return lags
        lead.wait_for_timeout(100)
    return lags


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--followers", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    proc, url = start_app({"PLAYGROUND_PRESENTER_TOKEN": TOKEN})
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            lead_ctx, lead = open_page(browser, url, "journey")
            unlock(lead)
            box = lead.get_by_role("spinbutton", name="Max new tokens").first
            box.fill(str(args.tokens))
            box.press("Enter")
            followers = [open_page(browser, url)[1] for _ in range(args.followers)]
            lead.get_by_test_id("stMainBlockContainer").get_by_role("button", name="Generate").click()
            t_click = time.perf_counter()
            lags = sample_lag(lead, followers)
            lead.get_by_text("Done:", exact=False).first.wait_for(timeout=600_000)
            t_done = time.perf_counter()
            done_lags = []
            for f in followers:
                f.get_by_text("Done:", exact=False).first.wait_for(timeout=120_000)
                done_lags.append(time.perf_counter() - t_done)
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    report = {"followers": args.followers, "tokens": args.tokens, "presenter_done_s": t_done - t_click,
              "stream_lag_p50_s": statistics.median(lags) if lags else None,
              "stream_lag_max_s": max(lags) if lags else None,
              "done_lag_p50_s": statistics.median(done_lags), "done_lag_max_s": max(done_lags),
              "load_average": os.getloadavg()}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
