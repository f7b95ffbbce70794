"""Why was my answer slow, in headless Chromium: after a generation the line and the chart appear under the answer
(above the tokens) at a projector's 1024x768, every word whole, no chart label over another and the line clear of
the chart; on the room page the presenter (at 1440x900) pushes the request picked and a follower's page (1024x768)
moves to it, the same two lines and chart drawn at both sizes."""
from __future__ import annotations

import json
import re
import threading
import urllib.request

import pytest

from test_browser import (LONG_PROMPT, PROJECTOR, assert_no_exception,  # noqa: F401
                          assert_nothing_clipped, button, projector, projector_shot, running_app,
                          set_number, shot, wait_heading, wait_idle, wait_text, wait_text_or_fail)
from test_browser_watch import TOKEN, unlock

pytestmark = pytest.mark.browser
WIDE = {"width": 1440, "height": 900}            # a laptop at the front of the room


def top(page, text: str) -> float:
    return page.get_by_text(text, exact=False).first.bounding_box()["y"]


def line_and_chart(page) -> tuple[dict, dict]:
    """The bounding boxes of the why-line (both of its lines) and of its chart."""
    line = page.locator('[data-testid="stMarkdown"]', has_text="to the first token").last
    chart = page.locator('[data-testid="stPlotlyChart"]', has_text="you (request").first
    chart.wait_for(timeout=60_000)
    return line.bounding_box(), chart.bounding_box()


def assert_apart(page, width: int) -> None:
    """The line above the chart, neither over the other, both within the page's width; nothing clipped."""
    line, chart = line_and_chart(page)
    assert line["y"] + line["height"] <= chart["y"], (line, chart)
    assert line["x"] + line["width"] <= width and chart["x"] + chart["width"] <= width
    assert line["height"] > 0 and chart["height"] > 100
    assert_nothing_clipped(page)                                 # every word whole, no chart label over another


def generate(page, tokens: int = 8) -> None:
    set_number(page, "Max new tokens", tokens)
    button(page, "Generate").click()
    wait_text_or_fail(page, "Done:", 240)
    wait_text(page, "to the first token", 60)
    wait_idle(page)
    assert_no_exception(page)


def test_the_line_and_the_chart_appear_under_the_answer_on_a_projector(app_url, projector):
    projector.goto(f"{app_url}/journey")
    wait_heading(projector, "The journey of a request")
    generate(projector)
    wait_text(projector, "then ", 10)                             # the second line: the first token to the end
    line, metrics, tokens = top(projector, "to the first token"), top(projector, "Time to first token"), \
        top(projector, "1. Tokens")
    box = line_and_chart(projector)[1]
    assert metrics < line < box["y"] < tokens                   # under the answer and its metrics, above the tokens
    assert box["width"] <= PROJECTOR["width"]
    assert_apart(projector, PROJECTOR["width"])
    projector_shot(projector, "journey-why")


def long_prompt_through_the_api(url: str, done: list) -> None:
    """A ~600-token prompt from an API client, beside the page's run (three prefill chunks)."""
    model = json.load(urllib.request.urlopen(f"{url}/v1/models", timeout=60))["data"][0]["id"]
    body = json.dumps({"model": model, "prompt": LONG_PROMPT[:2800], "max_tokens": 4}).encode()
    request = urllib.request.Request(f"{url}/v1/completions", body, {"Content-Type": "application/json"})
    done.append(json.load(urllib.request.urlopen(request, timeout=600))["usage"]["prompt_tokens"])


def test_with_a_long_prompt_joining_the_line_and_the_chart_stay_apart_on_a_projector(app_url, projector):
    """An API client's long prompt arrives while the page's answer streams (whether it lands in the answer's steps is
    the machine's speed: nothing here depends on it): the line and the chart stay apart, every word whole, and the
    Time to first token metric says what the line says (it said the prefill record's time, a second apart)."""
    projector.goto(f"{app_url}/journey")
    wait_heading(projector, "The journey of a request")
    set_number(projector, "Max new tokens", 24)
    button(projector, "Generate").click()
    done: list = []
    client = threading.Thread(target=long_prompt_through_the_api, args=(app_url, done))
    client.start()
    wait_text(projector, "Done:", 600)
    wait_text(projector, "to the first token", 120)
    client.join(600)
    wait_idle(projector)
    assert_no_exception(projector)
    assert done and done[0] > 500
    line = projector.locator('[data-testid="stMarkdown"]', has_text="to the first token").last.inner_text()
    metric = projector.get_by_test_id("stMetric").filter(has_text="Time to first token").first.inner_text()
    said = re.match(r"([\d.,]+) (ms|s) to the first token", line)
    shown_ms = float(re.search(r"([\d,.]+) ms", metric).group(1).replace(",", ""))
    said_ms = float(said.group(1).replace(",", "")) * (1000 if said.group(2) == "s" else 1)
    assert abs(said_ms - shown_ms) <= 5.5, (line, metric)              # one number, rounded two ways
    assert_apart(projector, PROJECTOR["width"])
    projector_shot(projector, "journey-why-long-prompt")


@pytest.fixture(scope="module")
def room_url(tmp_path_factory):
    with running_app(tmp_path_factory.mktemp("why-room"), {"PLAYGROUND_PRESENTER_TOKEN": TOKEN}) as url:
        yield url


def wide_shot(page, name: str) -> None:
    """The whole page at 1440 px wide (Streamlit scrolls inside the page, so the viewport is made tall first)."""
    page.set_viewport_size({"width": WIDE["width"], "height": 3000})
    wait_idle(page)
    shot(page, name)
    page.set_viewport_size(WIDE)
    wait_idle(page)


def test_the_presenter_pushes_a_picked_request_to_a_follower(room_url, people):
    follower = people.person(PROJECTOR)
    follower.goto(f"{room_url}/journey")
    wait_heading(follower, "The journey of a request")
    generate(follower)                                           # a person's request
    lead = people.person(WIDE)
    lead.goto(f"{room_url}/room")
    wait_heading(lead, "The room is the batch")
    unlock(lead)
    wait_text(lead, "A recent request", 60)
    wait_idle(lead)
    picked = lead.get_by_role("combobox", name="A recent request").input_value()
    assert "a person" in picked
    assert_apart(lead, WIDE["width"])
    button(lead, "Push this request to everyone").click()
    wait_text(lead, "Pushed (version", 30)
    wide_shot(lead, "wide-room-why")

    wait_heading(follower, "The room is the batch", 60)          # the follower's page moved to the room page
    wait_text(follower, "The presenter pushed this request", 60)
    wait_idle(follower)
    assert_no_exception(follower)
    assert follower.get_by_role("combobox", name="A recent request").input_value() == picked   # the same request
    lead_line = lead.locator('[data-testid="stMarkdown"]', has_text="to the first token").last.inner_text()
    assert follower.locator('[data-testid="stMarkdown"]', has_text="to the first token").last.inner_text() == lead_line
    assert_apart(follower, PROJECTOR["width"])
    projector_shot(follower, "room-why-pushed")
