"""Real batched generation: each row equals unbatched greedy decoding; shapes and timings are sane."""
from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from conftest import tiny_prompt
from engine.lab.batching import BatchRun, batch_prompts, generate_batch, left_pad, measure_batching
from engine.errors import ContextLengthError, InvalidRequestError
from engine.core.generate import GenerationRequest, encode_prompt, forward, generate


def unbatched_greedy(lm, ids, n):
    """Plain greedy decoding of one prompt through the engine's single-sequence forward."""
    tokens, cache = [], DynamicCache(config=lm.model.config)
    with torch.inference_mode():
        logits = forward(lm, ids, cache)
        for _ in range(n):
            tokens.append(int(logits.argmax()))
            logits = forward(lm, [tokens[-1]], cache)
    return tokens


def test_left_pad_puts_pads_first_and_masks_them():
    ids, mask = left_pad([[5, 6, 7], [9]], pad=0, device=torch.device("cpu"))
    assert ids.tolist() == [[5, 6, 7], [0, 0, 9]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_each_batched_row_equals_unbatched_greedy(tiny_lm):
    rows = [tiny_lm.tokenizer(tiny_prompt(n, seed=n))["input_ids"] for n in (5, 11, 8, 3)]
    run = generate_batch(tiny_lm, rows, max_new_tokens=10)
    assert len(run.tokens) == 4 and all(len(t) == 10 for t in run.tokens)
    for row, got in zip(rows, run.tokens):
        assert list(got) == unbatched_greedy(tiny_lm, row, 10)


def test_rows_match_the_engines_own_generation(tiny_lm):
    prompts = [tiny_prompt(7, seed=1), tiny_prompt(12, seed=2)]
    requests = [GenerationRequest(p, max_new_tokens=8, chat=False) for p in prompts]
    rows = [encode_prompt(tiny_lm, r) for r in requests]
    run = generate_batch(tiny_lm, rows, max_new_tokens=8)
    for request, got in zip(requests, run.tokens):
        records = list(generate(tiny_lm, request))
        engine_ids = [records[0].token.id] + [r.token.id for r in records[1:-1]]
        assert list(got[: len(engine_ids)]) == engine_ids   # the engine stops at end-of-text, the batch does not


def test_timings_and_rates_add_up(tiny_lm):
    run = generate_batch(tiny_lm, batch_prompts(tiny_lm, 4, 16), max_new_tokens=6)
    assert isinstance(run, BatchRun) and run.batch == 4 and len(run.step_seconds) == 5
    assert run.prefill_seconds > 0 and all(s > 0 for s in run.step_seconds)
    assert run.total_tok_s == pytest.approx(4 * run.per_user_tok_s)
    assert run.per_user_tok_s == pytest.approx(5 / sum(run.step_seconds))


def test_batch_prompts_differ_and_vary_in_length(tiny_lm):
    rows = batch_prompts(tiny_lm, 4, 20)
    assert len(rows) == 4 and len({len(r) for r in rows}) > 1 and all(17 <= len(r) <= 20 for r in rows)


def test_measure_batching_gives_one_point_per_size(tiny_lm):
    points = measure_batching(tiny_lm, (1, 2, 4), prompt_tokens=12, new_tokens=4)
    assert [p.batch for p in points] == [1, 2, 4]
    for p in points:
        assert p.total_tok_s == pytest.approx(p.batch * p.per_user_tok_s)
        assert p.step_ms > 0 and p.prefill_ms > 0


def test_bad_batches_are_refused(tiny_lm):
    with pytest.raises(InvalidRequestError):
        generate_batch(tiny_lm, [], 4)
    with pytest.raises(InvalidRequestError):
        generate_batch(tiny_lm, [[1, 2], []], 4)
    with pytest.raises(ContextLengthError):
        generate_batch(tiny_lm, [[5] * 250], 10)   # the tiny model reads 256 positions


def test_rounds_interleave_and_keep_every_step(tiny_lm):
    calls = []
    points = measure_batching(tiny_lm, (1, 2), prompt_tokens=8, new_tokens=3, rounds=2,
                              progress=lambda f, m: calls.append(m))
    assert calls == ["batch of 1, round 1", "batch of 2, round 1", "batch of 1, round 2", "batch of 2, round 2"]
    assert [p.batch for p in points] == [1, 2]
