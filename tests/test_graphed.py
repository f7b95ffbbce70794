"""The batched decode step on fixed shapes over a kept pool (engine/serving/graphed.py), checked on the CPU: the
padding, the wide mask, the residual written inside the step and the fallbacks compute what each request computes
alone. On CUDA the same step is recorded as a CUDA graph (the CUDA test at the end)."""
from __future__ import annotations

import re
import threading

import pytest
import torch
from torch._dynamo.utils import counters

from conftest import tiny_prompt
from engine.core.generate import GenerationRequest, encode_prompt
from engine.core.hooks import CAPTURE_OFF, CapturePolicy
from engine.core.loader import load_model
from engine.core.records import DecodeRecord, PrefillRecord
from engine.serving.batch import BatchRunner, Slot
from engine.serving import graphed
from engine.serving.graphed import MIN_WIDTH, GraphedDecode, width_bucket
from engine.serving.limits import Limits
from engine.serving.paged import NULL, RESID, SCRATCH, WRITE, PagedBatch
from engine.serving.scheduler import Scheduler
from test_batch import Sink, alone, assert_same_run

ROWS = CapturePolicy(stats=False)
FULL = CapturePolicy(logit_lens=3)


@pytest.fixture(scope="module")
def lm(tiny_model_dir):
    """A private copy: the graphed runner leaves the small-batch kernels unpacked."""
    return load_model(str(tiny_model_dir), device="cpu", dtype="float32")


def run(lm, graphs, jobs, joins, max_batch=8):
    """(request, policy) jobs through one runner on `graphs`' pool; job i joins at step joins[i]."""
    runner = BatchRunner(lm, max_batch=max_batch, graphs=graphs)
    sinks = [Sink() for _ in jobs]
    step = 0
    while step < 1000 and (not runner.idle or step <= max(joins)):
        for i, (request, policy) in enumerate(jobs):
            if joins[i] == step:
                runner.add(sinks[i].slot(lm, request, policy))
        runner.step()
        step += 1
    return sinks


def jobs_of(policies, lengths=((5, 12), (17, 4), (9, 9), (30, 7))):
    return [(GenerationRequest(tiny_prompt(n, seed=n), max_new_tokens=m, chat=False), p)
            for (n, m), p in zip(lengths, policies)]


def test_padded_rows_and_keys_compute_what_each_request_computes_alone(lm):
    graphs = GraphedDecode(lm, n_blocks=64, compile="off", max_rows=8)
    jobs = jobs_of([CAPTURE_OFF] * 4)
    sinks = run(lm, graphs, jobs, joins=[0, 0, 2, 5])
    for sink, (request, policy) in zip(sinks, jobs):
        assert sink.error is None
        assert_same_run(sink, alone(lm, request, policy))
    assert graphs.shapes == {(8, MIN_WIDTH)}                     # every decode step ran padded, none eagerly
    assert not graphs.pool.keys[0][NULL].any()                   # pads read a slot that stays zero
    assert graphs.pool.keys[0][SCRATCH].any()                    # padding rows ran, and wrote where none reads


def test_steps_that_capture_run_graphed_and_each_residual_equals_alone(lm):
    """Capturing requests beside ones that capture nothing, in a batch padded to 8 rows: every step runs on the
    fixed shape (none eagerly), and each capturing request's residual, written inside the step, equals its own
    alone; padding rows and rows that keep nothing write only the scratch slot."""
    graphs = GraphedDecode(lm, n_blocks=64, compile="off", max_rows=8)
    jobs = jobs_of([ROWS, CAPTURE_OFF, FULL, ROWS], lengths=((5, 3), (17, 14), (9, 16), (30, 4)))
    sinks = run(lm, graphs, jobs, joins=[0, 0, 1, 8])
    for sink, (request, policy) in zip(sinks, jobs):
        assert sink.error is None
        assert_same_run(sink, alone(lm, request, policy))
    assert graphs.shapes == {(8, MIN_WIDTH)}                     # every decode step on the graph's shape
    assert not graphs.pool.resid[:, NULL].any()


def test_a_capturing_request_in_a_batch_of_32_equals_it_alone_and_a_misrouted_padding_row_is_caught(lm):
    """Two capturing requests among 30 that capture nothing, on the graph's fixed shape (40 rows: 8 of padding; the
    trace itself is the test above): each one's residual equals its own alone. Then the mutation: a padding row's
    residual routed into a real row's slot instead of the scratch slot; the same comparison must fail."""
    jobs = jobs_of([FULL if i in (3, 17) else CAPTURE_OFF for i in range(32)],
                   lengths=[(4 + i % 9, 3 + i % 4) for i in range(32)])
    want = {i: alone(lm, *jobs[i]) for i in (3, 17)}
    graphs = GraphedDecode(lm, n_blocks=64, compile="off", max_rows=40)
    sinks = run(lm, graphs, jobs, joins=[0] * 32, max_batch=32)
    assert graphs.shapes and all(rows == 40 for rows, _ in graphs.shapes)   # 8 padding rows in every step
    for i, single in want.items():
        assert sinks[i].error is None
        assert_same_run(sinks[i], single)

    class Misrouted(PagedBatch):
        def plan_into(self, index):
            super().plan_into(index)
            capturing = [b for b, s in enumerate(self.slots) if s.kept is not None]
            if capturing and index.shape[0] > len(self.slots):
                index[-1, RESID] = index[capturing[0], WRITE]           # the last padding row writes a real row's

    graphs.new_batch = lambda: Misrouted(pool=graphs.pool)
    wrong = run(lm, graphs, jobs, joins=[0] * 32, max_batch=32)
    with pytest.raises(AssertionError):
        for i, single in want.items():
            assert_same_run(wrong[i], single)


def test_a_pool_that_outgrows_itself_moves_and_the_batch_goes_on_eagerly(lm):
    graphs = GraphedDecode(lm, n_blocks=4, compile="off", max_rows=8)     # 3 blocks of 16 positions
    jobs = jobs_of([CAPTURE_OFF] * 4)
    sinks = run(lm, graphs, jobs, joins=[0, 0, 0, 0])
    for sink, (request, policy) in zip(sinks, jobs):
        assert sink.error is None
        assert_same_run(sink, alone(lm, request, policy))
    assert graphs.pool.n_blocks > 4 and graphs.fits(graphs.new_batch()) is None


def test_the_batched_step_traces_as_one_graph_and_warms_up_on_padding_only(lm):
    graphs = GraphedDecode(lm, n_blocks=64, compile="eager", max_rows=16, row_buckets=(8,))   # fullgraph: a
    graphs.warm_up((MIN_WIDTH,))                                                             # break raises
    assert graphs.shapes == {(8, MIN_WIDTH), (16, MIN_WIDTH)}
    pool = torch.stack(graphs.pool.keys)                                  # [L, slots, KVH, D]
    assert not pool[:, NULL].any() and not pool[:, SCRATCH + 1:].any()    # only the scratch slot was written
    assert not graphs.pool.resid[:, NULL].any() and not graphs.pool.resid[:, SCRATCH + 1:].any()   # the residual too
    jobs = jobs_of([FULL, CAPTURE_OFF, FULL])
    for sink, (request, policy) in zip(run(lm, graphs, jobs, joins=[0, 1, 2]), jobs):
        assert_same_run(sink, alone(lm, request, policy))


def step_guards(graphs: GraphedDecode) -> list[str]:
    """The guards dynamo checks before each call of the compiled step, one text per compiled shape."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    return [str(entry.guard_manager) for entry in _debug_get_cache_entry_list(graphs.step._torchdynamo_orig_callable)]


def test_the_compiled_step_checks_no_weight_but_what_can_change_between_steps(lm):
    """dynamo's guards on the step (engine.serving.graphed.unguarded_weights): none on the checkpoint's tensors (one a
    weight, each step, before the graph replays), every other kept (the index buffer, the pool, the mode's flag); the
    step still equals each request alone. Fails with the filter left out (a guard on L['lean'].layers[0].q[0]...)."""
    torch._dynamo.reset()
    graphs = GraphedDecode(lm, n_blocks=64, compile="eager", max_rows=8, row_buckets=(1,))
    graphs.warm_up((MIN_WIDTH,))
    texts = step_guards(graphs)
    assert len(texts) == 2                                                  # rows 1 and 8 at MIN_WIDTH
    for text in texts:
        assert "L['lean'].invariant" in text and "L['index']" in text and "L['pool'].keys[0]" in text
        assert not re.search(r"L\['lean'\]\.(layers|embed|norm|head)\b", text), text[:2000]
    jobs = jobs_of([FULL, CAPTURE_OFF])
    for sink, (request, policy) in zip(run(lm, graphs, jobs, joins=[0, 1]), jobs):
        assert_same_run(sink, alone(lm, request, policy))
    assert len(step_guards(graphs)) == 2                                    # nothing recompiled


def test_a_step_that_cannot_run_graphed_runs_eagerly_and_so_do_all_after_it(lm):
    graphs = GraphedDecode(lm, n_blocks=64, compile="off", max_rows=8)
    calls = []

    def broken(*args):
        calls.append(1)
        raise RuntimeError("the compiler gave up\nmore lines")
    graphs.step = broken
    jobs = jobs_of([CAPTURE_OFF] * 3)
    for sink, (request, policy) in zip(run(lm, graphs, jobs, joins=[0, 0, 3]), jobs):
        assert sink.error is None
        assert_same_run(sink, alone(lm, request, policy))
    assert len(calls) == 1 and graphs.error.startswith("RuntimeError: the compiler gave up (at test_graphed.py:")

def inputs_recorded(graphs: GraphedDecode) -> list[torch.Tensor]:
    """Every tensor the graphed step is handed from now on (kept alive: no address is reused while listed)."""
    seen: list[torch.Tensor] = []
    inner = graphs.step

    def recorded(index):
        seen.append(index)
        return inner(index)
    graphs.step = recorded
    return seen


def compiled_graphs() -> int:
    return counters["stats"]["unique_graphs"]


LONE = [(GenerationRequest(tiny_prompt(5, seed=1), max_new_tokens=60, chat=False), p) for p in (CAPTURE_OFF, FULL)]
ROOM = jobs_of([FULL, CAPTURE_OFF, ROWS, CAPTURE_OFF])


def audited(lm, graphs: GraphedDecode, lone=LONE, room=ROOM, warmed_up=lambda: None
            ) -> tuple[int, list[torch.Tensor], list]:
    """After warm-up at MIN_WIDTH (then `warmed_up()`): a lone request (capture off, then on) and a room of four, each
    through the step (dynamo's eager backend, fullgraph); (graphs compiled meanwhile, the tensors the step was handed,
    the runs)."""
    graphs.warm_up((MIN_WIDTH,))
    warmed_up()
    warmed = compiled_graphs()
    seen = inputs_recorded(graphs)
    sinks = [run(lm, graphs, [job], joins=[0])[0] for job in lone] + run(lm, graphs, room, joins=[0, 0, 2, 5])
    return compiled_graphs() - warmed, seen, sinks


def assert_static(graphs: GraphedDecode, recompiles: int, seen: list[torch.Tensor]) -> None:
    """Nothing compiled after warm-up; every step of a shape handed its one index buffer, at one address."""
    assert recompiles == 0
    assert {tuple(t.shape) for t in seen} == {(1, 4 + MIN_WIDTH), (8, 4 + MIN_WIDTH)}     # the lone step, the room
    for shape, inputs in graphs.inputs.items():
        mine = [t for t in seen if t.shape[0] == shape[0]]
        assert all(t is inputs.index and t.data_ptr() == inputs.index.data_ptr() for t in mine)


def test_after_warm_up_nothing_recompiles_and_every_step_reads_its_shape_s_one_buffer(lm):
    """The step traced by dynamo (eager backend, fullgraph) and warmed at one width: a lone request of 60 tokens,
    capture off and on, and a room of four (two capturing) run with zero recompiles, each step handed the same
    index tensor as the warm-up (same object, same address), and every answer (its residual included) equals the
    request alone and the eager route's."""
    graphs = GraphedDecode(lm, n_blocks=64, compile="eager", max_rows=8, row_buckets=(1,))
    recompiles, seen, sinks = audited(lm, graphs)
    assert_static(graphs, recompiles, seen)
    assert sinks[0].records[-1].generated_tokens == 60 and len(seen) > 2 * 59
    eager = [run(lm, None, [job], joins=[0])[0] for job in LONE] + run(lm, None, ROOM, joins=[0, 0, 2, 5])
    for sink, other, job in zip(sinks, eager, LONE + ROOM):
        assert sink.error is None
        assert_same_run(sink, alone(lm, *job))
        assert [r.token.id for r in sink.records[:-1]] == [r.token.id for r in other.records[:-1]]


def test_a_step_handed_a_new_tensor_each_time_is_caught(lm, monkeypatch):
    """The mutation: the step's inputs made afresh every step (a new tensor, as ids, positions and the mask were
    before): the audit above must fail, by a recompile and by the tensors handed."""
    load = graphed.StepInputs.load
    graphs = GraphedDecode(lm, n_blocks=64, compile="eager", max_rows=8, row_buckets=(1,))
    short = [(GenerationRequest(tiny_prompt(5, seed=1), max_new_tokens=6, chat=False), CAPTURE_OFF)]
    recompiles, seen, _ = audited(lm, graphs, short, jobs_of([CAPTURE_OFF] * 2), lambda: monkeypatch.setattr(
        graphed.StepInputs, "load", lambda inputs: load(inputs).clone()))
    assert recompiles > 0
    with pytest.raises(AssertionError):
        assert_static(graphs, 0, seen)


def test_width_buckets():
    assert [width_bucket(w, 4096) for w in (1, 256, 257, 1000, 4096, 4097)] == [256, 256, 512, 1024, 4096, None]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_graphed_batch_equals_each_request_alone(tiny_model_dir):
    cuda = load_model(str(tiny_model_dir), device="cuda", dtype="float32")
    graphs = GraphedDecode(cuda, n_blocks=64, max_rows=8)                  # auto: CUDA graphs
    assert graphs.graphs
    graphs.warm_up((MIN_WIDTH,))
    jobs = jobs_of([CAPTURE_OFF] * 4)
    for sink, (request, policy) in zip(run(cuda, graphs, jobs, joins=[0, 0, 2, 5]), jobs):
        assert sink.error is None
        assert_same_run(sink, alone(cuda, request, policy))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_graphs_are_recorded_recompile_nothing_and_read_one_buffer_per_shape(tiny_model_dir):
    """The audit above with the CUDA graphs themselves (inductor, cudagraph trees): no graph compiled and left
    unrecorded (inductor's cudagraph_skips), nothing recompiled after warm-up, each step handed its shape's one
    buffer, and every answer equal to the request alone."""
    cuda = load_model(str(tiny_model_dir), device="cuda", dtype="float32")
    graphs = GraphedDecode(cuda, n_blocks=64, max_rows=8, row_buckets=(1,))      # auto: CUDA graphs
    assert graphs.graphs
    skips = graphed.cudagraph_counts().get("cudagraph_skips", 0)
    recompiles, seen, sinks = audited(cuda, graphs)
    assert graphs.error is None and graphed.cudagraph_counts().get("cudagraph_skips", 0) == skips
    assert_static(graphs, recompiles, seen)
    for sink, (request, policy) in zip(sinks, LONE + ROOM):
        single = alone(cuda, request, policy)
        assert sink.error is None
        assert [r.token.id for r in sink.records[:-1]] == [r.token.id for r in list(single)[:-1]]
        if policy is CAPTURE_OFF:               # the residual inductor's kernels write: within rounding, not checked
            assert_same_run(sink, single)


def thread_recorded(graphs: GraphedDecode) -> list[int]:
    """The thread of every call of the graphed step (compile, record or replay) from now on."""
    calls: list[int] = []
    step = graphs.step

    def recorded(*args, **kwargs):
        calls.append(threading.get_ident())
        return step(*args, **kwargs)
    graphs.step = recorded
    return calls


def served_through_a_scheduler(tiny_model_dir, warm_here: bool):
    """Two requests through a real Scheduler whose model has a graphed step (uncompiled: which thread warms and
    steps it does not depend on what compiles it; compiling here would also add to dynamo's recompile count for
    `step`, shared by every test in the process): the threads that called the step, the scheduler's worker, the
    tokens, alone."""
    own = load_model(str(tiny_model_dir), device="cpu", dtype="float32")
    graphs = GraphedDecode(own, n_blocks=64, compile="off", max_rows=8, row_buckets=(1,))
    calls = thread_recorded(graphs)
    if warm_here:
        graphs.ensure_warm()                     # as the scheduler did before: in its caller's thread
    own.batch_graphs = graphs                    # graphed_decode hands the model's own to the scheduler
    before = len(calls)
    scheduler = Scheduler(own, Limits(max_batch=8))
    try:
        scheduler.warm_up()
        requests = [GenerationRequest(tiny_prompt(n, seed=n), max_new_tokens=6, chat=False) for n in (5, 17)]
        handles = [scheduler.submit(r) for r in requests]
        got = [[r.token.id for r in h.result(600) if isinstance(r, (PrefillRecord, DecodeRecord))] for h in handles]
        worker = scheduler._worker.ident
    finally:
        scheduler.close()
    want = [[r.token.id for r in alone(own, r) if isinstance(r, (PrefillRecord, DecodeRecord))] for r in requests]
    assert len(calls) > before + 1                # the scheduler's steps went through the graphed step
    return graphs, calls, worker, got, want


def test_the_scheduler_s_graphs_are_compiled_recorded_and_replayed_on_one_thread_of_their_own(tiny_model_dir):
    """cudagraph trees keep their managers per thread (issue 48's empty AssertionError: compiled in the scheduler's
    caller, replayed in its worker): every call of the step, the warm-up's included, runs on the graphs' own
    thread, which is neither the caller's nor the worker's."""
    graphs, calls, worker, got, want = served_through_a_scheduler(tiny_model_dir, warm_here=False)
    assert graphs.warmed and graphs.error is None
    assert len(set(calls)) == 1 and not {worker, threading.get_ident()} & set(calls)
    assert any(rows in (1, 8) for rows, _ in graphs.shapes)
    assert got == want


def test_graphs_warmed_from_one_thread_and_stepped_from_another_run_on_the_same_thread(tiny_model_dir):
    """Warmed from this thread, stepped from the scheduler's worker (as bench/load.py does: a scheduler, so a worker
    thread, per scenario on one model's graphs): one thread runs every call, and the answers equal alone."""
    graphs, calls, worker, got, want = served_through_a_scheduler(tiny_model_dir, warm_here=True)
    assert len(set(calls)) == 1 and worker not in calls
    assert got == want
