"""Launch limits: defaults per device, environment variables, and the checks the engine makes per request."""
from __future__ import annotations

import pytest

from conftest import tiny_prompt
from engine.errors import ContextLengthError, EngineError, InsufficientMemoryError, InvalidRequestError
from engine.core.generate import GenerationRequest, generate_kept
from engine.core.views import derive_captures
from engine.core.hooks import CapturePolicy
from engine.serving.limits import (CPU_LIMITS, ENV_VARS, GPU_LIMITS, Limits, capture_bytes, check_memory, check_request,
                                   kv_bytes)
from engine.serving.scheduler import Scheduler
from engine.projection.specs import model_preset


def test_defaults_depend_on_the_device():
    assert Limits.for_device("cpu") == CPU_LIMITS
    assert Limits.for_device("cuda:0") == GPU_LIMITS
    assert GPU_LIMITS.max_prompt_tokens > CPU_LIMITS.max_prompt_tokens
    assert GPU_LIMITS.max_sessions > CPU_LIMITS.max_sessions


def test_environment_variables_override_the_defaults_and_round_trip():
    env = {"PLAYGROUND_MAX_NEW_TOKENS": "48", "PLAYGROUND_REQUEST_SECONDS": "2.5", "PLAYGROUND_MAX_QUEUE": "0"}
    limits = CPU_LIMITS.with_env(env)
    assert (limits.max_new_tokens, limits.request_seconds, limits.max_queue) == (48, 2.5, 0)
    assert limits.max_prompt_tokens == CPU_LIMITS.max_prompt_tokens
    assert Limits().with_env(limits.to_env()) == limits
    assert set(limits.to_env()) == set(ENV_VARS.values())


@pytest.mark.parametrize("var,value,words", [
    ("PLAYGROUND_MAX_NEW_TOKENS", "lots", "must be a whole number"),
    ("PLAYGROUND_MAX_PROMPT_TOKENS", "-5", "positive"),
    ("PLAYGROUND_MAX_SESSIONS", "0", "positive"),
    ("PLAYGROUND_REQUEST_SECONDS", "nan", "positive number"),
])
def test_a_bad_environment_variable_is_named_in_the_error(var, value, words):
    with pytest.raises(EngineError, match=words) as err:
        Limits().with_env({var: value})
    assert var in str(err.value)


def test_token_limits_are_checked_in_the_engine():
    spec, limits = model_preset("smollm2-135m"), Limits(max_prompt_tokens=100, max_new_tokens=50)
    off = CapturePolicy(layers=())
    check_request(limits, spec, "float32", 100, 50, off)
    with pytest.raises(ContextLengthError, match="at most 100"):
        check_request(limits, spec, "float32", 101, 10, off)
    with pytest.raises(InvalidRequestError, match="at most 50"):
        check_request(limits, spec, "float32", 10, 51, off)


def test_capture_size_estimate_matches_what_a_run_keeps_and_its_files_carry(tiny_lm):
    """The estimate is the residual the run keeps (every position it reads, plus the one a last token would take) and
    the attention views its exports derive from it."""
    for policy in (CapturePolicy(), CapturePolicy(layers=(1,), heads=(0, 3), max_keys=5),
                   CapturePolicy(prefill_matrix=False), CapturePolicy(layers=(), inputs=(0, 3))):
        req = GenerationRequest(tiny_prompt(10, seed=3), max_new_tokens=6, chat=False)
        records, kept = generate_kept(tiny_lm, req, policy)
        views = derive_captures(tiny_lm.model, kept, records, policy)
        maps = sum(c.attention.nbytes for r in views[:-1] for c in r.captures.values() if c.attention is not None)
        n = len(records[0].prompt)
        bound = capture_bytes(tiny_lm.spec, policy, n, 6)
        assert records[-1].finish_reason == "length" and kept.length == n + 5
        assert bound == maps + len(kept.layers) * tiny_lm.spec.d_model * 4 * (kept.length + 1)


def test_kv_bytes_use_the_card_formula():
    spec = model_preset("llama-3.1-8b")
    assert kv_bytes(spec, "bf16", 1) == 131_072          # 128 KiB per token (FACTS.md)
    assert kv_bytes(spec, "bf16", 100_000) == pytest.approx(13.1e9, rel=0.01)


def test_a_long_context_request_is_refused_when_its_cache_does_not_fit():
    spec = model_preset("llama-3.1-8b")
    check_memory(spec, "bf16", 100_000, free_bytes=64e9)
    with pytest.raises(InsufficientMemoryError, match="128.0 KiB") as err:
        check_memory(spec, "bf16", 100_000, free_bytes=10e9)
    assert "13,107" in str(err.value)                     # the MB needed, from the formula
    with pytest.raises(InsufficientMemoryError):
        check_memory(spec, "bf16", 100_000, free_bytes=64e9, reserve_bytes=60e9)


def test_the_scheduler_refuses_over_limit_requests_before_queueing(tiny_lm):
    long_prompt = tiny_prompt(200, seed=1)
    cases = [
        (Limits(max_prompt_tokens=50), GenerationRequest(long_prompt, chat=False), None, ContextLengthError),
        (Limits(max_new_tokens=8), GenerationRequest("w1 w2", max_new_tokens=9, chat=False), None,
         InvalidRequestError),
        (Limits(max_capture_mb=1), GenerationRequest(long_prompt, max_new_tokens=20, chat=False), CapturePolicy(),
         InvalidRequestError),
        (Limits(max_capture_layers=1), GenerationRequest("w1", chat=False), CapturePolicy(layers=(0, 1)),
         InvalidRequestError),
        (Limits(reserve_mb=10**9), GenerationRequest("w1 w2", chat=False), None, InsufficientMemoryError),
    ]
    for limits, req, policy, error in cases:
        scheduler = Scheduler(tiny_lm, limits)
        with pytest.raises(error) as err:
            scheduler.submit(req, policy or CapturePolicy(layers=()))
        assert len(str(err.value)) > 20
        stats = scheduler.stats()
        assert (stats.refused, stats.submitted, stats.queued) == (1, 0, 0)
        scheduler.close()
