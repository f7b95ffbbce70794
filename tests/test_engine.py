"""The engine against independent references: HF eager attention and hidden states, model.generate, no-cache logits,
formulas. A run keeps its residual stream; the captures checked here are derived from it (engine/core/views.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from conftest import tiny_prompt
from engine.projection.card import kv_bytes_per_token, param_counts
from engine.core.generate import GenerationRequest, encode_prompt, generate, generate_kept, generate_captured
from engine.core.hooks import CAPTURE_OFF, CapturePolicy, count_hooks

ATOL = 1e-5  # float32 on CPU: SDPA vs eager attention differ by rounding only


def run(lm, prompt=None, policy=CAPTURE_OFF, **kw):
    """A run's records, with the captures `policy` names derived from the residual it kept."""
    request = GenerationRequest(prompt or tiny_prompt(), **{"max_new_tokens": 8, **kw})
    return generate_captured(lm, request, policy)


@pytest.fixture(scope="module")
def eager_model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="eager").eval()


def test_prefill_attention_equals_hf_output_attentions(tiny_lm, eager_model):
    records = run(tiny_lm, policy=CapturePolicy(), max_new_tokens=1)
    prefill = records[0]
    ids = torch.tensor([[p.id for p in prefill.prompt]])
    with torch.no_grad():
        reference = eager_model(ids, output_attentions=True).attentions  # per layer (1, H, T, T)
    assert len(prefill.captures) == tiny_lm.spec.n_layers
    for layer, cap in prefill.captures.items():
        assert cap.attention.shape == reference[layer][0].shape
        np.testing.assert_allclose(cap.attention, reference[layer][0].numpy(), atol=ATOL)


def test_decode_attention_rows_equal_hf_on_the_full_sequence(tiny_lm, eager_model):
    records = run(tiny_lm, policy=CapturePolicy(heads=(1, 3)), max_new_tokens=5)
    ids = [p.id for p in records[0].prompt] + [r.token.id for r in records[:-1]]
    with torch.no_grad():
        reference = eager_model(torch.tensor([ids]), output_attentions=True).attentions
    for rec in records[1:-1]:
        position = len(records[0].prompt) + rec.step - 1  # the token fed at this step
        assert sorted(rec.captures) == list(range(tiny_lm.spec.n_layers))
        for layer, cap in rec.captures.items():
            assert cap.heads == (1, 3) and cap.attention.shape == (2, 1, position + 1)
            expected = reference[layer][0, [1, 3], position, : position + 1].numpy()
            np.testing.assert_allclose(cap.attention[:, 0], expected, atol=ATOL)


def test_gqa_mapping_follows_the_config(tiny_lm):
    cap = run(tiny_lm, policy=CapturePolicy(layers=(0,)), max_new_tokens=1)[0].captures[0]
    group = tiny_lm.spec.n_heads // tiny_lm.spec.n_kv_heads
    assert cap.kv_heads == tuple(h // group for h in range(tiny_lm.spec.n_heads))


def test_greedy_equals_model_generate(tiny_lm):
    records = run(tiny_lm, max_new_tokens=20)
    prompt_ids = [p.id for p in records[0].prompt]
    ours = [r.token.id for r in records[:-1]]
    with torch.no_grad():
        ref = tiny_lm.model.generate(torch.tensor([prompt_ids]), do_sample=False, max_new_tokens=20)
    assert ours == ref[0, len(prompt_ids):].tolist()


def test_logits_with_cache_equal_logits_without(tiny_lm):
    records = run(tiny_lm, max_new_tokens=10)
    ids = [p.id for p in records[0].prompt] + [r.token.id for r in records[:-1]]
    with torch.no_grad():
        full = tiny_lm.model(torch.tensor([ids]), use_cache=False).logits[0]  # (T, V)
    n_prompt = len(records[0].prompt)
    for i, rec in enumerate(records[:-1]):
        expected = full[n_prompt - 1 + i, rec.token.logit_ids].numpy()
        np.testing.assert_allclose(rec.token.logits, expected, atol=1e-4)


def test_kv_cache_size_follows_the_formula(tiny_lm):
    records = run(tiny_lm, max_new_tokens=6)
    per_token = kv_bytes_per_token(tiny_lm.spec, "fp32")
    for rec in records[:-1]:
        assert rec.cache.bytes == per_token * rec.cache.length
        assert len(rec.cache.bytes_per_layer) == tiny_lm.spec.n_layers
    assert records[-2].cache.length == len(records[0].prompt) + records[-1].generated_tokens - 1


def test_the_kept_residual_equals_hf_hidden_states_at_every_position(tiny_lm, eager_model):
    """What a run keeps is HF's own `output_hidden_states` (eager attention, no cache): every layer's input at every
    position the run read, and the final norm's input (HF's last entry is that after the norm)."""
    records, kept = generate_kept(tiny_lm, GenerationRequest(tiny_prompt(), max_new_tokens=6), CapturePolicy())
    ids = [p.id for p in records[0].prompt] + [r.token.id for r in records[:-2]]
    with torch.no_grad():
        hidden = eager_model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    n = tiny_lm.spec.n_layers
    assert kept.layers == tuple(range(n + 1)) and kept.length == len(ids)
    for i in range(n):
        np.testing.assert_allclose(kept.input(i).numpy(), hidden[i][0].numpy(), atol=ATOL)
    np.testing.assert_allclose(eager_model.model.norm(kept.input(n)).detach().numpy(), hidden[n][0].numpy(), atol=ATOL)


def test_residual_norms_and_qkv_norms_match_independent_reads(tiny_lm, eager_model):
    """|residual| leaving each layer and |Q|, |K|, |V| per head at each pass's newest position, derived, against
    HF's hidden states and the layer's own projections run here (RoPE turns each pair of dims: norms are kept)."""
    records = run(tiny_lm, policy=CapturePolicy(attention=False), max_new_tokens=4)
    ids = [p.id for p in records[0].prompt] + [r.token.id for r in records[:-2]]
    with torch.no_grad():
        hidden = eager_model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    n_prompt, d = len(records[0].prompt), tiny_lm.spec.head_dim
    for rec in records[:-1]:
        p = n_prompt - 1 + (rec.step if rec.kind == "decode" else 0)
        assert sorted(rec.captures) == list(range(tiny_lm.spec.n_layers))
        for layer, cap in rec.captures.items():
            out = hidden[layer + 1][0, p] if layer < tiny_lm.spec.n_layers - 1 else None   # HF's last is normed
            if out is not None:
                assert cap.resid_norm == pytest.approx(float(out.norm()), rel=1e-5)
            block = eager_model.model.layers[layer]
            with torch.no_grad():
                x = block.input_layernorm(hidden[layer][0, p])
                q, k, v = (proj(x).view(-1, d).norm(dim=-1).numpy()
                           for proj in (block.self_attn.q_proj, block.self_attn.k_proj, block.self_attn.v_proj))
            assert cap.attention is None
            np.testing.assert_allclose(cap.q_norm, q, rtol=1e-5)
            np.testing.assert_allclose(cap.k_norm, k, rtol=1e-5)
            np.testing.assert_allclose(cap.v_norm, v, rtol=1e-5)


def test_the_logit_lens_equals_the_final_norm_and_lm_head_on_hf_hidden_states(tiny_lm, eager_model):
    records = run(tiny_lm, policy=CapturePolicy(attention=False, stats=False, logit_lens=4), max_new_tokens=3)
    ids = [p.id for p in records[0].prompt] + [r.token.id for r in records[:-2]]
    with torch.no_grad():
        hidden = eager_model(torch.tensor([ids]), output_hidden_states=True).hidden_states
        n_prompt = len(records[0].prompt)
        for rec in records[:-1]:
            p = n_prompt - 1 + (rec.step if rec.kind == "decode" else 0)
            for layer in range(tiny_lm.spec.n_layers - 1):
                probs = torch.softmax(eager_model.lm_head(eager_model.model.norm(hidden[layer + 1][0, p])), -1)
                best = probs.topk(4)
                got = rec.captures[layer].lens
                assert [t for t, _ in got] == best.indices.tolist()
                np.testing.assert_allclose([q for _, q in got], best.values.numpy(), atol=ATOL)


def test_logit_lens_last_layer_is_the_model_prediction(tiny_lm):
    records = run(tiny_lm, policy=CapturePolicy(attention=False, logit_lens=3), max_new_tokens=3)
    last = tiny_lm.spec.n_layers - 1
    for rec in records[:-1]:
        top_id, top_prob = rec.captures[last].lens[0]
        assert top_id == rec.token.id  # greedy: the final layer's lens is the real distribution
        assert top_prob == pytest.approx(rec.token.prob, rel=1e-4)


def test_a_capturing_run_attaches_no_hook_and_capture_off_keeps_nothing(tiny_lm):
    """The residual comes out of the forward pass itself (output_hidden_states): no hook of ours is attached before,
    during or after a capturing run, a cancelled one or one whose consumer failed."""
    model, policy = tiny_lm.model, CapturePolicy(logit_lens=2)
    gen = generate(tiny_lm, GenerationRequest(tiny_prompt(), max_new_tokens=8), policy)
    first = next(gen)
    assert count_hooks(model) == 0 and first.captures == {}            # records carry no captures
    gen.close()
    gen = generate(tiny_lm, GenerationRequest(tiny_prompt(), max_new_tokens=8), policy)
    next(gen)
    with pytest.raises(RuntimeError):
        gen.throw(RuntimeError("consumer failed"))
    assert count_hooks(model) == 0
    records, kept = generate_kept(tiny_lm, GenerationRequest(tiny_prompt(), max_new_tokens=3), CAPTURE_OFF)
    assert kept is None and all(r.captures == {} for r in records if r.kind in ("prefill", "decode"))


def test_same_seed_same_text_and_seeds_matter(tiny_lm):
    texts = [run(tiny_lm, temperature=1.5, seed=s, max_new_tokens=12)[-1].text for s in (7, 7, 8)]
    assert texts[0] == texts[1]
    assert texts[0] != texts[2]


def test_top_k_one_is_greedy_and_probabilities_are_filtered(tiny_lm):
    greedy = run(tiny_lm, max_new_tokens=6)
    topk1 = run(tiny_lm, temperature=2.0, top_k=1, seed=3, max_new_tokens=6)
    assert [r.token.id for r in greedy[:-1]] == [r.token.id for r in topk1[:-1]]
    assert all(r.token.prob == pytest.approx(1.0) for r in topk1[:-1])


def test_max_new_tokens_and_stop_strings(tiny_lm):
    records = run(tiny_lm, max_new_tokens=5)
    assert records[-1].generated_tokens <= 5 and records[-1].finish_reason in ("length", "eos")
    first_word = records[0].token.text.split()[0]
    stopped = run(tiny_lm, max_new_tokens=20, stop=(first_word,))
    assert stopped[-1].finish_reason == "stop" and first_word not in stopped[-1].text


def test_cancellation_leaves_the_engine_ready(tiny_lm):
    calls = iter(range(100))
    records = list(generate(tiny_lm, GenerationRequest(tiny_prompt(), max_new_tokens=50),
                            should_stop=lambda: next(calls) >= 2))
    assert records[-1].finish_reason == "cancelled" and records[-1].generated_tokens == 3
    assert run(tiny_lm, max_new_tokens=4)[-1].generated_tokens >= 1


def test_timings_are_positive_and_consistent(tiny_lm):
    records = run(tiny_lm, max_new_tokens=6)
    done = records[-1]
    assert done.ttft == records[0].seconds > 0
    assert done.total_seconds >= done.ttft + sum(r.seconds for r in records[1:-1]) * 0.99
    assert done.tokens_per_second > 0


def test_card_counts_equal_the_loaded_parameters(tiny_lm):
    assert param_counts(tiny_lm.spec).total == sum(p.numel() for p in tiny_lm.model.parameters())


def test_chat_template_is_applied_only_when_present(tiny_lm):
    request = GenerationRequest("w1 w2 w3")
    assert encode_prompt(tiny_lm, request) == tiny_lm.tokenizer("w1 w2 w3")["input_ids"]


@pytest.mark.slow
def test_smollm2_knows_the_capital_of_france(smol_lm):
    records = run(smol_lm, "What is the capital of France?", max_new_tokens=24)
    assert "Paris" in records[-1].text
    assert param_counts(smol_lm.spec).total == sum(p.numel() for p in smol_lm.model.parameters())
    assert (smol_lm.spec.n_layers, smol_lm.spec.n_heads, smol_lm.spec.n_kv_heads) == (30, 9, 3)


def test_one_layer_captured_again_equals_what_the_generation_kept(tiny_lm):
    """The attention explainer captures one layer over a run's positions in one pass: the prefill block and every
    decode step's row that the views derived from the run's residual hold."""
    from engine.lab.attention_math import capture_attention

    records = run(tiny_lm, policy=CapturePolicy(), max_new_tokens=5)
    prefill, steps = records[0], records[1:-1]
    ids = [p.id for p in prefill.prompt] + [r.token.id for r in records[:-2]]
    n = len(prefill.prompt)
    for layer in range(tiny_lm.spec.n_layers):
        cap = capture_attention(tiny_lm, ids, layer)
        assert cap.attention.shape == (tiny_lm.spec.n_heads, len(ids), len(ids)) and cap.query_start == 0
        np.testing.assert_allclose(cap.attention[:, :n, :n], prefill.captures[layer].attention, atol=ATOL)
        for rec in steps:
            position = n + rec.step - 1
            np.testing.assert_allclose(cap.attention[:, position, : position + 1], rec.captures[layer].attention[:, 0],
                                       atol=ATOL)
    assert count_hooks(tiny_lm.model) == 0
