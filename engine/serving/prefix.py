"""Prefix caching: prompts that start alike reuse the K/V their common start already has in memory.

    prefix = PrefixCache(max_bytes=64 * 2**20)
    entry, n = prefix.lookup(ids, policy, layer_ids, n_heads)     # the longest stored start of `ids`
    ...                                                          # prefill only ids[n:] on top of entry's K/V
    prefix.store(ids, cache, captures)                          # after a prefill: keep its K/V for the next

Causal attention makes this exact: the K/V of position i depends only on tokens 0..i, so a prompt that
shares its first n tokens with one seen before needs only its own tail computed (the chat template's
system prompt, a presenter's pushed prompt sent by the whole room). An entry also keeps the full prefill
attention matrices that were captured with it, so a request that captures them gets the rows of the
reused part from the entry: the same rows its own prefill would have computed, since row i only sees
keys 0..i. Entries are evicted least recently used first, to stay within `max_bytes`.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import DynamicCache

from engine.core.hooks import CapturePolicy, LayerCapture

MIN_REUSE = 8                 # shorter common starts are not worth a lookup's copy


@dataclass(eq=False)
class PrefixEntry:
    ids: np.ndarray                                   # (T,) the prompt whose K/V this is
    keys: list[torch.Tensor]                          # per layer [1, KVH, T, D]
    values: list[torch.Tensor]
    attention: dict[int, tuple[tuple[int, ...], np.ndarray]] = field(default_factory=dict)  # layer -> (heads, (h, T, T))
    nbytes: int = 0
    inputs: dict[int, torch.Tensor] = field(default_factory=dict)   # layer -> (T, d_model) its input, kept inputs


@dataclass
class PrefixStats:
    lookups: int = 0
    hits: int = 0
    queried_tokens: int = 0      # prompt tokens looked up (vLLM's prefix_cache_queries)
    reused_tokens: int = 0
    entries: int = 0
    bytes: int = 0


class PrefixCache:
    """Stored prompt K/V (and captured prefill matrices), looked up by the longest common start."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._entries: OrderedDict[int, PrefixEntry] = OrderedDict()
        self._ids = 0
        self.stats = PrefixStats()

    def lookup(self, ids: list[int], policy: CapturePolicy, layer_ids: frozenset[int],
               n_heads: int) -> tuple[PrefixEntry | None, int]:
        """The entry sharing the longest start with `ids` (at most all but the last token) that serves `policy`."""
        self.stats.lookups += 1
        self.stats.queried_tokens += len(ids)
        want = np.asarray(ids)
        best, best_n = None, 0
        for key, entry in self._entries.items():
            n = min(_common_start(entry.ids, want), len(ids) - 1)
            if n >= max(MIN_REUSE, best_n + 1) and _serves(entry, policy, layer_ids, n_heads):
                best, best_n, best_key = entry, n, key
        if best is None:
            return None, 0
        self._entries.move_to_end(best_key)
        self.stats.hits += 1
        self.stats.reused_tokens += best_n
        return best, best_n

    def store(self, ids: list[int], cache: DynamicCache, captures: dict[int, LayerCapture],
              inputs: dict[int, torch.Tensor] | None = None) -> None:
        """Keep a prefilled prompt's K/V (references: nothing here is ever written in place), with its captured maps
        and its kept layer inputs (T, d_model) when they fit too (those are copied: a run's buffers move)."""
        if self.max_bytes <= 0 or any(np.array_equal(e.ids, ids) for e in self._entries.values()):
            return
        keys = [layer.keys for layer in cache.layers]
        values = [layer.values for layer in cache.layers]
        attention = {i: (c.heads, c.attention) for i, c in captures.items()
                     if c.attention is not None and c.query_start == 0 and c.key_start == 0
                     and c.attention.shape[1:] == (len(ids), len(ids))}
        kv = sum(t.numel() * t.element_size() for t in keys + values)
        inputs = inputs or {}
        extra = sum(a.nbytes for _, a in attention.values()) + sum(t.numel() * t.element_size() for t in inputs.values())
        if kv > self.max_bytes:
            return
        if kv + extra > self.max_bytes:
            attention, inputs, extra = {}, {}, 0
        self._ids += 1
        copies = {i: t.clone() for i, t in inputs.items()}
        self._entries[self._ids] = PrefixEntry(np.asarray(ids), keys, values, attention, kv + extra, copies)
        self._evict()

    def _evict(self) -> None:
        while self._entries and sum(e.nbytes for e in self._entries.values()) > self.max_bytes:
            self._entries.popitem(last=False)
        self.stats.entries = len(self._entries)
        self.stats.bytes = sum(e.nbytes for e in self._entries.values())

    def clear(self) -> None:
        self._entries.clear()
        self._evict()


def load_prefix(cache: DynamicCache, entry: PrefixEntry, n: int) -> None:
    """Fill an empty per-request cache with the entry's first n positions."""
    for layer, k, v in zip(cache.layers, entry.keys, entry.values):
        layer.lazy_initialization(k[..., :n, :], v[..., :n, :])
        layer.keys, layer.values = k[..., :n, :], v[..., :n, :]


def reused_rows(entry: PrefixEntry, n: int, policy: CapturePolicy, layer_ids: frozenset[int],
                n_heads: int) -> dict[int, LayerCapture]:
    """The captured prefill rows 0..n-1 of the reused part, for the heads `policy` keeps (h, n, n)."""
    if not _needs_matrix(policy, layer_ids):
        return {}
    heads = policy.head_ids(n_heads)
    out = {}
    for i in layer_ids:
        stored_heads, matrix = entry.attention[i]
        rows = [stored_heads.index(h) for h in heads]
        out[i] = LayerCapture(layer=i, attention=matrix[rows, :n, :n])
    return out


def _needs_matrix(policy: CapturePolicy, layer_ids: frozenset[int]) -> bool:
    return bool(layer_ids) and policy.attention and policy.prefill_matrix


def _serves(entry: PrefixEntry, policy: CapturePolicy, layer_ids: frozenset[int], n_heads: int) -> bool:
    """Can this entry stand in for the prefill of its part, captures (and kept layer inputs) included?"""
    if policy.keeps_inputs and not set(policy.input_ids(len(entry.keys))) <= set(entry.inputs):
        return False
    if not _needs_matrix(policy, layer_ids):
        return True
    if policy.max_keys:
        return False
    heads = set(policy.head_ids(n_heads))
    return all(i in entry.attention and heads <= set(entry.attention[i][0]) for i in layer_ids)


def _common_start(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n
