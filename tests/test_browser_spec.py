"""The speculative-decoding page end to end in headless Chromium, on the app `make run` starts (the embedded
SmolLM2): an n-gram run on the copy preset and an early-exit run, with screenshots in tests/screenshots/.
The app, browser and helpers are the ones tests/test_browser.py defines.
"""
from __future__ import annotations

import os
import subprocess

import pytest

from test_browser import (COLLISIONS_JS, OUTSIDE_JS, assert_no_exception, assert_nothing_clipped,  # noqa: F401
                          button, page, projector, projector_shot, record_timing, set_number, shot, stop,
                          wait_heading, wait_idle, wait_text, wait_text_or_fail)

pytestmark = pytest.mark.browser


def open_spec_page(page, app_url: str) -> None:  # noqa: F811
    page.goto(f"{app_url}/speculative")
    wait_heading(page, "Speculative decoding")
    wait_text(page, "Nothing generated yet", 60)
    wait_idle(page)


def generate(page, max_new: int) -> float:  # noqa: F811
    """Generate and wait for the last sentence the page writes; the seconds it took."""
    import time

    set_number(page, "Max new tokens", max_new)
    start = time.perf_counter()
    button(page, "Generate").click()
    wait_text_or_fail(page, "Measured: a round cost", 300)
    wait_text(page, "Projected, not measured", 60)
    wait_idle(page, 120)
    assert_no_exception(page)
    return time.perf_counter() - start


def test_ngram_copy_run(app_url, page):  # noqa: F811
    open_spec_page(page, app_url)
    button(page, "Copy a passage").click()
    wait_idle(page)
    seconds = generate(page, 24)
    record_timing("speculative_ngram_copy_24_tokens_s", seconds)
    assert page.get_by_text("Decode speedup (measured)").count() == 1
    assert page.get_by_text("Same text as plain decoding").count() == 1
    assert page.locator(".js-plotly-plot").count() >= 4          # timeline, positions, round times, k
    shot(page, "speculative")


def test_early_exit_run_on_a_projector(app_url, projector):  # noqa: F811
    """At 1024x768: every metric, button and chart label of a finished run whole."""
    open_spec_page(projector, app_url)
    assert_nothing_clipped(projector)
    projector.get_by_test_id("stMainBlockContainer").get_by_text("Early exit (the model").first.click()
    wait_idle(projector)
    generate(projector, 12)
    assert (projector.get_by_text("Drafting is what makes it slow").count()
            + projector.get_by_text("helps here").count()) >= 1
    assert_nothing_clipped(projector)
    projector_shot(projector, "speculative-early-exit")


# Acceptance by draft position varies from run to run (a near tie decided another way, another thread count), so the
# page's own runs test whatever bars they happen to draw: a short bar once put its label over the axis' numbers ('3%'
# over '1', white on white). Here the bars that matter, on purpose: short, empty, full, many; drawn by a Streamlit
# page through the app's own `plot`, in both layouts, as the speculative page draws them.
ACCEPTANCE = ([0.03, 0.5, 0.2, 0.1], [0.0, 0.01, 0.02, 0.05], [0.04], [1.0, 0.03, 0.0, 0.06, 0.08, 0.5],
              [1.0, 1.0, 1.0, 0.97, 0.99, 1.0, 1.0, 1.0])
BARS_PAGE = """
import streamlit as st
from app.runs.widgets import plot
from app.speculative.figures import position_figure
from app.ui.layout import PRESENTER_KEY

st.session_state[PRESENTER_KEY] = bool(st.query_params.get("presenter"))
for i, rates in enumerate(RATES):
    plot(position_figure(rates, 0.3), key=f"bars.{i}")
"""


@pytest.fixture(scope="module")
def bars_url(tmp_path_factory):
    from servers import ROOT, free_port, python, wait_ready  # imported here: only this page starts its own app

    folder, port = tmp_path_factory.mktemp("bars"), free_port()
    (folder / "page.py").write_text(BARS_PAGE.replace("RATES", repr(ACCEPTANCE)))
    log = folder / "streamlit.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([python(), "-m", "streamlit", "run", str(folder / "page.py"), "--server.port",
                                 str(port), "--server.headless", "true", "--browser.gatherUsageStats", "false"],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, log, path="/_stcore/health")
        yield url
    finally:
        stop(proc)


@pytest.mark.parametrize("viewport,query", [({"width": 1440, "height": 900}, ""),
                                            ({"width": 1024, "height": 768}, "?presenter=1")])
def test_acceptance_bars_keep_their_labels_clear_whatever_the_rates(browser, bars_url, viewport, query):
    tab = browser.new_page(viewport={"width": viewport["width"], "height": 4000})    # every chart drawn at once
    try:
        tab.goto(bars_url + query)
        tab.wait_for_function(f"() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= "
                              f"{len(ACCEPTANCE)}", timeout=120_000)
        wait_idle(tab)
        assert_no_exception(tab)
        assert tab.evaluate(COLLISIONS_JS) == []
        assert tab.evaluate(OUTSIDE_JS) == []
        shown = tab.evaluate("() => [...document.querySelectorAll('text.bartext')].map(t => t.textContent)")
        assert shown == [f"{r:.0%}" for rates in ACCEPTANCE for r in rates if r > 0]    # each non-empty bar labelled
        shot(tab, f"speculative-acceptance-bars{'-presenter' if query else ''}")
    finally:
        tab.close()
