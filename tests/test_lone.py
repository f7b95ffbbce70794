"""A lone row's products side by side (engine/core/lone.py, engine/core/layout.side_by_side), and the one-query
attention bench/lone_parts.py tries against SDPA."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.lone_parts import one_query  # noqa: E402
from conftest import tiny_prompt  # noqa: E402
from engine.core import matvec  # noqa: E402
from engine.core.generate import GenerationRequest, generate  # noqa: E402
from engine.core.hooks import CAPTURE_OFF  # noqa: E402
from engine.core.lean import Fused  # noqa: E402
from engine.serving.batch import BatchRunner  # noqa: E402
from test_lean import run_runner, same_tokens  # noqa: E402


def exact(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scaling: float) -> torch.Tensor:
    """The float64 attention, each query head on its own key head (head h reads key head h // G)."""
    group = q.shape[1] // keys.shape[1]
    k = keys.double().repeat_interleave(group, dim=1)
    v = values.double().repeat_interleave(group, dim=1)
    return ((q.double() @ k.transpose(-1, -2)) * scaling).softmax(-1) @ v


@pytest.mark.parametrize("heads,kv_heads,length", [(9, 3, 1), (9, 3, 37), (4, 4, 16), (8, 2, 300)])
def test_one_query_equals_the_float64_attention_and_sdpa(heads, kv_heads, length):
    g = torch.Generator().manual_seed(length)
    q = torch.randn(1, heads, 1, 64, generator=g)
    keys, values = (torch.randn(1, kv_heads, length, 64, generator=g) for _ in range(2))
    got = one_query(q, keys, values, None, 0.125)
    assert got.shape == (1, heads, 1, 64)
    np.testing.assert_allclose(got, exact(q, keys, values, 0.125).float(), atol=1e-5, rtol=1e-5)
    sdpa = F.scaled_dot_product_attention(q, keys, values, scale=0.125, enable_gqa=heads != kv_heads)
    np.testing.assert_allclose(got, sdpa, atol=1e-5, rtol=1e-5)


def test_it_reads_the_keys_where_the_pool_keeps_them():
    """The lone step hands the pool's rows as a strided view, [n, KVH, D] transposed to [1, KVH, n, D]; the result
    is the same as on contiguous copies, and head h reads key head h // G, not a neighbour's."""
    g = torch.Generator().manual_seed(7)
    pool_k, pool_v = torch.randn(50, 2, 8, generator=g), torch.randn(50, 2, 8, generator=g)
    keys, values = pool_k[10:30].transpose(0, 1)[None], pool_v[10:30].transpose(0, 1)[None]
    assert not keys.is_contiguous()
    q = torch.randn(1, 6, 1, 8, generator=g)
    got = one_query(q, keys, values, None, 0.5)
    np.testing.assert_allclose(got, one_query(q, keys.contiguous(), values.contiguous(), None, 0.5),
                               atol=1e-6, rtol=1e-6)
    np.testing.assert_allclose(got, exact(q, keys, values, 0.5).float(), atol=1e-5, rtol=1e-5)
    values_one_head = values.clone()
    values_one_head[0, 1] = 0.0                              # key head 1 read by query heads 3, 4, 5 only
    zeroed = one_query(q, keys, values_one_head, None, 0.5)
    assert torch.equal(zeroed[0, :3], got[0, :3]) and torch.count_nonzero(zeroed[0, 3:]) == 0


def test_what_is_not_one_query_of_one_row_is_sdpas_own_result():
    g = torch.Generator().manual_seed(3)
    keys, values = torch.randn(2, 2, 5, 8, generator=g), torch.randn(2, 2, 5, 8, generator=g)
    two_rows = torch.randn(2, 4, 1, 8, generator=g)
    mask = torch.rand(2, 1, 1, 5, generator=g) > 0.3
    mask[..., -1] = True
    for q, m in ((two_rows, None), (two_rows, mask)):
        want = F.scaled_dot_product_attention(q, keys, values, attn_mask=m, scale=0.3, enable_gqa=True)
        assert torch.equal(one_query(q, keys, values, m, 0.3), want)
    three_queries = torch.randn(1, 4, 3, 8, generator=g)
    want = F.scaled_dot_product_attention(three_queries, keys[:1, :, :3], values[:1, :, :3], is_causal=True,
                                          scale=0.3, enable_gqa=True)
    assert torch.equal(one_query(three_queries, keys[:1, :, :3], values[:1, :, :3], None, 0.3), want)


def test_weights_side_by_side_are_views_of_one_matrix_with_the_same_values_and_products():
    g = torch.Generator().manual_seed(5)
    params = [torch.nn.Parameter(torch.randn(n, 48, generator=g), requires_grad=False) for n in (32, 8, 8)]
    values = [p.detach().clone() for p in params]
    whole = matvec.side_by_side(params)
    assert whole is not None and whole.shape == (48, 48)
    assert all(torch.equal(p, v) for p, v in zip(params, values))
    assert matvec.addresses(whole, params) == [whole.data_ptr() + 4 * 48 * n for n in (0, 32, 40)]
    x = torch.randn(1, 1, 48, generator=g)
    together = matvec.product(whole, None)(x)
    apart = torch.cat([F.linear(x, v) for v in values], -1)
    np.testing.assert_allclose(together, apart, atol=1e-5, rtol=1e-5)
    params[1].data = params[1].data.clone()                  # pointed elsewhere: no longer one matrix
    assert matvec.addresses(whole, params) is None


def test_what_cannot_lie_side_by_side_is_left_as_it_was():
    g = torch.Generator().manual_seed(6)
    wide, narrow = torch.randn(8, 48, generator=g), torch.randn(8, 40, generator=g)
    transposed = torch.randn(48, 8, generator=g).t()
    half = torch.randn(8, 48, generator=g).half()
    for group in ([wide, narrow], [wide, transposed], [wide, half], [wide, wide], []):
        before = [w.data_ptr() for w in group]
        assert matvec.side_by_side(group) is None
        assert [w.data_ptr() for w in group] == before


def test_the_loader_lays_each_layers_groups_side_by_side_and_a_lone_step_makes_each_one_product(tiny_lm,
                                                                                                  monkeypatch):
    """q|k|v and gate|up of every layer lie in one matrix each; a lone request's steps make them as one product
    each, and its answer equals the same request alone (transformers' modules, tests/test_lean.py's check)."""
    layers = tiny_lm.model.model.layers
    assert len(tiny_lm.side_by_side) == len(layers)
    for layer, (qkv, gate_up) in zip(layers, tiny_lm.side_by_side):
        attn, mlp = layer.self_attn, layer.mlp
        assert matvec.addresses(qkv, [attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]) is not None
        assert matvec.addresses(gate_up, [mlp.gate_proj.weight, mlp.up_proj.weight]) is not None
    runner = BatchRunner(tiny_lm, max_batch=8)
    grouped = []
    forward = runner.lean.lean.forward
    monkeypatch.setattr(runner.lean.lean, "forward", lambda *a, fused=None, **k: grouped.append(
        fused if a[0].shape[1] == 1 else None) or forward(*a, fused=fused, **k))           # the one-token steps
    request = GenerationRequest(tiny_prompt(9, seed=4), max_new_tokens=20, chat=False)
    (records,) = run_runner(tiny_lm, [(request, CAPTURE_OFF)], [0], runner)
    lone = [f for f in grouped if f is not None]
    assert len(lone) == 19 and all(len(f) == len(layers) and isinstance(f[0], Fused) and f[0].qkv and f[0].gate_up
                                   for f in lone)
    same_tokens(records, list(generate(tiny_lm, request)))


def test_a_weight_pointed_elsewhere_takes_the_products_one_weight_at_a_time_and_the_same_answer(tiny_lm):
    runner = BatchRunner(tiny_lm, max_batch=8)
    assert runner.lean.lone_fused() is not None
    up = tiny_lm.model.model.layers[1].mlp.up_proj.weight
    kept = up.data
    try:
        up.data = kept.clone()
        assert runner.lean.lone_fused() is None
        request = GenerationRequest(tiny_prompt(7, seed=8), max_new_tokens=12, chat=False)
        (records,) = run_runner(tiny_lm, [(request, CAPTURE_OFF)], [0], runner)
        same_tokens(records, list(generate(tiny_lm, request)))
    finally:
        up.data = kept
    assert runner.lean.lone_fused() is not None


def test_side_by_side_adds_no_memory_once_loaded(tiny_lm):
    """Every parameter's bytes are held once: the groups' storages are exactly their weights, nothing left over."""
    params = {id(p): p for p in tiny_lm.model.parameters()}.values()
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in params}
    assert sum(storages.values()) == sum(p.numel() * p.element_size() for p in params)
    assert len(storages) < len(params)                      # q, k, v (and gate, up) share one storage per layer


def test_the_parts_bench_adds_up_on_the_tiny_model(tiny_model_dir, tmp_path):
    """bench/lone_parts.py on the tiny model: every way is timed bare and by parts; each part lies inside the
    forward, the forward inside the step (so the rest of the forward and the host's work are never negative); the
    grouped products show as q|k|v and gate|up, the apart ones one weight at a time; the answer is the same."""
    import json

    from bench import lone_parts

    out = tmp_path / "parts.json"
    before = [getattr(module, name) for module, name in lone_parts.GLOBALS]
    assert lone_parts.main(["--model", str(tiny_model_dir), "--threads", "1", "--rounds", "2", "--tokens", "10",
                            "--way", "now", "--way", "apart", "--out", str(out)]) == 0
    assert [getattr(module, name) for module, name in lone_parts.GLOBALS] == before     # put back
    assert matvec.PARTS == 4
    report = json.loads(out.read_text())
    assert report["same_text"] and report["floor"]["floor_ms"] > 0
    for way in ("now", "apart"):
        ms = report[way]["ms"]
        assert report[way]["bare"]["steps"] > 0 and report[way]["operators"]["calls"] > 0
        for rnd in report[way]["rounds_ms"]:                # medians of nested clocks keep their order
            assert all(v <= rnd["forward"] for k, v in rnd.items() if k not in ("forward", "step")
                       and not k.startswith("host"))
            assert rnd["forward"] <= rnd["step"] and rnd["rest of the forward"] >= -1e-9 and rnd["host"] >= 0
            assert 0 < rnd["host: pick and describe"] <= rnd["host"]
            assert rnd.get("host: logits sha256", 0) == 0        # the checksum is opt-in: nobody asked for it
        assert ms["products"] > 0
    assert "layer to attention (C)" in report["now"]["ms"] and "q" not in report["now"]["ms"]     # LonePlan's
    assert "q" in report["apart"]["ms"] and "qkv" not in report["apart"]["ms"]


def test_the_weights_move_into_one_mapping_advised_for_huge_pages_with_the_same_values_and_answer(tiny_model_dir):
    """engine.core.layout.in_huge_pages at load: every parameter one view of one mapping (the same Parameter
    objects and values), q|k|v and gate|up still side by side, and a lone request's answer unchanged; moved again
    without the advice (the bench's comparison), the same."""
    from engine.core.layout import in_huge_pages
    from engine.core.loader import load_model

    lm = load_model(str(tiny_model_dir), device="cpu", dtype="float32")
    params = list(lm.model.parameters())
    assert len({p.untyped_storage().data_ptr() for p in params}) == 1          # moved at load
    values = [p.detach().clone() for p in params]
    request = GenerationRequest(tiny_prompt(8, seed=12), max_new_tokens=12, chat=False)
    want = list(generate(lm, request))
    for advise in (False, True):
        before = [p.data_ptr() for p in params]
        assert in_huge_pages(lm, advise=advise) == sum(p.numel() * 4 for p in params)
        assert list(lm.model.parameters()) == params and [p.data_ptr() for p in params] != before
        assert all(torch.equal(p, v) for p, v in zip(params, values))
        assert len({p.untyped_storage().data_ptr() for p in params}) == 1
        for layer, (qkv, gate_up) in zip(lm.model.model.layers, lm.side_by_side):
            attn, mlp = layer.self_attn, layer.mlp
            assert matvec.addresses(qkv, [attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]) is not None
            assert matvec.addresses(gate_up, [mlp.gate_proj.weight, mlp.up_proj.weight]) is not None
        runner = BatchRunner(lm, max_batch=8)
        assert runner.lean.lone_fused() is not None
        (records,) = run_runner(lm, [(request, CAPTURE_OFF)], [0], runner)
        same_tokens(records, want)
