"""Attention computed again from kept layer inputs equals Hugging Face's eager attention (output_attentions), on
models with RoPE, grouped-query attention, biased QKV (Qwen2), sliding windows (Qwen2, Mistral) and soft-capping
(Gemma2); and the blockwise per-head summaries equal the same numbers taken from the full maps."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.core.attention_maps import attention_map, attention_rows, head_stats
from engine.core.recompute import layer_qk, run_layers

EXACT = 1e-5


def _tiny(kind: str):
    from transformers import (Gemma2Config, Gemma2ForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig,
                              MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)

    base = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(1)
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**base))
    if kind == "qwen2":   # 6:1... here 4:2 GQA, biased QKV, layers 1 and 2 slide over 8 positions
        return Qwen2ForCausalLM(Qwen2Config(**base, use_sliding_window=True, sliding_window=8, max_window_layers=1))
    if kind == "mistral":
        return MistralForCausalLM(MistralConfig(**base, sliding_window=6))
    return Gemma2ForCausalLM(Gemma2Config(**base, head_dim=16, sliding_window=8, attn_logit_softcapping=5.0,
                                          query_pre_attn_scalar=24, layer_types=["sliding_attention",
                                                                                 "full_attention",
                                                                                 "sliding_attention"]))


def _eager(model, ids):
    model.set_attn_implementation("eager")
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_attentions=True, output_hidden_states=True)
    model.set_attn_implementation("playground")
    return out.attentions, out.hidden_states


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral", "gemma2"])
def test_recomputed_maps_equal_hf_eager(kind):
    import engine.core.hooks  # noqa: F401 - registers the playground attention function

    model = _tiny(kind).eval()
    ids = torch.randint(4, 90, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    attentions, hidden = _eager(model, ids)
    for layer in range(3):
        qk = layer_qk(model, layer, hidden[layer][0])
        mine = attention_rows(qk, list(range(4)), 0, len(ids))
        np.testing.assert_allclose(mine.numpy(), attentions[layer][0].numpy(), atol=EXACT)
        exact = attention_map(qk, head=3, cells=64)
        assert exact.factor == 1 and exact.how.startswith("exact")
        below = ~np.isnan(exact.values)
        np.testing.assert_allclose(exact.values[below], attentions[layer][0, 3].numpy()[below], atol=EXACT)
        assert np.all(attentions[layer][0, 3].numpy()[~below] == 0)                   # NaN exactly where masked


def test_pooled_map_is_the_mean_of_visible_weights():
    import engine.core.hooks  # noqa: F401

    model = _tiny("qwen2").eval()
    ids = list(range(4, 54))
    attentions, hidden = _eager(model, ids)
    qk = layer_qk(model, 1, hidden[1][0])                                            # a sliding layer
    pooled = attention_map(qk, head=1, cells=10)
    assert pooled.factor == 5 and pooled.values.shape == (10, 10) and "5x5" in pooled.how
    full = attentions[1][0, 1].numpy()
    seen = np.tril(np.ones_like(full, dtype=bool)) & (np.arange(50)[:, None] - np.arange(50)[None, :] < 8)
    for r, c in [(0, 0), (3, 2), (9, 9), (9, 8)]:
        block = (slice(5 * r, 5 * r + 5), slice(5 * c, 5 * c + 5))
        assert pooled.values[r, c] == pytest.approx(full[block][seen[block]].mean(), abs=1e-6)
    assert np.isnan(pooled.values[9, 0])                                             # out of the window: nothing
    region = attention_map(qk, head=1, cells=64, rows=(20, 30), keys=(15, 30))
    assert region.factor == 1 and region.values.shape == (10, 15)
    np.testing.assert_allclose(np.nan_to_num(region.values), full[20:30, 15:30], atol=EXACT)


def reference_stats(p: np.ndarray, window: int) -> np.ndarray:
    """(4, H) entropy bits, sink, distance, local mass from full maps p (H, N, N), rows 1.. averaged."""
    n = p.shape[-1]
    back = np.arange(n)[:, None] - np.arange(n)[None, :]
    p = p[:, 1:].astype(np.float64)
    b = back[1:]
    entropy = -(p * np.log2(np.where(p > 0, p, 1))).sum(-1).mean(-1)
    return np.stack([entropy, p[..., 0].mean(-1), (p * np.clip(b, 0, None)).sum(-1).mean(-1),
                     (p * ((b < window) & (b >= 0))).sum(-1).mean(-1)])


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gemma2"])
def test_blockwise_summaries_equal_the_full_maps(kind, monkeypatch):
    import engine.core.attention_maps as maps

    monkeypatch.setattr(maps, "ROW_TILE", 7)                                          # many tiles on a short run
    monkeypatch.setattr(maps, "KEY_TILE", 5)
    model = _tiny(kind).eval()
    ids = torch.randint(4, 90, (37,), generator=torch.Generator().manual_seed(2)).tolist()
    attentions, hidden = _eager(model, ids)
    for layer in range(3):
        stats = head_stats(layer_qk(model, layer, hidden[layer][0]), window=4)
        mine = np.stack([stats.entropy, stats.sink, stats.distance, stats.local])
        np.testing.assert_allclose(mine, reference_stats(attentions[layer][0].numpy(), 4), rtol=1e-4, atol=1e-5)
        assert stats.rows == len(ids) - 1


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral"])
def test_a_partial_prefill_rebuilds_the_layer_inputs(kind):
    import engine.core.hooks  # noqa: F401

    model = _tiny(kind).eval()
    ids = list(range(4, 34))
    _, hidden = _eager(model, ids)
    rebuilt = run_layers(model, hidden[0][0], 0, 2)
    np.testing.assert_allclose(rebuilt.numpy(), hidden[2][0].numpy(), atol=1e-5)
