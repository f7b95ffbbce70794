"""The journey page says what its charts show: the temperature bars and their caption from the same numbers (greedy
drawn as greedy), the observer effect's sentence from its measurement, and no widget state set twice. AppTest on the
tiny model the tests write themselves."""
from __future__ import annotations

import logging
import types

import pytest

from conftest import app_client, tiny_prompt
from test_pages import app, charts, generate, open_page  # noqa: F401 - `app`: the fixture


@pytest.fixture
def widget_warnings(monkeypatch) -> list[str]:
    """Streamlit's warning that a widget got a default value and a Session State value too: Streamlit checks it only
    under its server (`runtime.exists()`), so the check is switched on here, and its log lines collected."""
    from streamlit.elements.lib import policies

    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    monkeypatch.setattr(policies, "runtime", types.SimpleNamespace(exists=lambda: True))
    monkeypatch.setattr(policies, "_shown_default_value_warning", False)
    policies._LOGGER.addHandler(handler)
    yield said
    policies._LOGGER.removeHandler(handler)


def test_opening_a_recording_sets_the_journey_inputs_without_streamlit_warning(app, widget_warnings, tiny_model_dir,
                                                                                monkeypatch):  # noqa: F811
    """A recording opened, then a reload straight onto the journey page (the same person: their last run reopens in
    the very run that draws the page's widgets)."""
    from streamlit.testing.v1 import AppTest

    client = app_client(tiny_model_dir)                        # as SmolLM2: the toggle starts on, the template's
    monkeypatch.setattr(type(client), "has_chat_template", property(lambda self: True))
    at = open_page(app, "journey.py")
    assert at.toggle(key="journey.chat").value is True
    open_page(at, "recordings.py")
    at.button(key="recordings.open.0").click().run()
    opened = at.session_state["last_run"]
    again = AppTest.from_file("../app/main.py", default_timeout=60)
    again.session_state["session.id"] = at.session_state["session.id"]      # no cookie in AppTest: the same person
    again.switch_page("../pages/journey.py").run()
    assert not again.exception and again.session_state["last_run"].id == opened.id
    assert again.toggle(key="journey.chat").value is opened.request.chat
    assert not [w for w in widget_warnings if "default value" in w], widget_warnings
