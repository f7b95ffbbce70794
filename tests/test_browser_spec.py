"""The speculative-decoding page end to end in headless Chromium, on the app `make run` starts (the embedded
SmolLM2): an n-gram run on the copy preset and an early-exit run, with screenshots in tests/screenshots/.
The app, browser and helpers are the ones tests/test_browser.py defines.
"""
from __future__ import annotations

import pytest

from test_browser import (assert_no_exception, assert_nothing_clipped, browser, button, page,  # noqa: F401
                          projector, projector_shot, record_timing, set_number, shot, wait_heading, wait_idle,
                          wait_text)

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
    wait_text(page, "Measured: a round cost", 300)
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
