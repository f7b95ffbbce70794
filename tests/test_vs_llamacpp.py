"""bench/vs_llamacpp.py: its float32 GGUF (every tensor dequantized, the metadata kept, on a GGUF this test writes) and
its floors (each round against the readings beside it)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from vs_llamacpp import f32_gguf  # noqa: E402


def test_a_quantized_gguf_becomes_float32_with_the_same_values_and_metadata(tmp_path):
    rng = np.random.default_rng(0)
    weight, norm = rng.standard_normal((8, 64)).astype(np.float32), rng.standard_normal(64).astype(np.float32)
    q8 = gguf.quants.quantize(weight, gguf.GGMLQuantizationType.Q8_0)
    source = tmp_path / "q8.gguf"
    writer = gguf.GGUFWriter(str(source), arch="llama")
    writer.add_block_count(1)
    writer.add_chat_template("{{ messages }}")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    writer.add_tensor("blk.0.ffn_up.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("blk.0.attn_norm.weight", norm)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    out = gguf.GGUFReader(f32_gguf(source, tmp_path / "f32.gguf"))
    tensors = {t.name: t for t in out.tensors}
    assert {t.tensor_type for t in out.tensors} == {gguf.GGMLQuantizationType.F32}
    np.testing.assert_array_equal(tensors["blk.0.ffn_up.weight"].data,
                                  gguf.quants.dequantize(q8, gguf.GGMLQuantizationType.Q8_0))
    assert not np.array_equal(tensors["blk.0.ffn_up.weight"].data, weight)      # Q8_0's values, not the originals
    np.testing.assert_array_equal(tensors["blk.0.attn_norm.weight"].data, norm)
    assert out.fields["llama.block_count"].contents() == 1
    assert out.fields["tokenizer.chat_template"].contents() == "{{ messages }}"
    assert out.fields["general.file_type"].contents() == gguf.LlamaFileType.ALL_F32


def test_each_round_is_set_against_the_floor_of_the_readings_beside_it():
    """round_floors: the faster of the readings before and after each round; summarize: the median over rounds of
    each round's ms over its own floor, beside the one floor of the run's fastest reading."""
    import vs_llamacpp as v
    read = [{"2": 40.0}, {"2": 20.0}, {"2": 25.0}, {"2": 50.0}]          # GB/s: before round 1, after 1, 2, 3
    floors = v.round_floors(read, 10**9, "2")
    assert floors == [25.0, 40.0, 20.0]                                    # ms: 1 GB at 40, 25 and 50 GB/s
    answers = [{"ms_per_token": ms, "ttft_s": 0.1} for ms in (30.0, 50.0, 30.0)]
    rounds = [{"ours": [a]} for a in answers]
    table = v.summarize(rounds, 20.0, ("ours",), {"4 KB pages": floors})["ours"]
    assert table["ms_per_token"] == 30.0 and table["x_floor"] == 1.5
    assert table["x_round_floor (4 KB pages)"] == 1.25                     # median of 1.2, 1.25 and 1.5
    theirs = [{"ours": [a], "llama.cpp": [dict(a, ms_per_token=m)]} for a, m in zip(answers, (20.0, 100.0, 25.0))]
    assert v.summarize(theirs, 20.0, ("ours", "llama.cpp"))["llama.cpp"]["ours_over_paired"] == 1.2   # 1.5, 0.5, 1.2
