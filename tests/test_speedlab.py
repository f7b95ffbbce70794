"""The measured plane: exact-length prompts, timings, the N^2 onset, the roofline placement and the ceiling."""
from __future__ import annotations


import numpy as np
import pytest

from engine.errors import ContextLengthError, InvalidRequestError
from engine.projection.cost import prefill_flops
from engine.projection.specs import MODEL_PRESETS
from engine.lab.speed import (ContextPoint, DeviceRoof, attention_onset, attention_share, ceiling_prefill_seconds,
                              compare_decode, copy_bandwidth, fit_ttft, known_gpu, matmul_flops, measure_context,
                              measure_roof, place_decode, prompt_of_length, sweep_context, time_decode)

LLAMA_8B = MODEL_PRESETS["llama-3.1-8b"]
SMOL = MODEL_PRESETS["smollm2-135m"]


@pytest.mark.parametrize("n", [1, 7, 100, 250])
def test_prompt_has_exactly_n_tokens(tiny_lm, n):
    unit = tiny_lm.tokenizer("w1 w2 w3 w4 w5")["input_ids"]
    ids = prompt_of_length(tiny_lm, n, "w1 w2 w3 w4 w5")
    assert len(ids) == n and ids == [unit[i % len(unit)] for i in range(n)]


def test_prompt_length_is_checked(tiny_lm):
    with pytest.raises(InvalidRequestError):
        prompt_of_length(tiny_lm, 0)
    with pytest.raises(ContextLengthError):
        measure_context(tiny_lm, 254, steps=4)         # 256-token context


def test_time_decode_runs_greedy_steps_with_the_cache(tiny_lm):
    ids = prompt_of_length(tiny_lm, 20, "w3 w9 w12")
    timing = time_decode(tiny_lm, ids, steps=5)
    assert timing.prompt_tokens == 20 and len(timing.steps) == 5
    assert timing.prefill > 0 and all(s > 0 for s in timing.steps)
    assert timing.tokens_per_second == pytest.approx(1 / timing.itl)


def test_context_point_and_interleaved_comparison(tiny_lm):
    point = measure_context(tiny_lm, 40, steps=3, repeats=2)
    assert isinstance(point, ContextPoint) and point.tokens == 40 and point.repeats == 2
    assert point.ttft > 0 and point.itl > 0
    timings = compare_decode([tiny_lm, tiny_lm], prompt_of_length(tiny_lm, 16), steps=3, rounds=2)
    assert [len(t.steps) for t in timings] == [6, 6]


def test_attention_share_follows_the_projection_flops():
    for n in (16, 1024, 32768):
        share = attention_share(LLAMA_8B, n)
        pairs = prefill_flops(LLAMA_8B, n) * share
        assert 0 < share < 1
        # Was n x 2N: the lookup does no arithmetic and the LM head runs on the last position only.
        emb, norms = 128_256 * 4096, 65 * 4096
        linear = n * 2 * (8_030_261_248 - 2 * emb - norms) + 2 * emb
        assert prefill_flops(LLAMA_8B, n) - pairs == pytest.approx(linear)
    assert attention_share(LLAMA_8B, 100) < attention_share(LLAMA_8B, 10_000) < attention_share(LLAMA_8B, 100_000)


@pytest.mark.parametrize("spec", [LLAMA_8B, SMOL])
@pytest.mark.parametrize("share", [0.1, 0.5])
def test_attention_onset_is_the_first_length_reaching_the_share(spec, share):
    n = attention_onset(spec, share)
    assert attention_share(spec, n) >= share > attention_share(spec, n - 1)


def test_onset_for_llama_8b_is_thousands_of_tokens():
    assert 5_000 < attention_onset(LLAMA_8B, 0.1) < 8_000     # ~16 GFLOPs linear vs 0.5 MFLOPs per pair
    assert 50_000 < attention_onset(LLAMA_8B, 0.5) < 70_000


def test_fit_recovers_a_quadratic_and_its_onset():
    a, b, c = 0.01, 2e-4, 4e-8
    points = [ContextPoint(n, a + b * n + c * n * n, 0.01, 1) for n in (64, 256, 512, 1024, 2048)]
    fit = fit_ttft(points, share=0.1)
    assert fit.a == pytest.approx(a, rel=1e-6) and fit.b == pytest.approx(b, rel=1e-6)
    assert fit.c == pytest.approx(c, rel=1e-6)
    assert fit.onset == round(0.1 / 0.9 * b / c)
    assert fit_ttft(points[:3]) is None


def test_fit_of_a_line_has_no_quadratic_term_on_every_call():
    linear = [ContextPoint(n, 0.01 + 1e-4 * n, 0.01, 1) for n in (64, 256, 512, 1024)]
    fits = {fit_ttft(linear) for _ in range(50)}
    assert len(fits) == 1
    (fit,) = fits
    assert fit.c == 0.0 and fit.onset is None
    assert fit.b == pytest.approx(1e-4, rel=1e-9) and fit.a == pytest.approx(0.01, rel=1e-9)


def test_fit_treats_a_quadratic_term_within_noise_as_zero():
    rng = np.random.default_rng(0)
    lengths = (64, 128, 256, 512, 768, 1024)
    noisy = [ContextPoint(n, 0.02 + 1e-4 * n + rng.normal(0, 2e-3), 0.01, 1) for n in lengths]
    assert fit_ttft(noisy).c == 0.0 and fit_ttft(noisy).onset is None
    curved = [ContextPoint(n, 0.02 + 1e-4 * n + 2e-7 * n * n + rng.normal(0, 2e-3), 0.01, 1) for n in lengths]
    fit = fit_ttft(curved)
    assert fit.c == pytest.approx(2e-7, rel=0.2) and fit.onset is not None


def test_copy_and_matmul_benchmarks_are_positive_and_plausible():
    bw = copy_bandwidth(8 * 2**20, repeats=2)
    flops = matmul_flops(256, repeats=2)
    assert 1e8 < bw < 1e13 and 1e8 < flops < 1e15


def test_known_gpus_come_from_the_spec_table():
    assert known_gpu("NVIDIA H100 80GB HBM3").name == "H100 SXM"
    assert known_gpu("NVIDIA H100 PCIe").name == "H100 PCIe"
    assert known_gpu("NVIDIA A100-SXM4-80GB").name == "A100 SXM 80GB"
    assert known_gpu("NVIDIA GeForce RTX 4090").name == "RTX 4090"
    assert known_gpu("Some Other GPU") is None


def test_measure_roof_on_cpu_is_measured():
    roof = measure_roof("cpu")
    assert roof.source == "measured" and roof.bandwidth > 0 and roof.peak_flops > 0
    assert roof.attainable(1e-3) == pytest.approx(1e-3 * roof.bandwidth)
    assert roof.attainable(1e9) == roof.peak_flops


def test_decode_placement_uses_bytes_over_time(tiny_lm):
    roof = DeviceRoof("test device", bandwidth=10e9, peak_flops=100e9, source="measured")
    place = place_decode(tiny_lm, roof, step_seconds=0.002, context=50)
    spec = tiny_lm.spec
    kv = 2 * spec.n_layers * spec.n_kv_heads * spec.head_dim * 4 * 50
    assert place.bytes_read == pytest.approx(tiny_lm.weight_bytes + kv)
    assert place.effective_bandwidth == pytest.approx(place.bytes_read / 0.002)
    assert place.bandwidth_share == pytest.approx(place.effective_bandwidth / 10e9)
    # the tiny model is memory-bound on this device: the ceiling is bytes / bandwidth
    assert place.ceiling_step_seconds == pytest.approx(place.bytes_read / 10e9)
    assert place.ratio == pytest.approx(place.ceiling_step_seconds / 0.002)
    assert place.intensity == pytest.approx(place.flops / place.bytes_read)


def test_ceiling_prefill_is_compute_bound_for_long_prompts(tiny_lm):
    roof = DeviceRoof("test device", bandwidth=1e12, peak_flops=1e9, source="measured")
    t = ceiling_prefill_seconds(tiny_lm, roof, 200)
    assert t == pytest.approx(prefill_flops(tiny_lm.spec, 200) / 1e9)


def test_sweep_interleaves_lengths_and_merges_rounds(tiny_lm):
    seen = []
    points = sweep_context(tiny_lm, [8, 16], steps=2, rounds=2, progress=lambda f, m: seen.append(m))
    assert seen == ["prefill of 8 tokens", "prefill of 16 tokens"] * 2
    assert [(p.tokens, p.repeats) for p in points] == [(8, 2), (16, 2)]


def test_the_observer_effect_times_both_and_capture_changes_no_token(tiny_lm):
    from dataclasses import replace

    from conftest import tiny_prompt
    from engine.core.generate import GenerationRequest, generate
    from engine.core.hooks import CAPTURE_OFF, CapturePolicy
    from engine.core.records import DecodeRecord
    from engine.lab.speed import observer_effect

    request = GenerationRequest(tiny_prompt(8), max_new_tokens=6, chat=False, temperature=0.9)
    seen = []
    effect = observer_effect(tiny_lm, request, CapturePolicy(logit_lens=3), rounds=2,
                             progress=lambda f, text: seen.append(f))
    assert effect.same_tokens
    steps = [r for r in generate(tiny_lm, replace(request, temperature=0.0), CAPTURE_OFF)
             if isinstance(r, DecodeRecord)]
    assert len(effect.off.steps) == len(effect.on.steps) == 2 * len(steps)      # every step of every round timed
    assert effect.ratio == effect.on.itl / effect.off.itl > 0
    assert seen == sorted(seen) and len(seen) == 4
    import statistics

    n = len(steps)                                                          # each round's own median, off and on
    for r, (off, on) in enumerate(effect.rounds):
        assert off == statistics.median(effect.off.steps[r * n:(r + 1) * n])
        assert on == statistics.median(effect.on.steps[r * n:(r + 1) * n])
    spread = max(abs(effect.rounds[0][i] - effect.rounds[1][i]) for i in (0, 1))
    assert effect.noise == spread and effect.within_noise == (abs(effect.on.itl - effect.off.itl) <= spread)
