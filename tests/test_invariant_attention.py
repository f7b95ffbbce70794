"""The invariant mode's attention kernel (engine/core/kernels/attend.c, loaded by attend.py): SDPA's numbers within
float32 rounding (atol 1e-5, rtol 1e-5 on outputs of size ~1), and each query row's bits
independent of the other rows and their positions, of the thread count and of whether the row is a decode step or
a query of a prefill chunk of any length. A mutated copy of attend.c whose key blocks depend on the row count fails
the row check (it can fail); with no compiler, one warning and torch's invariant path. The whole forward with the
kernel in: tests/test_invariance.py."""
from __future__ import annotations

import logging

import pytest
import torch
from torch.nn import functional as F

from engine.core import invariant, kernels
from engine.core.kernels import attend
from engine.core.lean import causal_mask

SCALE = 0.125                     # 1 / sqrt(64)
TOLERANCE = dict(atol=1e-5, rtol=1e-5)


@pytest.fixture
def kernel():
    attend.forget()
    built = attend.attend_kernel()
    assert built is not None, attend.why_off()
    yield built


def qkv(b: int, t: int, s: int, seed: int, heads: int = 9, kv_heads: int = 3, d: int = 64):
    """q [b, heads, t, d], keys/values [b, kv_heads, s, d] (SmolLM2's heads), scores of a real model's spread."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(b, heads, t, d, generator=gen) * 2, torch.randn(b, kv_heads, s, d, generator=gen) * 2,
            torch.randn(b, kv_heads, s, d, generator=gen))


def batched(rows: list[tuple], pads: list[int]):
    """Single rows (q [1, H, T, D], keys, values [1, KVH, n, D]) left-padded to one width with a mask, as a batch's
    step runs them: q [B, H, T, D], keys/values [B, KVH, S, D], mask [B, 1, T, S]."""
    width = max(r[1].shape[2] + p for r, p in zip(rows, pads))
    keys = torch.cat([F.pad(r[1], (0, 0, width - r[1].shape[2], 0)) for r in rows])
    values = torch.cat([F.pad(r[2], (0, 0, width - r[2].shape[2], 0)) for r in rows])
    valid = torch.tensor([[col >= width - r[1].shape[2] for col in range(width)] for r in rows])
    return torch.cat([r[0] for r in rows]), keys, values, causal_mask(valid, rows[0][0].shape[2])


def row_keeps_its_bits(kernel: attend.AttendKernel, others: int, t: int = 1) -> bool:
    """Row 0 (300 keys) alone against the same row among `others` rows of other lengths (1 to 520 keys)."""
    me = qkv(1, t, 300, seed=1)
    alone = kernel.attention(*me, None, SCALE)
    rows = [me] + [qkv(1, t, 1 + 97 * i % 520, seed=10 + i) for i in range(others)]
    q, keys, values, mask = batched(rows, [0] * len(rows))
    return torch.equal(kernel.attention(q, keys, values, mask, SCALE)[:1], alone)


@pytest.mark.parametrize("b, t, s", [(1, 1, 1), (1, 1, 200), (20, 1, 130), (3, 5, 300), (1, 300, 300),
                                     (2, 64, 513)])
def test_it_gives_sdpas_numbers_within_float32_rounding(kernel, b, t, s):
    q, keys, values = qkv(b, t, s, seed=b * 1000 + s)
    valid = torch.ones(b, s, dtype=torch.bool)
    for r in range(b):
        valid[r, :(r * 17) % (s - t + 1)] = False                                # left pads
    mask = causal_mask(valid, t)
    causal = causal_mask(torch.ones(b, s, dtype=torch.bool), t)                  # what None stands for
    for m, want_mask in ((mask, mask), (None, causal)):
        want = F.scaled_dot_product_attention(q, keys, values, attn_mask=want_mask, scale=SCALE, enable_gqa=True)
        torch.testing.assert_close(kernel.attention(q, keys, values, m, SCALE), want, **TOLERANCE)


@pytest.mark.parametrize("others", [1, 6, 31])
@pytest.mark.parametrize("t", [1, 5])
def test_a_row_has_the_same_bits_alone_and_among_other_rows(kernel, others, t):
    assert row_keeps_its_bits(kernel, others, t)


def test_a_row_has_the_same_bits_behind_any_number_of_left_pads(kernel):
    me = qkv(1, 1, 150, seed=3)
    alone = kernel.attention(*me, None, SCALE)
    other = qkv(1, 1, 400, seed=4)
    for pads in (0, 1, 63, 64, 65, 250):
        q, keys, values, mask = batched([other, me], [0, pads])
        keys, values = F.pad(keys, (0, 0, 0, pads)), F.pad(values, (0, 0, 0, pads))  # keys past the row's end too
        mask = F.pad(mask, (0, pads), value=False)
        assert torch.equal(kernel.attention(q, keys, values, mask, SCALE)[1:], alone), pads


@pytest.mark.parametrize("chunk", [1, 7, 64, 256, 300])
def test_a_prefill_chunks_queries_have_the_bits_of_decode_steps(kernel, chunk):
    """A 300-token prompt's attention in chunks of `chunk` queries (each against every key before it and its own
    chunk's, causal) against each query as a decode step alone: bitwise."""
    q, keys, values = qkv(1, 300, 300, seed=5)
    steps = torch.cat([kernel.attention(q[:, :, i:i + 1], keys[:, :, :i + 1], values[:, :, :i + 1], None, SCALE)
                       for i in range(300)], dim=2)
    chunks = torch.cat([kernel.attention(q[:, :, lo:lo + chunk], keys[:, :, :lo + chunk], values[:, :, :lo + chunk],
                                         None, SCALE) for lo in range(0, 300, chunk)], dim=2)
    assert torch.equal(chunks, steps)


def test_one_two_and_three_threads_give_the_same_bits(kernel):
    q, keys, values = qkv(4, 9, 333, seed=6)
    outs = [kernel.attention(q, keys, values, None, SCALE, threads=n) for n in (1, 2, 3)]
    assert all(torch.equal(outs[0], o) for o in outs[1:])


def test_a_key_split_that_follows_the_row_count_fails_the_row_check(kernel, tmp_path, monkeypatch):
    """The mutation: attend.c with half-size key blocks whenever the call has more than one row; built and loaded as
    the kernel is, it gives a batched row other bits than alone, and the check above says so."""
    monkeypatch.setenv("PLAYGROUND_CACHE", str(tmp_path / "cache"))
    text = attend.SOURCE.read_text()
    fixed = "long block = KEY_BLOCK;"
    assert text.count(fixed) == 1
    source = tmp_path / "attend.c"
    source.write_text(text.replace(fixed, "long block = p->rows > 1 ? KEY_BLOCK / 2 : KEY_BLOCK;"))
    mutant = attend.AttendKernel(kernels.build(source))
    assert row_keeps_its_bits(kernel, 6) and not row_keeps_its_bits(mutant, 6)


def test_other_dtypes_take_torchs_invariant_path(kernel):
    q, keys, values = (x.to(torch.bfloat16) for x in qkv(2, 3, 100, seed=7))
    assert not kernel.fits(q, keys, values, None)
    assert torch.equal(invariant.attention(q, keys, values, None, SCALE),
                       invariant.torch_attention(q, keys, values, None, SCALE))


def test_without_a_compiler_one_warning_and_torchs_invariant_path(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("PLAYGROUND_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    attend.forget()
    q, keys, values = qkv(2, 3, 100, seed=8)
    try:
        with caplog.at_level(logging.WARNING, logger="engine.kernels"):
            first = invariant.attention(q, keys, values, None, SCALE)
            invariant.attention(q, keys, values, None, SCALE)
        assert attend.attend_kernel() is None and "no C compiler found" in attend.why_off()
    finally:
        attend.forget()
    warnings = [r.getMessage() for r in caplog.records if r.name == "engine.kernels"]
    assert len(warnings) == 1 and "attention kernel off" in warnings[0]
    assert torch.equal(first, invariant.torch_attention(q, keys, values, None, SCALE))
