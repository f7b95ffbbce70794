"""The serving simulation: conservation, continuous vs static batching, determinism, speed."""
from __future__ import annotations

import math

import pytest

from engine.projection.cost import cost_model
from engine.projection.serving_sim import (ServerConfig, SimRequest, Workload, make_requests, simulate,
                                           sweep_max_batch)
from engine.projection.specs import GPU_PRESETS, MODEL_PRESETS

LLAMA_8B = MODEL_PRESETS["llama-3.1-8b"]
H100 = GPU_PRESETS["h100-sxm"]
MIXED = Workload(n_requests=300, arrival_rate=50.0, output_min=8, output_max=512, seed=3)


@pytest.fixture(scope="module")
def runs():
    return {policy: simulate(LLAMA_8B, H100, MIXED, ServerConfig(policy=policy, max_batch=32))
            for policy in ("static", "continuous")}


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_conservation(runs, policy):
    result = runs[policy]
    requests = make_requests(MIXED)
    assert sorted(r.rid for r in result.records) == list(range(MIXED.n_requests))
    by_id = {r.rid: r for r in requests}
    for rec in result.records:
        assert rec.tokens == rec.output_tokens == by_id[rec.rid].output_tokens
        assert rec.arrival <= rec.start < rec.first_token <= rec.finish
    assert result.total_tokens == sum(r.output_tokens for r in requests)
    assert result.throughput_tok_s == pytest.approx(result.total_tokens / result.duration)


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_each_token_counted_once_against_the_step_series(policy):
    """With every step kept, the tokens the steps produced add up to the outputs, once each."""
    workload = Workload(n_requests=20, arrival_rate=math.inf, output_min=4, output_max=40, seed=1)
    result = simulate(LLAMA_8B, H100, workload, ServerConfig(policy=policy, max_batch=8))
    assert len(result.series) == result.decode_steps        # short run: nothing thinned
    outputs = sum(r.output_tokens for r in make_requests(workload))
    assert result.total_tokens == outputs
    batch_slots = sum(p.batch for p in result.series)
    if policy == "continuous":    # finished requests leave at once: every slot makes one token (the first: prefill)
        assert batch_slots == outputs - workload.n_requests
    else:                         # static: finished requests pad the batch until the longest is done
        assert batch_slots > outputs
    assert result.series[-1].kv_tokens >= 0


def test_continuous_beats_static_under_mixed_output_lengths(runs):
    static, continuous = runs["static"], runs["continuous"]
    assert continuous.throughput_tok_s > static.throughput_tok_s
    assert continuous.latency_p50 < static.latency_p50
    assert continuous.cost_per_million_tokens < static.cost_per_million_tokens


def test_deterministic_for_a_seed():
    a = simulate(LLAMA_8B, H100, MIXED, ServerConfig(max_batch=16))
    b = simulate(LLAMA_8B, H100, MIXED, ServerConfig(max_batch=16))
    assert a == b
    assert make_requests(MIXED) != make_requests(Workload(**{**MIXED.__dict__, "seed": 4}))


def test_single_request_timeline_matches_the_cost_model():
    """One request alone: the prefill yields the first token (TTFT = prefill), then one decode step per token."""
    req = SimRequest(0, 0.0, prompt_tokens=8, output_tokens=30)
    result = simulate(LLAMA_8B, H100, server=ServerConfig(), requests=[req])
    cm = cost_model(LLAMA_8B, H100)
    prefill = cm.prefill_seconds([8])
    steps = [cm.decode_seconds(1, 8 + i) for i in range(29)]
    rec = result.records[0]
    assert rec.first_token == pytest.approx(prefill) and rec.ttft == pytest.approx(prefill)
    assert rec.finish == rec.last_token == pytest.approx(prefill + sum(steps))
    assert rec.itl == pytest.approx(sum(steps) / 29) and rec.max_gap == pytest.approx(max(steps))
    assert result.itl_p50 == pytest.approx(sorted(steps)[14])
    assert 0.245 / 2 <= rec.finish <= 0.245 * 2           # FACTS worked example: ~245 ms
    assert result.busy_fraction == pytest.approx(1.0)


def test_kv_memory_limit_caps_the_batch():
    # Long prompts: each request reserves ~8K tokens = 1 GiB; ~65 GiB free holds ~65 of them.
    workload = Workload(n_requests=200, arrival_rate=math.inf, prompt_min=7000, prompt_max=7000,
                        output_min=1000, output_max=1000)
    result = simulate(LLAMA_8B, H100, workload, ServerConfig(max_batch=256))
    per_request = 8000 * 131_072
    free = 80 * 2**30 - 2 * 8_030_261_248
    assert 60 <= max(p.batch for p in result.series) <= free // per_request
    assert all(p.kv_reserved_tokens <= result.kv_capacity_tokens for p in result.series)


def test_idle_gpu_when_arrivals_are_sparse():
    result = simulate(LLAMA_8B, H100, Workload(n_requests=50, arrival_rate=0.5, output_max=64))
    assert result.busy_fraction < 0.5
    assert result.records[0].ttft < 0.1                     # nobody waits in the queue


def test_batch_sweep_trades_latency_for_throughput():
    workload = Workload(n_requests=200, arrival_rate=math.inf, output_max=256)
    rows = sweep_max_batch(LLAMA_8B, H100, workload, ServerConfig(), batches=[1, 8, 64])
    assert [r.max_batch for r in rows] == [1, 8, 64]
    assert rows[0].throughput_tok_s < rows[1].throughput_tok_s < rows[2].throughput_tok_s
    assert rows[0].per_user_tok_s > rows[2].per_user_tok_s
    assert rows[0].cost_per_million_tokens > 10 * rows[2].cost_per_million_tokens


def test_500_requests_simulate_to_a_bounded_series():
    """No wall-clock limit here (a test never depends on the machine's speed): the page stays quick because the
    series it draws is capped, whatever the workload."""
    result = simulate(LLAMA_8B, H100, Workload(n_requests=500), ServerConfig(max_batch=64))
    assert len(result.series) <= 2001
    assert set(result.summary()) >= {"throughput_tok_s", "ttft_p50", "latency_p95", "cost_per_million_tokens"}


def test_lognormal_lengths_stay_in_range():
    workload = Workload(n_requests=300, distribution="lognormal", prompt_min=16, prompt_max=4096)
    for r in make_requests(workload):
        assert 16 <= r.prompt_tokens <= 4096
        assert workload.output_min <= r.output_tokens <= workload.output_max


def test_bad_settings():
    with pytest.raises(ValueError):
        simulate(LLAMA_8B, H100, Workload(n_requests=5), ServerConfig(policy="fifo"))
    with pytest.raises(ValueError):
        simulate(MODEL_PRESETS["llama-3.1-405b"], H100, Workload(n_requests=5))
    with pytest.raises(ValueError):
        make_requests(Workload(distribution="zipf"))
