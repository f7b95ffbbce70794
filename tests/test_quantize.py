"""Weight quantization of a copy: error bounds, packing, kernels against dequantized matmuls, quality, no mutation."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import tiny_prompt
from engine.errors import InvalidRequestError
from engine.core.generate import GenerationRequest, generate
from engine.core.lean import lean_step_for
from engine.lab.quantize import (QuantizedWeight, QuantLinear, compare_logits, compare_models, dequantize_int4,
                                 dequantize_int8, pack_int4, perplexity, quantize_copy, quantize_int4,
                                 quantize_int8, quantized_layers, text_ids, unpack_int4, all_logits)


def weights(n=48, k=64, seed=0):
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 40), st.integers(1, 6), st.integers(0, 10_000))
def test_int8_error_is_at_most_half_a_step_per_row(n, k8, seed):
    w = weights(n, 8 * k8, seed)
    codes, scale = quantize_int8(w)
    assert codes.dtype == torch.int8 and codes.abs().max() <= 127
    err = (dequantize_int8(codes, scale) - w).abs()
    assert torch.all(err <= scale[:, None] / 2 + 1e-7)


@pytest.mark.parametrize("group", [32, 64])
def test_int4_error_is_at_most_half_a_step_per_group(group):
    w = weights(40, 128, seed=group)
    codes, scale, low = quantize_int4(w, group)
    assert codes.max() <= 15 and scale.shape == (40, 128 // group)
    err = (dequantize_int4(codes, scale, low) - w).abs().reshape(40, -1, group)
    assert torch.all(err <= scale[..., None] / 2 + 1e-7)


def test_int4_finds_a_4_bit_grid_exactly():
    """Weights that already lie on a 16-level grid per group come back unchanged."""
    g = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 16, (8, 64), generator=g)
    codes[:, 0::32], codes[:, 1::32] = 0, 15                    # each group uses both ends of the grid
    scale, low = torch.rand(8, 2, generator=g) + 0.1, torch.randn(8, 2, generator=g)
    w = dequantize_int4(codes, scale, low)
    q_codes, q_scale, q_low = quantize_int4(w, 32)
    assert torch.equal(q_codes.long(), codes)
    assert torch.allclose(dequantize_int4(q_codes, q_scale, q_low), w, atol=1e-6)


def test_nibble_packing_round_trips_and_halves_the_bytes():
    codes = torch.randint(0, 16, (6, 64), generator=torch.Generator().manual_seed(1)).to(torch.uint8)
    packed = pack_int4(codes)
    assert packed.shape == (6, 32) and packed.dtype == torch.uint8
    assert torch.equal(unpack_int4(packed), codes)


def test_int4_needs_whole_groups():
    with pytest.raises(InvalidRequestError):
        quantize_int4(weights(4, 48), 32)


@pytest.mark.parametrize("scheme", ["int8", "int4"])
@pytest.mark.parametrize("use_kernel", [True, False])
def test_quant_linear_equals_the_dequantized_matmul(scheme, use_kernel):
    linear = torch.nn.Linear(64, 96)
    qw = QuantizedWeight.from_weight(linear.weight, scheme, 32)
    layer = QuantLinear(qw, linear.bias, torch.float32, use_kernel)
    x = torch.randn(2, 5, 64)
    expected = torch.nn.functional.linear(x, qw.dequantize(), linear.bias)
    assert layer(x).shape == (2, 5, 96)
    torch.testing.assert_close(layer(x), expected, atol=1e-4, rtol=1e-4)
    kernels_here = hasattr(torch, "_weight_int8pack_mm") and hasattr(torch, "_weight_int4pack_mm_for_cpu")
    assert layer.mode == ("kernel" if use_kernel and kernels_here else "dequantize")


def test_bf16_kernel_activations_stay_close():
    linear = torch.nn.Linear(64, 96)
    qw = QuantizedWeight.from_weight(linear.weight, "int4", 32)
    layer = QuantLinear(qw, linear.bias, torch.bfloat16)
    x = torch.randn(3, 64)
    expected = torch.nn.functional.linear(x, qw.dequantize(), linear.bias)
    torch.testing.assert_close(layer(x), expected, atol=3e-2, rtol=3e-2)


def test_stored_bytes_are_what_the_scheme_promises():
    linear = torch.nn.Linear(128, 64, bias=False)
    int8 = QuantLinear(QuantizedWeight.from_weight(linear.weight, "int8"), None, torch.float32, False)
    int4 = QuantLinear(QuantizedWeight.from_weight(linear.weight, "int4", 32), None, torch.float32, False)
    assert int8.stored_bytes() == 64 * 128 + 64 * 4                 # codes + one fp32 scale per row
    assert int4.stored_bytes() == 64 * 128 // 2 + 2 * 64 * 4 * 4    # nibbles + scale and minimum per group


def snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}, [type(m) for m in model.modules()]


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_quantizing_leaves_the_shared_model_untouched(tiny_lm, scheme):
    before, types = snapshot(tiny_lm.model)
    ids = text_ids(tiny_lm, tiny_prompt(30))
    reference = all_logits(tiny_lm, ids)
    q = quantize_copy(tiny_lm, scheme, 32)
    after, types_after = snapshot(tiny_lm.model)
    assert types_after == types and before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert torch.equal(all_logits(tiny_lm, ids), reference)
    assert q.lm.model is not tiny_lm.model and q.lm.lock is not tiny_lm.lock
    assert len(quantized_layers(q.lm.model)) == 7 * tiny_lm.spec.n_layers
    assert not quantized_layers(tiny_lm.model)


def test_int8_copy_agrees_and_keeps_perplexity(tiny_lm):
    q = quantize_copy(tiny_lm, "int8")
    report = compare_models(tiny_lm, q.lm, text_ids(tiny_lm, tiny_prompt(60, seed=4)))
    assert report.tokens == 60                                    # the tiny tokenizer adds no BOS
    assert report.top1_agreement >= 0.95
    assert abs(report.ppl_change) < 0.02 and report.mean_kl < 0.01
    assert q.weight_error < 0.01


def test_int4_copy_is_smaller_and_close(tiny_lm):
    q8, q4 = quantize_copy(tiny_lm, "int8"), quantize_copy(tiny_lm, "int4", 32)
    assert q4.linear_bytes_after < q8.linear_bytes_after < q8.linear_bytes_before
    assert q8.stored_bytes < q8.reference_bytes
    assert 4 < q4.bits_per_weight < 8 < q8.bits_per_weight < 9
    report = compare_models(tiny_lm, q4.lm, text_ids(tiny_lm, tiny_prompt(60, seed=4)))
    assert report.top1_agreement >= 0.7
    assert 0 < report.ppl_candidate < float("inf") and abs(report.ppl_change) < 0.2
    assert q4.weight_error > q8.weight_error


def test_the_engine_generates_with_a_quantized_copy(tiny_lm):
    """The copy answers with its own quantized weights (plain greedy through its modules), not the original's: the
    project's forward does not cover quantized layers, and nothing made for the original (its forward, made here
    first as a server that has served a request has it) comes along."""
    assert lean_step_for(tiny_lm) is not None
    q = quantize_copy(tiny_lm, "int4", 32)
    assert q.lm.lean is None and lean_step_for(q.lm) is None
    request = GenerationRequest(tiny_prompt(6), max_new_tokens=5, chat=False)
    records = list(generate(q.lm, request))
    ids = tiny_lm.tokenizer(request.prompt)["input_ids"]
    with torch.no_grad():
        for _ in range(5):
            ids.append(int(q.lm.model(torch.tensor([ids])).logits[0, -1].argmax()))
    assert [records[0].token.id] + [r.token.id for r in records[1:-1]] == ids[-5:]


def test_perplexity_of_a_perfect_predictor_is_one():
    ids = [3, 1, 2, 0]
    logits = torch.full((4, 5), -1e4)
    logits[torch.arange(3), torch.tensor(ids[1:])] = 0.0
    assert perplexity(logits, ids) == pytest.approx(1.0)
    same = compare_logits(logits, logits.clone(), ids)
    assert same.top1_agreement == 1.0 and same.mean_kl == pytest.approx(0.0, abs=1e-6)


def test_unknown_scheme_and_group_are_refused(tiny_lm):
    with pytest.raises(InvalidRequestError):
        quantize_copy(tiny_lm, "int3")
    with pytest.raises(InvalidRequestError):
        quantize_copy(tiny_lm, "int4", group_size=48)
