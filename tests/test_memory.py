"""The memory ledger against the card's formula; on CUDA, the allocator's own counts."""
from __future__ import annotations

import pytest
import torch

from conftest import tiny_prompt
from engine.projection.card import kv_bytes_per_token, weight_bytes
from engine.core.generate import GenerationRequest, generate
from engine.core.loader import load_model
from engine.lab.memory import CPU_SOURCE, allocated_by, memory_ledger, peak_during
from engine.serving.paged import BLOCK, BlockPool

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="the allocator counters need a CUDA device")


@pytest.fixture(scope="module")
def lm(tiny_model_dir):
    return load_model(str(tiny_model_dir), device="cpu", dtype="float32")


def test_cpu_ledger_measures_tensors_and_says_how(lm):
    records = list(generate(lm, GenerationRequest(tiny_prompt(), max_new_tokens=5)))
    last = records[-2].cache
    ledger = memory_ledger(lm, last)
    assert ledger.measured_by == CPU_SOURCE and ledger.allocated is None and ledger.peak_reserved is None
    assert ledger.weights == ledger.weights_formula == weight_bytes(lm.spec, "fp32")
    assert ledger.kv_tokens == last.length and ledger.kv == ledger.kv_formula == kv_bytes_per_token(lm.spec, "fp32") * last.length
    assert ledger.process_rss > ledger.weights and ledger.workspace == ledger.process_rss - ledger.weights - ledger.kv
    assert allocated_by(lambda: 7, lm.device) == (7, None) and peak_during(lambda: 7, lm.device) == (7, None, None)


def test_the_small_batch_kernels_packed_copies_are_a_row_of_their_own(tiny_model_dir):
    from app.kv.sections import ledger_table
    from engine.core.small_batch import available, kernels_for

    if not available():
        pytest.skip("this torch has no oneDNN")

    lm = load_model(str(tiny_model_dir), device="cpu", dtype="float32")
    assert memory_ledger(lm).packed == 0                       # reading the ledger packs nothing
    kernels = kernels_for(lm)                                  # what the first batch does (the tests pack all)
    linears = [m for m in lm.model.modules() if isinstance(m, torch.nn.Linear)]
    ledger = memory_ledger(lm)
    assert ledger.packed == kernels.nbytes == sum(m.weight.numel() * 4 for m in linears)
    assert ledger.workspace == ledger.process_rss - ledger.weights - ledger.packed
    table = ledger_table(ledger)
    assert "Weights packed again for batched steps (small-batch kernel)" in table[""]
    assert "Rest of the process: RSS − weights − packed − KV" in table[""]


@needs_cuda
def test_cuda_allocator_counts_weights_cache_and_workspace(tiny_model_dir):
    lm, weights = allocated_by(lambda: load_model(str(tiny_model_dir), device="cuda", dtype="float32"),
                               torch.device("cuda"))
    assert lm.weight_bytes <= weights < lm.weight_bytes + 2**20      # + small buffers (rotary frequencies)
    spec = lm.spec
    pool, kv = allocated_by(lambda: BlockPool(spec.n_layers, spec.n_kv_heads, spec.head_dim, lm.dtype, lm.device,
                                              BLOCK, 16), lm.device)
    assert kv == pool.bytes_per_block * 16 == kv_bytes_per_token(spec, "fp32") * BLOCK * 16
    del pool
    records, peak, reserved = peak_during(lambda: list(generate(lm, GenerationRequest(tiny_prompt(), max_new_tokens=8))),
                                          lm.device)
    ledger = memory_ledger(lm, records[-2].cache)
    assert peak > 0 and reserved >= ledger.weights + ledger.kv
    assert ledger.allocated >= ledger.weights and ledger.workspace >= 0
    assert ledger.device_total > ledger.peak_reserved


def test_the_gpu_panel_shows_allocator_rows_beside_the_formula():
    from app.kv.sections import ledger_table
    from engine.lab.memory import CUDA_SOURCE, MemoryLedger

    gb = 10**9
    ledger = MemoryLedger("cuda:0", CUDA_SOURCE, weights=16_060_000_000, weights_formula=16.06 * gb, kv_tokens=1000,
                          kv=131_072_000, kv_formula=131_072_000, allocated=16_200_000_000, peak_allocated=16_900_000_000,
                          peak_reserved=17_300_000_000, device_total=85_000_000_000)
    columns = ledger_table(ledger)
    table = dict(zip(columns[""], zip(columns["measured"], columns["formula (model card)"])))
    assert table["Weights"] == ("16.06 GB", "16.06 GB")
    assert table["Allocated now (torch.cuda.memory_allocated)"] == ("16.20 GB", "16.06 GB")   # the weights
    assert table["Workspace at the peak: peak reserved − weights − KV"][0] == "1.11 GB"
    assert "Process resident memory (RSS)" not in table


def test_the_gpu_panel_shows_the_batch_pool_kept_for_cuda_graphs_apart_from_the_workspace():
    pytest.importorskip("streamlit")            # the page's module: a lent GPU machine runs the tests without it
    from app.kv.sections import ledger_table
    from engine.lab.memory import CUDA_SOURCE, MemoryLedger

    ledger = MemoryLedger("cuda:0", CUDA_SOURCE, weights=16 * 10**9, weights_formula=16e9, kv_tokens=0, kv=0,
                          kv_formula=0, allocated=29 * 10**9, peak_allocated=29 * 10**9, peak_reserved=30 * 10**9,
                          device_total=85 * 10**9, kv_pool=12 * 10**9, kv_pool_tokens=91_552)
    table = dict(zip(*(ledger_table(ledger)[k] for k in ("", "measured"))))
    assert table["Batch K/V pool kept for CUDA graphs (91,552 positions)"] == "12.00 GB"
    assert table["Workspace at the peak: peak reserved − weights − KV − pool"] == "2.00 GB"
