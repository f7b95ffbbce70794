"""Weights-free checkpoints: Llama-shaped models with random weights, written as real safetensors shards.

    folder = write_shaped("8b", cache_dir() / "shaped")     # Llama 3.1 8B shape, bf16, 4 shards of <= 5 GB
    lm = load_model(str(folder))                             # the real loader, the real engine

No model hub is needed. The config mirrors the public config.json of Llama 3.1 8B / Llama 3.2 1B
(layers, widths, heads, vocabulary, RoPE theta and the llama3 rope scaling); the weights are
normal(0, 0.02) draws, the norms ones. Decode and prefill speed depend on the shapes, the dtype and
the device, never on the weights' values, so timings taken on these folders hold for the real model;
the text they generate is noise.

Memory stays low at any size: each shard's safetensors header is computed from the shapes first,
then every tensor is drawn and written a chunk of rows at a time (tens of MB in memory, not 16 GB).
The tokenizer is a byte-level BPE trained on the spot on a short corpus, padded to the config's
vocabulary with filler tokens and Llama 3's special tokens at their real ids (128000 onward).
"""
from __future__ import annotations

import json
import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

DTYPE_CODES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}
MAX_SHARD_BYTES = 5 * 10**9      # HF's "5GB" shards: Llama 3.1 8B in bf16 ships as 4 of them
CHUNK_VALUES = 2**24             # values drawn at once (64 MB of float32)
INIT_STD = 0.02                  # the public config's initializer_range
DONE_MARKER = ".shaped-complete"


@dataclass(frozen=True)
class Shape:
    """The figures of a Llama-family checkpoint that decide memory and speed (a public config's numbers)."""

    key: str
    label: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_context: int
    tied: bool
    rope_factor: float           # llama3 rope scaling factor (8 for 3.1 8B, 32 for 3.2 1B)
    rope_theta: float = 500_000.0
    n_special: int = 256         # Llama 3 reserves the last 256 ids for special tokens (at least the 11 named)


SHAPES: dict[str, Shape] = {
    "8b": Shape("8b", "Llama-3.1-8B-shaped", 32, 4096, 32, 8, 128, 14336, 128_256, 131_072, False, 8.0),
    "1b": Shape("1b", "Llama-3.2-1B-shaped", 16, 2048, 32, 8, 64, 8192, 128_256, 131_072, True, 32.0),
    # the same code at test scale: a target and a tied draft that share one tokenizer
    "tiny": Shape("tiny", "tiny-Llama-shaped", 2, 64, 4, 2, 16, 128, 1024, 16384, False, 8.0, n_special=16),
    "tiny-draft": Shape("tiny-draft", "tiny-draft-shaped", 1, 32, 4, 2, 8, 64, 1024, 16384, True, 8.0, n_special=16),
}
DRAFT_OF = {"8b": "1b", "tiny": "tiny-draft"}

# Llama 3's first special tokens, at ids 128000 + i (the rest are <|reserved_special_token_N|>)
NAMED_SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                  "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
                  "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>")
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
                 "{{ m['content'] | trim }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
                 "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
CORPUS = (
    "The old lighthouse keeper climbed the spiral stairs every evening at dusk. He polished the great lens, "
    "trimmed the wick, and watched the ships pass safely beyond the rocks. Rivers carry water from the hills "
    "to the sea, and along the way they carve valleys, feed farms and give towns a reason to exist. "
    "What is the capital of France? Paris is the capital of France, and Berlin is the capital of Germany. "
    "Write a long, detailed story about a lighthouse keeper who finds a message in a bottle. "
    "def mean(values):\n    return sum(values) / len(values)\n\nfor i in range(10):\n    print(i * i)\n"
    "The history of computing is a story of ideas becoming machines: numbers, 0123456789, letters and words."
)


def special_tokens(shape: Shape) -> list[str]:
    reserved = [f"<|reserved_special_token_{i}|>" for i in range(3, 3 + shape.n_special - len(NAMED_SPECIALS))]
    return list(NAMED_SPECIALS[:shape.n_special]) + reserved


def special_id(shape: Shape, token: str) -> int:
    return shape.vocab_size - shape.n_special + special_tokens(shape).index(token)


def hf_config(shape: Shape) -> dict[str, Any]:
    """config.json as the public Llama 3.1 / 3.2 checkpoints write it (rope_scaling + rope_theta)."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
        "attention_dropout": 0.0, "mlp_bias": False, "hidden_act": "silu", "initializer_range": INIT_STD,
        "bos_token_id": special_id(shape, "<|begin_of_text|>"),
        "eos_token_id": [special_id(shape, t) for t in ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")],
        "hidden_size": shape.d_model, "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.n_layers, "num_attention_heads": shape.n_heads,
        "num_key_value_heads": shape.n_kv_heads, "head_dim": shape.head_dim,
        "max_position_embeddings": shape.max_context, "rms_norm_eps": 1e-05, "pretraining_tp": 1,
        "rope_scaling": {"factor": shape.rope_factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": shape.rope_theta, "tie_word_embeddings": shape.tied, "torch_dtype": "bfloat16",
        "use_cache": True, "vocab_size": shape.vocab_size,
        "playground_note": "random weights written by engine/models/shaped.py: right shapes, meaningless text",
    }


# --- the tensors, in the order Hugging Face writes them --------------------------------------------------

def tensor_layout(shape: Shape) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every weight of LlamaForCausalLM; no lm_head when the embeddings are tied."""
    d, q, kv, f = shape.d_model, shape.n_heads * shape.head_dim, shape.n_kv_heads * shape.head_dim, shape.intermediate_size
    layout = [("model.embed_tokens.weight", (shape.vocab_size, d))]
    for i in range(shape.n_layers):
        p = f"model.layers.{i}."
        layout += [(p + "input_layernorm.weight", (d,)), (p + "self_attn.q_proj.weight", (q, d)),
                   (p + "self_attn.k_proj.weight", (kv, d)), (p + "self_attn.v_proj.weight", (kv, d)),
                   (p + "self_attn.o_proj.weight", (d, q)), (p + "post_attention_layernorm.weight", (d,)),
                   (p + "mlp.gate_proj.weight", (f, d)), (p + "mlp.up_proj.weight", (f, d)),
                   (p + "mlp.down_proj.weight", (d, f))]
    layout.append(("model.norm.weight", (d,)))
    if not shape.tied:
        layout.append(("lm_head.weight", (shape.vocab_size, d)))
    return layout


def nbytes(dims: tuple[int, ...], dtype: torch.dtype) -> int:
    n = 1
    for s in dims:
        n *= s
    return n * dtype.itemsize


def plan_shards(layout: list[tuple[str, tuple[int, ...]]], dtype: torch.dtype,
                max_shard_bytes: int = MAX_SHARD_BYTES) -> list[list[tuple[str, tuple[int, ...]]]]:
    """Split the tensors, in order, into shards of at most `max_shard_bytes` (a bigger tensor gets its own)."""
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, dims in layout:
        b = nbytes(dims, dtype)
        if shards[-1] and size + b > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, dims))
        size += b
    return shards


def safetensors_header(tensors: list[tuple[str, tuple[int, ...]]], dtype: torch.dtype) -> bytes:
    """The file's header: 8-byte little-endian length, then JSON padded with spaces to a multiple of 8."""
    entries: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dims in tensors:
        end = offset + nbytes(dims, dtype)
        entries[name] = {"dtype": DTYPE_CODES[dtype], "shape": list(dims), "data_offsets": [offset, end]}
        offset = end
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def write_tensor(f: Any, name: str, dims: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator,
                 device: torch.device) -> None:
    """Draw one tensor a block of rows at a time and append its raw bytes: norms are ones, the rest N(0, 0.02)."""
    if name.endswith("norm.weight"):
        f.write(torch.ones(dims, dtype=dtype).view(torch.uint8).numpy())
        return
    rows, cols = dims
    step = max(1, CHUNK_VALUES // cols)
    for start in range(0, rows, step):
        n = min(step, rows - start)
        block = torch.randn(n, cols, generator=generator, device=device).mul_(INIT_STD).to(dtype)   # (n, cols)
        f.write(block.cpu().view(torch.uint8).numpy())


def write_shard(path: Path, tensors: list[tuple[str, tuple[int, ...]]], dtype: torch.dtype, seed: int,
                device: torch.device) -> None:
    generator = torch.Generator(device=device).manual_seed(seed)
    with open(path, "wb") as f:
        f.write(safetensors_header(tensors, dtype))
        for name, dims in tensors:
            write_tensor(f, name, dims, dtype, generator, device)


def write_weights(shape: Shape, folder: Path, dtype: torch.dtype = torch.bfloat16, seed: int = 0,
                  max_shard_bytes: int = MAX_SHARD_BYTES, device: str | torch.device = "cpu") -> list[Path]:
    """All shards plus model.safetensors.index.json (or a single model.safetensors when one shard holds all)."""
    layout = tensor_layout(shape)
    shards = plan_shards(layout, dtype, max_shard_bytes)
    n = len(shards)
    names = ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    for i, (fname, tensors) in enumerate(zip(names, shards)):
        write_shard(folder / fname, tensors, dtype, seed * 1000 + i, torch.device(device))
    if n > 1:
        index = {"metadata": {"total_size": sum(nbytes(d, dtype) for _, d in layout)},
                 "weight_map": {name: fname for fname, tensors in zip(names, shards) for name, _ in tensors}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return [folder / fname for fname in names]


# --- the tokenizer --------------------------------------------------------------------------------------

def train_bpe(n_tokens: int) -> dict[str, Any]:
    """A byte-level BPE trained on CORPUS (at most n_tokens ids); returns the tokenizers JSON as a dict."""
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=min(n_tokens, 2000), initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    core.train_from_iterator([CORPUS] * 4, trainer)
    return json.loads(core.to_str())


def pad_vocab(data: dict[str, Any], n_tokens: int) -> None:
    """Fill ids up to n_tokens with filler tokens: unreachable by the merges, but they decode (' t12345')."""
    vocab = data["model"]["vocab"]
    i = len(vocab)
    while len(vocab) < n_tokens:
        token = f"\u0120t{i}"    # byte-level for " t<i>"
        if token not in vocab:
            vocab[token] = len(vocab)
        i += 1


def write_tokenizer(shape: Shape, folder: Path) -> None:
    """Trained BPE + fillers for ids below the specials, then the special tokens at the config's ids."""
    base = shape.vocab_size - shape.n_special
    data = train_bpe(base)
    pad_vocab(data, base)
    core = Tokenizer.from_str(json.dumps(data))
    core.add_special_tokens(special_tokens(shape))
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                                  pad_token="<|finetune_right_pad_id|>")
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(folder)


# --- the whole folder -----------------------------------------------------------------------------------

def write_shaped(key: str, root: str | Path, dtype: torch.dtype = torch.bfloat16, seed: int = 0,
                 max_shard_bytes: int = MAX_SHARD_BYTES, device: str | torch.device = "cpu") -> Path:
    """Write (once) a random-weight checkpoint of a named shape under `root`; returns its folder.

    A finished folder is reused; a half-written one (interrupted run) is never taken for a model,
    because the folder is built under a temporary name and renamed at the end.
    """
    shape = SHAPES[key]
    out = Path(root) / f"{shape.label}-{DTYPE_CODES[dtype].lower()}-seed{seed}"
    if (out / DONE_MARKER).exists():
        return out
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "config.json").write_text(json.dumps(hf_config(shape), indent=2))
    write_tokenizer(shape, tmp)
    write_weights(shape, tmp, dtype, seed, max_shard_bytes, device)
    (tmp / DONE_MARKER).write_text(json.dumps({"shape": key, "dtype": str(dtype), "seed": seed}))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def shaped_bytes(key: str, dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes of weights the folder will hold (what `df` must have free)."""
    return sum(nbytes(dims, dtype) for _, dims in tensor_layout(SHAPES[key]))
