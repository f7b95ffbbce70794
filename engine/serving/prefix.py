"""Prefix caching: prompts that start alike reuse the K/V their common start already has in memory.

    prefix = PrefixCache(max_bytes=64 * 2**20)
    entry, n = prefix.lookup(ids, kept_layers)                  # the longest stored start of `ids`
    ...                                                          # prefill only ids[n:] on top of entry's K/V
    prefix.store(ids, cache, inputs)                            # after a prefill: keep its K/V for the next

Causal attention makes this exact: the K/V of position i depends only on tokens 0..i, so a prompt that
shares its first n tokens with one seen before needs only its own tail computed (the chat template's
system prompt, a presenter's pushed prompt sent by the whole room). The residual stream at position i depends
only on tokens 0..i too, so an entry also keeps the residual its prompt's run kept, and a request that captures
takes the reused part's residual from it exactly as its K/V: a prefix hit leaves no hole in what the run keeps.
A request that captures only reuses an entry holding every hidden state it keeps; an entry stored without them
is replaced by one with them. Entries are evicted least recently used first, to stay within `max_bytes`.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import DynamicCache

MIN_REUSE = 8                 # shorter common starts are not worth a lookup's copy


@dataclass(eq=False)
class PrefixEntry:
    ids: np.ndarray                                   # (T,) the prompt whose K/V this is
    keys: list[torch.Tensor]                          # per layer [1, KVH, T, D]
    values: list[torch.Tensor]
    nbytes: int = 0
    inputs: dict[int, torch.Tensor] = field(default_factory=dict)   # hidden state -> (T, d_model): the residual


@dataclass
class PrefixStats:
    lookups: int = 0
    hits: int = 0
    queried_tokens: int = 0      # prompt tokens looked up (vLLM's prefix_cache_queries)
    reused_tokens: int = 0
    entries: int = 0
    bytes: int = 0


class PrefixCache:
    """Stored prompt K/V (and residual), looked up by the longest common start."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._entries: OrderedDict[int, PrefixEntry] = OrderedDict()
        self._ids = 0
        self.stats = PrefixStats()

    def lookup(self, ids: list[int], kept: tuple[int, ...] = ()) -> tuple[PrefixEntry | None, int]:
        """The entry sharing the longest start with `ids` (at most all but the last token) that holds the hidden
        states `kept` (those a request that captures keeps)."""
        self.stats.lookups += 1
        self.stats.queried_tokens += len(ids)
        want = np.asarray(ids)
        best, best_n = None, 0
        for key, entry in self._entries.items():
            n = min(_common_start(entry.ids, want), len(ids) - 1)
            if n >= max(MIN_REUSE, best_n + 1) and set(kept) <= set(entry.inputs):
                best, best_n, best_key = entry, n, key
        if best is None:
            return None, 0
        self._entries.move_to_end(best_key)
        self.stats.hits += 1
        self.stats.reused_tokens += best_n
        return best, best_n

    def store(self, ids: list[int], cache: DynamicCache, inputs: dict[int, torch.Tensor] | None = None) -> None:
        """Keep a prefilled prompt's K/V (references: nothing here is ever written in place), with the residual its
        run kept, (T, d_model) per hidden state, when it fits too (copied: a run's buffers move). The same prompt
        stored already is replaced only by an entry that holds more of the residual."""
        inputs = inputs or {}
        same = [k for k, e in self._entries.items() if np.array_equal(e.ids, ids)]
        if self.max_bytes <= 0 or any(set(inputs) <= set(self._entries[k].inputs) for k in same):
            return
        keys = [layer.keys for layer in cache.layers]
        values = [layer.values for layer in cache.layers]
        kv = sum(t.numel() * t.element_size() for t in keys + values)
        extra = sum(t.numel() * t.element_size() for t in inputs.values())
        if kv > self.max_bytes:
            return
        if kv + extra > self.max_bytes:
            inputs, extra = {}, 0
        for k in same:
            del self._entries[k]
        self._ids += 1
        copies = {i: t.clone() for i, t in inputs.items()}
        self._entries[self._ids] = PrefixEntry(np.asarray(ids), keys, values, kv + extra, copies)
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


def _common_start(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n
