"""The projected plane against the FACTS.md figures, each recomputed by hand in the test."""
from __future__ import annotations

import argparse
import json
import math

import pytest

from engine import projection as pj
from engine.projection_cli import register
from engine.specs import GPU_PRESETS, MODEL_PRESETS

LLAMA_8B = MODEL_PRESETS["llama-3.1-8b"]
LLAMA_70B = MODEL_PRESETS["llama-3.1-70b"]
H100 = GPU_PRESETS["h100-sxm"]

# Llama 3.1 8B parameters written out from its config (FACTS: 8.03 B).
EMB_8B = 128_256 * 4096
ATTN_8B = 4096 * 4096 * 2 + 2 * 4096 * (8 * 128)      # W_Q, W_O + W_K, W_V: ~42 M per layer
MLP_8B = 3 * 4096 * 14_336                             # ~176 M per layer
PARAMS_8B = 2 * EMB_8B + 32 * (ATTN_8B + MLP_8B) + (2 * 32 + 1) * 4096
KV_PER_TOKEN_8B = 2 * 32 * 8 * 128 * 2                 # 131,072 bytes = 128 KiB


def within(value: float, target: float, rel: float) -> bool:
    return abs(value - target) <= rel * abs(target)


def test_parameter_and_weight_arithmetic():
    p = pj.project(LLAMA_8B, H100)
    assert p.params == PARAMS_8B
    assert within(p.params, 8.03e9, 0.005)
    assert within(p.weight_bytes, 16.06e9, 0.005)       # ~16 GB in BF16
    assert p.kv_bytes_per_token == KV_PER_TOKEN_8B == 128 * 1024


def test_batch1_decode_ceiling_is_about_209_tok_s():
    p = pj.project(LLAMA_8B, H100, batch=1, context=38, prompt_tokens=8, output_tokens=30)
    by_hand_s = (PARAMS_8B * 2 + 38 * KV_PER_TOKEN_8B) / 3.35e12     # 16.06 GB / 3.35 TB/s
    assert p.ceiling_step_ms == pytest.approx(by_hand_s * 1e3, rel=1e-9)
    assert within(p.ceiling_step_ms, 4.8, 0.01)
    assert within(p.ceiling_tok_s_per_user, 209, 0.01)
    assert p.decode_bound == "memory"


def test_worked_example_8_token_prompt_30_token_answer():
    """FACTS: prefill ~5 ms, each decode step ~8 ms, TTFT ~13 ms, total ~245 ms."""
    p = pj.project(LLAMA_8B, H100, batch=1, context=38, prompt_tokens=8, output_tokens=30)
    assert 245 / 2 <= p.request_ms <= 245 * 2
    assert within(p.request_ms, 245, 0.05)              # the default efficiencies land close
    assert 5 / 2 <= p.prefill_ms <= 5 * 2
    assert 13 / 2 <= p.ttft_ms <= 13 * 2
    assert within(p.decode_step_ms, 8.0, 0.05)
    # Short prompt: prefill is still a weight read, not compute.
    weight_read_s = PARAMS_8B * 2 / (3.35e12 * pj.DEFAULT_BANDWIDTH_EFFICIENCY)
    assert p.prefill_ms == pytest.approx(weight_read_s * 1e3, rel=0.01)


def test_forward_flops_are_2n_per_token_plus_causal_attention():
    assert within(pj.linear_flops_per_token(LLAMA_8B), 16e9, 0.01)     # ~16 GFLOPs per token
    n = 4096
    attn = 4 * 32 * 32 * 128 * n * (n + 1) / 2
    assert pj.prefill_flops(LLAMA_8B, n) == pytest.approx(n * 2 * PARAMS_8B + attn)
    # Attention grows with N^2, the rest with N: doubling the prompt more than doubles the cost.
    assert pj.prefill_flops(LLAMA_8B, 2 * n) > 2 * pj.prefill_flops(LLAMA_8B, n)


def test_32k_prefill_takes_seconds():
    p = pj.project(LLAMA_8B, H100, context=32_768, output_tokens=0)
    assert 0.5e3 <= p.prefill_ms <= 5e3


USERS_ROWS = [(1024, 500, 0.1), (10_240, 50, 0.1), (102_400, 5, 0.0), (131_072, 4, 0.0)]


@pytest.mark.parametrize("context,facts_users,rel", USERS_ROWS)
def test_users_that_fit_on_an_80gb_h100(context, facts_users, rel):
    """FACTS: 64 GB left after 16 GB of weights; ~500 / ~50 / ~5 / ~4 users at 1K/10K/100K/128K."""
    left = 80 * 2**30 - PARAMS_8B * 2                     # "80 GB" of HBM = 80 GiB
    by_hand = math.floor(left / (context * KV_PER_TOKEN_8B))
    assert pj.users_that_fit(LLAMA_8B, H100, context) == by_hand
    assert abs(by_hand - facts_users) <= rel * facts_users


def test_users_table_rows_match_facts():
    rows = pj.users_table(LLAMA_8B, H100, "bf16", "bf16", [1024, 10_240, 102_400, 131_072])
    assert [r.context for r in rows] == [1024, 10_240, 102_400, 131_072]
    assert rows[0].kv_bytes_per_user == 128 * 2**20                    # 128 MB (MiB) per 1K
    assert rows[1].kv_bytes_per_user == pytest.approx(1.25 * 2**30)    # "1.28 GB" = 10 x 128 MiB
    assert rows[2].kv_bytes_per_user == pytest.approx(12.5 * 2**30)    # "12.8 GB" = 100 x 128 MiB
    assert rows[3].kv_bytes_per_user == 16 * 2**30                     # 16 GB: as large as the weights
    assert [r.users for r in rows] == [520, 52, 5, 4]
    assert rows[0].to_dict()["users"] == 520


def test_fits_flag_follows_memory():
    assert pj.project(LLAMA_8B, H100, batch=4, context=131_072).fits
    assert not pj.project(LLAMA_8B, H100, batch=5, context=131_072).fits
    assert not pj.project(MODEL_PRESETS["llama-3.1-405b"], H100).fits   # ~810 GB of weights


def test_cost_per_token_falls_about_100x_from_batch_1_to_256():
    one = pj.project(LLAMA_8B, H100, batch=1, context=1024)
    many = pj.project(LLAMA_8B, H100, batch=256, context=1024)
    assert many.fits
    ratio = one.cost_per_million_tokens / many.cost_per_million_tokens
    assert 50 <= ratio <= 200
    # By hand at 100% efficiency: batch-1 step reads the weights + one user's cache.
    step1 = (2 * PARAMS_8B + 1024 * KV_PER_TOKEN_8B) / 3.35e12
    step256 = (2 * PARAMS_8B + 256 * 1024 * KV_PER_TOKEN_8B) / 3.35e12
    assert 50 <= (step1 / 1) / (step256 / 256) <= 200
    assert one.cost_per_million_tokens == pytest.approx(3.0 / 3600 * one.decode_step_ms / 1e3 * 1e6)


def test_large_batches_hit_the_compute_floor():
    p = pj.project(LLAMA_8B, H100, batch=4096, context=16)
    assert p.decode_bound == "compute"
    assert p.decode_step_ms == pytest.approx(p.decode_compute_ms)


@pytest.mark.parametrize("dtype,facts_gb", [("fp32", 280), ("bf16", 140), ("int8", 70), ("int4", 35)])
def test_quantization_table_for_70b(dtype, facts_gb):
    params_70b = 2 * 128_256 * 8192 + 80 * (8192 * 8192 * 2 + 2 * 8192 * 1024 + 3 * 8192 * 28_672) \
        + (2 * 80 + 1) * 8192
    p = pj.project(LLAMA_70B, GPU_PRESETS["b200"], weight_dtype=dtype)
    bytes_per = {"fp32": 4, "bf16": 2, "int8": 1, "int4": 0.5}[dtype]
    assert p.weight_bytes == pytest.approx(params_70b * bytes_per)
    assert within(p.weight_bytes / 1e9, facts_gb, 0.02)


def test_halving_weight_bytes_roughly_doubles_decode_ceiling():
    bf16 = pj.project(LLAMA_8B, H100, weight_dtype="bf16", context=64)
    fp8 = pj.project(LLAMA_8B, H100, weight_dtype="fp8", context=64)
    int4 = pj.project(LLAMA_8B, H100, weight_dtype="int4", context=64)
    assert 1.9 <= fp8.ceiling_tok_s_per_user / bf16.ceiling_tok_s_per_user <= 2.0
    assert 1.9 <= int4.ceiling_tok_s_per_user / fp8.ceiling_tok_s_per_user <= 2.0


def test_kv_precision_halves_cache_and_doubles_users():
    bf16 = pj.users_that_fit(LLAMA_8B, H100, 10_240, kv_dtype="bf16")
    fp8 = pj.users_that_fit(LLAMA_8B, H100, 10_240, kv_dtype="fp8")
    assert fp8 in (2 * bf16, 2 * bf16 + 1)


def test_roofline_and_intensities():
    ridge = pj.ridge_point(H100)
    assert ridge == pytest.approx(989e12 / 3.35e12)                # ~295 FLOPs per byte
    assert pj.attainable_flops(H100, 1.0) == pytest.approx(3.35e12)
    assert pj.attainable_flops(H100, 10 * ridge) == pytest.approx(989e12)
    points = pj.roofline(H100)
    assert any(pt.intensity == pytest.approx(ridge) for pt in points)
    assert all(pt.attainable_flops <= 989e12 * (1 + 1e-12) for pt in points)
    p = pj.project(LLAMA_8B, H100, batch=1, context=4096, prompt_tokens=4096)
    assert within(p.decode_intensity, 1.0, 0.1)       # 2 FLOPs per 2-byte weight
    assert p.prefill_intensity > ridge                 # long prefill: compute-bound
    assert p.decode_flops_utilization < 0.01           # decode uses well under 1% of the FLOPs
    assert pj.ridge_point(H100, "fp8") == pytest.approx(2 * ridge, rel=0.01)


def test_projection_is_frozen_and_serializable():
    p = pj.project(LLAMA_8B, H100)
    with pytest.raises(Exception):
        p.batch = 2  # type: ignore[misc]
    assert json.loads(json.dumps(p.to_dict()))["model"] == "Llama 3.1 8B"
    sweep = pj.sweep_batch(LLAMA_8B, H100, [1, 8, 64], context=512)
    assert [s.batch for s in sweep] == [1, 8, 64]
    assert sweep[0].total_tok_s < sweep[1].total_tok_s < sweep[2].total_tok_s


def test_bad_inputs_raise_value_error():
    with pytest.raises(ValueError):
        pj.project(LLAMA_8B, H100, weight_dtype="fp9")
    with pytest.raises(ValueError):
        pj.project(LLAMA_8B, H100, batch=0)
    with pytest.raises(ValueError):
        pj.project(LLAMA_8B, H100, flops_efficiency=1.5)


# --- the CLI -----------------------------------------------------------------------------------

def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["project", *argv])
    return args.func(args)


def test_cli_json(capsys):
    rc = run_cli(["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--weights", "bf16", "--kv", "bf16",
                  "--batch", "1", "--context", "38", "--prompt-tokens", "8", "--output-tokens", "30", "--json"])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert within(data["ceiling_tok_s_per_user"], 209, 0.01)
    assert data["fits"] is True
    for key in ("weight_bytes", "kv_bytes_total", "prefill_ms", "ttft_ms", "decode_step_ms",
                "per_user_tok_s", "total_tok_s", "users_that_fit"):
        assert key in data


def test_cli_table_and_config(tmp_path, capsys):
    config = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
              "num_hidden_layers": 32, "intermediate_size": 14336, "vocab_size": 128256,
              "max_position_embeddings": 131072, "rope_theta": 500000.0}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert run_cli(["--config", str(path), "--gpu", "h100-sxm"]) == 0
    out = capsys.readouterr().out
    assert "16.06 GB" in out and "decode step" in out


@pytest.mark.parametrize("argv", [
    ["--model", "no-such-model"],
    ["--model", "llama-3.1-8b", "--gpu", "tpu-v9"],
    ["--model", "llama-3.1-8b", "--weights", "fp9"],
    ["--model", "llama-3.1-8b", "--kv", "int3"],
    ["--config", "/no/such/config.json"],
    ["--model", "llama-3.1-8b", "--batch", "0"],
])
def test_cli_errors_are_one_line_exit_2(argv, capsys):
    assert run_cli(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in captured.err
