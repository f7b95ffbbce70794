"""The hosted room's join link end to end, in headless Chromium against the app started as a host starts it:
`playground --host 0.0.0.0` (the launcher itself, so its printed join link is what is checked), browsed over
loopback. Strangers (no code, a wrong code) get the join form only; the link lets a browser in, and a reload or
a new tab keeps it in; a rotated code keeps members in and turns the old link away; a closed room lets nobody
new in. Screenshots in tests/screenshots/ with `make screenshots`.
"""
from __future__ import annotations

import os
import re
import subprocess

import pytest

from test_browser import (PROJECTOR, ROOT, SHOW_DEPRECATIONS, assert_no_deprecation, assert_no_exception,  # noqa: F401
                          free_port, python, shot, stop, wait_healthy, wait_heading, wait_idle, wait_text)

pytestmark = pytest.mark.browser
TOKEN = "browser-join-presenter-token"
HOME = "Inference Playground"
FORM = "Join the room"
CURRENT: dict[str, str] = {}           # the room's join code now: the launcher's, until a test rotates it


@pytest.fixture(scope="module")
def room(tmp_path_factory):
    """(url over loopback, the join code the launcher printed, the launcher's log) for `playground --host 0.0.0.0`."""
    port = free_port()
    log = tmp_path_factory.mktemp("room") / "playground.log"
    cmd = [python(), "-m", "app.launch", "--host", "0.0.0.0", "--port", str(port), "--presenter-token", TOKEN]
    env = {k: v for k, v in os.environ.items() if k != "PLAYGROUND_JOIN_CODE"}
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**env, **SHOW_DEPRECATIONS})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
        found = re.search(rf"Join link: http://\S+:{port}/\?join=([a-z0-9-]+)", log.read_text())
        assert found, log.read_text()[:2000]
        CURRENT["code"] = found.group(1)
        yield url, found.group(1), log
    finally:
        stop(proc)
    assert_no_deprecation(log)


def tab(people, url: str, same=None):
    """A new person's tab at `url` (tests/browsers.py), or with `same` another tab of that tab's person."""
    if same is None:
        return people.person(PROJECTOR, url)
    page = same.context.new_page()
    page.set_viewport_size(PROJECTOR)
    page.goto(url)
    return page


def kept_out(page) -> bool:
    wait_heading(page, FORM)
    wait_idle(page)
    assert_no_exception(page)
    return (page.get_by_role("heading", name=HOME).count() == 0 and
            page.get_by_test_id("stSidebarNav").count() == 0 and page.get_by_test_id("stSidebar").count() == 0)


def let_in(page, heading: str = HOME) -> bool:
    wait_heading(page, heading)
    wait_idle(page)
    assert_no_exception(page)
    return page.get_by_text(FORM).count() == 0


def join_with(page, code: str) -> None:
    box = page.get_by_role("textbox", name="Join code")
    box.fill(code)
    page.get_by_role("button", name="Join").click()


def test_the_launcher_on_0000_prints_the_join_link(room):
    url, code, log = room
    assert re.fullmatch(r"[a-z0-9]{4}-[a-z0-9]{4}-[a-z0-9]{4}", code)
    assert f"Presenter token: {TOKEN}" in log.read_text()


def test_no_code_and_a_wrong_code_are_kept_out(room, people):
    url, code, _ = room
    page = tab(people, f"{url}/attention")                       # any page: the form, and nothing of the page
    assert kept_out(page)
    shot(page, "join-form")
    join_with(page, "wrong-code-123")
    wait_text(page, "That is not the join code.")
    assert kept_out(page)
    shot(page, "join-wrong-code")
    page.reload()
    assert kept_out(page)


def test_the_link_lets_in_and_a_reload_and_a_new_tab_keep_in(room, people):
    url, code, log = room
    page = tab(people, f"{url}/?join={code}")
    assert let_in(page)
    assert code not in page.url                                   # the address bar no longer carries it
    cookie = {c["name"]: c["value"] for c in page.context.cookies()}["playground_member"]
    assert code not in cookie and code.replace("-", "") not in cookie
    page.reload()
    assert let_in(page)
    other = tab(people, f"{url}/attention", page)
    assert let_in(other, "Attention")
    assert log.read_text().count(code) == 1                       # the launcher's banner only, no request line


def test_a_typed_code_lets_in(room, people):
    url, code, _ = room
    page = tab(people, url)
    assert kept_out(page)
    join_with(page, code.upper().replace("-", " "))
    assert let_in(page)


def presenter(people, url: str, code: str):
    """A browser that joined with the link and unlocked presenter mode; its sidebar shows the join panel."""
    page = tab(people, f"{url}/?join={code}")
    assert let_in(page)
    page.get_by_text("Presenter mode", exact=True).click()
    box = page.get_by_label("Presenter token")
    box.fill(TOKEN)
    box.press("Enter")
    wait_text(page, "New join code")
    wait_idle(page)
    return page


def shown_code(page) -> str:
    return re.search(r"Join code: ([a-z0-9-]+)", page.get_by_test_id("stSidebar").inner_text()).group(1)


def test_a_rotated_code_keeps_members_and_turns_the_old_link_away(room, people):
    url, code, log = room
    member = tab(people, f"{url}/?join={code}")
    assert let_in(member)
    lead = presenter(people, url, code)
    assert shown_code(lead) == code
    lead.get_by_test_id("stExpander").filter(has_text="Join link").scroll_into_view_if_needed()
    shot(lead, "join-presenter-panel")
    lead.get_by_role("button", name="New join code").click()
    lead.wait_for_function("code => !document.querySelector('[data-testid=\"stSidebar\"]').innerText.includes(code)",
                           arg=code, timeout=30_000)
    wait_idle(lead)
    new = CURRENT["code"] = shown_code(lead)
    assert new != code and f"?join={new}" in lead.get_by_test_id("stSidebar").inner_text().replace("\n", "")
    member.reload()
    assert let_in(member)                                         # a member stays in
    late = tab(people, f"{url}/?join={code}")
    assert kept_out(late)
    wait_text(late, "replaced by a new one")
    late.goto(f"{url}/?join={new}")
    assert let_in(late)
    lead.get_by_role("button", name="Show it large").click()
    lead.get_by_role("dialog").wait_for()
    shot(lead, "join-large")
    assert new not in log.read_text()


def test_a_closed_room_lets_nobody_new_in(room, people):
    url, _, _ = room
    lead = presenter(people, url, CURRENT["code"])              # the code now (the test above may have rotated it)
    current = shown_code(lead)
    member = tab(people, f"{url}/?join={current}")
    assert let_in(member)
    lead.get_by_text("Newcomers may join").click()
    wait_idle(lead)
    newcomer = tab(people, f"{url}/?join={current}")
    assert kept_out(newcomer)
    wait_text(newcomer, "closed to newcomers")
    member.reload()
    assert let_in(member)                                         # members stay in
    lead.get_by_text("Newcomers may join").click()                # open again
    wait_idle(lead)
    newcomer.goto(f"{url}/?join={current}")
    assert let_in(newcomer)


def test_the_presenter_sees_the_rooms_settings_and_a_member_does_not(room, people):
    """The room page's "Settings this room runs with" (as `playground --print-settings`): for the presenter only,
    the presenter token masked."""
    url, _, _ = room
    lead = presenter(people, url, CURRENT["code"])
    lead.get_by_test_id("stSidebarNav").get_by_text("The room is the batch").click()   # the same session
    wait_heading(lead, "The room is the batch")
    wait_idle(lead)
    lead.get_by_text("Settings this room runs with").click()
    wait_text(lead, f"set ({len(TOKEN)} characters, hidden)")
    panel = lead.get_by_test_id("stExpander").filter(has_text="Settings this room runs with")
    assert "presenter_token" in panel.inner_text() and TOKEN not in lead.content()
    cells = [[c.inner_text().strip() for c in row.locator("th, td").all()] for row in panel.locator("tr").all()]
    rows = {row[0]: row[1:] for row in cells if row}
    assert rows[""] == ["value", "came from", "set by"]                                      # the header
    assert rows["presenter_token"][:2] == [f"set ({len(TOKEN)} characters, hidden)", "flag"]   # as --print-settings
    assert rows["host"][:2] == ["0.0.0.0", "flag"] and rows["model"][1] == "default"        # says, from the launcher
    assert rows["join_code"][1] == rows["api_key"][1] == "launcher"                          # made up at start
    assert_no_exception(lead)
    panel.scroll_into_view_if_needed()
    shot(lead, "room_settings_presenter")
    member = tab(people, f"{url}/?join={CURRENT['code']}")
    assert let_in(member)
    member.goto(f"{url}/room")
    wait_heading(member, "The room is the batch")
    wait_idle(member)
    assert member.get_by_text("Settings this room runs with").count() == 0
