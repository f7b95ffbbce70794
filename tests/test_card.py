"""Model card figures against ../shared/FACTS.md and public configs, computed independently of engine/projection/card.py:
by hand from each model's published config.json, and against transformers' own models and caches."""
from __future__ import annotations

import json

import pytest
import torch

from engine.projection.card import (active_param_counts, attention_params_per_layer, expected_experts_touched,
                                    kv_bytes_per_token, kv_bytes_per_user, mlp_params_per_layer, model_card,
                                    naive_weight_bytes, param_counts, weight_bytes)
from engine.errors import ConfigError
from engine.projection.public_configs import PUBLIC_CONFIGS
from engine.projection.specs import MODEL_PRESETS, ModelSpec

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
    # FACTS' table is "weights alone": parameters x bytes. The card's weight_bytes is what a real
    # checkpoint stores (16-bit embeddings and head, scales), tested below; this is naive_weight_bytes.
    expected_gb = {"fp32": 280, "bf16": 140, "int8": 70, "int4": 35}
    for dtype, gb in expected_gb.items():
        assert naive_weight_bytes(MODEL_PRESETS["llama-3.1-70b"], dtype) / 1e9 == pytest.approx(gb, rel=0.02)
    assert weight_bytes(MODEL_PRESETS["llama-3.1-405b"], "bf16") / 1e9 == pytest.approx(810, rel=0.01)


def test_quantized_checkpoints_keep_embeddings_and_head_in_16_bit():
    """FACTS: an INT4 8B checkpoint is ~5.7 GB, not 4.0."""
    emb = 128_256 * 4096                                    # embeddings; the untied head is as large
    norms = (2 * 32 + 1) * 4096
    linear = 8_030_261_248 - 2 * emb - norms                # attention + MLP weights: what gets quantized
    int4 = linear * (0.5 + (2 + 0.5) / 128) + (2 * emb + norms) * 2   # + FP16 scale, 4-bit zero per 128
    assert weight_bytes(LLAMA_8B, "int4") == pytest.approx(int4)
    assert 5.6e9 < int4 < 5.8e9
    fp8 = linear * (1 + 4 / 4096) + (2 * emb + norms) * 2  # one FP32 scale per output row
    assert weight_bytes(LLAMA_8B, "fp8") == pytest.approx(fp8)
    assert weight_bytes(LLAMA_8B, "bf16") == 2 * 8_030_261_248


# --- public configs of today's popular models, recomputed by hand ----------------------------------------

def spec_of(key: str) -> ModelSpec:
    """Straight from the published config.json dict, through transformers' AutoConfig."""
    return ModelSpec.from_hf_config(PUBLIC_CONFIGS[key], name=key)


def test_presets_are_the_public_configs():
    for key in ("llama-3.1-8b", "mixtral-8x7b", "deepseek-v3", "gemma-2-9b", "gemma-3-27b", "llama-4-scout"):
        assert MODEL_PRESETS[key].to_dict() | {"name": key} == spec_of(key).to_dict()


def test_mixtral_8x7b_total_and_active():
    """Mixtral: 32 layers, d 4096, 32 heads over 8 KV heads of 128, 8 experts of width 14336, top 2."""
    attn = 4096 * 4096 * 2 + 2 * 4096 * 8 * 128
    expert = 3 * 4096 * 14_336
    shared = 2 * 32_000 * 4096 + (2 * 32 + 1) * 4096 + 32 * (attn + 4096 * 8)   # embeddings, head, norms, routers
    total, active = shared + 32 * 8 * expert, shared + 32 * 2 * expert
    spec = spec_of("mixtral-8x7b")
    assert param_counts(spec).total == total and round(total / 1e9, 2) == 46.70
    assert active_param_counts(spec).total == active and round(active / 1e9, 2) == 12.88
    assert kv_bytes_per_token(spec) == 2 * 32 * 8 * 128 * 2
    assert expected_experts_touched(spec, 1) == pytest.approx(2)                      # batch 1: its 2 experts
    assert expected_experts_touched(spec, 8) == pytest.approx(8 * (1 - (6 / 8) ** 8))  # ~7.2 of 8
    assert expected_experts_touched(spec, 256) == pytest.approx(8, abs=1e-9)


def test_deepseek_v3_latent_attention_and_experts():
    """DeepSeek-V3: 671 B total, ~37 B active, KV = (512 latent + 64 RoPE) x 61 layers x 2 bytes."""
    d, h = 7168, 128
    attn = (d * 1536 + 1536 + 1536 * h * 192        # Q: down to rank 1536, norm, up to 128 heads of 128 + 64
            + d * (512 + 64) + 512                  # the latent and the shared RoPE key, latent norm
            + 512 * h * (128 + 128)                 # K (no-RoPE part) and V rebuilt from the latent
            + h * 128 * d)                          # O
    expert = 3 * d * 2048
    common = 2 * 129_280 * d + (2 * 61 + 1) * d + 61 * attn + 3 * (3 * d * 18_432) + 58 * (expert + d * 256)
    spec = spec_of("deepseek-v3")
    assert param_counts(spec).total == common + 58 * 256 * expert
    assert round(param_counts(spec).total / 1e9) == 671
    assert active_param_counts(spec).total == common + 58 * 8 * expert
    assert 36.5e9 < active_param_counts(spec).total < 38e9                          # ~37 B
    assert kv_bytes_per_token(spec, "bf16") == (512 + 64) * 61 * 2 == 70_272
    # The same attention caching full K and V per head would hold 71x more.
    assert kv_bytes_per_token(spec.without_mla(), "bf16") == 61 * 128 * (192 + 128) * 2


def test_gemma_2_9b_ties_embeddings_by_its_model_type_default():
    """gemma-2-9b's config.json has no tie_word_embeddings key: transformers' Gemma 2 default ties them."""
    assert "tie_word_embeddings" not in PUBLIC_CONFIGS["gemma-2-9b"]
    d = 3584
    layer = d * 16 * 256 + 2 * d * 8 * 256 + 16 * 256 * d + 3 * d * 14_336
    total = 256_000 * d + 42 * layer + (4 * 42 + 1) * d              # four norms per layer, one head
    spec = spec_of("gemma-2-9b")
    assert spec.tie_embeddings and param_counts(spec).total == total
    assert round(total / 1e9, 2) == 9.24
    untied = ModelSpec.from_hf_config({**PUBLIC_CONFIGS["gemma-2-9b"], "tie_word_embeddings": False})
    assert param_counts(untied).total / total == pytest.approx(1.099, abs=0.001)   # read untied: +9.9%


def test_gemma_2_sliding_layers_stop_growing_at_the_window():
    spec = spec_of("gemma-2-9b")
    assert (spec.window, spec.windowed_layers, spec.full_layers) == (4096, 21, 21)
    per_layer = 8 * 256 * 2 * 2                                     # K and V, 8 heads of 256, BF16
    assert kv_bytes_per_user(spec, 1000) == 42 * 1000 * per_layer   # inside the window: every layer grows
    assert kv_bytes_per_user(spec, 8192) == (21 * 8192 + 21 * 4095) * per_layer


def test_gemma_3_reads_the_nested_text_config():
    spec = spec_of("gemma-3-27b")
    d = 5376
    layer = d * 32 * 128 + 2 * d * 16 * 128 + 32 * 128 * d + 2 * 128 + 3 * d * 21_504   # + q/k norms
    assert param_counts(spec).total == 262_208 * d + 62 * layer + (4 * 62 + 1) * d     # text decoder, tied
    assert round(param_counts(spec).total / 1e9, 1) == 27.0
    assert (spec.window, spec.windowed_layers, spec.max_context) == (1024, 52, 131_072)  # 5 local : 1 global
    per_layer = 16 * 128 * 2 * 2
    assert kv_bytes_per_user(spec, 131_072) == (10 * 131_072 + 52 * 1023) * per_layer
    assert kv_bytes_per_user(spec.without_window(), 131_072) / kv_bytes_per_user(spec, 131_072) > 5


def test_llama_4_scout_experts_and_chunked_attention():
    spec = spec_of("llama-4-scout")
    d = 5120
    attn = d * 40 * 128 + 2 * d * 8 * 128 + 40 * 128 * d
    expert = 3 * d * 8192
    common = 2 * 202_048 * d + (2 * 48 + 1) * d + 48 * (attn + expert + d * 16)   # + one shared expert per layer
    assert param_counts(spec).total == common + 48 * 16 * expert                # ~108 B in the text decoder
    assert active_param_counts(spec).total == common + 48 * 1 * expert          # ~17 B active
    assert round(active_param_counts(spec).total / 1e9) == 17
    assert (spec.window_kind, spec.window, spec.windowed_layers) == ("chunked", 8192, 36)


def test_qwen3_moe_and_mistral_window():
    spec = spec_of("qwen3-30b-a3b")
    d = 2048
    attn = d * 32 * 128 + 2 * d * 4 * 128 + 32 * 128 * d + 2 * 128
    common = 2 * 151_936 * d + (2 * 48 + 1) * d + 48 * (attn + d * 128)
    expert = 3 * d * 768
    assert param_counts(spec).total == common + 48 * 128 * expert               # 30.5 B
    assert active_param_counts(spec).total == common + 48 * 8 * expert          # 3.3 B
    mistral = spec_of("mistral-7b-v0.1")
    assert round(param_counts(mistral).total / 1e9, 2) == 7.24
    assert kv_bytes_per_user(mistral, 32_768) == 32 * 4095 * 8 * 128 * 2 * 2     # capped at the 4K window


# Tiny configs of every model type the projection reads; transformers builds the real models.
TINY_BASE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=128, max_position_embeddings=256)
TINY = {
    "llama": {}, "qwen2": {}, "qwen3": {"head_dim": 8}, "mistral": {"sliding_window": 8}, "gemma": {"head_dim": 16},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen3_moe": {"head_dim": 8, "moe_intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2,
                  "decoder_sparse_step": 2, "mlp_only_layers": [3]},
    "gemma2": {"head_dim": 32, "sliding_window": 8}, "gemma3_text": {"head_dim": 16, "sliding_window": 8},
    "llama4_text": {"intermediate_size": 32, "intermediate_size_mlp": 96, "head_dim": 16, "num_local_experts": 4,
                    "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "attention_chunk_size": 8},
    "deepseek_v3": {"moe_intermediate_size": 32, "num_key_value_heads": 4, "n_routed_experts": 8,
                    "n_shared_experts": 1, "num_experts_per_tok": 2, "first_k_dense_replace": 1, "kv_lora_rank": 16,
                    "q_lora_rank": 24, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
                    "n_group": 2, "topk_group": 1},
    "deepseek_v2": {"moe_intermediate_size": 32, "num_key_value_heads": 4, "n_routed_experts": 8,
                    "n_shared_experts": 2, "num_experts_per_tok": 2, "first_k_dense_replace": 1, "kv_lora_rank": 16,
                    "q_lora_rank": None, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
                    "n_group": 2, "topk_group": 1},
}


@pytest.mark.parametrize("model_type", list(TINY))
def test_counts_and_cache_match_transformers_own_models(model_type):
    """Parameters against the model transformers builds; KV bytes against its cache after 20 tokens."""
    from transformers import AutoConfig, AutoModelForCausalLM

    data = {"model_type": model_type, **TINY_BASE, **TINY[model_type]}
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **{k: v for k, v in data.items()
                                                                                if k != "model_type"}))
    spec = ModelSpec.from_hf_config(data)
    assert param_counts(spec).total == sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        cache = model(torch.randint(0, 128, (1, 20)), use_cache=True).cache
    held = sum(layer.keys.numel() + layer.values.numel() for layer in cache.layers) * 4   # float32
    assert held == kv_bytes_per_user(spec, 20, "fp32")      # MLA too: transformers caches the latent


# --- reading configs: defaults from transformers, errors in one line ------------------------------------

def test_spec_from_a_config_without_head_dim(tmp_path):
    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
              "num_attention_heads": 14, "num_key_value_heads": 2, "num_hidden_layers": 24,
              "intermediate_size": 4864, "vocab_size": 151936, "max_position_embeddings": 32768,
              "tie_word_embeddings": True, "rope_theta": 1000000.0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = ModelSpec.from_json(tmp_path / "config.json")
    assert spec.head_dim == 64 and spec.group_size == 7 and spec.attention_bias
    assert param_counts(spec).total / 1e9 == pytest.approx(0.494, abs=0.001)  # Qwen2.5 0.5B
    assert ModelSpec.from_json(tmp_path).to_dict() == spec.to_dict()         # the folder works too


@pytest.mark.parametrize("content,message", [
    (None, "no model config"),
    ('{"model_type": "llama", "hidden_size": 4096', "not valid JSON"),
    ("[1, 2]", "JSON list"),
    ('{"model_type": "bert", "architectures": ["BertForMaskedLM"], "hidden_size": 768}', "BertForMaskedLM"),
    ('{"model_type": "no_such_type"}', "unknown to transformers"),
    ('{"model_type": "llama", "hidden_size": 4096}', "num_hidden_layers"),
    ('{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": "two", "num_attention_heads": 4}',
     "num_hidden_layers"),
])
def test_bad_configs_say_what_is_wrong_in_one_line(tmp_path, content, message):
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as err:
        ModelSpec.from_json(path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_card_is_json_and_complete():
    card = json.loads(json.dumps(model_card(MODEL_PRESETS["smollm2-135m"])))
    assert card["parameters"]["total"] == sum(v for k, v in card["parameters"].items() if k != "total")
    assert card["query_heads_per_kv_head"] == 3 and card["kv_bytes_per_token"]["bf16"] == 2 * 30 * 3 * 64 * 2
    moe = json.loads(json.dumps(model_card(MODEL_PRESETS["mixtral-8x7b"])))
    assert moe["mixture_of_experts"]["experts_touched_per_step"]["1"] == 2
    assert moe["active_parameters"]["total"] < moe["parameters"]["total"]
