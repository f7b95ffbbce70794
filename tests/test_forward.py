"""The one forward (engine/core/lean.py) against its oracle, transformers' modules, for every family it covers: a
prefill chunk, a later chunk on a reused start, a decode row, the padded prefill of several newcomers, the residual it
writes (the one capture point) and whole greedy answers. The tests write their own tiny weights."""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import pytest
import torch
from transformers import DynamicCache

from conftest import TINY_CONFIG, assert_same_residual, tiny_prompt, write_tiny_tokenizer
from engine.core.generate import GenerationRequest, encode_prompt, generate, generate_kept
from engine.core.hooks import CapturePolicy
from engine.core.kept import KeptInputs, kept_for
from engine.core.lean import causal_mask, one_forward
from engine.core.loader import load_model
from engine.serving.batch import BatchRunner, Slot
from engine.serving.lean import pool_prefill

ATOL = 1e-5                                   # float32
EVERY = CapturePolicy(inputs=None)            # every hidden state kept


def _write(folder, family: str) -> None:
    import transformers

    config_class, model_class = {"llama": ("LlamaConfig", "LlamaForCausalLM"),
                                 "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
                                 "mistral": ("MistralConfig", "MistralForCausalLM")}[family]
    extra = {"sliding_window": None} if family == "mistral" else {}
    torch.manual_seed(7)
    config = getattr(transformers, config_class)(**TINY_CONFIG, **extra)
    getattr(transformers, model_class)(config).save_pretrained(folder, safe_serialization=True)
    write_tiny_tokenizer(folder, TINY_CONFIG["vocab_size"])


@pytest.fixture(scope="module", params=["llama", "qwen2", "mistral"])
def family_lm(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"tiny-{request.param}")
    _write(folder, request.param)
    lm = load_model(str(folder), device="cpu", dtype="float32")
    assert one_forward(lm) is not None, request.param
    return lm


@contextmanager
def modules_only(lm):
    """Every step through transformers' modules: a model whose `forward` was replaced keeps them (one_forward)."""
    lm.model.forward = lm.model.forward
    try:
        assert one_forward(lm) is None
        yield
    finally:
        del lm.model.forward


def random_ids(lm, n: int, seed: int) -> list[int]:
    return torch.randint(4, lm.spec.vocab_size, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def oracle(lm, ids: list[int]):
    """The modules over the whole sequence at once: logits [T, V], hidden states L + 1 of [T, d], the cache."""
    cache = DynamicCache(config=lm.model.config)
    with torch.inference_mode():
        out = lm.model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True, output_hidden_states=True)
    return out.logits[0], [h[0] for h in out.hidden_states], cache


def every_layer(lm, capacity: int = 64) -> KeptInputs:
    return KeptInputs(tuple(range(lm.spec.n_layers + 1)), lm.spec.d_model, lm.dtype, lm.device, capacity)


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, atol=ATOL * max(1.0, float(b.abs().max())), rtol=0)


def test_a_prefill_chunk_a_later_chunk_and_a_decode_row_equal_the_modules(family_lm):
    """Chunks of 12 and 7 tokens (the second on the first's K/V, as after a reused prefix), then one decode row:
    every position's logits, every residual the forward wrote and the K/V equal the modules over the whole."""
    lm, ids = family_lm, random_ids(family_lm, 20, seed=1)
    lean, cache, kept = one_forward(lm), DynamicCache(config=lm.model.config), every_layer(lm)
    with torch.inference_mode():
        logits = torch.cat([lean.on_cache(ids[:12], cache, kept, 12), lean.on_cache(ids[12:19], cache, kept, 7),
                            lean.on_cache(ids[19:], cache, kept)])
    want, hidden, want_cache = oracle(lm, ids)
    close(logits, want)
    assert kept.length == 20
    for i, h in enumerate(hidden):
        close(kept.input(i), h)
    for mine, theirs in zip(cache.layers, want_cache.layers):
        close(mine.keys, theirs.keys)
        close(mine.values, theirs.values)


def newcomer(lm, batch, ids: list[int], start: int) -> Slot:
    """A slot admitted to the paged pool whose first `start` tokens' K/V and residual are in it already (through the
    modules, as a reused prefix is)."""
    request = GenerationRequest("(token ids)", max_new_tokens=4, chat=False)
    slot = Slot(request, ids, EVERY, lambda r: None, pytest.fail, kept=every_layer(lm))
    slot.begin(lm)
    batch.admit(slot, lm.spec, lm.dtype, lm.device)
    if start:
        _, hidden, cache = oracle(lm, ids[:start])
        where = batch.load(slot, [layer.keys for layer in cache.layers], [layer.values for layer in cache.layers],
                           start)
        for i, h in enumerate(hidden):
            batch.pool.resid[i, where] = h
        slot.length = slot.prefilled = start
        slot.kept.commit(start)
    return slot


@pytest.mark.parametrize("route", ["forward", "modules"])
def test_the_padded_prefill_of_newcomers_with_reused_starts_equals_each_alone_through_the_modules(family_lm, route):
    """Rests of 6, 13 and 9 tokens on starts of 0, 5 and 11 (so both the starts and the rests are padded), written
    straight into the paged pool, through the one forward and through the modules: each row's logits, residual and
    K/V (read back from the pool) equal the modules over that row's whole prompt."""
    lm = family_lm
    prompts = [(random_ids(lm, n, seed=n), start) for n, start in ((6, 0), (18, 5), (20, 11))]
    batch = BatchRunner(lm, max_batch=8).batch
    group = [newcomer(lm, batch, ids, start) for ids, start in prompts]
    with torch.inference_mode(), (modules_only(lm) if route == "modules" else nullcontext()):
        logits = pool_prefill(lm, batch, group, [len(ids) - start for ids, start in prompts])
    for b, (slot, (ids, _)) in enumerate(zip(group, prompts)):
        slot.length = len(ids)
        slot.kept.commit(slot.length)
        want, hidden, want_cache = oracle(lm, ids)
        close(logits[b], want[-1])
        for i, h in enumerate(hidden):
            close(slot.kept.input(i), h)
        own = batch.own_cache(slot, lm.model.config)
        for mine, theirs in zip(own.layers, want_cache.layers):
            close(mine.keys, theirs.keys)
            close(mine.values, theirs.values)


BF16_TOL = 0.03      # bf16 weights on this CPU: |forward - modules| <= BF16_TOL * max |modules| (measured: under 0.01)


@pytest.fixture(scope="module", params=["llama", "qwen2", "mistral"])
def family_bf16(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"tiny-bf16-{request.param}")
    _write(folder, request.param)
    return load_model(str(folder), device="cpu", dtype="bfloat16")


def test_in_bf16_prefill_chunks_on_reused_starts_then_decode_rows_stay_within_the_stated_tolerance(family_bf16):
    """bf16 weights: the padded prefill of three newcomers (two on reused starts) into the pool, then a decode row
    each (a chunk of one), through the forward; logits and every kept residual within BF16_TOL of the modules'
    (bf16 too) over each row's whole sequence."""
    lm = family_bf16
    prompts = [(random_ids(lm, n, seed=n), start) for n, start in ((6, 0), (18, 5), (20, 11))]
    batch = BatchRunner(lm, max_batch=8).batch
    group = [newcomer(lm, batch, ids, start) for ids, start in prompts]
    worst = 0.0
    for step in range(2):
        chunks = [len(ids) - start for ids, start in prompts] if step == 0 else [1, 1, 1]
        if step:
            for (ids, _), slot in zip(prompts, group):
                ids.append(int(torch.randint(4, 90, (1,))))
        with torch.inference_mode():
            logits = pool_prefill(lm, batch, group, chunks)
        for b, (slot, (ids, _)) in enumerate(zip(group, prompts)):
            slot.length = len(ids)
            slot.kept.commit(slot.length)
            want, hidden, _ = oracle(lm, ids)
            pairs = [(logits[b], want[-1])] + [(slot.kept.input(i), h) for i, h in enumerate(hidden)]
            for got, ref in pairs:
                err = float((got.float() - ref.float()).abs().max() / ref.float().abs().max())
                worst = max(worst, err)
                assert err <= BF16_TOL, (step, b, err)
    print(f"bf16 worst relative error {worst:.4f}")


def test_whole_greedy_answers_and_residuals_equal_the_modules_alone(family_lm):
    lm = family_lm
    request, ids = GenerationRequest("(token ids)", max_new_tokens=24, chat=False), random_ids(lm, 11, seed=4)
    records, kept = generate_kept(lm, request, EVERY, ids)
    with modules_only(lm):
        want, want_kept = generate_kept(lm, request, EVERY, ids)
    assert [r.token.id for r in records if hasattr(r, "token")] == [r.token.id for r in want if hasattr(r, "token")]
    assert_same_residual(kept, want_kept)


def test_every_row_of_a_batch_keeps_its_own_residual_and_answer(tiny_lm):
    """Three requests, two of them capturing, joining at different steps (padded prefills, decode rows on the pool):
    each answer and each kept residual equal the same request alone through the modules. A step that wrote one
    row's residual at another's slots, or left one row's out, fails here."""
    jobs = [(GenerationRequest(tiny_prompt(n, seed=n), max_new_tokens=m, chat=False), policy)
            for n, m, policy in ((7, 10, EVERY), (12, 9, CapturePolicy(inputs=(0, 2, 3))), (5, 12, EVERY))]
    runner, out, kept = BatchRunner(tiny_lm, max_batch=8), [[] for _ in jobs], {}
    for step in range(40):
        if step < len(jobs):
            request, policy = jobs[step]
            ids = encode_prompt(tiny_lm, request)
            kept[step] = kept_for(tiny_lm, policy, len(ids) + request.max_new_tokens)
            runner.add(Slot(request, ids, policy, out[step].append, pytest.fail, kept=kept[step]))
        if not runner.idle:
            runner.step()
    assert runner.idle
    with modules_only(tiny_lm):
        for i, (request, policy) in enumerate(jobs):
            want, want_kept = generate_kept(tiny_lm, request, policy)
            assert [r.token.id for r in out[i] if hasattr(r, "token")] == [r.token.id for r in want
                                                                          if hasattr(r, "token")]
            assert_same_residual(kept[i], want_kept)


def test_a_family_the_forward_does_not_cover_keeps_the_modules(tmp_path):
    """Mistral with a sliding window: the modules' route, said why, and its answers are still the modules'."""
    from engine.core.lean import why_not

    lm_folder = tmp_path / "windowed"
    import transformers
    torch.manual_seed(3)
    config = transformers.MistralConfig(**TINY_CONFIG, sliding_window=8)
    transformers.MistralForCausalLM(config).save_pretrained(lm_folder, safe_serialization=True)
    write_tiny_tokenizer(lm_folder, TINY_CONFIG["vocab_size"])
    lm = load_model(str(lm_folder), device="cpu", dtype="float32")
    assert why_not(lm.model) == "sliding-window attention" and one_forward(lm) is None
    records = list(generate(lm, GenerationRequest(tiny_prompt(6), max_new_tokens=3, chat=False)))
    assert records[-1].generated_tokens == 3


@dataclass(eq=False)
class Row:
    """What the paged batch reads of a runner's slot."""

    length: int
    kept: object


def test_the_compiled_step_traces_whole_for_prefill_mixed_and_decode_steps_with_capture_on(family_lm):
    """The function a GPU compiles (engine.serving.lean.step, the one every eager step runs), compiled here with
    `fullgraph=True` on dynamo's eager backend, so that a graph break fails this test: a step of two prefill chunks
    (one padded), a padded step of one decode row and one chunk of four, then a decode step, on the paged pool with one row capturing. Every
    step's logits and the kept row's residual in the pool equal the modules over each row's whole sequence."""
    from engine.serving.lean import step as one_step
    from engine.serving.paged import BlockPool, PagedBatch

    lm, lean = family_lm, one_forward(family_lm)
    pool = BlockPool(lm.spec.n_layers, lm.spec.n_kv_heads, lm.spec.head_dim, lm.dtype, lm.device, 4, 16)
    pool.ensure_residual(lm.spec.d_model, lm.dtype)
    batch = PagedBatch(pool=pool)
    seqs = [random_ids(lm, 12, seed=21), random_ids(lm, 12, seed=22)]
    for kept in (True, None):
        slot = Row(length=0, kept=kept)
        batch.slots.append(slot)
        batch.tables[slot] = []
    step = torch.compile(one_step, fullgraph=True, backend="eager", dynamic=False)
    torch._dynamo.reset()
    for new in ([7, 5], [1, 4], [1, 1]):
        valid = batch.plan(new)
        t = max(new)
        ids = torch.tensor([[0] * (t - n) + seq[s.length:s.length + n] for s, seq, n in zip(batch.slots, seqs, new)])
        positions = torch.tensor([[0] * (t - n) + list(range(s.length, s.length + n))
                                  for s, n in zip(batch.slots, new)])
        with torch.no_grad():
            logits = step(lean, ids, positions, batch.write_and_gather, causal_mask(valid, t), pool.resid,
                          batch.residual_slots)[:, -1]
        for b, (slot, seq, n) in enumerate(zip(batch.slots, seqs, new)):
            slot.length += n
            close(logits[b], oracle(lm, seq[:slot.length])[0][-1])
    first = batch.slots[0]
    where = pool.slots(batch.tables[first], 0, first.length)
    for i, h in enumerate(oracle(lm, seqs[0][:first.length])[1]):
        close(pool.resid[i, where], h)


# --- the mixed step: decode rows and prefill chunks in ONE forward over the flattened step ---------------------------

@dataclass(eq=False)
class Token:
    id: int


def mixed_batch(lm):
    """A paged batch with three decode rows (prompts of 5, 17 and 9 tokens in the pool, the second capturing) and two
    newcomers (one from scratch, one on a reused start of 6): built the same way every time, so two copies hold the
    same numbers in the same slots."""
    from engine.serving.paged import PagedBatch

    batch = PagedBatch(block=4)
    rows = []
    for n, keeps in ((5, False), (17, True), (9, False)):
        ids = random_ids(lm, n + 1, seed=40 + n)
        slot = newcomer(lm, batch, ids, n)
        slot.kept = slot.kept if keeps else None
        slot.token = Token(ids[n])
        batch.join(slot)
        rows.append(slot)
    fresh = newcomer(lm, batch, random_ids(lm, 11, seed=51), 0)
    reused = newcomer(lm, batch, random_ids(lm, 14, seed=52), 6)
    return batch, rows, [fresh, reused], [11, 8]


def apart(lm, batch, rows, newcomers, chunks) -> torch.Tensor:
    """The same step run apart: the rows' decode step, then each chunk's prefill: logits [B + C, V]."""
    from engine.serving.lean import step

    lean = one_forward(lm)
    valid = batch.plan([1] * len(rows), slots=rows)
    ids = torch.tensor([[s.token.id] for s in rows])
    positions = torch.tensor([[s.length] for s in rows])
    with torch.inference_mode():
        logits = [step(lean, ids, positions, batch.write_and_gather, valid[:, None, None, :], batch.pool.resid,
                       batch.residual_slots)[:, -1]]
        logits += [pool_prefill(lm, batch, [slot], [n]) for slot, n in zip(newcomers, chunks)]
    return torch.cat(logits)


def test_a_mixed_step_equals_its_decode_rows_and_prefill_chunks_run_apart(family_lm, monkeypatch):
    """Three decode rows (one capturing) and two prompt chunks (every residual kept; one on a reused start) as ONE
    forward over the flattened step: every logit, the pool's K/V and every kept residual equal the same step run
    apart (within 1e-5 in float32). Then the mutations: a chunk's slots swapped with a row's, and a row's residual
    write dropped, each make the comparison fail."""
    from engine.serving.lean import mixed_step

    from engine.serving import lean as serving_lean
    from engine.serving.paged import SCRATCH

    lm, lean = family_lm, one_forward(family_lm)
    want_batch, *parts = mixed_batch(lm)
    want = apart(lm, want_batch, *parts)
    row = parts[0][1]
    new_slot = want_batch.pool.slots(want_batch.tables[row], row.length, row.length + 1)
    assert want_batch.pool.resid[:, new_slot].any()                   # the capturing row's residual: written

    def same_step() -> None:
        batch, rows, newcomers, chunks = mixed_batch(lm)
        got = mixed_step(lean, batch, rows, newcomers, chunks)
        assert got.shape == want.shape == (5, lm.spec.vocab_size)
        close(got, want)
        for mine, theirs in zip([*batch.pool.keys, *batch.pool.values, batch.pool.resid],
                                [*want_batch.pool.keys, *want_batch.pool.values, want_batch.pool.resid]):
            close(mine, theirs)
    same_step()
    rows_segment = serving_lean._rows_segment
    for mutation in (lambda flat: flat.write.append(flat.write.pop().flip(0)),                 # rows' slots swapped
                     lambda flat: flat.resid.append(torch.full_like(flat.resid.pop(), SCRATCH))):  # no residual
        def mutated(batch, rows, flat, mutation=mutation):
            out = rows_segment(batch, rows, flat)
            mutation(flat)
            return out
        monkeypatch.setattr(serving_lean, "_rows_segment", mutated)
        with pytest.raises(AssertionError):
            same_step()


def test_the_compiled_step_traces_whole_for_a_flattened_mixed_step_with_capture_on(family_lm):
    """The flattened mixed step (decode rows and prompt chunks as one [1, N] sequence, attention by segment) through
    the compiled step function, `fullgraph=True` on dynamo's eager backend (a graph break fails here, not on the
    GPU): the same logits, K/V and residual as the step run apart."""
    from engine.serving.lean import mixed_inputs, step

    lm, lean = family_lm, one_forward(family_lm)
    want_batch, *parts = mixed_batch(lm)
    want = apart(lm, want_batch, *parts)
    batch, rows, newcomers, chunks = mixed_batch(lm)
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="eager", dynamic=False)
    with torch.no_grad():
        got = compiled(lean, **mixed_inputs(batch, rows, newcomers, chunks))[0]
    close(got, want)
    close(batch.pool.resid, want_batch.pool.resid)
    close(batch.pool.keys[-1], want_batch.pool.keys[-1])
