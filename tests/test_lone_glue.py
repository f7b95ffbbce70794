"""The forward's work around the products made with fewer calls (engine/core/lean.py: `rms_norm` without its no-op
casts, `rotary` once over a lone row's q|k side by side) gives the same bits as the operations it replaced, kept
here as they were at 2274b52 (transformers' apply_rotary_pos_emb on q and k apart, the norm with its casts)."""
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

    def _rotated(self, h, w, cos, sin, linear, f):
        b, t = h.shape[:2]
        d, kvd = self.heads * self.head_dim, self.kv_heads * self.head_dim
        q, k, v = f.qkv(h).split((d, kvd, kvd), dim=-1) if f.qkv else (linear(h, *p) for p in (w.q, w.k, w.v))
        q = q.view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos.squeeze(1), sin.squeeze(1))
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


def same_bits(got: list, want: list) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("side_by_side", [True, False])
def test_the_step_gives_the_bits_of_the_operations_it_replaced(tiny_lm, monkeypatch, rows, side_by_side):
    """A lone row (q|k rotated as one where they are one product) and two rows (each rotated apart): the logits of
    a prefill and of every decode step, and every residual, bitwise those of the forward as it was."""
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
