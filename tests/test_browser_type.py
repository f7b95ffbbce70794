"""Type a projector can show, on every page at 1024x768, in headless Chromium on the app `make run` starts (the
session's app of tests/conftest.py, the browser and helpers of tests/test_browser.py).

Every text of every plotly chart (ticks, titles, legends, bar and point labels, heatmap cells, annotations) is drawn
at app.ui.style.MIN_TEXT_PX or more, read as the browser computed it (font size times the element's on-screen scale);
no chart has a toolbar to cover its values; and the sentence under the speculative page's bars names the bars' own
labels. One run on the journey page and one on the speculative page first, so the charts a run brings are there.
"""
from __future__ import annotations

import re

import pytest

from app.ui.style import MIN_TEXT_PX
from test_browser import (PAGES, PROJECTOR, assert_no_exception, button, go_to,  # noqa: F401
                          set_number, wait_heading, wait_idle, wait_text)

pytestmark = pytest.mark.browser

# Every chart text under `min` px as the browser draws it: [px, text, the chart's top] (an empty list passes).
SMALL_TEXT_JS = """min => [...document.querySelectorAll('.js-plotly-plot')].flatMap(plot =>
  [...plot.querySelectorAll('text')].filter(t => t.textContent.trim() && t.getBBox().width > 0)
    .map(t => { const m = t.getScreenCTM();
                return [parseFloat(getComputedStyle(t).fontSize) * Math.hypot(m.a, m.b), t.textContent.trim(),
                        plot.getBoundingClientRect().top | 0]; })
    .filter(([px]) => px < min - 0.05))"""
CHARTS_JS = "() => document.querySelectorAll('.js-plotly-plot').length"
TOOLBAR_JS = "() => document.querySelectorAll('.js-plotly-plot .modebar-btn').length"


@pytest.fixture(scope="module")
def room(browser):
    """One projector-sized tab for the whole module: its session keeps the runs made below."""
    context = browser.new_context(viewport=PROJECTOR)
    page = context.new_page()
    yield page
    context.close()


def assert_type_fits_a_projector(page, where: str) -> int:
    """No chart text under MIN_TEXT_PX and no chart toolbar; the number of charts checked."""
    small = page.evaluate(SMALL_TEXT_JS, MIN_TEXT_PX)
    assert small == [], f"{where}: chart text under {MIN_TEXT_PX} px: {small[:10]}"
    assert page.evaluate(TOOLBAR_JS) == 0, f"{where}: a chart toolbar"
    return page.evaluate(CHARTS_JS)


def test_runs_bring_their_charts(app_url, room):
    """A journey run (tokens, shapes, timeline, distribution, the lens) and a speculative one (timeline, bars, round
    times, k): their charts at the minimum, and the bars' sentence naming the bars' own labels."""
    room.goto(f"{app_url}/journey")
    wait_heading(room, "The journey of a request")
    set_number(room, "Max new tokens", 8)
    button(room, "Generate").click()
    wait_text(room, "Done:", 240)
    wait_text(room, "Through the layers", 60)
    wait_idle(room)
    assert_no_exception(room)
    assert assert_type_fits_a_projector(room, "journey after a run") >= 5
    room.hover(".js-plotly-plot >> nth=0")                   # the pointer over a chart: still no toolbar
    assert room.evaluate(TOOLBAR_JS) == 0

    go_to(room, "Speculative decoding")
    wait_heading(room, "Speculative decoding")
    wait_idle(room)
    button(room, "Copy a passage").click()
    wait_idle(room)
    set_number(room, "Max new tokens", 16)
    button(room, "Generate").click()
    wait_text(room, "Projected, not measured", 300)
    wait_idle(room, 120)
    assert_no_exception(room)
    assert assert_type_fits_a_projector(room, "speculative after a run") >= 4
    labels = room.locator(".js-plotly-plot").filter(has_text="accepted / drafted").locator("text.bartext")
    shown = [t.strip() for t in labels.all_text_contents()]
    caption = room.get_by_text("Bars: the share of rounds").first.inner_text()
    said = re.search(r"The bars go from (\d+%) to (\d+%)", caption)
    assert said and shown and said.groups() == (shown[0], shown[-1]), (shown, caption)


@pytest.mark.parametrize("url_path,title", [p for p in PAGES if p[0] not in ("", "journey")] + PAGES[:1])  # Home last:
                                                                                                      # a reload
def test_every_page_draws_its_charts_at_the_minimum(app_url, room, url_path, title):
    """Each page through the sidebar (the session's runs above stay in it), at 1024x768."""
    if url_path:
        go_to(room, title)
    else:
        room.goto(app_url)
    wait_heading(room, title)
    room.wait_for_timeout(500)                              # a page's charts arrive in the run after its heading
    wait_idle(room, 120)
    assert_no_exception(room)
    assert_type_fits_a_projector(room, url_path or "home")
