"""A token's description from one top-k of the logits, on the calling thread alone (issue 54, "nothing else in the
way": engine/core/generate.py token_facts, rest_logsumexp, greedy_ids; engine/core/openmp.py one_thread), checked
against the definitions it replaced, computed here in float64."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.lone_host import before_pick_tokens  # noqa: E402
from engine.core.generate import (KEEP_LOGITS, GenerationRequest, TextStream, greedy_ids, pick_tokens,  # noqa: E402
                                  rest_logsumexp, token_facts)
from engine.core.openmp import one_thread  # noqa: E402
from engine.core.sampling import logits_to_probs  # noqa: E402

FILTERS = [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 40, 1.0), (0.8, 0, 0.5), (1.3, 20, 0.9)]


def logits_of(rows: int, vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 4


@pytest.mark.parametrize("vocab", [300, 5_000, 49_152])
@pytest.mark.parametrize("temperature,top_k,top_p", FILTERS)
def test_the_facts_are_what_their_definitions_give(vocab, temperature, top_k, top_p):
    logits = logits_of(3, vocab, seed=vocab)
    probs = logits_to_probs(logits, temperature, top_k, top_p)
    chosen = torch.tensor([0, 7, int(logits[2].argmax())])
    facts = token_facts(logits, probs, chosen)
    kept = torch.topk(logits, KEEP_LOGITS, dim=-1)
    assert torch.equal(facts["kept_ids"], kept.indices) and torch.equal(facts["kept_values"], kept.values)
    order = torch.sort(probs, dim=-1, descending=True, stable=True)
    for b in range(3):
        live = int((probs[b] > 0).sum().clamp(max=10))        # past the live ones, any token of probability 0 will do
        assert facts["top_ids"][b, :live].tolist() == order.indices[b, :live].tolist()
        assert (probs[b, facts["top_ids"][b, live:]] == 0).all()
    assert torch.equal(facts["top_probs"], probs.gather(-1, facts["top_ids"]))
    assert torch.equal(facts["chosen_probs"], probs[torch.arange(3), chosen])
    rest = [torch.logsumexp(torch.from_numpy(np.delete(logits[b].double().numpy(), kept.indices[b].numpy())), 0)
            for b in range(3)]
    np.testing.assert_allclose(facts["rest"].double(), torch.stack(rest), rtol=2e-7)   # float32 rounding of a sum


def test_the_rest_is_the_logsumexp_of_every_logit_not_kept_whatever_their_spread():
    logits = torch.cat([torch.full((1, 10), 80.0), torch.linspace(-60, 0, 1_000)[None]], dim=1)
    kept = torch.topk(logits, 10, dim=-1)
    got = rest_logsumexp(logits, kept.indices, logits[:, 10:].amax(-1, keepdim=True))
    assert float(got) == pytest.approx(float(torch.logsumexp(logits[0, 10:].double(), 0)), rel=1e-6)
    assert torch.isfinite(got).all()                     # the kept ones, 80 above, would overflow an unshifted sum


def test_a_vocabulary_no_larger_than_the_kept_logits_has_no_rest():
    logits = logits_of(2, KEEP_LOGITS)
    facts = token_facts(logits, logits_to_probs(logits), torch.tensor([1, 2]))
    assert "rest" not in facts and facts["kept_ids"].shape == (2, KEEP_LOGITS)


def test_greedy_ids_are_torchs_argmax_the_first_of_equal_largest():
    logits = logits_of(4, 1_000)
    logits[1, [5, 9, 700]] = 50.0
    assert greedy_ids(logits) == torch.argmax(logits, dim=-1).tolist() and greedy_ids(logits)[1] == 5
    assert greedy_ids(logits.double()) == greedy_ids(logits.bfloat16()) == greedy_ids(logits)


@pytest.mark.parametrize("kind", [{}, {"temperature": 1.0}, {"temperature": 0.7, "top_k": 40, "top_p": 0.9}])
def test_picking_gives_the_tokens_and_numbers_it_gave_before_within_float32_rounding(tiny_lm, kind):
    logits = logits_of(3, 49_152, seed=5)
    requests = [GenerationRequest("x", seed=s, **kind) for s in range(3)]

    def picked(pick):
        return pick(tiny_lm, logits, requests, [torch.Generator().manual_seed(s) for s in range(3)],
                    [TextStream(tiny_lm.tokenizer) for _ in requests])
    for a, b in zip(picked(before_pick_tokens), picked(pick_tokens)):
        assert (a.id, a.text, a.logit, a.rest_count) == (b.id, b.text, b.logit, b.rest_count)
        assert np.array_equal(a.logit_ids, b.logit_ids) and np.array_equal(a.logits, b.logits)
        live = [c for c in a.top if c.prob > 0]
        assert [(c.id, c.text) for c in live] == [(c.id, c.text) for c in b.top[:len(live)]]
        # a greedy row with no filter is described by glue.c (engine/core/generate.py `quick_facts`): its softmax's
        # sum in double, within 1e-6 of float64's where torch's float32 sum over 49,152 logits is ~1e-5 off
        quick = not kind
        np.testing.assert_allclose([a.prob, *(c.prob for c in a.top)], [b.prob, *(c.prob for c in b.top)],
                                   rtol=2e-5 if quick else 1e-6, atol=1e-12)
        assert b.rest_logsumexp == pytest.approx(a.rest_logsumexp, rel=1e-6)
    if not kind:
        exact = torch.softmax(logits.double(), -1)
        for row, b in enumerate(picked(pick_tokens)):
            np.testing.assert_allclose([c.prob for c in b.top], exact[row, [c.id for c in b.top]].numpy(), rtol=1e-6)


def test_one_thread_puts_the_count_back_even_when_the_block_raises():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with one_thread(torch.device("cpu")):
            assert torch.get_num_threads() == 1
        with pytest.raises(RuntimeError), one_thread(torch.device("cpu")):
            raise RuntimeError("inside")
        assert torch.get_num_threads() == 2
        with one_thread(torch.device("meta")):                # not a CPU: nothing changes
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_picking_leaves_the_step_loops_thread_count_as_it_found_it(tiny_lm):
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        pick_tokens(tiny_lm, logits_of(1, 600), [GenerationRequest("x")], [torch.Generator()],
                    [TextStream(tiny_lm.tokenizer)])
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_the_bench_s_two_ways_of_a_lone_row_s_inputs_give_the_same_answers_and_the_same_picks(tiny_lm):
    """bench/lone_host.py's `inputs_in_steps`: the lone row's inputs and the pick's outputs as at 5fd0cd7 (made each
    step) and as now (made once) take a request's steps in turn; its answer is the same whichever way leads, and the
    old pick's arrays equal the new one's on the same logits. The way put back after it: the runner's row fills its
    own tensors again."""
    from bench.lone_host import INPUT_WAYS, inputs_steps, made_each_step_pick
    from engine.core.kernels.glue import GlueKernel, glue_kernel
    from engine.serving.batch import BatchRunner
    runner = BatchRunner(tiny_lm, max_batch=4, prefix=None)
    got = inputs_steps(runner, tiny_lm, tokens=12, rounds=2)
    assert got["same_text"] and all(got[w]["steps"] > 0 for w in INPUT_WAYS)
    assert "of" not in runner.lean.row.__dict__ and GlueKernel.pick is not made_each_step_pick
    logits = logits_of(3, 5_000)
    for old, new in zip(made_each_step_pick(glue_kernel(), logits, 257), glue_kernel().pick(logits, 257)):
        np.testing.assert_array_equal(old, new)
