"""The browser tests' tabs (tests/browsers.py), on a page of a plain HTTP server: a lent tab is a new person's (no
cookie of the one before), a tab given back has left the page (its storage cleared, its extra tabs closed) and is
lent again (the same renderer: warm), and a tab the test closed is not."""
from __future__ import annotations

import http.server
import threading

import pytest

from browsers import Tabs

pytestmark = pytest.mark.browser
PAGE = (b"<html><body><p id=who></p><p id=stored></p><script>"
        b"document.getElementById('who').textContent = document.cookie || 'nobody';"
        b"document.getElementById('stored').textContent = localStorage.getItem('kept') || 'empty';"
        b"document.cookie = 'person=' + Math.random(); localStorage.setItem('kept', 'yes');</script></body></html>")


@pytest.fixture(scope="module")
def site():
    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(PAGE)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


def test_a_lent_tab_is_a_new_person_and_comes_back_warm(browser, site):
    tabs = Tabs(browser)
    first = tabs.person({"width": 800, "height": 600}, site)
    assert (first.inner_text("#who"), first.inner_text("#stored")) == ("nobody", "empty")
    first.reload()
    assert first.inner_text("#who").startswith("person=")                 # the same person across a reload
    assert first.inner_text("#stored") == "yes"
    second_tab = first.context.new_page()
    tabs.give_back()
    assert first.url == "about:blank" and second_tab.is_closed() and tabs.free == [first]

    again = tabs.person({"width": 1024, "height": 768}, site)
    assert again is first and again.viewport_size == {"width": 1024, "height": 768}
    assert again.inner_text("#who") == "nobody"                           # the cookie went with the person
    assert again.inner_text("#stored") == "empty"                         # and what the page kept in the browser
    other = tabs.person({"width": 800, "height": 600}, site)               # two people at once: two contexts
    assert other.context is not again.context and other.inner_text("#who") == "nobody"
    other.close()                                                          # a person leaving
    tabs.give_back()
    assert tabs.free == [again] and tabs.lent == []
