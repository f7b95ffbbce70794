"""The invariant mode's attention kernel (engine/core/kernels/attend.c, loaded by attend.py): SDPA's numbers within
float32 rounding (atol 1e-5, rtol 1e-5 on outputs of size ~1), and each query row's bits
independent of the other rows and their positions, of the thread count and of whether the row is a decode step or
a query of a prefill chunk of any length. A mutated copy of attend.c whose key blocks depend on the row count fails
the row check (it can fail); with no compiler, one warning and torch's invariant path. attend.c builds for every x86
vector width (SSE's 4 lanes, AVX2's 8, AVX-512's 16) and, where the CPU fuses multiply-adds, each width gives the
same bits (a mutated copy whose weights' sum follows the width fails that check). The whole forward with the
kernel in: tests/test_invariance.py."""
from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

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


def test_a_lone_rows_kv_heads_dealt_to_two_or_three_threads_give_the_bits_of_one(kernel):
    """attend_row, as a lone step's layers call it in C (glue.c's lone_layers, on torch's team): one query a head
    against 150 keys (two blocks, the second short), its 3 kv heads dealt to the threads, against the same row on one
    thread."""
    q, keys, values = qkv(1, 1, 150, seed=7)
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


# x86 targets attend.c must build for, whatever this machine is: its vector is the widest the target has (SSE's 4
# lanes, AVX2's 8, AVX-512's 16), its tiles fit that target's registers. (-march, the CPU flag a machine needs to run
# the build, whether the target fuses multiply-adds: the bits are the same across the targets that do)
TARGETS = [("x86-64", "sse2", False), ("x86-64-v3", "avx2", True), ("skylake-avx512", "avx512f", True)]
WIDTHS = (4, 8, 16)               # -DLANES: every vector width built for this CPU, each compared bit for bit
CPU_FLAGS = kernels._cpu_flags().split()


def build_as(source: Path, made: Path, march: str = "native", lanes: int | None = None) -> Path:
    """`source` built with the kernel's flags, -march=`march` in place of native, and LANES named where given."""
    flags = [f"-march={march}" if f == "-march=native" else f for f in kernels.FLAGS]
    flags += [f"-DLANES={lanes}"] if lanes else []
    done = subprocess.run([kernels.compiler(), *flags, "-o", str(made), str(source)], capture_output=True, text=True,
                          timeout=kernels.BUILD_SECONDS)
    assert done.returncode == 0, done.stderr[-2000:]
    return made


def width_cases():
    """A batch's decode step (left pads, a mask; keys past 8 blocks) and a prefill chunk, causal (None)."""
    q, keys, values = qkv(3, 1, 600, seed=11)
    valid = torch.ones(3, 600, dtype=torch.bool)
    valid[1, :37], valid[2, :300] = False, False
    yield q, keys, values, causal_mask(valid, 1)
    yield (*qkv(1, 130, 300, seed=12), None)


def outputs(kernel: attend.AttendKernel) -> list[torch.Tensor]:
    return [kernel.attention(q, keys, values, mask, SCALE) for q, keys, values, mask in width_cases()]


def exact(q, keys, values, mask) -> torch.Tensor:
    """The attention in float64 (torch's SDPA on doubles): what every build is within float32's rounding of."""
    t, s = q.shape[2], keys.shape[2]
    mask = torch.ones(t, s, dtype=torch.bool).tril(s - t) if mask is None else mask
    q, keys, values = (x.double() for x in (q, keys, values))
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=SCALE, enable_gqa=True)


def widths_agree(source: Path, folder: Path) -> bool:
    """`source` built at each of WIDTHS for this CPU (into `folder`, a new one per source: a loaded library is never
    written over): the same bits from every width, case by case."""
    folder.mkdir()
    runs = [outputs(attend.AttendKernel(build_as(source, folder / f"attend-{n}.so", lanes=n))) for n in WIDTHS]
    return all(torch.equal(a, b) for run in runs[1:] for a, b in zip(runs[0], run))


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86 targets")
@pytest.mark.parametrize("march,flag,fused", TARGETS)
def test_it_builds_for_every_x86_target_and_the_fused_ones_give_the_same_bits(kernel, march, flag, fused, tmp_path):
    """A build this CPU can run is loaded and checked against float64 attention; one whose target fuses
    multiply-adds gives the bits of this machine's own build where this CPU fuses them too (here AVX2's x86-64-v3
    equals -march=native; on an AVX-512 machine skylake-avx512 and x86-64-v3 both equal its build, so each other)."""
    made = build_as(attend.SOURCE, tmp_path / f"attend-{march}.so", march=march)
    if flag not in CPU_FLAGS:
        return                                                                  # built; this CPU cannot run it
    built = attend.AttendKernel(made)
    for case, out in zip(width_cases(), outputs(built)):
        torch.testing.assert_close(out.double(), exact(*case), atol=1e-5, rtol=1e-5)
    if fused and "fma" in CPU_FLAGS:
        assert all(torch.equal(a, b) for a, b in zip(outputs(built), outputs(kernel)))


@pytest.mark.skipif("fma" not in CPU_FLAGS, reason="the widths share their bits where multiply-adds are fused")
def test_every_vector_width_gives_a_query_the_same_bits(kernel, tmp_path):
    """4, 8 and 16 lanes built for this CPU (16 split in two halves without AVX-512, as an AVX2 build of attend.c's
    first version was): one order per query whatever the width, so the same bits, and the native build's."""
    assert widths_agree(attend.SOURCE, tmp_path / "widths")
    eight = outputs(attend.AttendKernel(build_as(attend.SOURCE, tmp_path / "attend-8.so", lanes=8)))
    assert all(torch.equal(a, b) for a, b in zip(eight, outputs(kernel)))


@pytest.mark.skipif("fma" not in CPU_FLAGS, reason="the widths share their bits where multiply-adds are fused")
def test_a_weights_sum_that_follows_the_vector_width_fails_the_width_check(tmp_path):
    """The mutation: the block's weights added in vectors of the build's width (lanes j and j + LANES / 2 first), not
    in 16 lanes: each build's own order, so 4, 8 and 16 lanes give a query other bits, and the check above says so."""
    text = attend.SOURCE.read_text()
    fixed = "#define PARTS (SUM_LANES / LANES)"
    assert text.count(fixed) == 1 and text.count("sums[c % PARTS] = sums[c % PARTS] + w;") == 1
    source = tmp_path / "attend.c"
    source.write_text(text.replace(fixed, "#define PARTS 1"))
    assert widths_agree(attend.SOURCE, tmp_path / "kept") and not widths_agree(source, tmp_path / "mutant")
