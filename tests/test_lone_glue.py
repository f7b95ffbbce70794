"""The forward's work around the products made with fewer calls in torch's operators (engine/core/lean.py's
TorchGlue: `rms_norm` without its no-op casts, `rotary` once over a lone row's q|k side by side) gives the same bits
as the operations it replaced, kept here as they were at 2274b52 (transformers' apply_rotary_pos_emb on q and k
apart, the norm with its casts). The same work in C (CGlue) is tests/test_glue.py's."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine.core import lean as lean_module, matvec  # noqa: E402
from engine.core.lean import LeanStep, lean_step_for  # noqa: E402
from engine.core.lone import SideBySide  # noqa: E402


def norm_before(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """engine.core.lean.rms_norm at 2274b52."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


class Before(LeanStep):
    """The forward with q and k rotated apart by transformers' apply_rotary_pos_emb, as at 2274b52."""

    def _rotated(self, h, w, g, linear, f):
        b, t = h.shape[:2]
        d, kvd = self.heads * self.head_dim, self.kv_heads * self.head_dim
        q, k, v = f.qkv(h).split((d, kvd, kvd), dim=-1) if f.qkv else (linear(h, *p) for p in (w.q, w.k, w.v))
        q = q.view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, g.cos.squeeze(1), g.sin.squeeze(1))
        return q, k, v


class Kept:
    """Every residual the forward writes, copied."""

    def __init__(self):
        self.seen: list[torch.Tensor] = []

    def write(self, layer: int, x: torch.Tensor) -> None:
        self.seen.append(x.clone())


def decode(step: LeanStep, ids: torch.Tensor, tokens: int, linear, fused) -> tuple[list, list]:
    """Prefill `ids` [B, T], then `tokens` greedy steps: every step's logits and residuals."""
    store: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def kv(i, k, v):
        if i in store:
            k, v = (torch.cat([old, new], dim=2) for old, new in zip(store[i], (k, v)))
        store[i] = (k, v)
        return k, v
    logits, resid, start = [], [], 0
    with torch.inference_mode():
        for _ in range(tokens + 1):
            b, t = ids.shape
            positions = torch.arange(start, start + t)[None].expand(b, t)
            keep = Kept()
            out = step.forward(ids, positions, kv, None, keep, linear=linear, fused=fused)
            logits.append(out)
            resid += keep.seen
            start += t
            ids = out[:, -1].argmax(-1)[:, None]
    return logits, resid


@pytest.fixture
def torch_glue():
    """glue.c off for one test: the forward's glue in torch's operators (TorchGlue)."""
    from engine.core.kernels import glue
    glue.GLUE.use(False)
    yield
    glue.GLUE.use(True)


def same_bits(got: list, want: list) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("side_by_side", [True, False])
def test_the_step_gives_the_bits_of_the_operations_it_replaced(tiny_lm, monkeypatch, torch_glue, rows, side_by_side):
    """A lone row (q|k rotated as one where they are one product) and two rows (each rotated apart): the logits of
    a prefill and of every decode step, and every residual, bitwise those of the forward as it was (the glue in
    torch's operators: glue.c off)."""
    now = lean_step_for(tiny_lm)
    fused = SideBySide(now).fused() if side_by_side else None
    assert (fused is not None) == side_by_side        # the loader laid the tiny model's groups side by side
    ids = torch.randint(3, 80, (rows, 6), generator=torch.Generator().manual_seed(rows))
    got = decode(now, ids, 5, matvec.linear, fused)
    monkeypatch.setattr(lean_module, "rms_norm", norm_before)
    want = decode(Before(tiny_lm), ids, 5, matvec.linear, fused)
    same_bits(got[0], want[0])
    same_bits(got[1], want[1])
    assert len(got[1]) == 6 * (len(now.layers) + 1)


def test_the_norm_keeps_its_casts_for_another_dtype():
    """bfloat16 in: computed in float32 and cast back, as transformers' LlamaRMSNorm."""
    x, weight = torch.randn(2, 3, 16, dtype=torch.bfloat16), torch.randn(16, dtype=torch.bfloat16)
    assert torch.equal(lean_module.rms_norm(x, weight, 1e-6), norm_before(x, weight, 1e-6))
    x = torch.randn(2, 3, 16)
    assert torch.equal(lean_module.rms_norm(x, weight.float(), 1e-6), norm_before(x, weight.float(), 1e-6))
    assert torch.equal(lean_module.rotary(x[:, None], x[:, None] * 0 + 0.5, x[:, None] * 0 - 0.25),
                       apply_rotary_pos_emb(x[:, None], x[:, None], torch.full_like(x, 0.5),
                                            torch.full_like(x, -0.25))[0])


def test_the_glue_bench_runs_both_trees_on_the_tiny_model(tiny_model_dir, tmp_path):
    """bench/lone_glue.py with this tree on both sides: the same logits' hash, each way's operator counts and the
    product call's cost, and a result file with its provenance."""
    import json

    from bench import lone_glue
    out = tmp_path / "glue.json"
    root = Path(__file__).resolve().parent.parent
    assert lone_glue.main(["--model", str(tiny_model_dir), "--before", str(root), "--rounds", "1", "--tokens", "12",
                           "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["same_logits"] and d["provenance"]["name"] == "lone_glue"
    for way in ("before", "after"):
        w = d["ways"][way]
        assert w["ops_per_step"] > 0 and w["allocations_per_step"] > 0 and w["wall_ms"] > 0
        assert 0 < w["call_us"]["ctypes call"] and 0 < w["call_us"]["matvec.linear"]
        assert w["own_ms_per_step"]


def one_row_before(batch, slot):
    """engine.serving.lean.one_row (and its _reader) as at 84db7f9: the slot written through indexing, the keys read
    as a slice, transposed and unsqueezed (returned as one_row returns its `kv` now, the slot as `.write`)."""
    pool, block, n = batch.pool, batch.block, slot.length
    table = batch.tables[slot]
    if n == len(table) * block:
        table.append(pool.allocate())
    write = table[n // block] * block + n % block
    first = table[0]
    if table == list(range(first, first + len(table))):
        def take(p):
            return p[first * block:first * block + n + 1]
    else:
        index = (torch.tensor(table)[:, None] * block + torch.arange(block)).flatten()[:n + 1]

        def take(p):
            return p.index_select(0, index)

    def kv(i, k, v):
        keys, values = pool.keys[i], pool.values[i]
        keys[write].copy_(k[0, :, 0])
        values[write].copy_(v[0, :, 0])
        return take(keys).transpose(0, 1)[None], take(values).transpose(0, 1)[None]
    kv.write = write                        # the new token's slot, where one_row keeps it now
    return kv


def run_kept(lm, jobs, joins, monkeypatch=None, ends_in_c=True):
    """run_runner over `jobs`, every decode step's logits as returned (not copied: a product's output reused by the
    next step would show here) and each job's kept residual per layer; with `monkeypatch`, the path as at 84db7f9:
    the old one_row, and each product through matvec.linear (q|k|v and gate|up side by side); `ends_in_c`: the
    runner's LeanDecode.ends_in_c."""
    from engine.serving import lean as serving_lean
    from engine.serving.batch import BatchRunner
    from test_lean import run_runner
    runner = BatchRunner(lm, max_batch=8)
    runner.lean.ends_in_c = ends_in_c
    if monkeypatch is not None:
        monkeypatch.setattr(serving_lean, "one_row", one_row_before)
        monkeypatch.setattr(runner.lean, "lone_step", lambda: ((runner.lean.linear, runner.lean.lone_fused()), None))
        runner.lean.plan_layers = False
    logits, decode = [], runner.lean.decode
    runner.lean.decode = lambda batch, slots: logits.append(decode(batch, slots)) or logits[-1]
    kept: dict = {}
    records = run_runner(lm, jobs, joins, runner, kept)
    resid = {i: [k.input(layer) for layer in k.layers] for i, k in kept.items() if k is not None}
    return records, logits, resid


@pytest.mark.parametrize("joins", [(0,), (0, 0)], ids=["alone", "alone after a neighbour left"])
def test_a_lone_step_bound_once_gives_the_bits_of_the_step_before(tiny_lm, monkeypatch, joins):
    """The lone step's products bound once (engine.core.lone.SideBySide.bound, matvec.Bound: outputs reused) and its
    K/V written and read through one view each (engine.serving.lean.one_row, `rows`): every decode step's logits
    (kept as returned, across steps) and every kept residual bitwise those of the step as it was at 84db7f9. Alone
    from the start its blocks follow one another (read in place); after a neighbour left they interleave
    (gathered). 40 tokens: past two 16-token blocks."""
    from engine.core.hooks import CapturePolicy
    from engine.core.generate import GenerationRequest
    from conftest import tiny_prompt
    jobs = [(GenerationRequest(tiny_prompt(9, seed=3), max_new_tokens=40, chat=False), CapturePolicy(logit_lens=3)),
            (GenerationRequest(tiny_prompt(5, seed=4), max_new_tokens=6, chat=False), CapturePolicy(logit_lens=3))]
    jobs = jobs[:len(joins)]
    got = run_kept(tiny_lm, jobs, list(joins))
    bound = [f for f in got[1] if f.shape[0] == 1]
    assert len(bound) >= 30
    want = run_kept(tiny_lm, jobs, list(joins), monkeypatch)
    assert [r.token.id for r in got[0][0] if hasattr(r, "token")] == [r.token.id for r in want[0][0]
                                                                      if hasattr(r, "token")]
    same_bits(got[1], want[1])
    assert got[2].keys() == want[2].keys() and got[2]
    for i in got[2]:
        same_bits(got[2][i], want[2][i])


def test_the_lone_products_are_bound_once_and_each_reuses_its_output(tiny_lm):
    """bound(): every product of the tiny model's lone step bound (o, down and the head by weight, q|k|v and gate|up
    as Fused), made once; a layer's product writes into the same tensor each call, the head into a new one."""
    from engine.core import kernels
    grouped = SideBySide(lean_step_for(tiny_lm))
    linear, fused = grouped.bound()
    again = grouped.bound()
    assert again[0] is linear and again[1] is fused
    layers = grouped.lean.layers
    assert len(linear.by_id) == 2 * len(layers) + 1 and len(fused) == len(layers)
    w = layers[0]
    x = torch.randn(1, 1, w.o[0].shape[1])
    with torch.inference_mode():
        first = linear(x, *w.o)
        assert torch.equal(first, kernel_linear(x, *w.o))
        assert linear(x * 2, *w.o) is first and torch.equal(first, kernel_linear(x * 2, *w.o))
        head = grouped.lean.head
        assert linear(x, *head) is not linear(x, *head)
        two = torch.randn(2, 1, x.shape[-1])                 # not one row: the general product, a new tensor
        assert torch.equal(linear(two, *w.o), kernels.row_kernel().linear(two.view(2, -1), *w.o).view(2, 1, -1))
        qkv = fused[0].qkv(x)
        assert fused[0].qkv(x) is qkv


def kernel_linear(x, weight, bias):
    """The row kernel's product as `linear` makes it (engine.core.matvec.linear): the reference for a bound one."""
    return matvec.linear(x, weight, bias)


def test_a_moved_weight_unbinds_the_lone_products_and_the_step_reads_the_new_values(tiny_lm):
    """A weight that only `bound()` binds (o, down: not side by side) pointed at new values: bound() is None, and a
    lone request's answer is that of the model with the new values (transformers' modules), not of the old ones."""
    from engine.core.generate import GenerationRequest, generate
    from engine.core.hooks import CAPTURE_OFF
    from engine.serving.batch import BatchRunner
    from conftest import tiny_prompt
    from test_lean import run_runner, same_tokens
    runner = BatchRunner(tiny_lm, max_batch=8)
    assert runner.lean.side_by_side.bound() is not None
    down = tiny_lm.model.model.layers[0].mlp.down_proj.weight
    kept = down.data
    try:
        down.data = kept * 3
        assert runner.lean.side_by_side.bound() is None
        request = GenerationRequest(tiny_prompt(7, seed=8), max_new_tokens=12, chat=False)
        (records,) = run_runner(tiny_lm, [(request, CAPTURE_OFF)], [0], runner)
        same_tokens(records, list(generate(tiny_lm, request)))
    finally:
        down.data = kept
    assert runner.lean.side_by_side.bound() is not None


@pytest.mark.parametrize("capture", [True, False], ids=["its residual kept", "nothing kept"])
def test_a_lone_token_in_one_call_gives_the_bits_of_its_ends_made_apart(tiny_lm, monkeypatch, capture):
    """LonePlan.token (glue.c's lone_token: the embedding row, every layer, the final residual, the final norm and
    the head in one call, the rotary table read from the plan's memo) against the same plan with those ends made
    from Python around `layers_at_once` (LeanDecode.ends_in_c off): every decode step's logits and every kept
    residual bitwise the same, and the one call made every lone step."""
    from engine.core.hooks import CAPTURE_OFF, CapturePolicy
    from engine.core.generate import GenerationRequest
    from engine.core.lone import LonePlan
    from conftest import tiny_prompt
    jobs = [(GenerationRequest(tiny_prompt(9, seed=5), max_new_tokens=24, chat=False),
             CapturePolicy(logit_lens=3) if capture else CAPTURE_OFF)]
    calls = []
    token = LonePlan.token
    monkeypatch.setattr(LonePlan, "token", lambda self, *a: calls.append(a[:2]) or token(self, *a))
    got = run_kept(tiny_lm, jobs, [0])
    assert len(calls) == len([f for f in got[1] if f.shape[0] == 1]) >= 20
    assert [p for _, p in calls] == list(range(calls[0][1], calls[0][1] + len(calls)))    # each its own position
    apart = []
    monkeypatch.setattr(LonePlan, "token", lambda self, *a: apart.append(a) or token(self, *a))
    want = run_kept(tiny_lm, jobs, [0], ends_in_c=False)
    assert not apart
    same_bits(got[1], want[1])
    assert got[2].keys() == want[2].keys() and bool(got[2]) == capture
    for i in got[2]:
        same_bits(got[2][i], want[2][i])


def test_the_plans_rotary_table_is_the_models_own_at_every_position(tiny_lm, monkeypatch):
    """LonePlan.rotary_at: cos and sin as the model's rotary makes them for that one position, bitwise, under the
    memo's limit (kept, read again) and past it (made each call into the spare row); a rope whose table depends on
    more than the position keeps nothing."""
    import ctypes
    from engine.core import lone
    plan = SideBySide(lean_step_for(tiny_lm))
    assert plan.bound() is not None
    plan = plan.plan()
    monkeypatch.setattr(lone, "ROTARY_MEMO", 5)
    plan._table = None
    dim = plan.q.shape[-1]

    def read(at: int) -> torch.Tensor:
        return torch.tensor((ctypes.c_float * dim).from_address(at)[:])

    for position in (0, 3, 3, 4, 5, 9, 9, 200):
        cos, sin = tiny_lm.model.model.rotary_emb(plan.x, torch.tensor([[position]]))
        at = plan.rotary_at(position)
        assert torch.equal(read(at[0]), cos[0, 0]) and torch.equal(read(at[1]), sin[0, 0]), position
    assert bytes(plan._memo) == bytes([1, 0, 0, 1, 1])
    plan._table = None
    monkeypatch.setattr(plan._rotary, "rope_type", "dynamic")
    plan.rotary_at(2)
    assert len(plan._memo) == 0


def test_a_moved_embedding_or_final_norm_unbinds_the_lone_token(tiny_lm):
    """What LonePlan.token reads besides the bound products, the embedding and the final norm, is checked with them
    each step: either pointed at new values, bound() is None (the step reads the new values through the forward)."""
    grouped = SideBySide(lean_step_for(tiny_lm))
    assert grouped.bound() is not None and grouped.plan().takes_token()
    for param in (tiny_lm.model.model.norm.weight, tiny_lm.model.model.embed_tokens.weight):
        kept = param.data
        try:
            param.data = kept.clone()
            assert grouped.bound() is None
        finally:
            param.data = kept
        assert grouped.bound() is not None


def test_a_token_outside_the_embedding_is_refused_before_c_reads_it(tiny_lm):
    """LonePlan.token reads the token's embedding row by address: an id past its rows (or negative) raises, as
    F.embedding does, instead of reading other memory."""
    grouped = SideBySide(lean_step_for(tiny_lm))
    assert grouped.bound() is not None
    plan, rows = grouped.plan(), tiny_lm.model.model.embed_tokens.weight.shape[0]
    for token in (rows, -1):
        with pytest.raises(IndexError, match="outside the embedding"):
            plan.token(token, 0, [], [], None, 0, 0, 0, 1)
