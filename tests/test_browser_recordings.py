"""Recordings in Chromium at a projector's 1024x768 (the session's app of tests/conftest.py): a run kept on the server
is the person's, so it is listed again after a reload and in a second tab of the same browser, and not in another
browser, and opens again after the reload; Open and Keep on this server say what they did where the button was, in
view."""
from __future__ import annotations

import pytest

from test_browser import assert_no_exception, wait_heading, wait_idle  # noqa: F401

pytestmark = pytest.mark.browser


def kept(page) -> list[str]:
    return [t for t in page.get_by_test_id("stText").all_inner_texts() if ", kept " in t]


def in_view(page, locator) -> bool:
    box = locator.bounding_box()
    return box is not None and box["y"] >= 0 and box["y"] + box["height"] <= page.viewport_size["height"]


def recordings(page, url: str) -> None:
    page.goto(f"{url}/recordings")
    wait_heading(page, "Kept on this server")
    wait_idle(page)


def test_a_kept_run_is_the_persons_after_a_reload_and_in_a_second_tab(app_url, people, tmp_path):
    page = people.person({"width": 1024, "height": 768})
    recordings(page, app_url)
    assert kept(page) == []
    page.get_by_role("button", name="Open").first.click()
    wait_idle(page)
    shown = page.get_by_text("Shown now").first
    assert in_view(page, shown)                                     # the result of Open, where Open was
    keep = page.get_by_role("button", name="Keep on this server")
    keep.scroll_into_view_if_needed()
    keep.click()
    wait_idle(page)
    note = page.get_by_text("on this server (").first              # "Kept “…” on this server (0.62 MB)."
    assert note.inner_text().startswith("Kept \u201c") and in_view(page, note)
    assert len(kept(page)) == 1
    listed = kept(page)

    page.reload()
    wait_heading(page, "Kept on this server")
    wait_idle(page)
    assert kept(page) == listed
    row = page.get_by_test_id("stHorizontalBlock").filter(has_text=", kept ")
    row.get_by_role("button", name="Open").click()                  # the kept run, from the run store
    wait_idle(page)
    assert in_view(page, row.get_by_text("Shown now")) and kept(page) == listed
    assert_no_exception(page)
    page.screenshot(path=str(tmp_path / "kept-opened-1024x768.png"))
    tab = page.context.new_page()                                   # a second tab of the same person
    tab.set_viewport_size({"width": 1024, "height": 768})
    recordings(tab, app_url)
    assert kept(tab) == listed
    assert_no_exception(tab)

    stranger = people.person({"width": 1024, "height": 768})
    recordings(stranger, app_url)
    assert kept(stranger) == []                                     # another browser: another person
