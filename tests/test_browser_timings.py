"""Why was my answer slow, in headless Chromium at a projector's 1024x768: after a generation the line and the chart
appear under the answer (above the tokens), every word whole and no chart label over another."""
from __future__ import annotations

import pytest

from test_browser import (PROJECTOR, assert_no_exception, browser,  # noqa: F401
                          assert_nothing_clipped, button, projector, projector_shot,
                          set_number, wait_heading, wait_idle, wait_text)

pytestmark = pytest.mark.browser


def top(page, text: str) -> float:
    return page.get_by_text(text, exact=False).first.bounding_box()["y"]


def test_the_line_and_the_chart_appear_under_the_answer_on_a_projector(app_url, projector):
    projector.goto(f"{app_url}/journey")
    wait_heading(projector, "The journey of a request")
    set_number(projector, "Max new tokens", 8)
    button(projector, "Generate").click()
    wait_text(projector, "Done:", 240)
    wait_text(projector, "to the first token", 60)
    wait_idle(projector)
    assert_no_exception(projector)
    chart = projector.locator('[data-testid="stPlotlyChart"]', has_text="you (request").first
    chart.wait_for(timeout=60_000)
    line, metrics, tokens = top(projector, "to the first token"), top(projector, "Time to first token"), \
        top(projector, "1. Tokens")
    box = chart.bounding_box()
    assert metrics < line < box["y"] < tokens                   # under the answer and its metrics, above the tokens
    assert box["width"] <= PROJECTOR["width"] and box["height"] > 100
    assert_nothing_clipped(projector)                            # every word whole, no chart label over another
    projector_shot(projector, "journey-why")
