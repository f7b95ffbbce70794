"""Chunked prefill, prefill/decode disaggregation and goodput in the serving simulation: each timeline of a
two-request trace worked out by hand, step by step, from the cost model's pass times."""
from __future__ import annotations

import math

import pytest

from engine.projection.cost import causal_pairs, cost_model
from engine.projection.serving_sim import (POLICIES, RequestRecord, ServerConfig, SimRequest, Targets, Workload, goodput,
                                           kv_transfer_seconds, make_requests, rescore, simulate)
from engine.projection.specs import GPU_PRESETS, MODEL_PRESETS

LLAMA_8B, H100 = MODEL_PRESETS["llama-3.1-8b"], GPU_PRESETS["h100-sxm"]
CM = cost_model(LLAMA_8B, H100)
# A short chat turn decoding when a long prompt arrives a microsecond later.
A = SimRequest(0, 0.0, prompt_tokens=8, output_tokens=4)
B = SimRequest(1, 1e-6, prompt_tokens=2000, output_tokens=2)

# Llama 3.1 8B from its config (as in test_projection.py), for one mixed step by hand.
EMB = 128_256 * 4096
PARAMS = 2 * EMB + 32 * (4096 * 4096 * 2 + 2 * 4096 * 1024 + 3 * 4096 * 14_336) + (2 * 32 + 1) * 4096
MATMUL, HEAD, KV = PARAMS - EMB - (2 * 32 + 1) * 4096, EMB, 2 * 32 * 8 * 128 * 2
PER_PAIR = 2 * 32 * 32 * (128 + 128)


def run(policy: str, requests=(A, B), **server) -> dict[int, RequestRecord]:
    result = simulate(LLAMA_8B, H100, server=ServerConfig(policy=policy, **server), requests=list(requests))
    return {r.rid: r for r in result.records}


# --- the mixed step --------------------------------------------------------------------------------------

def test_a_mixed_step_is_decode_alone_or_prefill_alone_at_the_ends():
    assert CM.mixed_step_seconds(5, 3000) == CM.decode_seconds(5, 3000)
    assert CM.mixed_step_seconds(0, 0, [(700, 0, True)]) == pytest.approx(CM.prefill_seconds([700]), rel=1e-12)
    assert CM.chunk_pairs(300, 0) + CM.chunk_pairs(200, 300) == causal_pairs(500)


def test_a_mixed_step_by_hand():
    """3 users decoding (300 cached tokens in all) and a 100-token chunk after 200 tokens of its prompt."""
    flops = 3 * 2 * MATMUL + 300 * PER_PAIR + 100 * 2 * (MATMUL - HEAD) + (300 * 301 / 2 - 200 * 201 / 2) * PER_PAIR
    nbytes = 2 * (PARAMS - EMB) + 103 * 2 * 4096 + (300 + 200 + 100) * KV     # weights, rows, K/V read and written
    by_hand = max(flops / (989e12 * 0.6), nbytes / (3.35e12 * 0.7))
    assert CM.mixed_step_seconds(3, 300, [(100, 200, False)]) == pytest.approx(by_hand, rel=1e-12)


# --- the three ways of serving a long prompt beside a short one ------------------------------------------

def test_continuous_batching_stalls_the_others_for_a_whole_prefill():
    t1 = CM.prefill_seconds([8])                         # A's first token
    t2 = t1 + CM.decode_seconds(1, 8)                    # A's second; B has arrived meanwhile
    t3 = t2 + CM.prefill_seconds([2000])                 # B read in a pass of its own: A waits
    t4 = t3 + CM.decode_seconds(2, 9 + 2000)             # A's third, B's second (B done)
    t5 = t4 + CM.decode_seconds(1, 10)                   # A's fourth
    a, b = run("continuous").values()
    assert (a.first_token, a.last_token, a.finish) == pytest.approx((t1, t5, t5))
    assert a.max_gap == pytest.approx(t4 - t2) and a.itl == pytest.approx((t5 - t1) / 3)
    assert b.ttft == pytest.approx(t3 - 1e-6) and b.finish == pytest.approx(t4)


def test_chunked_prefill_keeps_the_others_decoding():
    s1 = CM.mixed_step_seconds(0, 0, [(8, 0, True)])                 # A read whole: first token
    s2 = CM.mixed_step_seconds(1, 8, [(511, 0, False)])              # A decodes, B's first chunk fills the budget
    s3 = CM.mixed_step_seconds(1, 9, [(511, 511, False)])
    s4 = CM.mixed_step_seconds(1, 10, [(511, 1022, False)])          # A's fourth token: done
    s5 = CM.mixed_step_seconds(0, 0, [(467, 1533, True)])            # B's last chunk: its first token
    s6 = CM.mixed_step_seconds(1, 2000)
    a, b = run("chunked", token_budget=512).values()
    assert a.first_token == pytest.approx(s1) and a.finish == pytest.approx(s1 + s2 + s3 + s4)
    assert a.max_gap == pytest.approx(max(s2, s3, s4))
    assert b.ttft == pytest.approx(s1 + s2 + s3 + s4 + s5 - 1e-6)
    assert b.finish == pytest.approx(s1 + s2 + s3 + s4 + s5 + s6)
    stalled = run("continuous")
    assert a.max_gap < stalled[0].max_gap / 3                       # the others' ITL: no long stall


def test_disaggregation_moves_the_cache_between_pools():
    p1 = CM.prefill_seconds([8])                                    # the prefill GPU: A, then B
    p2 = p1 + CM.prefill_seconds([2000])
    link = 900 / 2                                                  # NVLink 4, one direction, GB/s
    ready_a = p1 + 10e-6 + 8 * KV / (link * 1e9)
    ready_b = p2 + 10e-6 + 2000 * KV / (link * 1e9)
    assert ready_a == pytest.approx(p1 + kv_transfer_seconds(CM, 8, link))
    d = [CM.decode_seconds(1, 8 + i) for i in range(3)]             # the decode GPU: A's three tokens alone
    assert ready_b > ready_a + sum(d)                               # B arrives after A has left
    a, b = run("disaggregated").values()
    assert (a.start, a.first_token) == pytest.approx((0.0, p1))     # TTFT = queueing + prefill, no interference
    assert a.finish == pytest.approx(ready_a + sum(d))
    assert a.max_gap == pytest.approx(ready_a + d[0] - p1)          # the first gap carries the hand-off
    assert (b.start, b.ttft) == pytest.approx((p1, p2 - 1e-6))
    assert b.finish == pytest.approx(ready_b + CM.decode_seconds(1, 2000))
    slow = run("disaggregated", kv_link_gbs=50.0)                   # InfiniBand between nodes
    assert slow[1].finish - b.finish == pytest.approx(2000 * KV * (1 / 50e9 - 1 / 450e9))
    result = simulate(LLAMA_8B, H100, server=ServerConfig(policy="disaggregated"), requests=[A, B])
    assert result.kv_handoff_mean == pytest.approx((ready_a - p1 + ready_b - p2) / 2)


def test_colocated_gpus_each_serve_their_share():
    same = [SimRequest(0, 0.0, 500, 20), SimRequest(1, 0.0, 500, 20)]
    alone = run("continuous", requests=same[:1])[0]
    two = run("continuous", requests=same, gpus=2)
    assert two[0].finish == pytest.approx(alone.finish) and two[1].finish == pytest.approx(alone.finish)
    shared = run("continuous", requests=same)                       # one GPU: both in one batch
    assert shared[0].finish > alone.finish


# --- goodput ---------------------------------------------------------------------------------------------

def _record(rid: int, ttft: float, itl: float, tokens: int) -> RequestRecord:
    return RequestRecord(rid, 0.0, 0.0, ttft, ttft + itl * (tokens - 1), 10, tokens, tokens, ttft + itl * (tokens - 1))


def test_goodput_counts_requests_within_both_targets():
    records = [_record(0, 0.2, 0.02, 100), _record(1, 0.9, 0.02, 50),     # both within
               _record(2, 1.5, 0.01, 80),                                  # TTFT too long
               _record(3, 0.1, 0.08, 40), _record(4, 0.3, 0.0, 1)]         # ITL too long; one token: no gaps
    g = goodput(records, duration=10.0, targets=Targets(ttft=1.0, itl=0.05))
    assert (g.requests, g.tokens) == (3, 151)
    assert g.requests_per_s == pytest.approx(0.3) and g.tokens_per_s == pytest.approx(15.1)
    assert g.share == pytest.approx(3 / 5)


def test_goodput_of_a_trace_by_hand_and_rescored():
    result = simulate(LLAMA_8B, H100, server=ServerConfig(policy="continuous"), requests=[A, B],
                      targets=Targets(ttft=1.0, itl=0.02))
    a, b = result.records
    assert a.itl > 0.02 > b.itl                      # the stall pushes A's mean gap past 20 ms; B decodes once
    assert result.goodput.requests == 1 and result.goodput.requests_per_s == pytest.approx(1 / result.duration)
    lax = rescore(result, Targets(ttft=1.0, itl=0.1))
    assert lax.goodput.requests == 2 and lax.goodput.tokens == 6 and lax.records == result.records


# --- the policies on one arrival trace -------------------------------------------------------------------

LONG = Workload(n_requests=200, arrival_rate=10.0, prompt_min=64, prompt_max=8192, output_min=16, output_max=256)


@pytest.fixture(scope="module")
def long_prompts():
    servers = {"continuous": ServerConfig(gpus=2), "chunked": ServerConfig(policy="chunked", gpus=2),
               "disaggregated": ServerConfig(policy="disaggregated")}
    return {k: simulate(LLAMA_8B, H100, LONG, s) for k, s in servers.items()}


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_serves_every_token_once(policy):
    workload = Workload(n_requests=60, arrival_rate=30.0, prompt_max=3000, output_min=1, output_max=64, seed=5)
    result = simulate(LLAMA_8B, H100, workload, ServerConfig(policy=policy, gpus=2, token_budget=256))
    by_id = {r.rid: r for r in make_requests(workload)}
    assert sorted(r.rid for r in result.records) == sorted(by_id)
    for rec in result.records:
        assert rec.tokens == by_id[rec.rid].output_tokens
        assert rec.arrival <= rec.start < rec.first_token <= rec.last_token <= rec.finish
    assert result.gpus == 2 and 0 < result.busy_fraction <= 1
    assert result.cost_per_million_tokens == pytest.approx(2 * 3.0 * result.duration / 3600 / result.total_tokens * 1e6)


def test_long_prompts_chunked_and_disaggregated_cut_the_itl_tail(long_prompts):
    stalled, chunked, split = long_prompts["continuous"], long_prompts["chunked"], long_prompts["disaggregated"]
    assert chunked.itl_p99 < stalled.itl_p99 / 3
    assert split.itl_p99 < stalled.itl_p99 / 3
    assert all(r.gpus == 2 for r in long_prompts.values())
    assert not math.isclose(split.ttft_p50, stalled.ttft_p50)
