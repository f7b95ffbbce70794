"""The room page's "Same question, same numbers?" in headless Chromium on the embedded model (SmolLM2, as `make run`
serves it): a person presses the button at 1440x900, waits for the four parts (float32 and bfloat16, the invariant
kernels off and on), and reads the chart, the table and the two-order sum; the same page at a projector's 1024x768.
Every word whole, no chart label over another, and with the kernels on the table says 0."""
from __future__ import annotations

import pytest

from test_browser import (PROJECTOR, assert_no_exception, assert_nothing_clipped,  # noqa: F401
                          button, projector_shot, shot, wait_heading, wait_idle, wait_text,
                          wait_text_or_fail)

pytestmark = pytest.mark.browser
WIDE = {"width": 1440, "height": 900}
LESSON_SECONDS = 900                     # four jobs on a shared 2-core machine; a limit on a wait, not a speed target


def parts_table(page) -> str:
    return page.locator('[data-testid="stDataFrame"]').last.inner_text()


def test_the_room_page_compares_alone_and_in_a_batch(app_url, people):
    page = people.person(WIDE)
    page.goto(f"{app_url}/room")
    wait_heading(page, "The room is the batch")
    wait_heading(page, "Same question, same numbers?")
    button(page, "Compare alone and in a batch").click()
    wait_text_or_fail(page, "Added exactly, the sum is", LESSON_SECONDS)
    wait_idle(page)
    assert_no_exception(page)
    assert page.get_by_text("invariant kernels on**", exact=False).count() == 0        # markdown rendered, not shown
    for setting in ("float32, invariant kernels on", "bfloat16, invariant kernels on"):
        wait_text(page, f"{setting}: the same 16 tokens alone and in the batch, every log-probability equal")
    assert_nothing_clipped(page)
    page.get_by_text("Same question, same numbers?").first.scroll_into_view_if_needed()
    shot(page, "room-same-numbers-1440")
    page.set_viewport_size({"width": WIDE["width"], "height": 4200})      # Streamlit scrolls inside the page
    wait_idle(page)
    shot(page, "room-same-numbers-1440-full")
    page.set_viewport_size(PROJECTOR)
    page.wait_for_timeout(500)
    wait_idle(page)
    assert_nothing_clipped(page)
    page.get_by_text("Same question, same numbers?").first.scroll_into_view_if_needed()
    shot(page, "room-same-numbers-1024")
    projector_shot(page, "room-same-numbers")
