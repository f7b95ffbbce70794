"""Fuzzing the engine's public API on the tiny model: every request generates or fails with a clear
EngineError, and the engine serves the next request normally with no hook left behind."""
from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from engine.errors import EngineError
from engine.core.generate import GenerationRequest, generate
from engine.core.hooks import CAPTURE_OFF, CapturePolicy, count_hooks
from engine.serving.limits import Limits
from engine.core.records import DoneRecord
from engine.serving.scheduler import Scheduler

FUZZ = settings(max_examples=120, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
PROBE = GenerationRequest("w1 w2 w3 w4", max_new_tokens=4, chat=False)

any_char = st.characters(codec=None, categories=None)            # every code point, lone surrogates included
words = st.lists(st.sampled_from(["w1", "w7", "w42", "<s>", "</s>", "<unk>"]), min_size=1, max_size=12).map(" ".join)
prompts = st.one_of(
    st.text(any_char, max_size=40),                                      # control characters, surrogates, anything
    st.text(st.sampled_from("aé中ع😀\u200b\u202e\x00\x07\n\t \ufeff"), max_size=40),   # mixed scripts, emoji, bidi
    words, st.just(""),
    st.integers(150, 400).map(lambda n: "w5 " * n),                      # near and past the 256-token context
    st.just("w9 " * 70_000),                                             # past the character limit
    st.just("   \n\t "),
)
numbers = st.floats(allow_nan=True, allow_infinity=True)
valid = dict(
    max_new_tokens=st.integers(1, 6),
    temperature=st.one_of(st.just(0.0), st.floats(0, 3)),
    top_k=st.integers(0, 120),
    top_p=st.floats(1e-30, 1),        # below ~1e-45 see test_a_vanishing_top_p_keeps_the_most_likely_token
    seed=st.integers(0, 2**63 - 1),
    stop=st.lists(st.text(any_char, max_size=5), max_size=3).map(tuple),
    chat=st.booleans(),
    system=st.one_of(st.none(), st.text(any_char, max_size=20)),
)
edges = dict(
    max_new_tokens=st.sampled_from([-3, 0, 10**9]),
    temperature=st.one_of(numbers, st.just(-0.5)),
    top_k=st.integers(-5, -1),
    top_p=st.one_of(st.floats(allow_nan=True, allow_infinity=True).filter(lambda p: not 0 < p <= 1),
                    st.sampled_from([0.0, -1.0, 1.5])),
    seed=st.sampled_from([-2, 2**63, 2**64]),
)
policies = st.sampled_from([CAPTURE_OFF, CapturePolicy(layers=(0, 2), logit_lens=2),
                            CapturePolicy(layers=(99, -1), max_keys=3)])


@pytest.fixture(scope="module")
def probe_text(tiny_lm) -> str:
    return list(generate(tiny_lm, PROBE))[-1].text


def assert_serves_normally(lm, expected: str) -> None:
    assert count_hooks(lm.model) == 0
    assert list(generate(lm, PROBE))[-1].text == expected


def run_or_refuse(lm, request: GenerationRequest, policy: CapturePolicy) -> None:
    try:
        records = list(generate(lm, request, policy))
    except EngineError as err:
        assert str(err).strip(), f"{type(err).__name__} without a message"
        event(f"refused: {type(err).__name__}")
        return
    event(f"generated ({records[-1].finish_reason})")
    done = records[-1]
    assert isinstance(done, DoneRecord) and 1 <= done.generated_tokens <= request.max_new_tokens
    assert math.isfinite(request.temperature) and 0 < request.top_p <= 1


@FUZZ
@given(prompt=prompts, data=st.data())
def test_any_prompt_either_runs_or_refuses_with_a_message(tiny_lm, probe_text, prompt, data):
    fields = {name: data.draw(strategy) for name, strategy in valid.items()}
    run_or_refuse(tiny_lm, GenerationRequest(prompt, **fields), data.draw(policies))
    assert_serves_normally(tiny_lm, probe_text)


@FUZZ
@given(prompt=words, data=st.data())
def test_any_settings_either_run_or_refuse_with_a_message(tiny_lm, probe_text, prompt, data):
    fields = {name: data.draw(st.one_of(strategy, edges[name]) if name in edges else strategy)
              for name, strategy in valid.items()}
    run_or_refuse(tiny_lm, GenerationRequest(prompt, **fields), data.draw(policies))
    assert_serves_normally(tiny_lm, probe_text)


odd_values = st.one_of(st.none(), st.booleans(), st.text(max_size=3), st.floats(allow_nan=True),
                       st.integers(-10, 10), st.lists(st.integers(), max_size=2), st.binary(max_size=3))


@FUZZ
@given(field=st.sampled_from(["prompt", "max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop",
                              "chat", "system"]), value=odd_values)
def test_the_scheduler_refuses_wrongly_typed_fields_with_a_message(tiny_lm, probe_text, field, value):
    scheduler = Scheduler(tiny_lm, Limits(max_new_tokens=16))
    try:
        base = {"prompt": "w1 w2", "max_new_tokens": 3, "chat": False}
        handle = scheduler.submit(GenerationRequest(**{**base, field: value}))
    except EngineError as err:
        assert str(err).strip()
        event(f"refused: {type(err).__name__}")
    else:
        event("generated")
        done = handle.result(timeout=60)[-1]
        assert isinstance(done, DoneRecord) and handle.state == "done" and handle.error is None
    finally:
        scheduler.close()
    assert_serves_normally(tiny_lm, probe_text)


def test_a_vanishing_top_p_keeps_the_most_likely_token(tiny_lm, probe_text):
    request = GenerationRequest("w1", max_new_tokens=2, temperature=1.0, top_p=8.6e-122, chat=False)
    records = list(generate(tiny_lm, request, CAPTURE_OFF))
    greedy = list(generate(tiny_lm, GenerationRequest("w1", max_new_tokens=2, chat=False), CAPTURE_OFF))
    assert [r.token.id for r in records[:-1]] == [r.token.id for r in greedy[:-1]]  # only the top token survives
