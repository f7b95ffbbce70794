"""bench/vs_llamacpp.py's float32 GGUF: every tensor dequantized, the metadata kept (on a GGUF this test writes)."""
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
