"""A lone step's products (engine/core/matvec.py): `linear`, the row kernel where it is built (engine/core/kernels,
tests/test_row_kernel.py), and `split`, torch's path: the weights in blocks of output rows, one torch.bmm."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from engine.core import matvec


def exact(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    y = x.double() @ w.double().T
    return (y + b.double() if b is not None else y).float()


@pytest.mark.parametrize("rows", [1, 2, 4])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("way", [matvec.linear, matvec.split])
def test_the_products_equal_the_float64_product_and_f_linear(rows, bias, way):
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(192, 576, generator=g)
    b = torch.randn(192, generator=g) if bias else None
    x = torch.randn(1, rows, 576, generator=g)
    assert matvec.splits(w)
    got = way(x, w, b)
    assert got.shape == (1, rows, 192)
    np.testing.assert_allclose(got, exact(x, w, b), atol=1e-4, rtol=1e-5)
    np.testing.assert_allclose(got, F.linear(x, w, b), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("way", [matvec.linear, matvec.split])
def test_each_row_is_its_own_block_of_the_output_not_a_neighbours(way):
    """Block p of the output is block p of the weight's rows: a weight with one non-zero row per block gives each
    output's value at exactly that row."""
    w = torch.zeros(16, 8)
    for p in range(matvec.PARTS):
        w[p * 16 // matvec.PARTS + 1, p] = 1.0 + p
    x = torch.arange(1.0, 9.0)[None]                                           # [1, 8]
    got = way(x, w)[0]
    want = torch.zeros(16)
    for p in range(matvec.PARTS):
        want[p * 16 // matvec.PARTS + 1] = (1.0 + p) * (p + 1)
    assert torch.equal(got, want)


def test_what_split_does_not_split_is_f_linears_own_product():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 64, generator=g)
    odd = torch.randn(30, 64, generator=g)                                     # 30 rows: not a multiple of PARTS
    transposed = torch.randn(64, 32, generator=g).t()                          # (32, 64) stored (in, out)
    half = torch.randn(32, 64, generator=g).half()
    assert not matvec.splits(odd) and not matvec.splits(transposed) and not matvec.splits(half)
    for w in (odd, transposed):
        assert torch.equal(matvec.split(x, w), F.linear(x, w))
    assert torch.equal(matvec.split(x.half(), half), F.linear(x.half(), half))
    assert torch.equal(matvec.linear(x.half(), half), F.linear(x.half(), half))
    many = torch.randn(matvec.MAX_ROWS + 1, 64, generator=g)
    w = torch.randn(32, 64, generator=g)
    assert torch.equal(matvec.split(many, w), F.linear(many, w))


@pytest.mark.parametrize("way", [matvec.linear, matvec.split])
def test_it_runs_under_inference_mode_and_with_two_threads(way):
    g = torch.Generator().manual_seed(1)
    w, x = torch.randn(1536, 576, generator=g), torch.randn(1, 576, generator=g)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            with torch.inference_mode():
                np.testing.assert_allclose(way(x, w), exact(x, w, None), atol=1e-4, rtol=1e-5)
    finally:
        torch.set_num_threads(before)
