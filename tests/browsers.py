"""Headless Chromium for the browser tests: one browser per test module, and the tabs its people browse in.

A person is a browser context of their own (the app knows a person by a cookie). A new context is a cold browser:
its first page load compiles Streamlit's and plotly's scripts again, about 2 s of CPU on two cores, half of what
the load costs. So a test's people are tabs lent from a pool: each a context of its own, its cookies and the app's
storage cleared when lent (a new person), its renderer still holding the compiled scripts, as a person's browser
does. When the test ends every tab goes back (its extra tabs closed, the tab itself left for about:blank, so the app
sees the person go and frees their seat). `bench/browser_tabs.py` measures a load both ways side by side.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]


@pytest.fixture(scope="module")
def browser():
    """One Chromium for the module's tests. Not one for the worker's whole session: Playwright's sync API keeps an
    event loop running in the main thread while it is started, and a later module's `asyncio.run()` then fails."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (run `make browser`)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


class Tabs:
    """Warm tabs, each in a context of its own: `person(viewport)` lends one as a new person's, `give_back()` takes
    every lent one back."""

    def __init__(self, browser) -> None:
        self.browser = browser
        self.free: list = []
        self.lent: list = []

    def person(self, viewport: dict, url: str | None = None):
        """A new person's tab (no cookie, nothing the app kept in this browser) at `viewport`, at `url` if given."""
        page = self.free.pop() if self.free else self.browser.new_context().new_page()
        page.context.clear_cookies()
        page.set_viewport_size(viewport)
        self.lent.append(page)
        if url is not None:
            page.goto(url)
        return page

    def give_back(self) -> None:
        for page in self.lent:
            if page.is_closed():                    # the test closed the tab (a person leaving): its context goes too
                with contextlib.suppress(Exception):
                    page.context.close()
                continue
            try:
                for other in page.context.pages:
                    if other is not page:
                        other.close()                # the person's second tabs
                with contextlib.suppress(Exception):     # a page of no origin has no storage
                    page.evaluate("() => { localStorage.clear(); sessionStorage.clear(); }")
                page.goto("about:blank")
            except Exception:                        # a tab the test left broken is not lent again
                with contextlib.suppress(Exception):
                    page.context.close()
                continue
            self.free.append(page)
        self.lent = []


@pytest.fixture(scope="module")
def tab_pool(browser):
    return Tabs(browser)


@pytest.fixture
def people(tab_pool):
    """Lends tabs for this test's people (`people.person(viewport)`), takes them back when it ends."""
    yield tab_pool
    tab_pool.give_back()
