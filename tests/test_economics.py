"""Output against input tokens: the price arithmetic, the projection for Llama 3.1 8B on an H100 recomputed by hand
from its config and the spec sheet, and the measured plane on the tiny Llama."""
from __future__ import annotations

import pytest

from engine.lab.batching import PhasePoint, measure_phases
from engine.projection.economics import dollars_per_million, projected_token_prices, token_prices
from engine.errors import InvalidRequestError
from engine.projection.cost import Layout
from engine.projection.specs import GPU_PRESETS, MODEL_PRESETS

LLAMA_8B, H100 = MODEL_PRESETS["llama-3.1-8b"], GPU_PRESETS["h100-sxm"]

# Llama 3.1 8B from its config, as in test_projection.py.
EMB = 128_256 * 4096
PARAMS = 2 * EMB + 32 * (4096 * 4096 * 2 + 2 * 4096 * 1024 + 3 * 4096 * 14_336) + (2 * 32 + 1) * 4096
MATMUL = PARAMS - EMB - (2 * 32 + 1) * 4096       # every weight a token is multiplied through, LM head included
HEAD = EMB                                        # the untied LM head: vocab x d_model
KV = 2 * 32 * 8 * 128 * 2                         # bytes per token
PER_PAIR = 2 * 32 * 32 * (128 + 128)              # q.k and p.v over all layers and heads
PEAK, BW = 989e12, 3.35e12
FLOPS_EFF, BW_EFF = 0.6, 0.7                      # the projection's stated defaults


def test_prices_from_two_throughputs_by_hand():
    p = token_prices(prefill_tok_s=36_000, decode_tok_s=120, dollars_per_hour=3.0, batch=1)
    assert p.output_per_input == pytest.approx(300)
    assert p.input_per_million == pytest.approx(3 / 3600 / 36_000 * 1e6)          # $0.0231
    assert p.output_per_million == pytest.approx(3 / 3600 / 120 * 1e6)             # $6.94
    assert p.output_per_million / p.input_per_million == pytest.approx(p.output_per_input)
    assert dollars_per_million(3.6, 1000) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        token_prices(0, 10, 3.0)
    with pytest.raises(ValueError):
        token_prices(10, 10, -1.0)


def _by_hand(batch: int, n: int = 1024) -> tuple[float, float]:
    """(input tok/s, output tok/s) for `batch` prompts of n tokens on one H100 at 60% of peak FLOP/s and 70% of peak bandwidth."""
    prefill_flops = batch * (n * 2 * (MATMUL - HEAD) + 2 * HEAD + n * (n + 1) / 2 * PER_PAIR)
    prefill_bytes = 2 * (PARAMS - EMB) + batch * n * 2 * 4096 + batch * n * KV    # weights, rows looked up, K/V written
    prefill = max(prefill_flops / (PEAK * FLOPS_EFF), prefill_bytes / (BW * BW_EFF))
    decode_flops = batch * 2 * MATMUL + batch * n * PER_PAIR
    decode_bytes = 2 * (PARAMS - EMB) + batch * 2 * 4096 + batch * n * KV
    step = max(decode_flops / (PEAK * FLOPS_EFF), decode_bytes / (BW * BW_EFF))
    return batch * n / prefill, batch / step


@pytest.mark.parametrize("batch", [1, 64])
def test_projected_llama_8b_on_h100_by_hand(batch):
    row = projected_token_prices(LLAMA_8B, H100, batches=[batch], dollars_per_hour=3.0)[0]
    prefill, decode = _by_hand(batch)
    assert row.prefill_tok_s == pytest.approx(prefill, rel=1e-9)
    assert row.decode_tok_s == pytest.approx(decode, rel=1e-9)
    assert row.output_per_input == pytest.approx(prefill / decode, rel=1e-9)
    assert row.output_per_million == pytest.approx(3 / 3600 / decode * 1e6, rel=1e-9)


def test_batching_narrows_the_gap_but_output_stays_dearer():
    rows = projected_token_prices(LLAMA_8B, H100)
    ratios = [r.output_per_input for r in rows]
    assert [r.batch for r in rows] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert ratios == sorted(ratios, reverse=True)
    assert ratios[0] > 250                       # batch 1: one weight read per output token
    assert 2 < ratios[-1] < 10                   # batch 256: still several times (the caches are read every step)


def test_batches_that_do_not_fit_are_left_out_and_replicas_pay_for_every_gpu():
    assert projected_token_prices(MODEL_PRESETS["llama-3.1-405b"], H100) == []
    long = projected_token_prices(LLAMA_8B, H100, prompt_tokens=131_072)
    assert [r.batch for r in long] == [1, 2]     # 16 GB per user at 128K beside 16 GB of weights
    one = projected_token_prices(MODEL_PRESETS["llama-3.1-70b"], H100, batches=[8], layout=Layout(4))[0]
    assert one.dollars_per_hour == pytest.approx(4 * 3.0)


def test_phase_point_throughputs():
    p = PhasePoint(batch=4, prompt_tokens=128, prefill_seconds=0.5, step_seconds=0.02)
    assert p.prefill_tok_s == pytest.approx(4 * 128 / 0.5) and p.decode_tok_s == pytest.approx(4 / 0.02)
    assert p.to_dict()["decode_tok_s"] == pytest.approx(200)


def test_measured_phases_on_the_tiny_model(tiny_lm):
    messages = []
    points = measure_phases(tiny_lm, (1, 2), prompt_tokens=32, new_tokens=3, rounds=2,
                            progress=lambda f, m: messages.append(m))
    assert [p.batch for p in points] == [1, 2] and len(messages) == 4
    for p in points:
        assert p.prompt_tokens == 32 and p.prefill_seconds > 0 and p.step_seconds > 0
        prices = token_prices(p.prefill_tok_s, p.decode_tok_s, 1.0, p.batch)
        assert prices.output_per_input == pytest.approx(p.batch * 32 / p.prefill_seconds / (p.batch / p.step_seconds))
    with pytest.raises(InvalidRequestError):
        measure_phases(tiny_lm, (1,), prompt_tokens=8, new_tokens=1)
