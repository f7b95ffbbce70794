"""Attention at long context, measured here: the first N tokens of a long public-domain text (assets/long_context/)
fed to the model, its prefill timed, its KV cache weighed, and every head summarised at full length.

    ids = text_ids(lm, 2048)                           # the first 2,048 tokens of the text
    point = measure_length(lm, ids, window=16)         # prefill time, KV bytes, kept bytes, Summaries
    for point in sweep(lm, [128, 512, 2048], 16, progress): ...

The summaries never hold an N x N map: each layer's input is computed from the one below, its Q and K taken by the
layer's own modules, and the statistics gathered over key tiles with an online softmax (engine/core/attention_maps).
"""
from __future__ import annotations

import functools
import gzip
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch
from transformers import DynamicCache

from engine.core.attention_maps import Summaries, summarise
from engine.core.generate import cache_state, forward, sync
from engine.core.loader import LoadedModel
from engine.core.recompute import embeddings
from engine.errors import ContextLengthError

TEXT = Path(__file__).resolve().parents[2] / "assets" / "long_context" / "shakespeare.txt.gz"
TEXT_NAME = "Shakespeare's plays (public domain)"
MIN_TOKENS = 128


@functools.lru_cache(maxsize=1)
def _text() -> str:
    return gzip.decompress(TEXT.read_bytes()).decode("utf-8")


@functools.lru_cache(maxsize=4)
def _all_ids(tokenizer_id: int, tokenizer) -> tuple[int, ...]:  # noqa: ANN001 - a tokenizer
    return tuple(tokenizer(_text(), add_special_tokens=False)["input_ids"])


def text_ids(lm: LoadedModel, n: int) -> list[int]:
    """The first n tokens of the text (no chat template: the model reads the plays as they are)."""
    if n > lm.spec.max_context:
        raise ContextLengthError(f"{n:,} tokens were asked for; {lm.label} reads at most {lm.spec.max_context:,}")
    ids = _all_ids(id(lm.tokenizer), lm.tokenizer)
    if n > len(ids):
        raise ContextLengthError(f"the text is {len(ids):,} tokens long for this tokenizer; {n:,} were asked for")
    return list(ids[:n])


@dataclass(frozen=True)
class LongContextPoint:
    """One length of the slider: what the prefill took, what it holds, and every head summarised."""

    n: int
    prefill_seconds: float      # one forward over the n tokens, capture off
    kv_bytes: int               # K and V in the cache after it (read from the cache object)
    kept_bytes: int             # what a run of n positions keeps to recompute its attention (every layer's input)
    attention_bytes: int        # what HF's output_attentions would hold: layers x heads x n² float32
    summaries: Summaries


def prefill(lm: LoadedModel, ids: list[int]) -> tuple[float, int]:
    """Seconds of one capture-off forward over ids, and the KV bytes the cache then holds."""
    cache = DynamicCache(config=lm.model.config)
    t0 = time.perf_counter()
    with torch.inference_mode():
        forward(lm, ids, cache)
    sync(lm.device)
    return time.perf_counter() - t0, cache_state(cache).bytes


def measure_length(lm: LoadedModel, ids: list[int], window: int,
                   progress: Callable[[int, str], None] | None = None) -> LongContextPoint:
    """Prefill (timed, capture off), then every layer summarised from the embeddings up."""
    seconds, kv = prefill(lm, ids)
    summaries = summarise(lm.model, embeddings(lm.model, ids, lm.device), lambda i: None, lm.spec.n_layers,
                          window, progress)
    spec, n = lm.spec, len(ids)
    kept = spec.n_layers * spec.d_model * n * lm.dtype.itemsize
    return LongContextPoint(n, seconds, kv, kept, spec.n_layers * spec.n_heads * n * n * 4, summaries)


def lengths_up_to(n: int) -> list[int]:
    """128, 256, 512, ... doubling, then n itself: the slider's curve grows as N does."""
    out, size = [], MIN_TOKENS
    while size < n:
        out.append(size)
        size *= 2
    return out + [n]


def sweep(lm: LoadedModel, lengths: list[int], window: int,
          progress: Callable[[float, str], None]) -> Iterator[LongContextPoint]:
    """Each length in turn, its progress a share of the whole (a length's cost grows about as its square)."""
    weights = [n * n for n in lengths]
    done, total = 0.0, float(sum(weights))
    for n, w in zip(lengths, weights):
        report = lambda i, text, base=done, w=w: progress((base + w * i / lm.spec.n_layers) / total,  # noqa: E731
                                                          f"N = {n:,}: {text}")
        progress(done / total, f"N = {n:,}: prefill")
        yield measure_length(lm, text_ids(lm, n), window, report)
        done += w
