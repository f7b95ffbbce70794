"""Fuzzing the engine's public API on the tiny model: every request generates or fails with a clear
EngineError, and the engine serves the next request normally with no hook left behind."""
from __future__ import annotations


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


def unicode_ok(text: str | None) -> bool:
    return text is None or not any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def broken_rules(lm, request: GenerationRequest) -> list[str]:
    """What the engine must say about this request, written from its documented rules (not from its code): every
    rule the request breaks, as the start of the message that names it; [] for a request it must serve. The tiny
    model has no chat template, so its prompt is the tokenizer's plain encoding, and a 256-token context."""
    r, context = request, lm.spec.max_context
    rules = [(not unicode_ok(r.system), "the system prompt holds text that is not valid Unicode"),
             (not all(unicode_ok(x) for x in r.stop), "a stop string holds text that is not valid Unicode"),
             (not r.prompt.strip(), "the prompt is empty"),
             (len(r.prompt) > 200_000, "the prompt has"),
             (not unicode_ok(r.prompt), "the prompt holds text that is not valid Unicode"),
             (not 1 <= r.max_new_tokens <= 4096, "max new tokens must be 1 to 4096"),
             (not 0 <= r.temperature <= 10, "temperature must be between 0 and 10"),
             (r.top_k < 0, "top-k must be 0 (off) or positive"),
             (not 0 < r.top_p <= 1, "top-p must be above 0 and at most 1"),
             (not 0 <= r.seed < 2**63, "the seed must be a non-negative integer")]
    broken = [message for bad, message in rules if bad]
    if broken:
        return broken
    n = len(lm.tokenizer(r.prompt)["input_ids"])
    return [message for bad, message in [(n == 0, "the prompt encodes to no tokens"),
                                         (n > context, f"the prompt is {n:,} tokens"),
                                         (n + r.max_new_tokens > context, f"{n:,} prompt tokens + ")] if bad]


def run_or_refuse(lm, request: GenerationRequest, policy: CapturePolicy) -> None:
    """A request that breaks no rule is served; one that does is refused with the message of a rule it breaks."""
    broken = broken_rules(lm, request)
    try:
        records = list(generate(lm, request, policy))
    except EngineError as err:
        assert broken, f"a valid request was refused: {type(err).__name__}: {err}"
        assert any(str(err).startswith(message) for message in broken), (str(err), broken)
        event(f"refused: {type(err).__name__}")
        return
    assert not broken, f"served a request that breaks: {broken}"
    event(f"generated ({records[-1].finish_reason})")
    done = records[-1]
    assert isinstance(done, DoneRecord) and 1 <= done.generated_tokens <= request.max_new_tokens


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


KINDS = {"prompt": str, "max_new_tokens": int, "temperature": (int, float), "top_k": int, "top_p": (int, float),
         "seed": int, "chat": bool, "system": (str, type(None))}
RANGES = {"prompt": (lambda v: bool(v.strip()), "the prompt is empty"),
          "max_new_tokens": (lambda v: 1 <= v <= 16, "max new tokens must be 1 to 4096"),
          "temperature": (lambda v: 0 <= v <= 10, "temperature must be between 0 and 10"),
          "top_k": (lambda v: v >= 0, "top-k must be 0 (off) or positive"),
          "top_p": (lambda v: 0 < v <= 1, "top-p must be above 0 and at most 1"),
          "seed": (lambda v: v >= 0, "the seed must be a non-negative integer")}


def wrong_value(field: str, value) -> str | None:
    """The start of the message a request with `field=value` (the rest valid) must be refused with; None when it
    must be served. From the documented field types and ranges, not from the engine's code."""
    if field == "stop":
        ok = isinstance(value, (list, tuple)) and all(isinstance(x, str) for x in value)
        return None if ok else "stop must be a list of strings"
    if isinstance(value, bool) != (KINDS[field] is bool) or not isinstance(value, KINDS[field]):
        return f"{field.replace('_', ' ')} must be "
    check, message = RANGES.get(field, (lambda v: True, ""))
    return None if check(value) else message


@FUZZ
@given(field=st.sampled_from(["prompt", "max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop",
                              "chat", "system"]), value=odd_values)
def test_the_scheduler_refuses_wrongly_typed_fields_with_a_message(tiny_lm, probe_text, field, value):
    scheduler = Scheduler(tiny_lm, Limits(max_new_tokens=16))
    wrong = wrong_value(field, value)
    try:
        base = {"prompt": "w1 w2", "max_new_tokens": 3, "chat": False}
        handle = scheduler.submit(GenerationRequest(**{**base, field: value}))
    except EngineError as err:
        assert wrong is not None, f"{field}={value!r} was refused: {err}"
        assert str(err).startswith(wrong), (str(err), wrong)
        event(f"refused: {type(err).__name__}")
    else:
        assert wrong is None, f"{field}={value!r} was accepted; expected: {wrong}"
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
