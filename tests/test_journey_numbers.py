"""The journey page says what its charts show: the temperature bars and their caption from the same numbers (greedy
drawn as greedy), the observer effect's sentence from its measurement, and no widget state set twice. AppTest on the
tiny model the tests write themselves."""
from __future__ import annotations

import logging
import types

import numpy as np
import pytest

from conftest import app_client, tiny_prompt
from test_pages import app, array, charts, generate, open_page  # noqa: F401 - `app`: the fixture


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


# --- one token's candidates: temperature 0 is greedy, one axis in %, the caption quotes the bars ----------------

def distribution(at) -> dict:
    return next(c for c in charts(at) if c["layout"].get("xaxis", {}).get("title", {}).get("text") == "probability (%)")


def candidates_caption(at) -> str:
    return next(c.value for c in at.caption if c.value.startswith("Re-drawn from the"))


def test_temperature_zero_puts_everything_on_the_argmax_and_the_caption_quotes_the_bars(app):  # noqa: F811
    at = open_page(app, "journey.py")
    generate(at, "journey", tiny_prompt(8), 3)                 # temperature 0: greedy
    token = at.session_state["last_run"].tokens[0]
    chart = distribution(at)
    bars, raw = chart["data"][0], chart["data"][1]
    assert bars["y"][0].endswith(f"({token.id})") and token.id == int(token.logit_ids[np.argmax(token.logits)])
    assert array(bars["x"]).tolist() == [100.0] + [0.0] * (len(bars["y"]) - 1)       # all the mass on the argmax
    assert raw["name"] == "plain softmax (temperature 1)" and array(raw["x"])[0] == pytest.approx(100 * token.prob,
                                                                                                  rel=1e-4)
    caption = candidates_caption(at)
    assert f"gets {bars['text'][0]} and every other 0%" in caption and f"where it has {raw['text'][0]}" in caption
    assert f"took it with certainty, as the most likely token: {bars['text'][0]} in these bars" in caption

    on_top = []
    for temperature in (0.05, 0.3, 0.7, 1.0, 1.5, 2.0):
        at.slider(key="journey.temperature").set_value(temperature).run()
        chart = distribution(at)
        assert chart["layout"]["xaxis"]["range"] == [0, 118] and chart["layout"]["xaxis"]["ticksuffix"] == "%"
        bars = chart["data"][0]
        on_top.append(array(bars["x"])[0])
        assert f"at the sliders' settings it has p = {bars['text'][0]}" in candidates_caption(at)
        assert len(chart["data"]) == (1 if temperature == 1.0 else 2)          # at T=1 the bars are the softmax
    assert [100.0, *on_top] == sorted([100.0, *on_top], reverse=True)        # hotter, flatter: never sharper
    assert on_top[-1] < on_top[0]


# --- the observer effect: the sentence says what was measured --------------------------------------------------

def effect(off_rounds: list[list[float]], on_rounds: list[list[float]]):
    """An ObserverEffect as observer_effect builds it from per-round step times (ms)."""
    import statistics

    from engine.lab.speed import DecodeTiming, ObserverEffect

    def timing(rounds):
        return DecodeTiming(8, 0.01, tuple(s / 1e3 for r in rounds for s in r))
    per_round = tuple((statistics.median(a) / 1e3, statistics.median(b) / 1e3) for a, b in zip(off_rounds, on_rounds))
    return ObserverEffect(timing(off_rounds), timing(on_rounds), True, per_round)


@pytest.mark.parametrize("off,on,verdict", [
    ([[33.0, 33.3, 33.6], [33.9, 34.1, 34.0], [32.9, 33.2, 33.1]],        # on within the rounds' own spread
     [[33.8, 33.9, 34.0], [33.1, 33.3, 33.5], [34.2, 33.9, 33.7]], "nearly free"),
    ([[30.0, 30.1, 30.2], [30.1, 30.2, 30.3], [30.0, 30.2, 30.1]],        # 6 ms more, rounds 0.1 ms apart
     [[36.0, 36.1, 36.2], [36.1, 36.2, 36.3], [36.0, 36.1, 36.2]], "Capture costs 6.0 ms a step"),
    ([[40.0, 40.1, 40.2], [40.1, 40.2, 40.3], [40.0, 40.2, 40.1]],
     [[30.0, 30.1, 30.2], [30.1, 30.2, 30.3], [30.0, 30.1, 30.2]], "measure again"),
])
def test_the_observer_sentence_follows_its_numbers(off, on, verdict):
    from app.journey.sections import observer_caption

    e = effect(off, on)
    text = observer_caption(e, "the residual stream entering every layer")
    assert verdict in text and f"{e.ratio:.2f}× as long" in text
    assert f"{e.off.itl * 1e3:.1f} ms with capture off and {e.on.itl * 1e3:.1f} ms with capture on" in text
    assert f"({e.noise * 1e3:.1f} ms)" in text and "costs time" not in text
    assert ("nearly free" in text) == e.within_noise


def test_the_observer_section_quotes_its_bars(app):  # noqa: F811
    at = open_page(app, "journey.py")
    generate(at, "journey", tiny_prompt(8), 4)
    at.button(key="journey.observer.measure").click().run()
    measured = at.session_state["journey.observer"]
    bars = next(c for c in charts(at) if c["data"] and c["data"][0].get("y") == ["capture off", "capture on"])
    off, on = bars["data"][0]["text"]
    caption = next(c.value for c in at.caption if c.value.startswith("Measured on this server: one decode step"))
    assert f"took {off} with capture off and {on} with capture on" in caption
    assert ("nearly free" in caption) == measured.within_noise and len(measured.rounds) == 3
    assert "the residual stream entering every layer" in caption


# --- a recording's times are the recording machine's: the page says where and how it was made -------------------

def test_an_opened_recording_says_where_when_and_how_it_was_recorded(app):  # noqa: F811
    from app.runs.recordings import RECORDINGS_DIR
    from engine.runs import load

    at = open_page(app, "recordings.py")
    at.button(key="recordings.open.0").click().run()
    rec = load(sorted(RECORDINGS_DIR.glob("*.run.zip"))[0]).recording
    at = open_page(at, "journey.py")
    said = next(c.value for c in at.caption if c.value.startswith("Recorded "))
    assert said.startswith(f"Recorded on {rec.created[:10]} in {rec.dtype} on {rec.device}")
    assert (rec.machine in said) if rec.machine else ("does not say how busy" in said)
    layers = len(rec.policy.layer_ids(rec.spec.n_layers))
    assert f"capturing {layers} of {rec.spec.n_layers} layers" in said and "not this server's" in said
    assert sum(c.value.count("not this server's") for c in at.caption) == 1                   # once, under its times
