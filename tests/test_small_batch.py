"""The packed small-batch kernel of batched decode steps on CPU (engine/core/small_batch.py)."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from conftest import tiny_prompt, write_tiny_llama
from engine.core import matvec, small_batch
from engine.core.generate import GenerationRequest
from engine.core.loader import load_model
from engine.core.small_batch import SmallBatchKernels, SmallBatchLinear, calibrate, pack_weight, packed_linear
from test_batch import FULL, alone, assert_same_run, run_staggered

pytestmark = pytest.mark.skipif(not small_batch.available(), reason="this torch has no oneDNN")


@pytest.mark.parametrize("rows", [1, 2, 5, 16, 40])
def test_the_packed_product_equals_the_float64_product(rows):
    g = torch.Generator().manual_seed(rows)
    w, b = torch.randn(96, 160, generator=g), torch.randn(96, generator=g)
    x = torch.randn(2, rows, 160, generator=g)
    exact = (x.double() @ w.double().T + b.double()).float()
    got = packed_linear(x, pack_weight(w), b)
    assert got.shape == (2, rows, 96)
    np.testing.assert_allclose(got, exact, atol=1e-4, rtol=1e-5)


def make_layers():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 48), nn.ReLU(), nn.Linear(48, 8, bias=False)).eval()


def test_only_small_batches_inside_the_context_use_the_packed_weights():
    model = make_layers()
    plain = copy.deepcopy(model)
    kernels = SmallBatchKernels.pack(model, environ={small_batch.ENV: "all"})
    assert kernels.weights == 2 and all(type(m) is SmallBatchLinear for m in (model[0], model[2]))
    with torch.inference_mode():
        for rows in (1, 2, 16, 32, 33):
            x = torch.randn(rows, 32)
            assert torch.equal(model(x), plain(x))            # outside the context: nn.Linear's own product
            with kernels.active():
                y = model(x)
            if rows in small_batch.ROWS:
                np.testing.assert_allclose(y, plain(x), atol=1e-5)
                assert kernels.packed_for(model[0].weight, x) is not None
            elif rows == 1:                                   # one row: the row kernel's product (a prefill's head)
                np.testing.assert_allclose(y, plain(x), atol=1e-5)
                hidden = torch.relu(matvec.linear(x, model[0].weight, model[0].bias))
                assert torch.equal(y, matvec.linear(hidden, model[2].weight, None))
            else:
                assert torch.equal(y, plain(x))
                assert kernels.packed_for(model[0].weight, x) is None


def test_a_copy_with_new_weights_never_uses_the_old_packed_ones():
    """The quantization lab copies the model over the same tensors and then gives layers new weights."""
    model = make_layers()
    kernels = SmallBatchKernels.pack(model, environ={small_batch.ENV: "all"})
    memo = {id(t): t for t in model.parameters()}
    clone = copy.deepcopy(model, memo)
    with torch.no_grad():
        clone[0].weight = nn.Parameter(torch.zeros_like(model[0].weight), requires_grad=False)
    x = torch.randn(4, 32)
    with torch.inference_mode(), kernels.active():
        assert torch.equal(clone[0](x), F.linear(x, clone[0].weight, clone[0].bias))     # zeros + bias
        np.testing.assert_allclose(clone[2](torch.ones(4, 48)), model[2](torch.ones(4, 48)), atol=1e-6)


def test_a_tied_weight_is_packed_once_and_off_packs_nothing(tmp_path):
    lm = load_model(str(write_tiny_llama(tmp_path / "tied", tie_word_embeddings=True)))
    assert lm.model.lm_head.weight is lm.model.model.embed_tokens.weight
    kernels = SmallBatchKernels.pack(lm.model, environ={small_batch.ENV: "all"})
    linears = [m for m in lm.model.modules() if isinstance(m, nn.Linear)]
    assert kernels.weights == len(linears) and kernels.nbytes == sum(m.weight.numel() * 4 for m in linears)
    assert SmallBatchKernels.pack(make_layers(), environ={small_batch.ENV: "off"}) is None
    assert SmallBatchKernels.pack(make_layers(), max_bytes=0, environ={small_batch.ENV: "all"}) is None
    first_only = make_layers()
    kernels = SmallBatchKernels.pack(first_only, max_bytes=48 * 32 * 4, environ={small_batch.ENV: "all"})
    assert kernels.nbytes == 48 * 32 * 4 and [type(first_only[i]) for i in (0, 2)] == [SmallBatchLinear, nn.Linear]


def test_auto_packs_the_shapes_that_measured_faster(monkeypatch):
    model = nn.Sequential(nn.Linear(32, 48), nn.Linear(48, 48), nn.Linear(48, 32)).eval()
    times = {(48, 32): (1.0, 0.5), (48, 48): (1.0, 0.95), (32, 48): (1.0, 2.0)}     # MKL s, packed s
    monkeypatch.setattr(small_batch, "calibrate", lambda w, packed: times[tuple(w.shape)])
    kernels = SmallBatchKernels.pack(model, environ={})
    assert [type(m) is SmallBatchLinear for m in model] == [True, False, False]
    assert kernels.shapes == times


def test_calibrate_times_both_kernels_on_this_machine():
    w = torch.randn(64, 32)
    mkl, onednn = calibrate(w, pack_weight(w))
    assert 0 < mkl < 1 and 0 < onednn < 1


def test_a_batch_with_every_linear_packed_equals_each_request_alone(tiny_lm, monkeypatch):
    """The tiny model packed (the test session packs every linear): requests joining and leaving mid-flight,
    captures included, equal each alone, whose steps of one row never use the packed weights (its prefill chunks
    and mixed steps of up to 128 tokens do)."""
    kernels = small_batch.kernels_for(tiny_lm)
    assert kernels is not None and kernels.weights == 3 * 7 + 1
    rows_seen = []

    def counted(x, packed, bias):
        rows_seen.append(x.numel() // x.shape[-1])
        return packed_linear(x, packed, bias)

    monkeypatch.setattr(small_batch, "packed_linear", counted)
    jobs = [(GenerationRequest(tiny_prompt(n, seed=n), max_new_tokens=m, chat=False), FULL)
            for n, m in ((6, 10), (13, 5), (4, 8))]
    sinks = run_staggered(tiny_lm, jobs, joins=[0, 0, 2])
    assert {2, 3} <= set(rows_seen) and 1 not in rows_seen     # the batched steps went through the packed kernel
    rows_seen.clear()
    for sink, (request, policy) in zip(sinks, jobs):
        assert sink.error is None
        assert_same_run(sink, alone(tiny_lm, request, policy))
    assert rows_seen == []                          # a request alone never does


def test_the_room_page_says_which_kernel_its_batched_steps_use(tmp_path, monkeypatch):
    from app.speed.room import kernel_note

    from engine.service.service import EngineService

    lm = load_model(str(write_tiny_llama(tmp_path / "m")))
    served = EngineService(lm)                                   # its scheduler's first batch runner packs
    lm.small_batch = None
    assert kernel_note(served) is None                           # nothing packed: asking does not pack
    monkeypatch.setattr(small_batch, "calibrate", lambda w, packed: (2e-3, 1e-3) if w.shape[0] == 96 else (1, 1))
    lm.small_batch = SmallBatchKernels.pack(lm.model, environ={})
    note = kernel_note(served)
    served.close()
    assert "copies of 1 weight matrix rearranged" in note
    assert "96 x 64, 4 requests' rows took 2.0 ms the usual way and 1.0 ms with the rearranged copy" in note
    ordered = small_batch.ordered(small_batch.pack_weight(lm.model.lm_head.weight))     # where the row kernel builds
    assert ("in the same order as for the request alone" in note) == ordered
    assert ("One request alone keeps the usual routine." in note) != ordered


def test_weights_that_share_an_input_fuse_into_one_product_in_place_of_their_own_copies():
    """q|k|v as one packed matrix: the same products side by side (a missing bias counts as zeros), the three
    packed copies given back, the same fused matrix on a second call, and nothing fused past the byte budget."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 48), nn.Linear(32, 16, bias=False), nn.Linear(32, 16))
    kernels = SmallBatchKernels.pack(model, environ={"PLAYGROUND_SMALL_BATCH": "all"})
    before = kernels.nbytes
    pairs = [(m.weight, m.bias) for m in model]
    packed, bias = kernels.fuse(pairs)
    x = torch.randn(5, 32)
    with torch.inference_mode():
        want = torch.cat([m(x) for m in model], dim=-1)
        torch.testing.assert_close(packed_linear(x, packed, bias), want, atol=1e-5, rtol=1e-5)
    assert kernels.packed_for(model[0].weight, x) is None             # their own copies were given back
    assert kernels.nbytes == before and kernels.weights == 3          # the same bytes, in one matrix
    assert kernels.fuse(pairs)[0] is packed
    small = SmallBatchKernels.pack(model, max_bytes=48 * 32 * 4, environ={"PLAYGROUND_SMALL_BATCH": "all"})
    assert small.fuse([(model[1].weight, None), (model[2].weight, None)]) is None
