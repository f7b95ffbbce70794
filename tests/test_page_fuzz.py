"""Fuzz the journey page's inputs with hypothesis, through the real app (AppTest on the tiny Llama).

Prompts: empty, blank, huge, control characters, mixed scripts, emoji. Settings: NaN, infinities,
negative and enormous numbers, as a stale session or a push could leave them. Whatever comes in,
the page raises nothing, says what is wrong in words, and the next ordinary request works.
"""
from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from streamlit.testing.v1 import AppTest

from conftest import tiny_prompt
from app.runs.request import SETTING_RANGES
from app.hosting.model import model_slot
from engine.core.generate import MAX_PROMPT_CHARS
from engine.serving.scheduler import scheduler_for

MAIN = "../app/main.py"
PIECES = ["w1 ", "Grüße, мир, 世界 ", "🙂👩🏽‍💻🚀 ", "\x00\x07\x1b[31m\u202e\ufeff ", "<script>alert(1)</script> ", "\n\t "]
PROMPTS = st.one_of(
    st.sampled_from(["", " ", "\n\t  \r\n"]),
    st.text(st.characters(exclude_categories=("Cs",)), max_size=300),          # any script, emoji, controls
    st.builds(lambda parts: "".join(parts), st.lists(st.sampled_from(PIECES), min_size=1, max_size=40)),
    st.builds(lambda piece, n: piece * n, st.sampled_from(PIECES), st.integers(1_000, 15_000)),   # up to ~350K characters
)
NUMBERS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**63), 2**63))
SETTINGS = st.dictionaries(st.sampled_from(["temperature", "top_k", "top_p", "seed", "max_new"]), NUMBERS, max_size=5)


def clear_messages(at: AppTest) -> list[str]:
    messages = [e.value for e in at.error] + [w.value for w in at.warning]
    for m in messages:
        assert m.strip() and "Traceback" not in m
    return messages


def assert_clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def journey_with(stored: dict) -> AppTest:
    """A fresh session whose stored journey settings are `stored`, on the journey page."""
    at = AppTest.from_file(MAIN, default_timeout=60).run()
    for name, value in stored.items():
        at.session_state[f"journey.{name}"] = value
    at.switch_page("../pages/journey.py").run()
    assert_clean(at)
    return at


def out_of_range(stored: dict, max_new_limit: int) -> list[str]:
    """Labels of the stored settings the page must put back in range."""
    labels = []
    for name, value in stored.items():
        label, _, low, high = SETTING_RANGES[name]
        high = max_new_limit if name == "max_new" else high
        if not math.isfinite(value) or not low <= value <= high:
            labels.append(label)
    return labels


def test_the_journey_page_survives_any_input_and_serves_the_next_request(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("PLAYGROUND_MODEL", str(tiny_model_dir))
    monkeypatch.setenv("PLAYGROUND_DEVICE", "cpu")
    monkeypatch.setenv("PLAYGROUND_DTYPE", "float32")

    lm = model_slot(str(tiny_model_dir), "cpu", "float32", None).get().lm
    max_new_limit = min(SETTING_RANGES["max_new"][3], scheduler_for(lm).limits.max_new_tokens)

    @settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(prompt=PROMPTS, stored=SETTINGS)
    def check(prompt: str, stored: dict) -> None:
        at = journey_with(stored)
        try:
            try_inputs(at, prompt, stored, max_new_limit)
            normal_request(at)
        finally:                                                            # as a closed tab would: the room stays free
            if "session.id" in at.session_state:
                scheduler_for(lm).leave(at.session_state["session.id"])

    check()


def try_inputs(at: AppTest, prompt: str, stored: dict, max_new_limit: int) -> None:
    warnings = " ".join(w.value for w in at.warning)
    for label in out_of_range(stored, max_new_limit):                   # put back in range, with a word
        assert f"{label} was" in warnings
    at.number_input(key="journey.max_new").set_value(3)
    at.text_area(key="journey.prompt").set_value(prompt).run()
    assert_clean(at)
    messages = clear_messages(at)
    if not prompt.strip() or len(prompt) > MAX_PROMPT_CHARS:
        assert at.error and at.button(key="journey.generate").disabled
    if not at.button(key="journey.generate").disabled:
        at.button(key="journey.generate").click().run()
        assert_clean(at)
        run = at.session_state.get("last_run")
        assert (run is not None and run.status == "done") or clear_messages(at) != messages


def normal_request(at: AppTest) -> None:
    """After anything at all: an ordinary request on the same page is served."""
    at.text_area(key="journey.prompt").set_value(tiny_prompt(5, seed=3))
    at.number_input(key="journey.max_new").set_value(3).run()
    assert not at.error and not at.button(key="journey.generate").disabled
    at.button(key="journey.generate").click().run()
    assert_clean(at)
    run = at.session_state["last_run"]
    assert run.status == "done" and run.request.prompt == tiny_prompt(5, seed=3)
    assert 1 <= len(run.tokens) <= 3
