"""A lone request's fast path: the lean step (engine/core/lean.py) against the model's own forward, the lone decode
on the paged pool (engine/serving/lean.py) against running alone, the weights' measured layout
(engine/core/layout.py), and the scheduler's thread tuner (engine/serving/threads.py)."""
from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from conftest import assert_same_residual, tiny_prompt, write_tiny_llama
from engine.core.generate import GenerationRequest, encode_prompt, generate, generate_kept
from engine.core.hooks import CAPTURE_OFF, CapturePolicy, count_hooks
from engine.core.kept import kept_for
from engine.core import kernels
from engine.core.layout import in_huge_pages, relayout
from engine.core.lean import LeanStep, lean_step_for, why_not
from engine.core.loader import load_model
from engine.core.records import DoneRecord
from engine.core.small_batch import kernels_for
from engine.serving.batch import BatchRunner, Slot
from engine.serving.threads import FIRST_HOLD, LEAVE_MARGIN, MARGIN, TRIAL_STEPS, ThreadTuner, fixed_threads


FULL = CapturePolicy(logit_lens=3)          # every hidden state kept (as the pages' capture keeps them)


def contiguous_kv(n_layers: int):
    """A kv callback over plain lists: each layer's keys and values grow by one position per step."""
    keys, values = [None] * n_layers, [None] * n_layers

    def kv(i, k, v):
        keys[i] = k if keys[i] is None else torch.cat([keys[i], k], dim=2)
        values[i] = v if values[i] is None else torch.cat([values[i], v], dim=2)
        return keys[i], values[i]
    return kv


class Collected:
    """A residual sink that keeps what the forward hands it: hidden state i of every row, [B, T, d]."""

    def __init__(self):
        self.states = []

    def write(self, layer, x):
        assert layer == len(self.states)
        self.states.append(x.clone())


def lean_logits(lm, ids: list[int]) -> torch.Tensor:
    """The lean step fed one token at a time from position 0: logits (T, V)."""
    lean, kv = LeanStep(lm), contiguous_kv(lm.spec.n_layers)
    with torch.inference_mode():
        return torch.stack([lean(t, p, kv) for p, t in enumerate(ids)])


def model_logits(lm, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        out = lm.model(input_ids=torch.tensor([ids]), cache=DynamicCache(config=lm.model.config), use_cache=True)
    return out.logits[0]


@pytest.fixture(scope="module")
def tiny_qwen(tmp_path_factory):
    """A tiny Qwen2 (biased Q/K/V, its own rotary settings), random weights written here."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from conftest import TINY_CONFIG, write_tiny_tokenizer
    folder = tmp_path_factory.mktemp("tiny-qwen2")
    torch.manual_seed(1)
    Qwen2ForCausalLM(Qwen2Config(**TINY_CONFIG)).save_pretrained(folder, safe_serialization=True)
    write_tiny_tokenizer(folder, TINY_CONFIG["vocab_size"])
    return load_model(str(folder), device="cpu", dtype="float32")


@pytest.mark.parametrize("which", ["tiny_lm", "tiny_qwen"])
def test_the_lean_step_gives_the_models_own_logits_at_every_position(which, request):
    lm = request.getfixturevalue(which)
    ids = torch.randint(4, lm.spec.vocab_size, (20,), generator=torch.Generator().manual_seed(0)).tolist()
    torch.testing.assert_close(lean_logits(lm, ids), model_logits(lm, ids), atol=1e-5, rtol=1e-5)


def test_a_model_the_lean_step_does_not_cover_says_why_and_keeps_the_ordinary_path(tmp_path):
    lm = load_model(str(write_tiny_llama(tmp_path / "gelu", hidden_act="gelu")), device="cpu", dtype="float32")
    assert "SiLU" in why_not(lm.model)
    assert lean_step_for(lm) is None and BatchRunner(lm).lean is None


def run_runner(lm, jobs, joins, runner=None, kept: dict | None = None):
    """(request, policy) jobs through one runner, job i joining at step joins[i]; each job's records (and in
    `kept`, job i's kept residual)."""
    runner = runner or BatchRunner(lm, max_batch=8)
    out = [[] for _ in jobs]
    kept = {} if kept is None else kept
    step = 0
    while step == 0 or not runner.idle or step <= max(joins):
        for i, (request, policy) in enumerate(jobs):
            if joins[i] == step:
                ids = encode_prompt(lm, request)
                kept[i] = kept_for(lm, policy, len(ids) + request.max_new_tokens)  # a capturing run keeps its residual
                runner.add(Slot(request, ids, policy, out[i].append, pytest.fail, kept=kept[i]))
        if not runner.idle:
            runner.step()
        step += 1
    return out


def same_tokens(records, alone):
    assert [r.token.id for r in records if hasattr(r, "token")] == [r.token.id for r in alone if hasattr(r, "token")]
    for a, b in zip(records, alone):
        if hasattr(b, "token"):
            assert a.token.prob == pytest.approx(b.token.prob, abs=1e-5)
            assert (a.cache.length, a.cache.bytes) == (b.cache.length, b.cache.bytes)
    assert records[-1].text == alone[-1].text


def decode_steps(runner, monkeypatch) -> list[int]:
    """The rows of every decode step the runner runs through the one step function (`LeanDecode.decode`)."""
    calls, decode = [], runner.lean.decode
    monkeypatch.setattr(runner.lean, "decode", lambda batch, slots: calls.append(len(slots)) or decode(batch, slots))
    return calls


def test_a_lone_request_steps_on_the_lean_path_and_equals_itself_alone(tiny_lm, monkeypatch):
    runner = BatchRunner(tiny_lm, max_batch=8)
    calls = decode_steps(runner, monkeypatch)
    request = GenerationRequest(tiny_prompt(9, seed=3), max_new_tokens=40, chat=False)   # past two 16-token blocks
    (records,) = run_runner(tiny_lm, [(request, CAPTURE_OFF)], [0], runner)
    assert calls == [1] * 39                                            # every decode step after the prefill's token
    same_tokens(records, list(generate(tiny_lm, request)))
    assert count_hooks(tiny_lm.model) == 0


def test_requests_joining_a_lone_one_and_leaving_it_alone_again_equal_each_alone(tiny_lm):
    """The lone steps keep the K/V where the batch reads it: a newcomer joins mid-answer, and after the others leave
    the first goes on alone on blocks that no longer follow one another (read through the gather)."""
    jobs = [(GenerationRequest(tiny_prompt(n, seed=n), max_new_tokens=m, chat=False), policy)
            for n, m, policy in ((7, 40, CAPTURE_OFF), (12, 16, CAPTURE_OFF), (5, 8, CapturePolicy(layers=(1,))))]
    out = run_runner(tiny_lm, jobs, [0, 6, 9])
    for records, (request, policy) in zip(out, jobs):
        assert isinstance(records[-1], DoneRecord)
        same_tokens(records, list(generate(tiny_lm, request, policy)))


def prefilled(lm, lengths: tuple[int, ...]) -> BatchRunner:
    """A runner whose rows (prompts of these lengths) are prefilled and ready for a decode step."""
    runner = BatchRunner(lm, max_batch=8)
    for n in lengths:
        ids = torch.randint(4, lm.spec.vocab_size, (n,), generator=torch.Generator().manual_seed(n + 1)).tolist()
        request = GenerationRequest("(token ids)", max_new_tokens=64, chat=False)
        runner.add(Slot(request, ids, CAPTURE_OFF, lambda r: None, pytest.fail))
    while runner.prefilling:
        runner.step()
    return runner


@pytest.mark.parametrize("which", ["tiny_lm", "tiny_qwen"])
def test_the_lean_rows_give_the_modules_logits_and_residuals_on_a_left_padded_batch(which, request):
    """Rows of different lengths (so the keys are padded on the left and masked): the lean step's logits and the
    L + 1 residuals it hands back equal the modules' forward on the same paged batch, with the same products."""
    lm = request.getfixturevalue(which)
    runner = prefilled(lm, (5, 17, 11))
    batch, slots = runner.batch, runner.batch.slots
    assert len(slots) == 3 and len(set(batch.pads())) == 3
    ids = torch.tensor([s.token.id for s in slots])
    positions = torch.tensor([s.length for s in slots])
    mask = batch.step_mask()
    with torch.inference_mode():
        out = lm.model(input_ids=ids[:, None], attention_mask=mask, position_ids=positions[:, None],
                       cache=batch.cache, use_cache=True, logits_to_keep=1, output_hidden_states=True)
        hidden = Collected()
        logits = runner.lean.lean.forward(ids[:, None], positions[:, None], batch.write_and_gather,
                                          mask.bool()[:, None, None, :], hidden)[:, -1]
    torch.testing.assert_close(logits, out.logits[:, -1], atol=1e-5, rtol=1e-5)
    assert len(hidden.states) == len(out.hidden_states) == lm.spec.n_layers + 1
    for mine, theirs in zip(hidden.states, out.hidden_states):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)
    kernels = kernels_for(lm)                  # packed products, q|k|v and gate|up fused: the same within rounding
    fused = runner.lean.fused(kernels)
    assert all(f.qkv and f.gate_up for f in fused)
    with torch.inference_mode():
        packed = runner.lean.lean.forward(ids[:, None], positions[:, None], batch.write_and_gather,
                                          mask.bool()[:, None, None, :], None, kernels.linear, fused)[:, -1]
    torch.testing.assert_close(packed, out.logits[:, -1], atol=1e-4, rtol=1e-4)


def test_a_batch_decodes_on_the_lean_rows_and_every_row_equals_itself_alone(tiny_lm, monkeypatch):
    """Every decode step goes through the one step function (`LeanDecode.decode`; the modules run no step at all),
    and each answer, one of them capturing, equals the same request alone."""
    monkeypatch.setenv("PLAYGROUND_SMALL_BATCH", "all")          # the packed products too, on any machine
    runner = BatchRunner(tiny_lm, max_batch=8)
    modules = []
    rows = decode_steps(runner, monkeypatch)
    hook = tiny_lm.model.register_forward_pre_hook(lambda module, args, kwargs: modules.append(
        kwargs["input_ids"].shape), with_kwargs=True)
    jobs = [(GenerationRequest(tiny_prompt(n, seed=n), max_new_tokens=m, chat=False), policy)
            for n, m, policy in ((7, 12, CAPTURE_OFF), (12, 9, CapturePolicy(layers=(0, 1, 2))), (5, 6, CAPTURE_OFF))]
    kept = {}
    try:
        out = run_runner(tiny_lm, jobs, [0, 2, 3], runner, kept)
    finally:
        hook.remove()
    assert rows and max(rows) == 3
    assert modules == []                                       # prefills too go through the one forward
    for i, (records, (request, policy)) in enumerate(zip(out, jobs)):
        want, want_kept = generate_kept(tiny_lm, request, policy)
        same_tokens(records, want)
        assert_same_residual(kept[i], want_kept)


def test_a_capturing_request_alone_steps_as_one_row_without_the_packed_products(tiny_lm, monkeypatch):
    """One row that captures steps as any lone row does (its residual written at its slot inside the step) and keeps
    the one-row products: the fused packed ones serve 2 to 128 rows only (here its prompt's chunk)."""
    from engine.serving import lean as serving_lean

    monkeypatch.setenv("PLAYGROUND_SMALL_BATCH", "all")
    runner = BatchRunner(tiny_lm, max_batch=8)
    packed_rows = []
    product = serving_lean.packed_linear

    def counted(x, packed, bias):
        packed_rows.append(x.numel() // x.shape[-1])
        return product(x, packed, bias)
    monkeypatch.setattr(serving_lean, "packed_linear", counted)
    rows = decode_steps(runner, monkeypatch)
    request, policy, kept = GenerationRequest(tiny_prompt(8, seed=2), max_new_tokens=6, chat=False), FULL, {}
    (records,) = run_runner(tiny_lm, [(request, policy)], [0], runner, kept)
    assert rows == [1] * 5 and 1 not in packed_rows and packed_rows           # the prompt's 8 tokens: packed
    want, want_kept = generate_kept(tiny_lm, request, policy)
    same_tokens(records, want)
    assert_same_residual(kept[0], want_kept)


def test_a_matrix_stored_transposed_keeps_its_values_and_every_answer(tiny_model_dir, monkeypatch):
    """Where the row kernel is not built, the layout measured faster is the same parameter with other strides: the
    same logits, the same answers; moved into the huge-page mapping, still transposed, still the same values."""
    lm = load_model(str(tiny_model_dir), device="cpu", dtype="float32")
    request = GenerationRequest(tiny_prompt(10), max_new_tokens=12, chat=False)
    ids = encode_prompt(lm, request)
    before, text = model_logits(lm, ids), list(generate(lm, request))[-1].text
    monkeypatch.setattr("engine.core.layout.MIN_BYTES", 0)          # the tiny model's matrices count too
    monkeypatch.setattr("engine.core.layout.time_both", lambda w, rounds=5: (2.0, 1.0))   # "transposed is faster"
    kernels.use(False)
    try:
        timed = relayout(lm)
    finally:
        kernels.use(True)
    assert timed and all(changed for _, _, changed in timed.values())
    linears = [m for m in lm.model.modules() if isinstance(m, torch.nn.Linear)]
    assert all(not m.weight.is_contiguous() for m in linears)
    torch.testing.assert_close(model_logits(lm, ids), before, atol=1e-5, rtol=1e-5)
    assert list(generate(lm, request))[-1].text == text
    torch.testing.assert_close(lean_logits(lm, ids), before, atol=1e-5, rtol=1e-5)
    values = [m.weight.detach().clone() for m in linears]
    in_huge_pages(lm)
    params = list(lm.model.parameters())
    assert len({p.untyped_storage().data_ptr() for p in params}) == 1          # the transposed ones moved too
    assert all(not m.weight.is_contiguous() and torch.equal(m.weight, v) for m, v in zip(linears, values))
    torch.testing.assert_close(model_logits(lm, ids), before, atol=1e-5, rtol=1e-5)


def test_with_the_row_kernel_every_matrix_stays_as_stored_whatever_a_timing_would_say(tiny_model_dir, monkeypatch):
    """The layout does not depend on how busy the machine was at load: with the row kernel (a float32 model on the
    CPU) nothing is timed and nothing moves, even where a timing would call the transposed form faster (as one
    did on a 2-core machine while vLLM's server started beside ours: the lone step then lost its plan)."""
    assert kernels.row_kernel() is not None
    lm = load_model(str(tiny_model_dir), device="cpu", dtype="float32")
    monkeypatch.setattr("engine.core.layout.MIN_BYTES", 0)
    calls = []
    monkeypatch.setattr("engine.core.layout.time_both", lambda w, rounds=5: calls.append(w) or (2.0, 1.0))
    assert relayout(lm) == {} and calls == []
    assert all(m.weight.is_contiguous() for m in lm.model.modules() if isinstance(m, torch.nn.Linear))
    assert BatchRunner(lm, max_batch=4).lean.lone_fused() is not None      # the lone step's plan binds them


# --- the thread tuner ------------------------------------------------------------------------------------------------

def drive(tuner: ThreadTuner, cost: dict[int, float], steps: int, rows: int = 4) -> list[int]:
    """Steps whose time depends only on the thread count; the counts they ran with."""
    used = []
    for _ in range(steps):
        t = tuner.before_step()
        used.append(t)
        tuner.after_step(cost[t], rows, 0)
    return used


def test_the_tuner_keeps_the_faster_count_and_tries_again_less_and_less_often(monkeypatch):
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    tuner = ThreadTuner(2)
    used = drive(tuner, {2: 0.30, 1: 0.20}, 2 * TRIAL_STEPS + 100)
    assert used[:2 * TRIAL_STEPS] == [2, 1] * TRIAL_STEPS              # a trial first, alternating
    assert set(used[2 * TRIAL_STEPS:2 * TRIAL_STEPS + FIRST_HOLD]) == {1}   # then the faster, held
    choice = tuner.choice()
    assert choice.threads == 1 and choice.auto and choice.changes == 1
    assert dict((t, s) for t, s, _ in choice.measured) == {2: 0.30, 1: 0.20}
    assert "1 torch thread of 2 cores, measured" in choice.describe()
    trials = choice.trials
    drive(tuner, {2: 0.30, 1: 0.20}, 4000)
    assert trials < tuner.choice().trials < trials + 4000 // FIRST_HOLD // 2   # held longer each time it agrees


def test_a_count_far_slower_ends_the_trial_after_one_step(monkeypatch):
    """On a busy machine the wrong count can take several times as long: one such step is all a trial spends."""
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    tuner = ThreadTuner(2)
    used = drive(tuner, {2: 0.9, 1: 0.2}, 2 + FIRST_HOLD)
    assert used[:2] == [2, 1] and set(used[2:]) == {1}
    used = drive(tuner, {2: 0.9, 1: 0.2}, 400)
    assert used.count(2) == tuner.choice().trials - 1                   # each later trial: one step on 2 threads


def test_the_tuner_follows_a_change_in_the_load(monkeypatch):
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    tuner = ThreadTuner(2)
    drive(tuner, {2: 0.30, 1: 0.20}, 200)
    assert tuner.choice().threads == 1
    drive(tuner, {2: 0.10, 1: 0.20}, 2000)                             # the neighbours left
    assert tuner.choice().threads == 2


def test_fewer_threads_must_win_clearly_and_every_core_wins_back_on_a_small_margin(monkeypatch):
    """A lone request's 1-row steps differ by a few percent between the counts, as much as steps differ among
    themselves: leaving every core needs LEAVE_MARGIN, coming back needs MARGIN."""
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    tuner = ThreadTuner(2)
    drive(tuner, {2: 0.100, 1: 0.100 * (1 - LEAVE_MARGIN / 2)}, 500)     # one thread a little faster: noise
    assert tuner.choice().threads == 2 and tuner.choice().changes == 0
    drive(tuner, {2: 0.100, 1: 0.100 * (1 - 2 * LEAVE_MARGIN)}, 2000)   # clearly faster: a busy machine
    assert tuner.choice().threads == 1
    drive(tuner, {2: 0.100 * (1 - 2 * MARGIN), 1: 0.100}, 2000)         # every core a little faster again
    assert tuner.choice().threads == 2


def test_a_batch_that_grows_or_shrinks_is_tried_at_once_not_after_the_hold(monkeypatch):
    """The presenter alone (every core faster), then a room (one thread faster beside six browsers): the tuner
    tries again within a few steps of the room's start, not after the hundreds of steps its hold has grown to."""
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    tuner = ThreadTuner(2)
    drive(tuner, {2: 0.10, 1: 0.11}, 3000, rows=1)
    assert tuner.choice().threads == 2 and tuner.hold >= 256
    used = drive(tuner, {2: 0.60, 1: 0.20}, 40, rows=6)
    assert tuner.choice().threads == 1 and set(used[3:3 + FIRST_HOLD]) == {1}     # one step on 2, then a trial
    trials = tuner.choice().trials
    drive(tuner, {2: 0.60, 1: 0.20}, tuner.countdown - 1, rows=5)       # within RESIZE of the trial's rows: held
    assert tuner.choice().trials == trials
    drive(tuner, {2: 0.60, 1: 0.20}, 3, rows=12)                        # twice its rows: tried at once
    assert tuner.choice().trials == trials + 1


def test_a_step_that_prefills_runs_on_the_chosen_count_even_in_a_trial(monkeypatch):
    """A trial left on its other count when the batch drained must not hold the next long prompt's prefill there."""
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    tuner = ThreadTuner(2)
    assert tuner.before_step() == 2
    tuner.after_step(0.10, 1, 0)                                        # a trial's first step; its next is on 1
    assert [tuner.before_step(prefill=True) for _ in range(8)] == [2] * 8
    for _ in range(8):
        tuner.after_step(0.50, 1, 256)                                  # prefill chunks: not the trial's
    assert tuner.before_step() == 1                                     # the trial goes on with decode steps


def test_steps_that_prefill_or_differ_in_rows_do_not_decide(monkeypatch):
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    tuner = ThreadTuner(2)
    for _ in range(20):                                                 # prefill steps: not counted, order kept
        assert tuner.before_step() == 2
        tuner.after_step(9.0, 4, 100)
    assert tuner.choice().trials == 0


def test_a_fixed_count_is_never_tuned(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    assert fixed_threads({"PLAYGROUND_THREADS": "3"}) == 3 and fixed_threads({"OMP_NUM_THREADS": "2"}) == 2
    assert fixed_threads({}) is None and fixed_threads({"PLAYGROUND_THREADS": "auto"}) is None
    tuner = ThreadTuner(4, fixed=3)
    assert set(drive(tuner, {3: 0.1}, 50)) == {3} and calls == [3]
    assert "fixed" in tuner.choice().describe()
    assert ThreadTuner.for_device(torch.device("cuda")) is None


def test_the_pool_residual_is_written_in_place_when_compiled():
    """`PoolResidual.write` compiled by inductor (as the GPU path compiles the step that calls it) writes the new
    rows into the pool and allocates nothing of a layer's share of it: a write into a view of the pool
    (`resid[layer].index_copy_`) was functionalized into a copy of that whole [slots, d] view at every layer (a
    compiled SmolLM2 lone step took 171 ms a step that way, 45 ms in place). Eagerly it is the same copy either way."""
    from torch._inductor.utils import run_and_get_code

    from engine.core.lean import PoolResidual

    layers, slots, d = 3, 1237, 24                                     # sizes no other buffer has
    resid, where = torch.zeros(layers, slots, d), torch.tensor([5, 900, 17])
    x = torch.randn(1, 3, d)

    def write(x: torch.Tensor) -> torch.Tensor:
        PoolResidual(resid, where).write(1, x)
        return x + 1

    torch._dynamo.reset()
    _, (code, *_) = run_and_get_code(torch.compile(write, backend="inductor", fullgraph=True), x)
    # layer 1's other rows untouched, exactly: a float sum of x's 72 values against the same among 29,688 zeros (the
    # check before) parted in the last bit for some x
    others = torch.ones(slots, dtype=torch.bool)
    others[where] = False
    assert torch.equal(resid[1, where], x[0]) and resid[[0, 2]].abs().sum() == 0 and resid[1, others].abs().sum() == 0
    assert f"({slots}, {d})" not in code, "a buffer of the layer's [slots, d] share: the pool copied, not written"
