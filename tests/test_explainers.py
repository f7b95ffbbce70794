"""The explainer engines (fusion, cache on/off, attention arithmetic, quantization closely, float bits, the model
folder), each checked against an independent computation: Hugging Face's own attention, plain greedy decoding,
the published NF4 table, Python's struct, and the formulas worked by hand."""
from __future__ import annotations

import math
import struct

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import eager_attention_forward

from conftest import tiny_prompt, write_tiny_llama
from engine.lab.attention_math import attention_steps, capture_qkv
from engine.lab.quant_calibrated import ALPHAS, awq, compare_methods, gptq, group_scales, rtn
from app.speculative.numbers import projected_pair
from engine.lab.kv_cache import (TokenRow, compare_runs, generate_both, generate_timed, project_answer_seconds, project_token,
                                 slope)
from engine.errors import InvalidRequestError, NoWeightsError
from engine.lab.floatbits import float_bits, format_range
from engine.models.folder import PCIE, describe_folder, file_kind, pcie_seconds, time_read
from engine.lab.fusion import (AttentionShape, Traffic, causal_mask, decode_row_bytes, eager_attention, eager_bytes,
                               eager_bytes_per_score, fused_attention,
                               fused_bytes, largest_intermediate_bytes, measure_fusion, project_fusion, random_qkv)
from engine.core.generate import GenerationRequest, encode_prompt, forward, generate
from engine.core.hooks import CapturePolicy
from engine.core.loader import load_model
from engine.lab.quant_detail import (activation_channels, bits_per_weight, fake_nf4, fake_rtn_asym, fake_rtn_sym,
                                     grid_share, int8_errors_by_layer, int8_matmul_errors, q_proj_inputs, layer_inputs, nf4_levels, on_grid, scheme_quality)
from engine.lab.quantize import all_logits
from engine.projection.specs import GPU_PRESETS, MODEL_PRESETS

LLAMA_8B, H100 = MODEL_PRESETS["llama-3.1-8b"], GPU_PRESETS["h100-sxm"]


class _Module:
    """What HF's eager_attention_forward reads from its module."""

    def __init__(self, groups: int):
        self.num_key_value_groups, self.training = groups, False


# --- fusion -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (4, 4)])
def test_eager_steps_equal_hf_eager_and_fused(dtype, heads, kv_heads):
    s = AttentionShape(heads, kv_heads, 24, 16, torch.empty((), dtype=dtype).element_size())
    q, k, v = random_qkv(s, "cpu", dtype)
    mask = causal_mask(s.tokens, dtype, "cpu")
    ours = eager_attention(q, k, v, 0.25, mask)
    hf, _ = eager_attention_forward(_Module(heads // kv_heads), q, k, v, mask[None, None], 0.25)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(ours.transpose(1, 2).float(), hf.float(), atol=tol)
    assert torch.allclose(ours.float(), fused_attention(q, k, v, 0.25).float(), atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (6, 6)])
def test_counted_traffic_equals_the_formula(dtype, heads, kv_heads):
    s = AttentionShape(heads, kv_heads, 20, 8, torch.empty((), dtype=dtype).element_size())
    q, k, v = random_qkv(s, "cpu", dtype)
    log = Traffic()
    out = eager_attention(q, k, v, 0.3, causal_mask(s.tokens, dtype, "cpu"), log)
    assert log.total == eager_bytes(s)
    assert fused_bytes(s) == sum(t.numel() * t.element_size() for t in (q, k, v, out))
    assert max(w for _, _, w in log.steps) == largest_intermediate_bytes(s)     # the float32 probabilities
    assert [name for name, _, _ in log.steps][-1] == "P·V"
    assert ("cast back" in [n for n, _, _ in log.steps]) == (dtype != torch.float32)


def test_eager_traffic_per_score_is_24_bytes_in_bf16_and_32_in_fp32():
    for itemsize, per_score in ((2, 24), (4, 32)):
        s = AttentionShape(32, 8, 32768, 128, itemsize)
        assert eager_bytes(s) == pytest.approx(per_score * s.scores, rel=0.01)
        assert eager_bytes_per_score(itemsize) == per_score
    assert decode_row_bytes(LLAMA_8B, 32768, 2) == 32 * 32 * 32768 * 24                # ~805 MB per decode step


def test_measure_fusion_on_the_tiny_model_shapes(tiny_lm):
    s = AttentionShape.of_spec(tiny_lm.spec, 64, 4)
    point = measure_fusion(s, "cpu", torch.float32, repeats=1)
    assert point.eager_seconds > 0 and point.fused_seconds > 0
    assert point.eager_bytes == eager_bytes(s) and point.fused_bytes == fused_bytes(s)
    assert point.largest_bytes == 4 * 64 * 64 * 4 and point.max_difference < 1e-5
    with pytest.raises(InvalidRequestError):
        measure_fusion(AttentionShape(32, 8, 300_000, 128, 2), "cpu", torch.bfloat16)


def test_projected_fusion_for_llama_8b_on_h100_by_hand():
    """At the projection's default efficiencies, the ones every page uses: 60% of peak FLOP/s, 70% of bandwidth."""
    p = project_fusion(LLAMA_8B, H100, 32768)
    n, flops, bandwidth = 32768, 989e12 * 0.6, 3.35e12 * 0.7
    eager_per_layer = max(4 * 32 * 128 * n * n / flops, eager_bytes(AttentionShape(32, 8, n, 128, 2)) / bandwidth)
    fused_per_layer = max(4 * 32 * 128 * n * (n + 1) / 2 / flops, (2 * 32 + 2 * 8) * n * 128 * 2 / bandwidth)
    assert p.eager_seconds == pytest.approx(32 * eager_per_layer)
    assert p.fused_seconds == pytest.approx(32 * fused_per_layer)
    assert p.largest_bytes == 32 * n * n * 4 and not p.fits                   # 137 GB > 80 GB
    matmul = 8.03e9 - 128256 * 4096                     # every weight a token is multiplied through: not the embedding
    assert p.linear_seconds == pytest.approx(n * 2 * matmul / flops, rel=0.01)
    assert p.eager_ttft > 5 * p.fused_ttft
    assert project_fusion(LLAMA_8B, H100, 1024).fits


# --- the cache on and off --------------------------------------------------------------------------------------

def test_with_and_without_the_cache_give_plain_greedy_tokens(tiny_lm):
    ids = encode_prompt(tiny_lm, GenerationRequest(tiny_prompt(10), chat=False))
    on, off = generate_both(tiny_lm, ids, 8)
    assert on.use_cache and not off.use_cache
    assert generate_timed(tiny_lm, ids, 8, use_cache=False).tokens == off.tokens
    with torch.inference_mode():
        hf = tiny_lm.model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False, min_new_tokens=8)
    assert on.tokens == off.tokens == tuple(hf[0, len(ids):].tolist())
    assert len(on.seconds) == 8 and all(t > 0 for t in on.seconds + off.seconds)
    assert on.lengths() == list(range(10, 18))


def test_logits_with_the_cache_equal_logits_without(tiny_lm):
    ids = encode_prompt(tiny_lm, GenerationRequest(tiny_prompt(12, seed=3), chat=False))
    full = all_logits(tiny_lm, ids)                                                 # (T, V), no cache
    cache = DynamicCache(config=tiny_lm.model.config)
    with torch.inference_mode():
        forward(tiny_lm, ids[:-1], cache, None)
        last = forward(tiny_lm, ids[-1:], cache)
    assert torch.allclose(last, full[-1], atol=1e-5)


def test_per_token_flops_follow_the_formulas_by_hand(tiny_lm):
    ids = encode_prompt(tiny_lm, GenerationRequest(tiny_prompt(6), chat=False))
    on, off = generate_timed(tiny_lm, ids, 4, True), generate_timed(tiny_lm, ids, 4, False)
    rows = compare_runs(tiny_lm.spec, on, off)
    params = sum(p.numel() for p in tiny_lm.model.parameters())                   # untied: every parameter counts
    params -= 96 * 64 + (2 * 3 + 1) * 64                  # no FLOPs for the embedding lookup and the norms' scales
    linear, pair = 2 * params, 4 * 3 * 4 * 16                                       # 3 layers x 4 heads x head_dim 16
    head = 2 * 64 * 96                                                             # LM head: d_model x vocab
    assert [r.length for r in rows] == [7, 8, 9]
    for r in rows:
        n = r.length
        assert r.flops_on == pytest.approx(linear + n * pair)
        off_flops = n * (linear - head) + head + n * (n + 1) / 2 * pair               # the LM head once per pass
        assert r.flops_off == pytest.approx(off_flops)
        assert r.flops_saved == pytest.approx(1 - (linear + n * pair) / off_flops)
    bad = type(off)(off.prompt_tokens, False, (1,) + off.tokens[1:], off.seconds)
    with pytest.raises(ValueError):
        compare_runs(tiny_lm.spec, on, bad)


def test_slope_ignores_one_slow_step():
    rows = [TokenRow(n, 0.01 + 0.002 * n, 0.5, 1, 2) for n in range(10, 20)]
    rows[4] = TokenRow(14, 3.0, 9.0, 1, 2)                                         # a noisy neighbour
    assert slope(rows, "seconds_on") == pytest.approx(0.002) and slope(rows, "seconds_off") == pytest.approx(0)


def test_projected_token_on_h100_by_hand():
    """At the projection's default efficiencies (60% of peak FLOP/s, 70% of bandwidth): the 6.5 ms decode step of
    the speculative and cost pages, not the spec sheet's 4.5 ms."""
    flops, bandwidth = 989e12 * 0.6, 3.35e12 * 0.7
    assert project_token(LLAMA_8B, H100, 1024).seconds_on == pytest.approx(projected_pair().target_step_ms / 1e3)
    p = project_token(LLAMA_8B, H100, 8192)
    embedding = 128256 * 4096                              # a step reads one embedding row, not the table
    head = 2 * 4096 * 128256                               # the LM head runs once per pass, for the last position
    weights = (8.03e9 - embedding) * 2
    assert p.seconds_on == pytest.approx((weights + 8192 * 131072) / bandwidth, rel=0.01)
    per_token = 2 * (8.03e9 - embedding) - head
    work = 8192 * per_token + head + 8192 * 8193 / 2 * 4 * 32 * 32 * 128
    assert p.seconds_off == pytest.approx(work / flops, rel=0.01)
    prefill = lambda n: (n * per_token + head + n * (n + 1) / 2 * 4 * 32 * 32 * 128) / flops   # noqa: E731
    decode = lambda n: (weights + n * 131072) / bandwidth                                     # noqa: E731
    on, off = project_answer_seconds(LLAMA_8B, H100, 1024, 100)
    assert on == pytest.approx(prefill(1024) + sum(decode(1024 + i) for i in range(1, 100)), rel=0.01)
    assert off == pytest.approx(prefill(1024) + sum(prefill(1024 + i) for i in range(1, 100)), rel=0.01)


# --- attention arithmetic ----------------------------------------------------------------------------------------

def test_our_attention_equals_the_models_own_output(tiny_lm):
    ids = encode_prompt(tiny_lm, GenerationRequest(tiny_prompt(9), chat=False))
    qkv = capture_qkv(tiny_lm, ids, 1)
    assert qkv.hf_difference < 1e-5
    assert qkv.q.shape == (4, 9, 16) and qkv.k.shape == (2, 9, 16)


@pytest.mark.parametrize("head", [0, 3])
def test_each_step_equals_hf_eager_attention_for_the_head(tiny_lm, head):
    ids = encode_prompt(tiny_lm, GenerationRequest(tiny_prompt(11, seed=2), chat=False))
    qkv = capture_qkv(tiny_lm, ids, 2)
    s = attention_steps(qkv, head)
    q, k, v = (torch.from_numpy(a)[None] for a in (qkv.q, qkv.k, qkv.v))
    mask = causal_mask(11, torch.float32, "cpu")[None, None]
    out, probs = eager_attention_forward(_Module(2), q, k, v, mask, qkv.scaling)
    assert np.allclose(s.probs, probs[0, head].numpy(), atol=1e-6)
    assert np.allclose(s.out, out[0, :, head].numpy(), atol=1e-5)
    assert s.kv_head == head // 2 and s.scaling == pytest.approx(16 ** -0.5)
    assert np.allclose(s.scaled, s.scores * s.scaling)
    assert np.all(np.isneginf(s.masked[np.triu_indices(11, 1)])) and np.allclose(s.probs.sum(-1), 1)


def test_steps_match_the_capture_of_a_real_prefill(tiny_lm):
    from engine.core.generate import generate_captured

    request = GenerationRequest(tiny_prompt(8, seed=4), chat=False, max_new_tokens=1)
    prefill = generate_captured(tiny_lm, request, CapturePolicy(layers=(1,), stats=False))[0]
    captured = prefill.captures[1]
    s = attention_steps(capture_qkv(tiny_lm, encode_prompt(tiny_lm, request), 1), 2)
    assert np.allclose(s.probs, captured.attention[list(captured.heads).index(2)], atol=1e-5)


def test_attention_steps_refuse_bad_layers_and_heads(tiny_lm):
    with pytest.raises(InvalidRequestError):
        capture_qkv(tiny_lm, [5, 6], 3)
    with pytest.raises(InvalidRequestError):
        capture_qkv(tiny_lm, [], 0)
    with pytest.raises(InvalidRequestError):
        attention_steps(capture_qkv(tiny_lm, [5, 6], 0), 4)


# --- quantization, closely ----------------------------------------------------------------------------------------

BNB_NF4 = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
           -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
           0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
           0.7229568362236023, 1.0]   # bitsandbytes' NF4 code book (QLoRA, appendix E)


def test_nf4_levels_are_the_published_table():
    assert torch.allclose(nf4_levels(), torch.tensor(BNB_NF4), atol=1e-6)


def test_nf4_rounds_each_weight_to_the_nearest_level_of_its_block():
    w = torch.randn(8, 128, generator=torch.Generator().manual_seed(0)) * 0.05
    blocks = w.reshape(8, 2, 64, 1)
    candidates = torch.tensor(BNB_NF4) * blocks.abs().amax(2, keepdim=True)        # (8, 2, 1, 16)
    pick = (blocks - candidates).abs().argmin(-1, keepdim=True)                     # (8, 2, 64, 1)
    nearest = candidates.expand(8, 2, 64, 16).gather(-1, pick).reshape(8, 128)
    assert torch.allclose(fake_nf4(w, 64), nearest, atol=1e-6)


def test_symmetric_rtn_stays_within_half_a_step_on_integer_codes():
    w = torch.randn(6, 64, generator=torch.Generator().manual_seed(1))
    step = w.reshape(6, 2, 32).abs().amax(-1, keepdim=True) / 7
    approx = fake_rtn_sym(w, 32).reshape(6, 2, 32)
    assert torch.all((approx - w.reshape(6, 2, 32)).abs() <= step / 2 + 1e-6)
    codes = approx / step
    assert torch.allclose(codes, codes.round(), atol=1e-4) and codes.round().min() >= -8 and codes.round().max() <= 7


def test_bits_per_weight():
    assert [bits_per_weight(s) for s in ("rtn-asym-g32", "rtn-sym-g32", "rtn-asym-g64", "nf4-b64")] == \
        [5.0, 4.5, 4.5, 4.25]
    with pytest.raises(InvalidRequestError):
        bits_per_weight("int3")


def test_on_grid_recognises_a_q4_grid():
    w = torch.randn(4, 64, generator=torch.Generator().manual_seed(2))
    assert on_grid(fake_rtn_asym(w, 32)).all() and not on_grid(w).any()
    assert not on_grid(fake_rtn_asym(w, 32), group=64).all()                    # 64 spans two grids


@pytest.fixture(scope="module")
def gridded_lm(tmp_path_factory):
    """The tiny Llama with its block weights snapped to a Q4_1-like grid (scale and minimum per 32)."""
    folder = write_tiny_llama(tmp_path_factory.mktemp("gridded"), seed=5)
    lm = load_model(str(folder), device="cpu", dtype="float32")
    with torch.no_grad():
        for block in lm.model.model.layers:
            for lin in (block.self_attn.q_proj, block.self_attn.k_proj, block.self_attn.v_proj,
                        block.self_attn.o_proj, block.mlp.gate_proj, block.mlp.up_proj, block.mlp.down_proj):
                lin.weight.copy_(fake_rtn_asym(lin.weight, 32))
    return lm


def test_a_grid_aligned_with_the_source_shows_no_error(gridded_lm, tiny_lm):
    ids = encode_prompt(gridded_lm, GenerationRequest(tiny_prompt(40), chat=False))
    assert grid_share(gridded_lm) == 1.0 and grid_share(tiny_lm) == 0.0
    aligned = scheme_quality(gridded_lm, "rtn-asym-g32", ids)
    assert aligned.weight_error < 1e-6 and aligned.mean_kl < 1e-7 and aligned.top1_agreement == 1.0
    for scheme in ("rtn-asym-g64", "rtn-sym-g32", "nf4-b64"):
        assert scheme_quality(gridded_lm, scheme, ids).weight_error > 0.01


def test_scheme_quality_leaves_the_model_alone_and_measures_independently(tiny_lm):
    ids = encode_prompt(tiny_lm, GenerationRequest(tiny_prompt(30, seed=6), chat=False))
    before = {k: v.clone() for k, v in tiny_lm.model.state_dict().items()}
    q = scheme_quality(tiny_lm, "nf4-b64", ids)
    assert all(torch.equal(before[k], v) for k, v in tiny_lm.model.state_dict().items())
    with torch.inference_mode():
        logits = tiny_lm.model(torch.tensor([ids])).logits[0]
    ppl = math.exp(float(F.cross_entropy(logits[:-1], torch.tensor(ids[1:]))))
    assert q.ppl_reference == pytest.approx(ppl, rel=1e-5)
    blocks = [lin.weight for b in tiny_lm.model.model.layers for lin in (b.self_attn.q_proj, b.self_attn.k_proj,
              b.self_attn.v_proj, b.self_attn.o_proj, b.mlp.gate_proj, b.mlp.up_proj, b.mlp.down_proj)]
    blocks = [w.detach() for w in blocks]
    err = math.sqrt(sum(float((fake_nf4(w, 64) - w).square().sum()) for w in blocks)
                    / sum(float(w.square().sum()) for w in blocks))
    assert q.weight_error == pytest.approx(err, rel=1e-6) and 0 < q.top1_agreement <= 1


def test_int8_errors_show_what_an_outlier_channel_does():
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(50, 64, generator=g) * 0.5, torch.randn(32, 64, generator=g) * 0.05
    x[:, 7] = 40.0 + torch.randn(50, generator=g)                                   # one outlier feature
    e = int8_matmul_errors(x, w)
    assert e.outlier_columns == 1 and e.per_tensor > e.mixed and e.per_token > e.mixed
    calm = int8_matmul_errors(x.clamp(-3, 3), w)
    assert calm.outlier_columns == 0 and calm.mixed == pytest.approx(calm.per_token)


def test_activation_channels_match_the_hidden_states(tiny_lm):
    ids = encode_prompt(tiny_lm, GenerationRequest(tiny_prompt(20), chat=False))
    hidden = layer_inputs(tiny_lm, ids)
    normed, resid = activation_channels(tiny_lm, hidden)
    assert normed.max_abs.shape == (3, 64) and resid.mean_abs.shape == (3, 64)
    with torch.inference_mode():
        hs = tiny_lm.model(torch.tensor([ids]), output_hidden_states=True).hidden_states
        block = tiny_lm.model.model.layers[2]
        x = block.input_layernorm(hs[2])[0]                                         # (T, d_model)
    assert np.allclose(normed.max_abs[2], x.abs().amax(0).numpy()) and np.allclose(resid.mean_abs[0], hs[0][0].abs().mean(0))
    assert len(hidden) == 3 and np.all(normed.ratio() >= 1)
    assert torch.allclose(q_proj_inputs(tiny_lm, ids, 2), x)
    got, want = int8_errors_by_layer(tiny_lm, hidden)[2], int8_matmul_errors(x, block.self_attn.q_proj.weight)
    assert got.per_tensor == pytest.approx(want.per_tensor) and got.mixed == pytest.approx(want.mixed)


# --- GPTQ and AWQ on one layer --------------------------------------------------------------------------------

def correlated_inputs(t: int = 96, k: int = 64, seed: int = 7) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(t, 8, generator=g) @ torch.randn(8, k, generator=g) + 0.1 * torch.randn(t, k, generator=g)


def test_rtn_takes_the_nearest_level_of_the_shared_grid():
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(8))
    scales = group_scales(w, 32)
    levels = torch.arange(-8, 8, dtype=torch.float32)                                # (16,)
    steps = scales.repeat_interleave(32, dim=1)[..., None]                          # (16, 64, 1)
    nearest = (levels * steps).gather(-1, (w[..., None] - levels * steps).abs().argmin(-1, keepdim=True))
    assert torch.allclose(rtn(w, scales, 32), nearest[..., 0], atol=1e-6)


def test_gptq_is_rtn_when_the_inputs_are_uncorrelated():
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(9))
    x = torch.eye(64) * math.sqrt(64 / 2)                                            # H = I: nothing to spread
    scales = group_scales(w, 32)
    assert torch.allclose(gptq(w, x, scales, 32), rtn(w, scales, 32), atol=1e-6)


def test_gptq_and_awq_lower_the_output_error_they_aim_at():
    x, w = correlated_inputs(), torch.randn(32, 64, generator=torch.Generator().manual_seed(10)) * 0.05
    scales = group_scales(w, 32)
    out_err = lambda approx: float((x @ (w - approx).T).norm())                      # noqa: E731
    assert out_err(gptq(w, x, scales, 32)) < out_err(rtn(w, scales, 32))
    awq_w, alpha = awq(w, x, 32)
    assert out_err(awq_w) <= out_err(rtn(w, scales, 32)) + 1e-9 and alpha in ALPHAS  # alpha 0 is RTN itself
    result = compare_methods(x, w)
    assert [m.method for m in result.rows] == ["RTN", "GPTQ", "AWQ"]
    assert result.calibration_tokens == result.test_tokens == 48
    assert result.rows[0].weight_error <= result.rows[1].weight_error                 # same grid: RTN is nearest
    with pytest.raises(InvalidRequestError):
        compare_methods(x[:3], w)
    with pytest.raises(InvalidRequestError):
        group_scales(w[:, :48], 32)


# --- float bits ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [1.0, -2.5, 0.0371, 5.251953125, 1.52587890625e-05, 6e-8])
def test_bits_agree_with_struct(value):
    fp32 = float_bits(value, "fp32")
    word = struct.unpack(">I", struct.pack(">f", value))[0]
    assert int(fp32.bits, 2) == word
    fp16 = float_bits(value, "fp16")
    assert int(fp16.bits, 2) == struct.unpack(">H", struct.pack(">e", value))[0]
    assert fp16.stored == struct.unpack(">e", struct.pack(">e", value))[0]
    rounded = (word + 0x7FFF + ((word >> 16) & 1)) >> 16                            # FP32 -> BF16, ties to even
    assert int(float_bits(value, "bf16").bits, 2) == rounded


def test_bf16_is_the_top_of_fp32_and_hex_reads_right():
    assert float_bits(1.0, "bf16").hex == "0x3F80" and float_bits(-2.5, "bf16").hex == "0xC020"
    assert float_bits(1.0, "bf16").power == 0 and float_bits(-2.5, "fp16").sign == "1"
    exact = float_bits(0.15625, "fp32")                                             # exactly representable in BF16
    assert float_bits(0.15625, "bf16").bits == exact.bits[:16]
    sub = float_bits(1.52587890625e-05, "fp16")
    assert sub.exponent == "00000" and sub.power == -14                             # a subnormal in FP16
    with pytest.raises(InvalidRequestError):
        float_bits(1.0, "fp8")


def test_format_ranges():
    bf16, fp16, fp32 = format_range("bf16"), format_range("fp16"), format_range("fp32")
    assert fp16.largest == 65504.0 and fp16.step_after_one == 2 ** -10 and fp16.smallest_normal == 2 ** -14
    assert bf16.step_after_one == 2 ** -7 and bf16.smallest_normal == fp32.smallest_normal == 2 ** -126
    assert bf16.largest == pytest.approx((2 - 2 ** -7) * 2 ** 127)


# --- the model folder ---------------------------------------------------------------------------------------------

def test_folder_report_reads_the_headers(tiny_model_dir, tiny_lm):
    report = describe_folder(tiny_model_dir)
    kinds = {f.name: f.kind for f in report.files}
    assert kinds["config.json"] == "config" and kinds["model.safetensors"] == "weights"
    assert kinds["tokenizer.json"] == "tokenizer"
    assert report.parameters == sum(p.numel() for p in tiny_lm.model.parameters())
    assert report.shards[0].dtypes == {"F32": report.parameters}
    assert report.weight_bytes == (tiny_model_dir / "model.safetensors").stat().st_size
    assert time_read(report).nbytes == report.weight_bytes
    with pytest.raises(NoWeightsError):
        describe_folder(tiny_model_dir / "config.json")


def test_file_kinds_and_pcie_rates():
    assert [file_kind(n) for n in ("model-00001-of-00004.safetensors", "model.safetensors.index.json",
                                   "generation_config.json", "tokenizer.model", "chat_template.jinja", "README.md")] \
        == ["weights", "weights", "generation", "tokenizer", "chat template", "other"]
    assert PCIE["gen5-x16"].bytes_per_second == pytest.approx(32e9 * 16 * 128 / 130 / 8)   # ~63.0 GB/s
    assert pcie_seconds(16.06e9, PCIE["gen5-x16"]) == pytest.approx(0.2549, abs=1e-3)
    assert pcie_seconds(16.06e9, PCIE["gen4-x16"]) == pytest.approx(2 * 0.2549, abs=2e-3)
