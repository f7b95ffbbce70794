"""The paged batch cache (engine/serving/paged.py): blocks handed out and given back, and the K/V in them equal to the
same prompt's cache computed alone."""
from __future__ import annotations

import torch
from transformers import DynamicCache

from conftest import tiny_prompt
from engine.serving import paged
from engine.serving.batch import BatchRunner
from engine.core.generate import GenerationRequest, encode_prompt, generate
from engine.core.hooks import CAPTURE_OFF
from test_batch import Sink

BLOCK = paged.BLOCK


def prompt_of(lm, n_words: int) -> GenerationRequest:
    return GenerationRequest(" ".join(["hello world"] * n_words), max_new_tokens=6, chat=False)


def own_cache(lm, ids: list[int]) -> DynamicCache:
    """The prompt's K/V computed alone by HF: the reference the pool must hold."""
    cache = DynamicCache(config=lm.model.config)
    with torch.inference_mode():
        lm.model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True)
    return cache


def runner_with(lm, requests):
    runner = BatchRunner(lm, max_batch=8)
    sinks = [Sink() for _ in requests]
    for sink, request in zip(sinks, requests):
        runner.add(sink.slot(lm, request))
    return runner, sinks


def test_each_request_gets_its_own_blocks_and_the_tail_is_counted(tiny_lm):
    requests = [prompt_of(tiny_lm, n) for n in (2, 9, 17)]
    runner, _ = runner_with(tiny_lm, requests)
    info = runner.step()                       # prefill all three together, then one decode step
    table = info.blocks
    lengths = [len(encode_prompt(tiny_lm, r)) + 1 for r in requests]     # the prompt and one decoded token
    assert [n for _, _, n in table.rows] == lengths
    assert [len(blocks) for _, blocks, _ in table.rows] == [-(-n // BLOCK) for n in lengths]
    held = [b for _, blocks, _ in table.rows for b in blocks]
    assert len(held) == len(set(held)) and paged.NULL not in held           # no block shared, the null block kept
    assert table.used == len(held) and table.free == table.n_blocks - len(held)
    assert table.empty_slots == sum(-(-n // BLOCK) * BLOCK - n for n in lengths)
    assert table.fragmentation == table.empty_slots / (len(held) * BLOCK)
    assert info.cache_positions == len(held) * BLOCK and info.real_positions == sum(lengths)


def test_the_pool_holds_what_the_model_computes_alone(tiny_lm):
    requests = [prompt_of(tiny_lm, n) for n in (3, 12)]
    runner, _ = runner_with(tiny_lm, requests)
    runner.step()
    for b, request in enumerate(requests):
        ids = encode_prompt(tiny_lm, request)
        slot = runner.batch.slots[b]
        row = runner.batch.row_cache(b, tiny_lm.model.config)
        reference = own_cache(tiny_lm, ids + [slot.generated[0]])          # the prompt and the token decoded
        for mine, theirs in zip(row.layers, reference.layers):
            torch.testing.assert_close(mine.keys, theirs.keys, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(mine.values, theirs.values, atol=1e-5, rtol=1e-4)


def test_a_request_leaving_gives_its_blocks_back_and_a_newcomer_takes_them(tiny_lm):
    short = GenerationRequest(tiny_prompt(), max_new_tokens=2, chat=False)
    long = prompt_of(tiny_lm, 20)
    runner, sinks = runner_with(tiny_lm, [short, long])
    runner.step()                                  # the short one leaves after one decode step
    table = runner.batch.table()
    assert [label for label, _, _ in table.rows] == [None]                 # only the long one is left
    kept = table.rows[0][1]
    newcomer = Sink()
    runner.add(newcomer.slot(tiny_lm, prompt_of(tiny_lm, 2)))
    runner.step()
    after = runner.batch.table()
    assert after.rows[0][1][:len(kept)] == kept                            # the long one's blocks did not move
    assert min(after.rows[1][1]) < max(kept)                               # the newcomer reuses a freed low block


def test_outputs_match_alone_when_the_pool_must_grow(tiny_lm, monkeypatch):
    monkeypatch.setattr(paged, "FIRST_BLOCKS", 2)                          # one usable block: it doubles at once
    requests = [GenerationRequest(tiny_prompt(), max_new_tokens=20, chat=False, seed=s, temperature=0.0)
                for s in range(3)] + [prompt_of(tiny_lm, 15)]
    runner, sinks = runner_with(tiny_lm, requests)
    grown = 0
    while not runner.idle:
        info = runner.step()
        if info.blocks is not None:
            grown = max(grown, info.blocks.n_blocks)
    assert grown > 1
    for sink, request in zip(sinks, requests):
        single = list(generate(tiny_lm, request, CAPTURE_OFF))
        assert sink.records[-1].text == single[-1].text
    assert runner.batch.pool is None                                       # idle: the memory is given back


def test_a_pool_grown_inside_a_step_still_takes_a_reused_prefix_written_outside_it():
    """A decode step grows the pool inside `torch.inference_mode()`; a prefix reused at a request's admission is
    written into it outside (engine/serving/batch.py `_reuse_prefix`). The pool's tensors stay normal tensors, or
    that write raises and every request of the room fails (seen now and then in bench/load.py's second room)."""
    pool = paged.BlockPool(2, 1, 4, torch.float32, torch.device("cpu"), n_blocks=2)
    with torch.inference_mode():
        taken = [pool.allocate(), pool.allocate()]            # one free block (0 is the null block): it grows
        pool.ensure_residual(8, torch.float32)
    assert pool.n_blocks == 4 and len(set(taken)) == 2
    assert not any(t.is_inference() for t in (*pool.keys, *pool.values, pool.resid))
    pool.keys[0][taken[1] * pool.block] = 1.0                # outside: an inference tensor would refuse this
    pool.resid[0, taken[1] * pool.block] = 1.0
    assert pool.keys[0][taken[1] * pool.block].eq(1.0).all()


def test_a_graph_s_index_buffer_holds_the_slots_plan_gives_and_its_mask(tiny_lm):
    """`plan_into` (the graphed step's inputs, filled in place) against `plan` at the same fixed shape: every row's
    token, position, K/V slot, residual slot (SCRATCH where it keeps none) and the slots it reads; padding rows read
    NULL and write SCRATCH; the mask the graph computes from the slots equals plan's; a row at a block's end gets
    its new block."""
    from types import SimpleNamespace

    from engine.core.lean import causal_mask

    class Row(SimpleNamespace):
        __hash__ = object.__hash__                            # a slot is a key of the batch's tables

    spec = tiny_lm.spec
    batch = paged.PagedBatch(pool=paged.BlockPool(spec.n_layers, spec.n_kv_heads, spec.head_dim, torch.float32,
                                                  torch.device("cpu")))
    slots = [Row(length=n, token=SimpleNamespace(id=7 + n), kept=kept) for n, kept in ((5, None), (16, 1), (40, None))]
    for slot in slots:
        batch.tables[slot] = [batch.pool.allocate() for _ in range(-(-slot.length // BLOCK))]
        batch.join(slot)
    rows, width = 5, 64
    index = torch.full((rows, paged.GATHER + width), -1, dtype=torch.long)
    batch.plan_into(index.numpy())
    assert len(batch.tables[slots[1]]) == 2                   # 16 positions held, the 17th needs a second block
    valid = batch.plan([1] * 3, rows, width)                  # the same tables: nothing more to allocate
    assert torch.equal(index[:, paged.GATHER:], batch.reads)
    assert torch.equal(index[:, paged.WRITE:paged.WRITE + 1], batch.writes)
    assert torch.equal(index[:, paged.RESID], batch.residual_slots)
    assert index[:3, paged.IDS].tolist() == [12, 23, 47] and index[3:, paged.IDS].tolist() == [12, 12]
    assert index[:3, paged.POS].tolist() == [5, 16, 40] and not index[3:, paged.POS].any()
    assert index[[0, 2], paged.RESID].tolist() == [paged.SCRATCH] * 2 and index[1, paged.RESID] != paged.SCRATCH
    assert torch.equal(causal_mask(index[:, paged.GATHER:] != paged.NULL, 1), causal_mask(valid, 1))
