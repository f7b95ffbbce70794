"""Continuous batching (engine/serving/batch.py): every request batched equals the same request run alone, the
residual stream it keeps included (and so every view derived from it)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import assert_same_residual, tiny_prompt
from engine.serving.batch import BatchRunner, Slot, mixed_share
from engine.core.generate import GenerationRequest, encode_prompt, generate_kept
from engine.core.hooks import CAPTURE_OFF, CapturePolicy, count_hooks
from engine.core.kept import kept_for
from engine.core.lean import one_forward
from engine.core.records import DecodeRecord, DoneRecord, PrefillRecord
from engine.core.views import derive_captures

FULL = CapturePolicy(logit_lens=3)
SUBSET = CapturePolicy(layers=(0, 2), inputs=(1,), stats=False)


class Sink:
    """Collects one request's records, the residual it keeps, and its failure."""

    def __init__(self):
        self.records, self.error, self.kept = [], None, None

    def slot(self, lm, request, policy=CAPTURE_OFF, stop=lambda: False) -> Slot:
        ids = encode_prompt(lm, request)
        self.kept = kept_for(lm, policy, len(ids) + request.max_new_tokens)
        return Slot(request, ids, policy, self.records.append, self._fail, stop, kept=self.kept)

    def _fail(self, err):
        self.error = err

    @property
    def done(self):
        return bool(self.records) and isinstance(self.records[-1], DoneRecord) or self.error is not None


def run_staggered(lm, jobs, max_batch=8, prefill_chunk=256, joins=None):
    """Run (request, policy) jobs through one runner; job i joins at step joins[i] (default: all at once)."""
    runner = BatchRunner(lm, max_batch=max_batch, prefill_chunk=prefill_chunk)
    sinks = [Sink() for _ in jobs]
    joins = joins or [0] * len(jobs)
    step = 0
    while step < 10_000:
        for i, (request, policy) in enumerate(jobs):
            if joins[i] == step:
                runner.add(sinks[i].slot(lm, request, policy))
        if runner.idle and step > max(joins):
            break
        runner.step()
        step += 1
    return sinks


class Alone(list):
    """A request's records run alone, and the residual it kept (`kept`)."""

    kept = None


def alone(lm, request, policy=CAPTURE_OFF) -> Alone:
    records, kept = generate_kept(lm, request, policy)
    run = Alone(records)
    run.kept = kept
    return run


def assert_same_views(lm, batched, single, policy):
    """The captures derived from each run's residual are the same (attention, norms, lens)."""
    mine = derive_captures(lm.model, batched.kept, batched.records, policy)
    theirs = derive_captures(lm.model, single.kept, list(single), policy)
    assert any(r.captures for r in theirs) == policy.views
    for a, b in zip(mine, theirs):
        assert_same_captures(getattr(a, "captures", {}), getattr(b, "captures", {}))


def assert_same_captures(batched, single, atol=1e-5):
    assert batched.keys() == single.keys()
    for i in single:
        a, b = batched[i], single[i]
        assert (a.heads, a.kv_heads, a.query_start, a.key_start) == (b.heads, b.kv_heads, b.query_start, b.key_start)
        for name in ("attention", "q_norm", "k_norm", "v_norm"):
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None) == (y is None)
            if x is not None:
                assert x.shape == y.shape
                np.testing.assert_allclose(x, y, atol=atol, rtol=1e-4)
        assert (a.resid_norm is None) == (b.resid_norm is None)
        if a.resid_norm is not None:
            assert a.resid_norm == pytest.approx(b.resid_norm, rel=1e-4)
        if b.lens is not None:
            assert [t for t, _ in a.lens] == [t for t, _ in b.lens]
            np.testing.assert_allclose([p for _, p in a.lens], [p for _, p in b.lens], atol=1e-5)


def assert_same_run(batched, single):
    """`batched`: a Sink (or its records), `single`: alone(...): the same records, and the same residual kept."""
    if isinstance(batched, Sink):
        assert_same_residual(batched.kept, single.kept)
        batched = batched.records
    assert [type(r) for r in batched] == [type(r) for r in single]
    for a, b in zip(batched, single):
        if isinstance(b, DoneRecord):
            assert (a.text, a.finish_reason, a.prompt_tokens, a.generated_tokens) == \
                   (b.text, b.finish_reason, b.prompt_tokens, b.generated_tokens)
            continue
        assert a.token.id == b.token.id and a.token.text == b.token.text
        assert a.token.prob == pytest.approx(b.token.prob, abs=1e-5)
        assert (a.cache.length, a.cache.bytes, a.cache.bytes_per_layer) == \
               (b.cache.length, b.cache.bytes, b.cache.bytes_per_layer)
        assert_same_captures(a.captures, b.captures)
        if isinstance(b, PrefillRecord):
            assert [p.id for p in a.prompt] == [p.id for p in b.prompt] and a.shapes == b.shapes


def test_requests_joining_and_leaving_mid_flight_equal_each_alone(tiny_lm):
    jobs = [(GenerationRequest(tiny_prompt(n, seed=n), max_new_tokens=m, chat=False), FULL)
            for n, m in ((5, 12), (17, 4), (9, 9), (30, 7), (3, 15))]
    sinks = run_staggered(tiny_lm, jobs, joins=[0, 0, 2, 5, 6])
    for sink, (request, policy) in zip(sinks, jobs):
        assert sink.error is None
        single = alone(tiny_lm, request, policy)
        assert_same_run(sink, single)
        assert_same_views(tiny_lm, sink, single, policy)
        assert not sink.kept.in_pool                          # its rows left the pool with its blocks
    assert count_hooks(tiny_lm.model) == 0



@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_requests_joining_and_leaving_mid_flight_equal_each_alone(tiny_model_dir):
    """The paged pool, the batched captures and the prefill grouping on the GPU, in float32."""
    from engine.core.loader import load_model

    lm = load_model(str(tiny_model_dir), device="cuda", dtype="float32")
    jobs = [(GenerationRequest(tiny_prompt(n, seed=n), max_new_tokens=m, chat=False), policy)
            for (n, m), policy in zip(((5, 12), (17, 4), (9, 9), (30, 7)), (FULL, CAPTURE_OFF, SUBSET, FULL))]
    for sink, (request, policy) in zip(run_staggered(lm, jobs, joins=[0, 0, 2, 5]), jobs):
        assert sink.error is None
        assert_same_run(sink, alone(lm, request, policy))

@pytest.mark.parametrize("policies", [(FULL,) * 4, (SUBSET, CAPTURE_OFF, SUBSET, CAPTURE_OFF, SUBSET)],
                         ids=["every row keeps every layer", "some rows keep some layers"])
def test_a_decode_step_writes_each_rows_residual_where_it_is_kept(tiny_lm, policies):
    """One decode step writes every capturing row's hidden states into the pool at its own slot (rows that keep
    nothing write the scratch slot): each run's residual equals its own alone, with every row capturing and
    with some rows keeping some hidden states."""
    jobs = [(GenerationRequest(tiny_prompt(4 + 3 * i, seed=i), max_new_tokens=6, chat=False), policy)
            for i, policy in enumerate(policies)]
    for sink, (request, policy) in zip(run_staggered(tiny_lm, jobs, joins=[0] * (len(jobs) - 1) + [2]), jobs):
        assert sink.error is None
        assert_same_run(sink, alone(tiny_lm, request, policy))


def test_chunked_prefill_equals_one_pass_residual_included(tiny_lm):
    long = GenerationRequest(tiny_prompt(40, seed=4), max_new_tokens=5, chat=False)
    short = GenerationRequest(tiny_prompt(6, seed=5), max_new_tokens=12, chat=False)
    last_rows = CapturePolicy(prefill_matrix=False, logit_lens=2)
    for policy in (FULL, last_rows):
        sinks = run_staggered(tiny_lm, [(short, policy), (long, policy)], prefill_chunk=7, joins=[0, 1])
        assert_same_run(sinks[0], alone(tiny_lm, short, policy))
        assert_same_run(sinks[1], alone(tiny_lm, long, policy))


def test_chunked_prefill_does_not_freeze_the_others(tiny_lm):
    """While a 40-token prompt is prefilled 8 tokens a step, the running request gets a token every step."""
    runner = BatchRunner(tiny_lm, prefill_chunk=8)
    first, second = Sink(), Sink()
    runner.add(first.slot(tiny_lm, GenerationRequest(tiny_prompt(4), max_new_tokens=30, chat=False)))
    runner.step()
    runner.add(second.slot(tiny_lm, GenerationRequest(tiny_prompt(40, seed=2), max_new_tokens=3, chat=False)))
    infos = [runner.step() for _ in range(5)]
    assert [i.prefill_tokens for i in infos] == [8, 8, 8, 8, 8]
    assert all(i.decode_rows >= 1 for i in infos)
    assert sum(isinstance(r, DecodeRecord) for r in first.records) == 1 + 5   # the first step decoded once too


SAMPLING = [dict(temperature=0.9, top_k=20, top_p=0.95), dict(temperature=0.0), dict(temperature=1.3, top_p=0.8),
            dict(temperature=0.9, top_k=20, top_p=0.95), dict(temperature=0.7, top_k=5)]


def test_seeded_sampling_gives_the_same_text_batched_or_alone(tiny_lm):
    """Rows that filter alike share one softmax, the others have their own; each row draws with its own seed."""
    jobs = [(GenerationRequest(tiny_prompt(8, seed=s), max_new_tokens=10, seed=s, chat=False, **kw), CAPTURE_OFF)
            for s, kw in enumerate(SAMPLING)]
    sinks = run_staggered(tiny_lm, jobs, joins=[0, 1, 1, 3, 0])
    for sink, (request, policy) in zip(sinks, jobs):
        assert_same_run(sink, alone(tiny_lm, request, policy))


def test_picking_every_row_at_once_describes_each_token_as_picking_it_alone(tiny_lm):
    from engine.core.generate import TextStream, pick_token, pick_tokens

    logits = torch.randn(len(SAMPLING), 50_000, generator=torch.Generator().manual_seed(0)) * 4
    requests = [GenerationRequest("x", seed=s, **kw) for s, kw in enumerate(SAMPLING)]
    gens = lambda: [torch.Generator().manual_seed(r.seed) for r in requests]  # noqa: E731
    streams = lambda: [TextStream(tiny_lm.tokenizer) for _ in requests]  # noqa: E731
    together = pick_tokens(tiny_lm, logits, requests, gens(), streams())
    for row, r, g, stream, a in zip(logits, requests, gens(), streams(), together):
        b = pick_token(tiny_lm, row, r, g, stream)
        assert (a.id, a.text, [c.id for c in a.top], [c.text for c in a.top]) == \
               (b.id, b.text, [c.id for c in b.top], [c.text for c in b.top])
        np.testing.assert_allclose([a.prob, *(c.prob for c in a.top)], [b.prob, *(c.prob for c in b.top)], rtol=1e-6)
        assert np.array_equal(a.logit_ids, b.logit_ids) and np.array_equal(a.logits, b.logits)
        assert a.rest_logsumexp == pytest.approx(b.rest_logsumexp, rel=1e-6) and a.rest_count == b.rest_count
        assert a.logit == b.logit


def test_a_cancelled_request_leaves_and_the_others_finish(tiny_lm):
    runner = BatchRunner(tiny_lm)
    flag = {"stop": False}
    a, b = Sink(), Sink()
    req_a = GenerationRequest(tiny_prompt(6), max_new_tokens=20, chat=False)
    req_b = GenerationRequest(tiny_prompt(11, seed=3), max_new_tokens=20, chat=False)
    runner.add(a.slot(tiny_lm, req_a, stop=lambda: flag["stop"]))
    runner.add(b.slot(tiny_lm, req_b, FULL))
    for _ in range(5):
        runner.step()
    flag["stop"] = True
    while not runner.idle:
        runner.step()
    assert a.records[-1].finish_reason == "cancelled" and a.records[-1].generated_tokens < 20
    assert_same_run(b, alone(tiny_lm, req_b, FULL))
    assert runner.batch.cache is None and count_hooks(tiny_lm.model) == 0


def test_a_request_cancelled_mid_run_frees_its_residual_with_its_blocks(tiny_lm):
    """A capturing request stopped mid-run: its blocks (K, V and the residual in them) go back to the pool, the
    pool's free count returns to where it was, and its residual so far stays readable, copied out of the pool."""
    runner = BatchRunner(tiny_lm)
    flag, keep = {"stop": False}, Sink()
    runner.add(keep.slot(tiny_lm, GenerationRequest(tiny_prompt(5, seed=8), max_new_tokens=40, chat=False), FULL))
    runner.step()
    pool, free = runner.batch.pool, len(runner.batch.pool.free)
    stopped = Sink()
    request = GenerationRequest(tiny_prompt(20, seed=4), max_new_tokens=30, chat=False)
    runner.add(stopped.slot(tiny_lm, request, FULL, stop=lambda: flag["stop"]))
    for _ in range(4):
        runner.step()
    assert stopped.kept.in_pool and len(pool.free) < free and pool.resid is not None
    flag["stop"] = True
    runner.step()
    assert len(pool.free) == free and not stopped.kept.in_pool
    n = stopped.kept.length
    # its prompt went in with the other's decode row in one step (the mixed step), then three decode steps
    assert stopped.records[-1].finish_reason == "cancelled" and n == len(encode_prompt(tiny_lm, request)) + 3
    single = alone(tiny_lm, request, FULL)
    for i in single.kept.layers:
        torch.testing.assert_close(stopped.kept.input(i), single.kept.input(i)[:n], atol=1e-5, rtol=1e-4)


def test_a_request_that_fails_in_the_batch_fails_alone(tiny_lm):
    """A row whose forward raises (here: a token id past the vocabulary) fails; the others finish alone's way."""
    runner = BatchRunner(tiny_lm)
    good, bad = Sink(), Sink()
    req = GenerationRequest(tiny_prompt(7), max_new_tokens=8, chat=False)
    runner.add(good.slot(tiny_lm, req, FULL))
    runner.add(bad.slot(tiny_lm, GenerationRequest(tiny_prompt(5, seed=9), max_new_tokens=8, chat=False)))
    runner.step()
    runner.step()
    broken = runner.batch.slots[1]
    broken.token.id = 10**6                    # the embedding lookup raises for this row only
    while not runner.idle:
        runner.step()
    assert bad.error is not None and not any(isinstance(r, DoneRecord) for r in bad.records)
    assert good.error is None
    assert_same_run(good, alone(tiny_lm, req, FULL))


def test_a_finished_runs_residual_moves_out_of_the_pool_off_the_step_that_finished_it(tiny_lm):
    """A capturing run that finishes while another decodes: after the step that finished it (its DoneRecord sent)
    its residual is still in its blocks, held (not free, not counted as used) and readable, equal to alone's; once
    nothing else runs, one more step moves it out and the pool is given back."""
    runner, short, long_ = BatchRunner(tiny_lm), Sink(), Sink()
    req = GenerationRequest(tiny_prompt(9, seed=5), max_new_tokens=3, chat=False)
    runner.add(short.slot(tiny_lm, req, FULL))
    runner.add(long_.slot(tiny_lm, GenerationRequest(tiny_prompt(6, seed=6), max_new_tokens=12, chat=False)))
    while not short.records or not isinstance(short.records[-1], DoneRecord):
        runner.step()
    table = runner.batch.table()
    assert short.kept.in_pool and table.held == len(runner.batch.held[short.kept]) > 0
    assert table.used + table.free + table.held == table.n_blocks
    assert_same_run(short, alone(tiny_lm, req, FULL))           # read from the held blocks
    while runner.batch.slots:
        runner.step()
    assert short.kept.in_pool and not runner.idle
    runner.step()
    assert not short.kept.in_pool and runner.idle and runner.batch.pool is None
    assert_same_run(short, alone(tiny_lm, req, FULL))


def test_a_pool_with_no_free_block_moves_held_residuals_out_before_it_grows(tiny_lm, monkeypatch):
    """A pool of 7 blocks: a finished run's 2 blocks are held; a newcomer needing more than the free ones takes them
    back (the run's residual copied out first, still equal to alone's) instead of doubling the pool."""
    from engine.serving import paged

    monkeypatch.setattr(paged, "FIRST_BLOCKS", 8)
    runner, short, other, big = BatchRunner(tiny_lm), Sink(), Sink(), Sink()
    req = GenerationRequest(tiny_prompt(20, seed=5), max_new_tokens=3, chat=False)
    runner.add(short.slot(tiny_lm, req, FULL))
    runner.add(other.slot(tiny_lm, GenerationRequest(tiny_prompt(4, seed=6), max_new_tokens=30, chat=False)))
    while not short.records or not isinstance(short.records[-1], DoneRecord):
        runner.step()
    pool = runner.batch.pool
    assert short.kept.in_pool and len(runner.batch.held[short.kept]) == 2 and len(pool.free) == 4
    runner.add(big.slot(tiny_lm, GenerationRequest(tiny_prompt(70, seed=7), max_new_tokens=2, chat=False)))
    runner.step()
    assert not short.kept.in_pool and not runner.batch.held and runner.batch.pool.n_blocks == 8
    assert_same_run(short, alone(tiny_lm, req, FULL))
    while not runner.idle:
        runner.step()
    assert other.error is None and big.error is None


def test_a_newcomer_cancelled_while_its_prompt_is_prefilled_frees_its_blocks(tiny_lm):
    """A capturing newcomer whose long prompt is prefilled chunk by chunk straight into the pool, stopped between
    chunks: its K/V and residual blocks go back (the pool's free count returns) and the running request finishes
    as alone."""
    runner = BatchRunner(tiny_lm, prefill_chunk=8)
    flag, keep = {"stop": False}, Sink()
    req = GenerationRequest(tiny_prompt(5, seed=8), max_new_tokens=12, chat=False)
    runner.add(keep.slot(tiny_lm, req, FULL))
    runner.step()
    pool, free = runner.batch.pool, len(runner.batch.pool.free)
    stopped = Sink()
    runner.add(stopped.slot(tiny_lm, GenerationRequest(tiny_prompt(40, seed=4), max_new_tokens=5, chat=False), FULL,
                            stop=lambda: flag["stop"]))
    runner.step()
    runner.step()
    assert runner.prefilling and stopped.kept.in_pool and len(pool.free) < free and stopped.kept.length == 16
    flag["stop"] = True
    runner.step()
    assert len(pool.free) == free and not stopped.kept.in_pool and not runner.prefilling
    assert stopped.records[-1].finish_reason == "cancelled"
    while not runner.idle:
        runner.step()
    assert_same_run(keep, alone(tiny_lm, req, FULL))


def test_a_newcomer_whose_prefill_fails_fails_alone_and_frees_its_blocks(tiny_lm):
    """Three newcomers prefilled in one padded pass, the middle one's prompt holding a token id past the vocabulary:
    that pass raises, the oldest runs alone, then the faulty one alone fails; its blocks go back and the other two
    finish as alone."""
    runner = BatchRunner(tiny_lm)
    sinks = [Sink(), Sink(), Sink()]
    reqs = [GenerationRequest(tiny_prompt(n, seed=n), max_new_tokens=6, chat=False) for n in (6, 9, 7)]
    for sink, req in zip(sinks, reqs):
        runner.add(sink.slot(tiny_lm, req, FULL))
    runner.prefilling[1].ids[3] = 10**6
    while not runner.idle:
        runner.step()
    assert sinks[1].error is not None and not any(isinstance(r, DoneRecord) for r in sinks[1].records)
    for i in (0, 2):
        assert sinks[i].error is None
        assert_same_run(sinks[i], alone(tiny_lm, reqs[i], FULL))
    assert runner.batch.pool is None                # every block given back: an idle batch drops its pool


def test_a_fault_no_row_repeats_alone_fails_the_newest_request_only(tiny_lm):
    """An out-of-memory error once in a batched step: the last request in leaves with it, the others finish."""
    runner = BatchRunner(tiny_lm)
    sinks = [Sink(), Sink()]
    reqs = [GenerationRequest(tiny_prompt(6, seed=s), max_new_tokens=6, chat=False) for s in (1, 2)]
    for sink, req in zip(sinks, reqs):
        runner.add(sink.slot(tiny_lm, req))
    runner.step()
    runner.step()
    real = tiny_lm.model.forward
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise torch.OutOfMemoryError("injected: out of memory once")
        return real(*args, **kwargs)

    tiny_lm.model.forward = flaky
    try:
        while not runner.idle:
            runner.step()
    finally:
        del tiny_lm.model.forward
    assert sinks[0].error is None and isinstance(sinks[1].error, torch.OutOfMemoryError)
    assert_same_run(sinks[0], alone(tiny_lm, reqs[0]))


def test_the_gathered_view_is_as_wide_as_the_longest_row_left(tiny_lm):
    runner = BatchRunner(tiny_lm)
    long, short = Sink(), Sink()
    runner.add(long.slot(tiny_lm, GenerationRequest(tiny_prompt(30), max_new_tokens=4, chat=False)))
    runner.add(short.slot(tiny_lm, GenerationRequest(tiny_prompt(4, seed=1), max_new_tokens=12, chat=False)))
    runner.step()
    runner.step()
    assert runner.batch.width >= 30
    while long.records[-1:] and not isinstance(long.records[-1], DoneRecord):
        runner.step()
    runner.step()
    assert runner.batch.pads() == [0] and runner.batch.width == runner.batch.slots[0].length


@pytest.mark.slow
def test_smollm2_batched_equals_alone_token_for_token(smol_lm):
    prompts = ["What is the capital of France?", "Write a haiku about autumn.",
               "List three prime numbers.", "Explain gravity in one sentence to a child, please."]
    policy = CapturePolicy(layers=(0, 15, 29), logit_lens=3)
    jobs = [(GenerationRequest(p, max_new_tokens=n), policy) for p, n in zip(prompts, (12, 6, 9, 14))]
    sinks = run_staggered(smol_lm, jobs, joins=[0, 0, 3, 4])
    for sink, (request, pol) in zip(sinks, jobs):
        assert sink.error is None
        assert_same_run(sink, alone(smol_lm, request, pol))


# --- prefix caching ---------------------------------------------------------------------------------------

def run_in_turn(lm, jobs, prefix):
    """Each job runs to its end before the next joins: the later ones can reuse the earlier prompts' K/V."""
    sinks = []
    for request, policy in jobs:
        runner = BatchRunner(lm, prefix=prefix, prefill_chunk=7)
        sink = Sink()
        runner.add(sink.slot(lm, request, policy))
        while not runner.idle:
            runner.step()
        sinks.append(sink)
    return sinks


def test_a_repeated_prompt_reuses_all_but_its_last_token_and_equals_alone(tiny_lm):
    from engine.serving.prefix import PrefixCache

    prefix = PrefixCache(64 * 2**20)
    request = GenerationRequest(tiny_prompt(24, seed=7), max_new_tokens=6, chat=False)
    first, second = run_in_turn(tiny_lm, [(request, FULL), (request, FULL)], prefix)
    n = len(first.records[0].prompt)
    assert first.records[0].reused_tokens == 0 and second.records[0].reused_tokens == n - 1
    want = alone(tiny_lm, request, FULL)
    assert_same_run(first, want)
    assert_same_run(second, want)                      # the residual too: the reused part's comes from the entry
    assert prefix.stats.hits == 1 and prefix.stats.reused_tokens == n - 1


def test_a_shared_start_is_reused_and_the_tail_is_computed(tiny_lm):
    from engine.serving.prefix import PrefixCache

    prefix = PrefixCache(64 * 2**20)
    shared = tiny_prompt(20, seed=3)
    a = GenerationRequest(shared + " w1 w2 w3", max_new_tokens=5, chat=False)
    b = GenerationRequest(shared + " w9 w8 w7 w6 w5", max_new_tokens=5, chat=False)
    last_rows = CapturePolicy(prefill_matrix=False, logit_lens=2)
    for policy in (FULL, last_rows):
        prefix.clear()
        _, second = run_in_turn(tiny_lm, [(a, policy), (b, policy)], prefix)
        assert second.records[0].reused_tokens == 20          # the 20 shared words
        assert_same_run(second, alone(tiny_lm, b, policy))


def test_newcomers_that_reuse_a_prefix_all_start_in_one_step_and_equal_alone(tiny_lm):
    """A room pressing Generate together with the same opening (the chat template's): each newcomer reuses the
    stored prefix and computes its own tail on its own cache, all in the step they joined, within its budget."""
    from engine.serving.prefix import PrefixCache

    prefix = PrefixCache(64 * 2**20)
    shared = tiny_prompt(20, seed=3)
    run_in_turn(tiny_lm, [(GenerationRequest(shared + " w0", max_new_tokens=2, chat=False), FULL)], prefix)
    jobs = [GenerationRequest(shared + tail, max_new_tokens=4, chat=False) for tail in (" w1 w2", " w3", " w4 w5 w6")]
    runner = BatchRunner(tiny_lm, prefix=prefix, prefill_chunk=8)
    sinks = [Sink() for _ in jobs]
    for sink, request in zip(sinks, jobs):
        runner.add(sink.slot(tiny_lm, request, FULL))
    info = runner.step()
    assert all(isinstance(s.records[0], PrefillRecord) and s.records[0].reused_tokens == 20 for s in sinks)
    assert info.prefill_tokens <= 8
    while not runner.idle:
        runner.step()
    for sink, request in zip(sinks, jobs):
        assert_same_run(sink, alone(tiny_lm, request, FULL))


@pytest.mark.parametrize("policy", [CAPTURE_OFF, FULL], ids=["capture off", "every hidden state"])
def test_newcomers_on_stored_starts_of_different_lengths_prefill_their_rests_in_one_pass(tiny_lm, policy):
    """Newcomers that reuse stored starts of different lengths, and one with nothing stored, prefill the rest of
    their prompts in one padded pass (each row's cache: its start right-aligned, pads, its rest), not one pass
    each, capturing or not; every answer, and every residual, equals its prompt alone."""
    from engine.serving.prefix import PrefixCache

    prefix = PrefixCache(64 * 2**20)
    long_start, short_start = tiny_prompt(20, seed=3), tiny_prompt(12, seed=5)
    run_in_turn(tiny_lm, [(GenerationRequest(start + " w0", max_new_tokens=2, chat=False), policy)
                          for start in (long_start, short_start)], prefix)
    jobs = [GenerationRequest(p, max_new_tokens=5, chat=False)
            for p in (long_start + " w1 w2", short_start + " w3", tiny_prompt(6, seed=9), long_start + " w4 w5 w6")]
    runner = BatchRunner(tiny_lm, prefix=prefix)
    sinks = [Sink() for _ in jobs]
    for sink, request in zip(sinks, jobs):
        runner.add(sink.slot(tiny_lm, request, policy))
    passes, lean = [], one_forward(tiny_lm)          # prefill and decode passes alike go through the one forward
    real = lean.forward
    lean.forward = lambda ids, *args, **kwargs: passes.append(tuple(ids.shape)) or real(ids, *args, **kwargs)
    try:
        runner.step()
    finally:
        del lean.forward
    assert [s.records[0].reused_tokens for s in sinks] == [20, 12, 0, 20]
    assert len(passes) == 2 and passes[0][0] == 4 and passes[0][1] > 1 and passes[1] == (4, 1)   # one prefill
    #                                                          pass for all four, then their first decode pass
    while not runner.idle:
        runner.step()
    for sink, request in zip(sinks, jobs):
        assert sink.error is None
        assert_same_run(sink, alone(tiny_lm, request, policy))


def test_one_step_prefills_at_most_its_budget_for_all_newcomers(tiny_lm):
    """Three 6-token prompts and a budget of 8 a step: 8, 8, then the last 2, and the first tokens come in
    that order; nobody waits a whole step for an earlier newcomer that had already started."""
    runner = BatchRunner(tiny_lm, prefill_chunk=8)
    sinks = [Sink() for _ in range(3)]
    jobs = [GenerationRequest(tiny_prompt(6, seed=s), max_new_tokens=3, chat=False) for s in range(3)]
    n = [len(encode_prompt(tiny_lm, r)) for r in jobs]
    for sink, request in zip(sinks, jobs):
        runner.add(sink.slot(tiny_lm, request, FULL))
    budgets = [runner.step().prefill_tokens for _ in range(3)]
    assert budgets[0] == budgets[1] == 8 and sum(budgets) == sum(n)
    while not runner.idle:
        runner.step()
    for sink, request in zip(sinks, jobs):
        assert_same_run(sink, alone(tiny_lm, request, FULL))


def test_an_entry_without_the_residual_a_request_keeps_is_not_used_and_is_replaced(tiny_lm):
    from engine.serving.prefix import PrefixCache

    prefix = PrefixCache(64 * 2**20)
    request = GenerationRequest(tiny_prompt(16, seed=2), max_new_tokens=3, chat=False)
    _, full = run_in_turn(tiny_lm, [(request, CAPTURE_OFF), (request, FULL)], prefix)
    assert full.records[0].reused_tokens == 0                 # stored without a residual: computed again...
    assert prefix.stats.entries == 1                          # ...and stored again with it, in its place
    again, off = run_in_turn(tiny_lm, [(request, FULL), (request, CAPTURE_OFF)], prefix)
    n = len(full.records[0].prompt)
    assert again.records[0].reused_tokens == off.records[0].reused_tokens == n - 1
    assert_same_run(again, alone(tiny_lm, request, FULL))


def test_the_prefix_cache_stays_within_its_bytes(tiny_lm):
    from engine.projection.card import kv_bytes_per_token
    from engine.serving.prefix import PrefixCache

    per_token = int(kv_bytes_per_token(tiny_lm.spec, "float32"))
    prefix = PrefixCache(40 * per_token)                      # room for one 30-token prompt, not two
    jobs = [(GenerationRequest(tiny_prompt(29, seed=s), max_new_tokens=2, chat=False), CAPTURE_OFF) for s in (1, 2)]
    run_in_turn(tiny_lm, jobs, prefix)
    assert prefix.stats.entries == 1 and prefix.stats.bytes <= 40 * per_token
    again = run_in_turn(tiny_lm, [jobs[1]], prefix)[0]        # the newest stayed
    assert again.records[0].reused_tokens == 28               # all but the last of its 29 tokens


def test_a_model_with_sliding_window_layers_runs_one_at_a_time(tmp_path):
    """Windowed layers keep their own number of positions, so rows cannot be padded together: batch of one."""
    from transformers import MistralConfig, MistralForCausalLM

    from conftest import TINY_CONFIG, write_tiny_tokenizer
    from engine.serving.batch import batchable
    from engine.core.loader import load_model

    config = MistralConfig(**{**TINY_CONFIG, "sliding_window": 8})
    MistralForCausalLM(config).save_pretrained(tmp_path / "m", safe_serialization=True)
    write_tiny_tokenizer(tmp_path / "m", config.vocab_size)
    lm = load_model(str(tmp_path / "m"), device="cpu", dtype="float32")
    runner = BatchRunner(lm, max_batch=8)
    assert not batchable(lm) and runner.max_batch == 1
    request = GenerationRequest(tiny_prompt(12), max_new_tokens=12, chat=False)
    (sink,) = run_staggered(lm, [(request, FULL)], max_batch=8)
    assert_same_run(sink, alone(lm, request, FULL))


def test_steps_with_newcomers_and_decoding_rows_run_as_one_forward_and_each_answer_equals_it_alone(tiny_lm,
                                                                                                  monkeypatch):
    """Prompts (one of 200 tokens, in chunks of 64) joining rows that decode, some capturing: those steps run as ONE
    forward over the flattened step (engine.serving.lean.mixed_step: the modules and the apart passes run none of
    them), and every answer and kept residual equals the same request alone."""
    from engine.serving import batch as batch_module

    mixed, apart = [], []
    one_forward_step = batch_module.mixed_step
    monkeypatch.setattr(batch_module, "mixed_step", lambda lean, batch, rows, new, chunks, *products: mixed.append(
        (len(rows), sum(chunks))) or one_forward_step(lean, batch, rows, new, chunks, *products))
    prefill = batch_module.pool_prefill
    monkeypatch.setattr(batch_module, "pool_prefill", lambda *a: apart.append(a[3]) or prefill(*a))
    jobs = [(GenerationRequest(tiny_prompt(n, seed=n), max_new_tokens=m, chat=False), policy)
            for n, m, policy in ((6, 30, FULL), (200, 6, CAPTURE_OFF), (9, 12, SUBSET), (14, 5, CAPTURE_OFF))]
    sinks = run_staggered(tiny_lm, jobs, prefill_chunk=64, joins=[0, 2, 3, 3])
    assert apart == [[len(encode_prompt(tiny_lm, jobs[0][0]))]]   # only the first prompt (nobody decoding) alone
    assert all(rows >= 1 for rows, _ in mixed) and max(t for _, t in mixed) == 64    # chunks of 64 at most
    assert sum(t for _, t in mixed) == sum(len(encode_prompt(tiny_lm, r)) for r, _ in jobs[1:])   # every other
    for sink, (request, policy) in zip(sinks, jobs):
        assert sink.error is None
        assert_same_run(sink, alone(tiny_lm, request, policy))


def test_a_newcomer_that_fails_in_a_mixed_step_fails_alone_and_the_rows_go_on(tiny_lm):
    """A prompt with a token id past the vocabulary joins decoding rows: the one forward raises, the step runs apart,
    the newcomer fails alone, and the rows' answers equal each alone."""
    runner = BatchRunner(tiny_lm)
    jobs = [(GenerationRequest(tiny_prompt(n, seed=n), max_new_tokens=10, chat=False), CAPTURE_OFF) for n in (7, 11)]
    sinks = [Sink() for _ in jobs]
    for sink, (request, policy) in zip(sinks, jobs):
        runner.add(sink.slot(tiny_lm, request, policy))
    runner.step()
    bad = Sink()
    runner.add(Slot(GenerationRequest("(token ids)", max_new_tokens=4, chat=False), [5, 9, tiny_lm.spec.vocab_size + 3],
                    CAPTURE_OFF, bad.records.append, bad._fail))
    while not runner.idle:
        runner.step()
    assert isinstance(bad.error, IndexError) and not bad.records
    for sink, (request, policy) in zip(sinks, jobs):
        assert sink.error is None
        assert_same_run(sink, alone(tiny_lm, request, policy))


def test_a_request_that_did_not_ask_for_a_checksum_gets_none_and_pays_no_host_copy(tiny_lm, monkeypatch):
    """With the invariant mode off, only the request that asks (`GenerationRequest.logits_sha256`) is hashed: the
    others' DoneRecords carry none, and a step none of whose rows asked copies no logits to the host (hash_rows not
    called); the one that asked gets its checksum (the same when it runs alone twice)."""
    from engine.serving import batch as batch_module

    copies = []
    hash_rows = batch_module.hash_rows
    monkeypatch.setattr(batch_module, "hash_rows", lambda slots, logits: copies.append(len(slots)) or hash_rows(
        slots, logits))
    plain = [(GenerationRequest(tiny_prompt(n, seed=n), max_new_tokens=6, chat=False), CAPTURE_OFF) for n in (5, 9)]
    assert not one_forward(tiny_lm).invariant
    sinks = run_staggered(tiny_lm, plain)
    assert copies == [] and all(s.records[-1].logits_sha256 is None for s in sinks)
    asked = GenerationRequest(tiny_prompt(7, seed=3), max_new_tokens=6, chat=False, logits_sha256=True)
    beside = run_staggered(tiny_lm, [(asked, CAPTURE_OFF), *plain])
    assert copies and set(copies) == {1}                      # one row per step copied: the one that asked
    checksum = beside[0].records[-1].logits_sha256
    assert len(checksum) == 64 and all(s.records[-1].logits_sha256 is None for s in beside[1:])
    twice = [run_staggered(tiny_lm, [(asked, CAPTURE_OFF)])[0].records[-1].logits_sha256 for _ in range(2)]
    assert twice[0] == twice[1] and len(twice[0]) == 64         # alone, twice: the same numbers, the same checksum


def test_a_mixed_steps_prefill_part_is_its_share_by_tokens_and_says_it_is_mixed(tiny_lm):
    """One forward runs a newcomer's prompt with a decoding row: its time cannot be timed apart, so the step says it
    was mixed and gives the prompt its share by tokens, not the whole step (which biased the prefill rate)."""
    assert mixed_share(1.0, 30, 2) == pytest.approx(30 / 32) and mixed_share(0.0, 0, 0) == 0.0
    runner = BatchRunner(tiny_lm)
    first, second = Sink(), Sink()
    runner.add(first.slot(tiny_lm, GenerationRequest(tiny_prompt(5, seed=8), max_new_tokens=20, chat=False)))
    alone_step = runner.step()                           # the first prompt alone: prefill apart, then its first token
    assert not alone_step.mixed and 0 < alone_step.prefill_seconds <= alone_step.seconds
    request = GenerationRequest(tiny_prompt(20, seed=4), max_new_tokens=4, chat=False)
    runner.add(second.slot(tiny_lm, request, CAPTURE_OFF))
    step = runner.step()
    n = len(encode_prompt(tiny_lm, request))
    assert step.mixed and step.prefill_tokens == n and step.decode_rows == 1
    assert 0 < step.prefill_seconds < step.seconds * n / (n + 1) * 1.0000001   # the share of the forward, at most
    decode = runner.step()
    assert not decode.mixed and decode.prefill_seconds == 0.0 and decode.decode_rows == 2
