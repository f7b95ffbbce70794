"""glue.c (engine/core/kernels/glue.py): the RMS norm, the rotary and the gated SiLU in C, against torch's operators
(transformers' arithmetic: engine.core.lean.TorchGlue) and float64, and each row's bits the same whatever the other
rows and the thread count."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine.core import lean  # noqa: E402
from engine.core.kernels.glue import glue_kernel  # noqa: E402

pytestmark = pytest.mark.skipif(glue_kernel() is None, reason="glue.c could not be built here")
ROWS = (1, 2, 7, 31, 32, 70)       # PARALLEL_ROWS (32) and either side of it


@pytest.fixture(scope="module")
def glue():
    return glue_kernel()


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("d", [576, 64, 50, 17])
def test_the_norm_is_transformers_rms_norm_to_float32s_precision(glue, d):
    """Against float64 within a few ulps, and against transformers' operators (TorchGlue.norm) as closely: only the
    sum of squares' order differs. d not a multiple of 16: the tail in order."""
    x = torch.randn(3, 5, d, generator=gen(d)) * 3
    w = torch.randn(d, generator=gen(d + 1))
    got = glue.norm(x, w, 1e-5)
    x64 = x.double()
    want = w.double() * (x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-5))
    torch.testing.assert_close(got.double(), want, rtol=4e-7, atol=1e-6)
    torch.testing.assert_close(got, lean.rms_norm(x, w, 1e-5), rtol=4e-7, atol=1e-6)
    assert got.shape == x.shape and got.dtype == torch.float32


def test_the_norm_reads_a_slice_whose_rows_are_strided(glue):
    """The final norm's input is the last position of each row, x[:, -1:]: rows apart in memory."""
    x, w = torch.randn(4, 6, 64, generator=gen(2)), torch.randn(64, generator=gen(3))
    assert torch.equal(glue.norm(x[:, -1:], w, 1e-6), glue.norm(x[:, -1:].contiguous(), w, 1e-6))


@pytest.mark.parametrize("heads", [1, 3, 12])
def test_rope_is_bitwise_transformers_rotary(glue, heads):
    """In place on a product's columns (q|k side by side, v after them, which it leaves alone), bitwise
    transformers' x * cos + rotate_half(x) * sin (engine.core.lean.rotary is tested equal to apply_rotary_pos_emb)."""
    b, t, dim = 2, 5, 64
    qkv = torch.randn(b, t, (heads + 2) * dim, generator=gen(heads)) * 4
    angles = torch.randn(b, t, dim, generator=gen(heads + 9)) * 10
    cos, sin = angles.cos(), angles.sin()
    want = lean.rotary(qkv[..., :heads * dim].view(b, t, heads, dim).transpose(1, 2), cos[:, None], sin[:, None])
    v = qkv[..., heads * dim:].clone()
    glue.rope_(qkv[..., :heads * dim], cos, sin, heads, dim)
    assert torch.equal(qkv[..., :heads * dim].view(b, t, heads, dim).transpose(1, 2), want)
    assert torch.equal(qkv[..., heads * dim:], v)


def test_silu_mul_is_torchs_to_two_ulps_over_silus_whole_range(glue):
    """F.silu(gate) * up within two ulps (another exp than torch's), from -200 to 200 and at 0, on the halves of a
    gate|up product (strided) and on two tensors; the tail past the last vector of 8 included (f = 1539)."""
    g = torch.cat([torch.linspace(-200, 200, 1001), torch.randn(538, generator=gen(5)) * 6, torch.zeros(0)])
    u = torch.randn(1539, generator=gen(6))
    gate_up = torch.cat([g, u])[None, None]                                    # [1, 1, 2f]
    gate, up = gate_up.chunk(2, dim=-1)
    got = glue.silu_mul(gate, up)
    want = (F.silu(g.double()) * u.double()).float()
    torch.testing.assert_close(got[0, 0], want, rtol=2.5e-7, atol=1e-30)
    assert torch.equal(got, glue.silu_mul(gate.contiguous(), up.contiguous()))
    assert torch.equal(glue.silu_mul(torch.zeros(1, 8), torch.ones(1, 8)), torch.zeros(1, 8))


def per_row(glue, rows: int, threads: int) -> list[torch.Tensor]:
    """Row 0's norm, rope and silu_mul among `rows` rows (the others random) with `threads` threads."""
    torch.manual_seed(rows)
    x = torch.randn(rows, 1, 576)
    x[0] = torch.randn(1, 576, generator=gen(0))
    w = torch.randn(576, generator=gen(1))
    qk = torch.randn(rows, 1, 12 * 64)
    qk[0] = torch.randn(1, 12 * 64, generator=gen(2))
    angles = torch.randn(rows, 1, 64, generator=gen(3)) * 10
    gu = torch.randn(rows, 1, 2 * 1536)
    gu[0] = torch.randn(1, 2 * 1536, generator=gen(4))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        glue.rope_(qk, angles.cos(), angles.sin(), 12, 64)
        return [glue.norm(x, w, 1e-5)[0], qk[0], glue.silu_mul(*gu.chunk(2, dim=-1))[0]]
    finally:
        torch.set_num_threads(before)


def test_a_rows_numbers_are_its_own_whatever_the_other_rows_and_threads(glue):
    """Row 0 alone, on the calling thread, against row 0 among up to 70 rows (a team of threads from 32) with one
    thread and two: bitwise the same norm, rope and SiLU."""
    alone = per_row(glue, 1, 1)
    for rows in ROWS:
        for threads in (1, 2):
            for got, want in zip(per_row(glue, rows, threads), alone):
                assert torch.equal(got, want), (rows, threads)


def test_the_forward_takes_the_c_glue_for_float32_on_the_cpu_only():
    """glue_for: CGlue for a float32 CPU stream, TorchGlue for bfloat16, for autograd and while a compiler traces."""
    cos = sin = torch.zeros(1, 1, 64)
    assert isinstance(lean.glue_for(torch.zeros(1, 1, 8), cos, sin), lean.CGlue)
    assert type(lean.glue_for(torch.zeros(1, 1, 8, dtype=torch.bfloat16), cos, sin)) is lean.TorchGlue
    assert type(lean.glue_for(torch.zeros(1, 1, 8, requires_grad=True), cos, sin)) is lean.TorchGlue
    traced = torch.compile(lambda x: torch.tensor(isinstance(lean.glue_for(x, cos, sin), lean.CGlue)),
                           backend="eager", fullgraph=True)
    assert not traced(torch.zeros(1, 1, 8))


def test_the_cold_calls_bench_times_each_call_hot_and_after_a_stream(tmp_path):
    """bench/cold_calls.py: every call timed both ways, a result file with its provenance."""
    import json

    from bench import cold_calls
    out = tmp_path / "cold.json"
    assert cold_calls.main(["--samples", "3", "--threads", "1", "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["provenance"]["name"] == "cold_calls" and len(d["calls"]) == 5
    assert all(c["hot_us"] > 0 and c["cold_us"] > 0 for c in d["calls"].values())
