"""Weights-free shaped checkpoints: the public Llama configs, real safetensors shards, the real loader."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoTokenizer

from engine.projection.card import param_counts, weight_bytes
from engine.core.generate import GenerationRequest, generate
from engine.core.loader import load_model
from engine.models.shaped import (SHAPES, hf_config, plan_shards, shaped_bytes, special_id, tensor_layout, write_shaped,
                                  write_tokenizer)
from engine.projection.specs import MODEL_PRESETS, ModelSpec

SMALL_SHARDS = 60_000  # bytes: the tiny target splits into several shards, as the 8B does at 5 GB


@pytest.fixture(scope="module")
def shaped_root(tmp_path_factory):
    return tmp_path_factory.mktemp("shaped")


@pytest.fixture(scope="module")
def tiny_dir(shaped_root):
    return write_shaped("tiny", shaped_root, max_shard_bytes=SMALL_SHARDS)


@pytest.mark.parametrize("key,preset", [("8b", "llama-3.1-8b"), ("1b", "llama-3.2-1b")])
def test_configs_read_back_as_the_public_models(tmp_path, key, preset):
    (tmp_path / "config.json").write_text(json.dumps(hf_config(SHAPES[key])))
    config = AutoConfig.from_pretrained(tmp_path)
    spec = ModelSpec.from_hf_config(config, name=MODEL_PRESETS[preset].name)
    assert spec == MODEL_PRESETS[preset]
    rope = getattr(config, "rope_parameters", None) or config.rope_scaling
    assert rope["rope_type"] == "llama3" and rope["factor"] == {"8b": 8.0, "1b": 32.0}[key]
    # every tensor the writer lays out is one the card counts, and nothing else
    assert sum(torch.Size(d).numel() for _, d in tensor_layout(SHAPES[key])) == param_counts(spec).total
    assert shaped_bytes(key) == weight_bytes(spec, "bf16")


def test_the_8b_is_sixteen_gigabytes_in_four_shards_of_at_most_five():
    shards = plan_shards(tensor_layout(SHAPES["8b"]), torch.bfloat16)
    sizes = [sum(torch.Size(d).numel() * 2 for _, d in s) for s in shards]
    assert len(shards) == 4 and max(sizes) <= 5e9
    assert sum(sizes) == pytest.approx(16.06e9, rel=1e-3)  # FACTS: 8.03 B parameters x 2 bytes


def test_the_8b_tokenizer_has_llama3_special_ids(tmp_path):
    write_tokenizer(SHAPES["8b"], tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    assert len(tok) == 128_256
    assert tok.convert_tokens_to_ids(["<|begin_of_text|>", "<|eot_id|>"]) == [128_000, 128_009]
    text = "What is the capital of France? Paris."
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text


def test_shards_index_and_values(tiny_dir):
    index = json.loads((tiny_dir / "model.safetensors.index.json").read_text())
    layout = dict(tensor_layout(SHAPES["tiny"]))
    assert set(index["weight_map"]) == set(layout) and len(set(index["weight_map"].values())) > 1
    total = 0
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(tiny_dir / shard, framework="pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                assert index["weight_map"][name] == shard and tuple(t.shape) == layout[name]
                assert t.dtype == torch.bfloat16
                if name.endswith("norm.weight"):
                    assert bool((t == 1).all())
                total += t.numel() * 2
    assert total == index["metadata"]["total_size"]
    with safe_open(tiny_dir / index["weight_map"]["lm_head.weight"], framework="pt") as f:
        assert float(f.get_tensor("lm_head.weight").float().std()) == pytest.approx(0.02, rel=0.05)


def test_the_real_loader_and_engine_run_on_it(tiny_dir):
    lm = load_model(str(tiny_dir), device="cpu", dtype="float32")
    assert lm.spec.vocab_size == 1024 and lm.has_chat_template
    assert param_counts(lm.spec).total == sum(p.numel() for p in lm.model.parameters())
    records = list(generate(lm, GenerationRequest("What is the capital of France?", max_new_tokens=12)))
    prompt = [p.id for p in records[0].prompt]
    assert prompt[0] == special_id(SHAPES["tiny"], "<|begin_of_text|>")
    with torch.no_grad():
        ref = lm.model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=12)
    ours = [r.token.id for r in records[:-1]]
    assert ours == ref[0, len(prompt):len(prompt) + len(ours)].tolist()


def test_the_draft_is_tied_and_shares_the_tokenizer(shaped_root, tiny_dir):
    draft_dir = write_shaped("tiny-draft", shaped_root)
    assert (draft_dir / "model.safetensors").exists()  # one shard: no index needed
    draft = load_model(str(draft_dir), device="cpu", dtype="float32")
    assert draft.spec.tie_embeddings
    assert draft.model.lm_head.weight.data_ptr() == draft.model.model.embed_tokens.weight.data_ptr()
    target_tok = AutoTokenizer.from_pretrained(tiny_dir)
    assert draft.tokenizer.get_vocab() == target_tok.get_vocab()


def test_a_finished_folder_is_reused_and_an_unfinished_one_rebuilt(shaped_root, tiny_dir):
    stamp = (tiny_dir / "config.json").stat().st_mtime_ns
    assert write_shaped("tiny", shaped_root, max_shard_bytes=SMALL_SHARDS) == tiny_dir
    assert (tiny_dir / "config.json").stat().st_mtime_ns == stamp
    other = write_shaped("tiny", shaped_root, seed=1, max_shard_bytes=SMALL_SHARDS)
    shard = sorted(other.glob("*.safetensors"))[-1]
    shard.unlink()
    (other / ".shaped-complete").unlink()            # as if the run had died before the end
    assert write_shaped("tiny", shaped_root, seed=1, max_shard_bytes=SMALL_SHARDS) == other
    assert shard.exists()
