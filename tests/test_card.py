"""Model card figures against ../shared/FACTS.md, computed independently of engine/card.py."""
from __future__ import annotations

import json

import pytest

from engine.card import (attention_params_per_layer, kv_bytes_per_token, mlp_params_per_layer, model_card,
                         param_counts, weight_bytes)
from engine.specs import MODEL_PRESETS, ModelSpec

LLAMA_8B = MODEL_PRESETS["llama-3.1-8b"]


def test_llama_31_8b_matches_facts():
    assert param_counts(LLAMA_8B).total / 1e9 == pytest.approx(8.03, abs=0.005)
    assert weight_bytes(LLAMA_8B, "bf16") / 1e9 == pytest.approx(16.06, abs=0.01)     # ~16 GB
    assert attention_params_per_layer(LLAMA_8B) / 1e6 == pytest.approx(42, abs=0.1)  # ~42 M
    assert mlp_params_per_layer(LLAMA_8B) / 1e6 == pytest.approx(176, abs=0.2)       # ~176 M
    assert kv_bytes_per_token(LLAMA_8B, "bf16") == 2 * 32 * 8 * 128 * 2 == 128 * 1024
    assert kv_bytes_per_token(LLAMA_8B.with_full_mha(), "bf16") == 512 * 1024        # 4x without GQA
    assert LLAMA_8B.group_size == 4


def test_kv_cache_table_from_facts():
    per_token = kv_bytes_per_token(LLAMA_8B, "bf16")
    assert per_token * 1000 / 1e6 == pytest.approx(131, abs=1)          # ~128 MB per 1K
    assert per_token * 100_000 / 1e9 == pytest.approx(13.1, abs=0.1)    # ~12.8 GB
    assert per_token * 131_072 / 2**30 == pytest.approx(16, abs=0.01)   # 16 GiB at 128K


def test_llama_70b_quantization_table():
    expected_gb = {"fp32": 280, "bf16": 140, "int8": 70, "int4": 35}
    for dtype, gb in expected_gb.items():
        assert weight_bytes(MODEL_PRESETS["llama-3.1-70b"], dtype) / 1e9 == pytest.approx(gb, rel=0.02)
    assert weight_bytes(MODEL_PRESETS["llama-3.1-405b"], "bf16") / 1e9 == pytest.approx(810, rel=0.01)


def test_spec_from_a_config_without_head_dim(tmp_path):
    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
              "num_attention_heads": 14, "num_key_value_heads": 2, "num_hidden_layers": 24,
              "intermediate_size": 4864, "vocab_size": 151936, "max_position_embeddings": 32768,
              "tie_word_embeddings": True, "rope_theta": 1000000.0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = ModelSpec.from_json(tmp_path / "config.json")
    assert spec.head_dim == 64 and spec.group_size == 7 and spec.attention_bias
    assert param_counts(spec).total / 1e9 == pytest.approx(0.494, abs=0.001)  # Qwen2.5 0.5B


def test_card_is_json_and_complete():
    card = json.loads(json.dumps(model_card(MODEL_PRESETS["smollm2-135m"])))
    assert card["parameters"]["total"] == sum(v for k, v in card["parameters"].items() if k != "total")
    assert card["query_heads_per_kv_head"] == 3 and card["kv_bytes_per_token"]["bf16"] == 2 * 30 * 3 * 64 * 2
