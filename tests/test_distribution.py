"""The candidate bars and their caption come from one number: the bars are shares of the whole vocabulary, so at
the settings a token was drawn with, its bar is the probability it was drawn with (issue 11 item 7).

Before: the page re-drew the bars from the 256 stored logits alone, so every bar was a share of those 256 and the
chosen token's bar (15.6%) was larger than the p in the caption (15.2%, over the whole vocabulary).
"""
from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest
import torch
from streamlit.testing.v1 import AppTest

from conftest import tiny_prompt, write_tiny_llama
from engine.core.generate import KEEP_LOGITS, GenerationRequest, generate
from engine.core.loader import load_model
from engine.core.sampling import filter_probs

VOCAB = 400                     # more than the KEEP_LOGITS (256) a token stores


@pytest.fixture(scope="module")
def wide_dir(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-wide"), seed=3, vocab_size=VOCAB)


@pytest.fixture(scope="module")
def wide_lm(wide_dir):
    return load_model(str(wide_dir), device="cpu", dtype="float32")


def tokens(lm, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, n: int = 4):
    request = GenerationRequest(tiny_prompt(8), n, temperature, top_k, top_p, seed=1, chat=False)
    return [r.token for r in generate(lm, request) if getattr(r, "token", None) is not None]


def redrawn_p(token, temperature, top_k=0, top_p=1.0, rest=True) -> float:
    probs = filter_probs(token.logits, temperature, top_k, top_p,
                         token.rest_logsumexp if rest else None, token.rest_count)
    return float(probs[list(token.logit_ids).index(token.id)])


def test_a_token_keeps_the_total_of_the_logits_it_does_not_store(wide_lm):
    first = tokens(wide_lm, n=1)[0]
    ids = wide_lm.tokenizer(tiny_prompt(8), add_special_tokens=False)["input_ids"]
    with torch.no_grad():                                                  # HF's own forward, no engine
        logits = wide_lm.model(torch.tensor([ids])).logits[0, -1].double()
    rest = np.setdiff1d(np.arange(VOCAB), first.logit_ids)
    assert first.rest_count == VOCAB - KEEP_LOGITS == len(rest)
    assert first.rest_logsumexp == pytest.approx(float(torch.logsumexp(logits[rest], 0)), abs=1e-4)
    assert first.prob == pytest.approx(float(torch.softmax(logits, 0)[first.id]), rel=1e-5)


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.0, 0, 1.0), (1.0, 0, 1.0), (0.8, 50, 1.0), (1.0, 0, 0.3)])
def test_the_redrawn_bar_is_the_probability_the_token_was_drawn_with(wide_lm, temperature, top_k, top_p):
    drawn = tokens(wide_lm, temperature, top_k, top_p, n=8)
    stored = [t for t in drawn if t.id in t.logit_ids]     # a near-flat random model may sample beyond the 256
    assert len(stored) >= 3
    for token in stored:
        assert redrawn_p(token, temperature, top_k, top_p) == pytest.approx(token.prob, rel=1e-5)


def test_without_the_rest_the_bars_were_shares_of_the_stored_logits_only(wide_lm):
    token = tokens(wide_lm, n=1)[0]
    assert redrawn_p(token, 1.0, rest=False) > token.prob * 1.05         # the old bar: too large


def test_old_recordings_without_the_rest_still_redraw():
    probs = filter_probs(np.array([2.0, 1.0, 0.0], dtype=np.float32), 1.0)
    assert probs.sum() == pytest.approx(1.0)


def test_journey_caption_quotes_the_chosen_bar(wide_dir, monkeypatch):
    monkeypatch.setenv("PLAYGROUND_MODEL", str(wide_dir))
    monkeypatch.setenv("PLAYGROUND_DEVICE", "cpu")
    monkeypatch.setenv("PLAYGROUND_DTYPE", "float32")
    at = AppTest.from_file("../app/main.py", default_timeout=60).run()
    at.switch_page("../pages/journey.py").run()
    at.text_area(key="journey.prompt").set_value(tiny_prompt(8))
    at.number_input(key="journey.max_new").set_value(3)
    at.button(key="journey.generate").click().run()
    assert not at.exception, [e.value for e in at.exception]
    token = at.session_state["last_run"].tokens[0]
    caption = next(c.value for c in at.caption if "in these bars" in c.value)
    p = float(re.search(r"([\d.]+)% in the plain softmax", caption).group(1)) / 100
    bars = next(json.loads(c.proto.spec) for c in at.get("plotly_chart")
                if json.loads(c.proto.spec)["layout"].get("xaxis", {}).get("title", {}).get("text")
                == "probability (%)")
    values = bars["data"][1]["x"]                                        # greedy: the plain softmax beside the bars
    if isinstance(values, dict):                                         # Plotly's base64 array
        values = np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"]).tolist()
    assert round(max(values) / 100, 3) == round(p, 3) and p == pytest.approx(token.prob, abs=5e-4)
    assert "took it with certainty" in caption and f"other {VOCAB - KEEP_LOGITS:,} tokens" in caption
