"""Watch mode end to end in headless Chromium: a presenter generates once, and followers on other pages watch
the run stream in the strip at the top of their own page, then explore it on their pages. The app is started
the way `make run` starts it, with a presenter token. How many followers one server holds is bench/watch.py's
measurement; this checks that every follower of a small room gets the run, with screenshots at the
projector's size (1024x768) in tests/screenshots/.
"""
from __future__ import annotations

from contextlib import contextmanager

import pytest

from test_browser import (PROJECTOR, SHOTS, assert_no_exception, assert_nothing_clipped, button,  # noqa: F401
                          running_app, set_number, set_prompt, shot, wait_heading, wait_idle, wait_text)

pytestmark = pytest.mark.browser
TOKEN = "browser-watch-token-42"
TOKENS = 256   # the most this server allows (CPU limits): with PROMPT, greedy, the model counts on to the limit (no
# end-of-sequence before it), so the run lasts until the test presses Stop, once every follower shows it live. A
# run that ends before a follower's strip first ticks (every 0.5 s) is taken up without its live strip and without
# moving, as a latecomer's is (test_app_serving): with 8 or 32 tokens a loaded machine's followers did (2 of 5
# CI runs timed out; reproduced with 1 token: every follower showed "The run on this page is the presenter's").
PROMPT = "Count from 1 to 300, separated by commas."


@pytest.fixture(scope="module")
def room_url(tmp_path_factory):
    with running_app(tmp_path_factory.mktemp("room"), {"PLAYGROUND_PRESENTER_TOKEN": TOKEN}) as url:
        yield url


def open_tab(people, url: str, path: str, heading: str):
    page = people.person(PROJECTOR)
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.goto(f"{url}/{path}")
    wait_heading(page, heading)
    wait_idle(page)
    return page, errors


@contextmanager
def shown_on_failure(tabs: dict):
    """On a timeout, every tab's screenshot in tests/screenshots/ and the start of its text in the failure, so a run
    that failed once on a loaded CI machine says what each tab showed (the lead's run started or not)."""
    try:
        yield
    except Exception as err:
        SHOTS.mkdir(parents=True, exist_ok=True)
        seen = []
        for name, page in tabs.items():
            page.screenshot(path=str(SHOTS / f"failed-watch-{name}.png"), full_page=True)
            seen.append(f"{name}: {page.get_by_test_id('stMainBlockContainer').inner_text()[:600]!r}")
        raise AssertionError("\n".join(["what each tab showed:", *seen])) from err


def unlock(page) -> None:
    page.get_by_text("Presenter mode", exact=True).click()
    box = page.get_by_label("Presenter token")
    box.fill(TOKEN)
    box.press("Enter")
    wait_text(page, "You are the presenter")


def test_followers_on_other_pages_watch_one_run_then_explore_it(room_url, people):
    lead, lead_errors = open_tab(people, room_url, "journey", "The journey of a request")
    unlock(lead)
    set_number(lead, "Max new tokens", TOKENS)
    set_prompt(lead, PROMPT)
    home, home_errors = open_tab(people, room_url, "", "Inference Playground")
    attention, attention_errors = open_tab(people, room_url, "attention", "Attention")
    journey, journey_errors = open_tab(people, room_url, "journey", "The journey of a request")
    button(lead, "Generate").click()
    tabs = {"lead": lead, "home": home, "attention": attention, "journey": journey}
    with shown_on_failure(tabs):
        for follower in (home, attention, journey):        # the strip, above the follower's own page
            wait_text(follower, "The presenter's run", 120)
            follower.get_by_text("Generated tokens").first.wait_for(timeout=120_000)
    shot(home, "projector-watch-strip")
    button(lead, "Stop").click()                           # every follower has watched it stream: end it here
    wait_text(lead, "Stopped after", 180)
    wait_idle(lead, 120)
    answer = lead.get_by_test_id("stMainBlockContainer").locator('[data-testid="stText"]').first.inner_text()

    wait_heading(home, "The journey of a request", 120)    # from the home page on to the journey page
    wait_text(home, "4. One token up close", 120)
    wait_idle(home, 120)
    assert answer.strip() and answer.strip() in home.get_by_test_id("stMainBlockContainer").inner_text()
    wait_text(attention, "Every head at a glance", 120)              # the attention page draws the same run
    wait_idle(attention, 120)
    assert attention.get_by_text("The presenter's run,").count() == 0        # no live strip once the page draws it
    wait_text(attention, "The run on this page is the presenter's")
    home.get_by_role("link", name="3. The answer, token by token").click()  # the strip's link to the answer
    wait_text(journey, "4. One token up close", 120)       # a follower already on the journey page: its form too
    wait_idle(journey, 120)
    assert journey.get_by_role("textbox", name="Prompt").first.input_value() == PROMPT
    for page in (lead, home, attention, journey):
        assert_no_exception(page)
    assert_nothing_clipped(home)
    shot(home, "projector-watch-journey")
    assert lead_errors == home_errors == attention_errors == journey_errors == []
