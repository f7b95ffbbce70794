"""Speculative decoding on tiny self-written Llamas: exactness against plain greedy and against
transformers' assisted generation, the output distribution when sampling, cache rollback, records."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from conftest import tiny_prompt, write_tiny_llama
from engine.speculative.drafts import EarlyExitDraft, ModelDraft, NgramDraft, early_exit_logits, ngram_lookup
from engine.errors import DraftMismatchError, InvalidRequestError
from engine.core.generate import GenerationRequest, encode_prompt, generate
from engine.core.hooks import CapturePolicy, count_hooks
from engine.core.loader import load_model
from engine.core.records import PrefillRecord
from engine.speculative.decode import (SpecDoneRecord, SpecRoundRecord, accept_sampled, best_k, draft_from_spec,
                                       expected_speedup, expected_tokens_per_pass, record_to_json, speculative_generate,
                                       speedup_curve)

DRAFT_KINDS = ["ngram", "early-exit:1", "early-exit:2", "model"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from a second thread, and a single one does not stall on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def draft_lm(tmp_path_factory):
    """The target's weights plus noise (std 0.003 against weights of std 0.02), same tokenizer: a draft that
    agrees with the target on some tokens and not on others, so rounds accept partly and roll back."""
    from transformers import LlamaForCausalLM

    folder = write_tiny_llama(tmp_path_factory.mktemp("tiny-draft"), seed=0)
    model = LlamaForCausalLM.from_pretrained(folder)
    noise = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=noise) * 0.003)
    model.save_pretrained(folder, safe_serialization=True)
    return load_model(str(folder), device="cpu", dtype="float32")


def make_draft(kind: str, target, draft_lm):
    return ModelDraft(draft_lm) if kind == "model" else draft_from_spec(kind, target)


def answer_ids(records) -> list[int]:
    """Generated token ids from either loop's records."""
    ids = []
    for rec in records:
        if isinstance(rec, PrefillRecord) or getattr(rec, "kind", "") == "decode":
            ids.append(rec.token.id)
        elif isinstance(rec, SpecRoundRecord):
            ids.extend(t.id for t in rec.emitted)
    return ids


def greedy_request(seed: int = 0, n: int = 24, **kw) -> GenerationRequest:
    return GenerationRequest(tiny_prompt(12, seed=seed), max_new_tokens=n, chat=False, **kw)


# --- temperature 0: identical to plain greedy decoding -------------------------------------------------

@pytest.mark.parametrize("kind", DRAFT_KINDS)
@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_output_equals_plain_greedy(tiny_lm, draft_lm, kind, k):
    rates = []
    for seed in (0, 1, 3):
        request = greedy_request(seed)
        plain = list(generate(tiny_lm, request))
        spec = list(speculative_generate(tiny_lm, request, make_draft(kind, tiny_lm, draft_lm), k))
        assert answer_ids(spec) == answer_ids(plain)
        assert (spec[-1].text, spec[-1].finish_reason) == (plain[-1].text, plain[-1].finish_reason)
        assert spec[-1].generated_tokens == plain[-1].generated_tokens
        rates.append(spec[-1].acceptance_rate)
    assert max(rates) > 0 and min(rates) < 1                             # rounds both accepted and rejected


def test_stop_string_and_length_cut_exactly_like_plain_decoding(tiny_lm):
    full = list(generate(tiny_lm, greedy_request(0, n=24)))
    stop_word = full[-1].text.split()[5]                     # a word the answer reaches mid-way
    exact = EarlyExitDraft(tiny_lm.model, tiny_lm.spec.n_layers)  # all layers: every draft is accepted
    for request in (greedy_request(0, n=24, stop=(stop_word,)), greedy_request(0, n=7)):
        plain = list(generate(tiny_lm, request))
        spec = list(speculative_generate(tiny_lm, request, exact, 5))
        assert answer_ids(spec) == answer_ids(plain)
        assert (spec[-1].text, spec[-1].finish_reason) == (plain[-1].text, plain[-1].finish_reason)
    assert spec[-1].finish_reason == "length" and spec[-1].generated_tokens == 7


# transformers' own assisted generation hands its assistant both a generation_config and max_new_tokens
# (generation/candidate_generator.py), which transformers 5.24 logs as deprecated: its call, not ours.
@pytest.mark.library_deprecation("Passing `generation_config` together with generation-related arguments")
def test_transformers_assisted_generation_agrees_token_for_token(tiny_lm, draft_lm):
    request = greedy_request(2, n=20)
    prompt = torch.tensor([encode_prompt(tiny_lm, request)])
    n = prompt.shape[1]
    hf = dict(max_new_tokens=20, do_sample=False, attention_mask=torch.ones_like(prompt))
    reference = tiny_lm.model.generate(prompt, **hf)[0, n:].tolist()
    assert answer_ids(generate(tiny_lm, request)) == reference
    for k in (2, 5):
        runs = {
            "model": tiny_lm.model.generate(prompt, assistant_model=draft_lm.model, num_assistant_tokens=k,
                                            num_assistant_tokens_schedule="constant", **hf),
            "ngram": tiny_lm.model.generate(prompt, prompt_lookup_num_tokens=k, **hf),
            "early-exit:1": tiny_lm.model.generate(prompt, assistant_early_exit=1, num_assistant_tokens=k, **hf),
        }
        for kind, out in runs.items():
            assert out[0, n:].tolist() == reference, kind
            ours = speculative_generate(tiny_lm, request, make_draft(kind, tiny_lm, draft_lm), k)
            assert answer_ids(ours) == reference, kind
    assert tiny_lm.model.config.num_hidden_layers == tiny_lm.spec.n_layers


# --- sampling: the output distribution is the target's ----------------------------------------------------

def chi_square_p(observed: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Pearson chi-square p-value; categories expected fewer than 5 times are pooled."""
    n = observed.sum()
    expected = expected_probs * n
    rare = expected < 5
    obs = torch.cat([observed[~rare], observed[rare].sum(0, keepdim=True)])
    exp = torch.cat([expected[~rare], expected[rare].sum(0, keepdim=True)])
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def test_rejection_sampling_reproduces_target_joint_distribution():
    """accept_sampled alone: proposals drawn from q, outputs (first two tokens) distributed as p1 x p2."""
    g = torch.Generator().manual_seed(0)
    v, trials = 5, 12_000
    p = torch.softmax(torch.randn(3, v, generator=g) * 1.5, -1)          # target rows for positions 1, 2, 3
    q = torch.softmax(torch.randn(2, v, generator=g) * 1.5, -1)          # draft distributions
    for deterministic in (False, True):                                  # model draft, n-gram (one-hot) draft
        counts = torch.zeros(v * v)
        for _ in range(trials):
            drafted = [int(torch.multinomial(q[i], 1, generator=g)) for i in range(2)]
            n_ok, bonus = accept_sampled(drafted, None if deterministic else q, p, g)
            emitted = drafted[:n_ok] + [bonus]
            if len(emitted) == 1:                      # rejected at once: the next round draws from p2
                emitted.append(int(torch.multinomial(p[1], 1, generator=g)))
            counts[emitted[0] * v + emitted[1]] += 1
        target = torch.outer(p[0], p[1]).flatten()
        assert chi_square_p(counts, target) > 1e-4
        draft_only = torch.outer(q[0], q[1]).flatten()                   # what accepting everything would give
        assert chi_square_p(draft_only * trials, target) < 1e-12         # so the test can tell them apart


@pytest.fixture(scope="module")
def peaked_pair(tmp_path_factory):
    """Vocabulary of 16, weights large enough that target and draft disagree (TV ~0.5 on the first token)."""
    cfg = dict(vocab_size=16, initializer_range=0.12)
    target = write_tiny_llama(tmp_path_factory.mktemp("peaked-target"), seed=3, **cfg)
    draft = write_tiny_llama(tmp_path_factory.mktemp("peaked-draft"), seed=4, **cfg)
    return (load_model(str(target), device="cpu", dtype="float32"),
            load_model(str(draft), device="cpu", dtype="float32"))


def next_token_table(lm, ids: list[int]) -> torch.Tensor:
    """Full-sequence (no cache) reference: P[t1, t2, v] = p(v | prompt, t1, t2), plus P1 and P2."""
    v = lm.spec.vocab_size
    with torch.no_grad():
        p1 = torch.softmax(lm.model(torch.tensor([ids])).logits[0, -1].double(), -1)              # (V,)
        one = torch.tensor([ids + [a] for a in range(v)])
        p2 = torch.softmax(lm.model(one).logits[:, -1].double(), -1)                             # (V, V)
        two = torch.tensor([ids + [a, b] for a in range(v) for b in range(v)])
        p3 = torch.softmax(lm.model(two).logits[:, -1].double(), -1).view(v, v, v)               # (V, V, V)
    return p1, p2, p3


def token_marginals(p1, p2, p3, eos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Distributions of the 2nd and 3rd generated token, with a last category for 'ended at EOS before'."""
    live1 = p1.clone()
    live1[eos] = 0
    m2 = live1 @ p2                                                     # (V,)
    live12 = live1[:, None] * p2
    live12[:, eos] = 0
    m3 = torch.einsum("ab,abv->v", live12, p3)
    return torch.cat([m2, (1 - m2.sum())[None]]), torch.cat([m3, (1 - m3.sum())[None]])


def test_sampled_tokens_follow_the_target_distribution(peaked_pair):
    """1,000 seeded runs (temperature 1, k=2, a disagreeing draft): the 2nd and 3rd tokens, which come out of
    draft/verify rounds, match the target's exact marginals (chi-square p > 1e-4); the draft's own would not."""
    target, draft_lm = peaked_pair
    prompt, v, runs, eos = "w1 w5 w3", target.spec.vocab_size, 1000, 2
    ids = encode_prompt(target, GenerationRequest(prompt, chat=False))
    m2, m3 = token_marginals(*next_token_table(target, ids), eos)
    counts2, counts3 = torch.zeros(v + 1, dtype=torch.float64), torch.zeros(v + 1, dtype=torch.float64)
    draft, accepted = ModelDraft(draft_lm), 0.0
    for seed in range(runs):
        request = GenerationRequest(prompt, max_new_tokens=3, temperature=1.0, seed=seed, chat=False)
        records = list(speculative_generate(target, request, draft, 2))
        out = answer_ids(records) + [None, None]
        counts2[out[1] if out[1] is not None else v] += 1
        counts3[out[2] if out[2] is not None else v] += 1
        accepted += records[-1].acceptance_rate / runs
    assert chi_square_p(counts2, m2) > 1e-4
    assert chi_square_p(counts3, m3) > 1e-4
    assert 0.2 < accepted < 0.9                                          # rejections really happened
    p1, q2 = next_token_table(target, ids)[0], next_token_table(draft_lm, ids)[1]
    q_m2, _ = token_marginals(p1, q2, q2[None].expand(v, v, v), eos)     # if every draft token were kept
    assert chi_square_p(q_m2 * runs, m2) < 1e-12


# --- caches, records, hooks -----------------------------------------------------------------------------

@pytest.mark.parametrize("kind", DRAFT_KINDS)
def test_caches_are_rolled_back_every_round(tiny_lm, draft_lm, kind):
    request = greedy_request(1, n=30)
    records = list(speculative_generate(tiny_lm, request, make_draft(kind, tiny_lm, draft_lm), 4))
    n_prompt, so_far = records[-1].prompt_tokens, 1
    assert records[0].cache.length == n_prompt
    for rec in records[1:-1]:
        so_far += len(rec.emitted)
        assert rec.cache.length == n_prompt + so_far - 1                  # every token but the newest
        assert len(rec.emitted) <= rec.accepted + 1 and 0 <= rec.accepted <= len(rec.drafted) <= 4
        if kind == "ngram":
            assert rec.draft_cache_length is None
        else:
            assert rec.draft_cache_length <= rec.cache.length
    assert so_far == records[-1].generated_tokens


def test_a_speculative_run_keeps_the_residual_plain_decoding_keeps(tiny_lm, draft_lm):
    """Each verify pass writes its k+1 positions' hidden states; the rejected drafts' are dropped after it and written
    over by the next pass: the run keeps the residual of plain greedy decoding of the same request, and the rows
    derived for each round (one per token it emitted) start at the cache length."""
    from engine.core.generate import generate_kept
    from engine.core.kept import kept_for
    from engine.core.views import derive_captures

    policy, request = CapturePolicy(layers=(1,), stats=False), greedy_request(0, n=20)
    kept = kept_for(tiny_lm, policy, 64)
    records = list(speculative_generate(tiny_lm, request, ModelDraft(draft_lm), 3, policy, kept=kept))
    _, plain = generate_kept(tiny_lm, request, policy)
    assert any(r.accepted < len(r.drafted) for r in records[1:-1])   # some drafts were rejected and written over
    assert kept.layers == plain.layers and kept.length == plain.length
    for i in kept.layers:
        np.testing.assert_allclose(kept.input(i).numpy(), plain.input(i).numpy(), atol=1e-5)
    start = records[0].cache.length
    for rec in derive_captures(tiny_lm.model, kept, records, policy)[1:-1]:
        att = rec.captures[1]
        assert att.attention.shape[1] == len(rec.emitted)              # (heads, tokens emitted, T_k)
        assert att.query_start == start and att.attention.shape[2] == start + len(rec.emitted)
        start = rec.cache.length


def test_a_speculative_run_attaches_no_hook_even_when_cancelled(tiny_lm, draft_lm):
    policy = CapturePolicy(layers=(0, 2), logit_lens=3)
    stream = speculative_generate(tiny_lm, greedy_request(0), ModelDraft(draft_lm), 3, policy)
    next(stream), next(stream)
    assert count_hooks(tiny_lm.model) == 0
    stream.close()
    list(speculative_generate(tiny_lm, greedy_request(0), draft_from_spec("early-exit:2", tiny_lm), 3, policy))
    assert count_hooks(tiny_lm.model) == 0 and count_hooks(draft_lm.model) == 0


def test_summary_counts_and_a_perfect_draft(tiny_lm):
    k = 4
    exact = EarlyExitDraft(tiny_lm.model, tiny_lm.spec.n_layers)
    records = list(speculative_generate(tiny_lm, greedy_request(3, n=21), exact, k))
    done, rounds = records[-1], records[1:-1]
    assert isinstance(done, SpecDoneRecord) and done.rounds == len(rounds) and done.target_passes == len(rounds) + 1
    assert done.acceptance_rate == 1.0 and done.acceptance_by_position == [1.0] * k
    assert done.tokens_per_pass == sum(len(r.emitted) for r in rounds) / len(rounds)
    if done.finish_reason == "length":                                  # 20 tokens after prefill = 4 rounds of 5
        assert [len(r.emitted) for r in rounds] == [k + 1] * 4
    assert all(t.accepted and t.draft_prob > 0 for r in rounds for t in r.drafted)
    assert done.draft_seconds == pytest.approx(sum(r.draft_seconds for r in rounds))
    line = json.loads(json.dumps(record_to_json(rounds[0])))
    assert line["n_drafted"] == k and line["n_accepted"] == k and "logits" not in line["bonus"]


def test_expected_tokens_per_pass_formula():
    assert expected_tokens_per_pass(0.0, 4) == 1.0
    assert expected_tokens_per_pass(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens_per_pass(1.0, 4) == 5.0


def test_expected_speedup_and_the_best_k_by_hand():
    """a = 0.5, a draft token at c = 0.1 of a step, no verify cost: k = 1 gives 1.5 / 1.1, k = 2 gives 1.75 / 1.2,
    k = 3 gives 1.875 / 1.3, k = 4 gives 1.9375 / 1.4; the best is k = 2. A check cost u = 0.1 per drafted token
    doubles the draft's share: k = 2 gives 1.75 / 1.4."""
    curve = speedup_curve(0.5, 0.1, range(1, 5))
    assert curve == pytest.approx([1.5 / 1.1, 1.75 / 1.2, 1.875 / 1.3, 1.9375 / 1.4])
    assert best_k(0.5, 0.1, range(1, 5)) == (2, pytest.approx(1.75 / 1.2))
    assert expected_speedup(0.5, 2, 0.1, 0.1) == pytest.approx(1.75 / 1.4)
    assert expected_speedup(1.0, 4, 0.0) == 5.0                       # free drafts, all accepted: k + 1 per pass


# --- the drafts themselves ------------------------------------------------------------------------------

def test_ngram_lookup_prefers_longest_and_latest_match():
    assert ngram_lookup([5, 6, 7, 8, 1, 5, 6, 7, 9, 2, 6, 7], 3) == [9, 2, 6]      # 2-gram (6, 7): latest hit
    assert ngram_lookup([1, 2, 3, 9, 2, 3, 4, 1, 2, 3], 2) == [9, 2]               # 3-gram (1, 2, 3) wins
    assert ngram_lookup([1, 2, 3], 4) == [] and ngram_lookup([4, 4], 3) == [4]
    assert ngram_lookup([1, 2, 1], 5, max_ngram=1) == [2, 1]


def test_early_exit_matches_the_models_own_hidden_states(tiny_lm):
    ids = encode_prompt(tiny_lm, greedy_request(0))
    model = tiny_lm.model
    with torch.no_grad():
        hidden = model(torch.tensor([ids]), output_hidden_states=True).hidden_states  # layers + 1 x [1, T, d]
        for n in range(1, tiny_lm.spec.n_layers + 1):
            cache = DynamicCache(config=model.config)
            early_exit_logits(model, n, ids[:-3], cache)                             # cached prefix, then 3 more
            logits = early_exit_logits(model, n, ids[-3:], cache)
            if n < tiny_lm.spec.n_layers:
                reference = model.lm_head(model.model.norm(hidden[n][0, -1]))         # leaving layer n-1
            else:
                reference = model(torch.tensor([ids])).logits[0, -1]
            torch.testing.assert_close(logits, reference, atol=1e-4, rtol=1e-4)
            assert cache.get_seq_length() == len(ids)


def test_draft_specs_parse_and_refuse(tiny_lm, tiny_model_dir):
    assert draft_from_spec("ngram", tiny_lm) == NgramDraft(3)
    assert draft_from_spec("ngram:2", tiny_lm).max_ngram == 2
    assert draft_from_spec("early-exit:2", tiny_lm).layers == 2
    assert isinstance(draft_from_spec(str(tiny_model_dir), tiny_lm), ModelDraft)
    for bad in ("early-exit:0", "early-exit:4", "early-exit:x", "early-exit"):
        with pytest.raises(InvalidRequestError):
            draft_from_spec(bad, tiny_lm)
    with pytest.raises(InvalidRequestError):
        list(speculative_generate(tiny_lm, greedy_request(0), NgramDraft(), k=0))


def test_a_draft_with_another_vocabulary_is_refused(tiny_lm, tmp_path):
    smaller = write_tiny_llama(tmp_path / "smaller", vocab_size=80)
    with pytest.raises(DraftMismatchError, match="vocabulary"):
        draft_from_spec(str(smaller), tiny_lm)
    renamed = write_tiny_llama(tmp_path / "renamed")
    vocab = json.loads((renamed / "tokenizer.json").read_text())
    words = vocab["model"]["vocab"]
    vocab["model"]["vocab"] = {(f"x{w}" if w.startswith("w") else w): i for w, i in words.items()}
    (renamed / "tokenizer.json").write_text(json.dumps(vocab))
    with pytest.raises(DraftMismatchError, match="tokenizer"):
        draft_from_spec(str(renamed), tiny_lm)
    with pytest.raises(DraftMismatchError):
        list(speculative_generate(tiny_lm, greedy_request(0), ModelDraft(load_model(str(smaller), device="cpu")), 2))
