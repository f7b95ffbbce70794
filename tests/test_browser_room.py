"""A room of several web processes in headless Chromium: `playground --web-processes 2` starts one model server, two
Streamlit processes and nginx in front, as a host would for a big room.

Checked as people would meet it: a presenter in one web process generates, and a follower in the other watches
the run stream and then gets it on its page (watch mode lives in the model server); the room's limit of people
(3 here) counts both processes together, and a closed tab frees its place for a newcomer on either; through nginx a
browser stays on its process (its run's recording downloads from the process that holds it).
"""
from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from servers import free_port, python, ROOT
from test_browser import (PROJECTOR, assert_no_exception, button, set_number, set_prompt, shot,  # noqa: F401
                          wait_heading, wait_idle, wait_text, wait_text_or_fail)
from test_browser_watch import TOKEN, unlock

pytestmark = pytest.mark.browser
TOKENS = 12


@pytest.fixture(scope="module")
def room(tmp_path_factory):
    """The launcher's room; (nginx url, [web process urls]) read from its nginx.conf."""
    port = free_port()
    log = tmp_path_factory.mktemp("room") / "launcher.log"
    cmd = [python(), "-m", "app.launch", "--web-processes", "2", "--port", str(port), "--presenter-token", TOKEN,
           "--max-sessions", "3"]                                       # the embedded model, as `make run` serves it
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        run_dir = wait_ready(proc, log)
        ports = re.findall(r"server 127\.0\.0\.1:(\d+)", (run_dir / "nginx.conf").read_text())
        yield f"http://127.0.0.1:{port}", [f"http://127.0.0.1:{p}" for p in ports], proc
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def wait_ready(proc: subprocess.Popen, log: Path, timeout: float = 300) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text()
        if (found := re.search(r"Room ready: .*; logs in (\S+)", text)) is not None:
            return Path(found.group(1))
        assert proc.poll() is None, text[-3000:]
        time.sleep(0.5)
    raise AssertionError(f"the room did not start:\n{log.read_text()[-3000:]}")


def open_tab(browser, url: str, path: str, heading: str):
    context = browser.new_context(viewport=PROJECTOR, accept_downloads=True)
    page = context.new_page()
    page.goto(f"{url}/{path}")
    wait_heading(page, heading)
    wait_idle(page)
    return context, page


def reload_until_placed(page, heading: str, seconds: float = 60) -> None:
    """Reload until this tab has a place among the room's people: a closed tab's place frees at its web process's
    next report (every 5 s)."""
    deadline = time.monotonic() + seconds
    while page.get_by_text("already serves 3 people").count():
        assert time.monotonic() < deadline, "the closed tab's place never freed"
        time.sleep(2)
        page.reload()
        wait_heading(page, heading)
        wait_idle(page)


def test_a_presenter_in_one_web_process_leads_a_follower_in_the_other(room, browser):
    _, (first, second), _ = room
    lead_ctx, lead = open_tab(browser, first, "journey", "The journey of a request")
    unlock(lead)
    set_number(lead, "Max new tokens", TOKENS)
    set_prompt(lead, "Name three colours of the rainbow.")
    follow_ctx, follower = open_tab(browser, second, "attention", "Attention")
    button(lead, "Generate").click()
    wait_text(lead, "Done:", 180)
    wait_text(follower, "The run on this page is the presenter's", 120)   # read from the model server by its id
    wait_text(follower, "Every head at a glance", 120)       # the follower's own page draws it
    wait_idle(follower, 120)
    answer = lead.get_by_test_id("stMainBlockContainer").locator('[data-testid="stText"]').first.inner_text()
    follower.get_by_role("link", name="The journey of a request").first.click()
    wait_text(follower, "4. One token up close", 120)
    wait_idle(follower, 120)
    assert answer.strip() and answer.strip() in follower.get_by_test_id("stMainBlockContainer").inner_text()
    assert_no_exception(follower) and assert_no_exception(lead)
    shot(follower, "projector-room-follower-other-process")

    filler_ctx, _ = open_tab(browser, second, "", "Inference Playground")
    newcomer_ctx, newcomer = open_tab(browser, first, "journey", "The journey of a request")
    wait_text(newcomer, "already serves 3 people", 60)          # the people are counted across both processes
    follow_ctx.close()                                         # a tab closes in the other process...
    reload_until_placed(newcomer, "The journey of a request")  # ...and its place frees at that process's next report
    assert_no_exception(newcomer)
    for ctx in (lead_ctx, filler_ctx, newcomer_ctx):
        ctx.close()


def test_through_nginx_a_browser_stays_on_its_web_process(room, browser):
    url, _, _ = room
    ctx, page = open_tab(browser, url, "journey", "The journey of a request")
    reload_until_placed(page, "The journey of a request")    # the tabs the test before closed free their places
    cookie = next(c for c in ctx.cookies() if c["name"] == "playground_route")
    set_number(page, "Max new tokens", TOKENS)
    button(page, "Generate").click()
    wait_text_or_fail(page, "Done:", 180)
    wait_idle(page, 120)
    page.reload()                                             # a new Streamlit session, on the same process
    wait_heading(page, "The journey of a request")
    assert next(c for c in ctx.cookies() if c["name"] == "playground_route")["value"] == cookie["value"]
    set_number(page, "Max new tokens", TOKENS)
    button(page, "Generate").click()
    wait_text_or_fail(page, "Done:", 180)
    wait_idle(page, 120)
    with page.expect_download(timeout=60_000) as download:    # a file this process holds in its own memory
        page.get_by_role("button", name=re.compile("Save this run")).first.click()
    assert Path(download.value.path()).stat().st_size > 1000
    assert_no_exception(page)
    ctx.close()
