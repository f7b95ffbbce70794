"""The KV page says what its growth chart shows, and its prompt box shows the prompt of the run it charts
(issue 11 item 7). Before: the caption promised a "jump" at prefill that a chart counted in tokens cannot show,
and a run made on the journey page was charted under the KV page's own default prompt."""
from __future__ import annotations

import json

import pytest
from streamlit.testing.v1 import AppTest

from conftest import tiny_prompt


@pytest.fixture
def app(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("PLAYGROUND_MODEL", str(tiny_model_dir))
    monkeypatch.setenv("PLAYGROUND_DEVICE", "cpu")
    monkeypatch.setenv("PLAYGROUND_DTYPE", "float32")
    return AppTest.from_file("../app/main.py", default_timeout=60).run()


def generate(at: AppTest, ns: str, prompt: str, max_new: int) -> AppTest:
    at.text_area(key=f"{ns}.prompt").set_value(prompt)
    at.number_input(key=f"{ns}.max_new").set_value(max_new)
    at.button(key=f"{ns}.generate").click().run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def growth_chart(at: AppTest) -> dict:
    return next(json.loads(c.proto.spec) for c in at.get("plotly_chart")
                if "tokens in the cache" in json.dumps(json.loads(c.proto.spec)["layout"].get("xaxis", {})))


def test_the_box_shows_the_charted_runs_prompt_and_the_caption_what_the_chart_shows(app):
    journey_prompt = tiny_prompt(9, seed=4)
    at = app.switch_page("../pages/journey.py").run()
    generate(at, "journey", journey_prompt, 5)
    run = at.session_state["last_run"]
    at.switch_page("../pages/kv_cache.py").run()
    assert not at.exception
    assert at.text_area(key="kv.prompt").value == journey_prompt             # was the page's own default
    caption = next(c.value for c in at.caption if "Each band is one layer" in c.value)
    assert "jump" not in caption
    assert f"The first {run.n_prompt:,} tokens" in caption and f"{run.n_prompt + 4:,} in all" in caption
    lines = [s for s in growth_chart(at)["layout"].get("shapes", []) if s.get("type") == "line"]
    assert [s["x0"] for s in lines] == [run.n_prompt]                        # the dotted line the caption names
    assert not any("still shows the last run" in c.value for c in at.caption)

    at.text_area(key="kv.prompt").set_value(tiny_prompt(5, seed=7)).run()   # typed, not generated
    assert any("still shows the last run" in c.value for c in at.caption)
    generate(at, "kv", tiny_prompt(5, seed=7), 3)
    assert at.session_state["last_run"].request.prompt == tiny_prompt(5, seed=7)
    assert not any("still shows the last run" in c.value for c in at.caption)
