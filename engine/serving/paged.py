"""The batch's KV cache in fixed-size blocks, as vLLM's PagedAttention keeps it.

    batch = PagedBatch(block=16)
    batch.admit(slot, spec, dtype, device)   # a newcomer's (empty) block table; its prefill writes into its blocks
    valid = batch.plan([n], slots=[slot])    # a prefill chunk of n tokens: where its K/V and residual go
    batch.join(slot)                         # its prompt is in: it decodes with the batch
    valid = batch.plan([1] * len(batch.slots))   # a decode step; the forward's kv is `batch.write_and_gather`
    batch.plan_into(index)                   # a graphed decode step: the same slots into its index buffer, in place
    batch.table()                       # who holds which block, how full, how many free (measured)

Storage: per layer one K pool and one V pool of `n_blocks * block` slots, [slots, KVH, D]. A request owns
a list of blocks, its block table; its position p lives in slot `table[p // block] * block + p % block`.
Beside them, once a request that captures is admitted, the residual pool [L + 1, slots, d_model]: the residual stream
entering every layer and the final norm (engine/core/hooks.py), in the same slots, so a capturing request's
residual lives in its own blocks and leaves with them. Each step, prefill or decode, writes it itself, at the slots
the new tokens' K/V go to (`residual_slots`; SCRATCH for rows that capture nothing, for pads and for a CUDA graph's
padding rows).
A request takes a new block only when its last one is full, and gives all back when it leaves, so no
memory is reserved for tokens not yet generated and nothing is copied when others join or leave.

Block 0 is the null block: never handed out, its first slot stays zero, and padding reads it. For the
forward each layer gathers the batch's rows into the left-padded [B, KVH, W, D] that attention reads:
vLLM's kernel reads the blocks in place; a gather is the plain-PyTorch way to the same numbers, and
costs what DynamicCache's per-step `torch.cat` cost before it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache

from engine.core.records import CacheState

BLOCK = 16                 # tokens per block: vLLM's default
FIRST_BLOCKS = 64          # the pool's size at the start; it doubles when full
NULL = 0                   # the null block
SCRATCH = 1                # a slot of the null block nobody reads: a CUDA graph's padding rows write there
# the columns of a graphed decode step's index buffer [R, 4 + W] (PagedBatch.plan_into): per row
IDS, POS, WRITE, RESID, GATHER = 0, 1, 2, 3, 4   # token id, position, K/V slot, residual slot, then the W slots read


@dataclass(frozen=True)
class BlockTable:
    """The pool after a step, read from the cache object: one row per request in the batch."""

    block: int                                        # tokens per block
    n_blocks: int                                     # blocks in the pool (the null block not counted)
    free: int                                         # of those, held by nobody
    rows: tuple[tuple[Any, tuple[int, ...], int], ...]  # (request label, its blocks in order, its tokens)
    bytes_per_block: int                              # K and V of one block, all layers
    resid_bytes_per_block: int = 0                    # the residual of one block, every hidden state (0: no pool)
    held: int = 0                                     # blocks of finished runs whose residual is yet to move out

    @property
    def used(self) -> int:
        """Blocks held by the requests in the table (not the finished runs' `held`)."""
        return self.n_blocks - self.free - self.held

    @property
    def tokens(self) -> int:
        return sum(n for _, _, n in self.rows)

    @property
    def empty_slots(self) -> int:
        """Slots inside handed-out blocks that hold no token yet: the tail of each request's last block."""
        return self.used * self.block - self.tokens

    @property
    def fragmentation(self) -> float:
        """Share of the handed-out slots that hold nothing (internal fragmentation)."""
        return self.empty_slots / (self.used * self.block) if self.used else 0.0


class BlockPool:
    """K and V slots for every layer, handed out a block at a time.

    Its tensors are always normal tensors, never inference tensors, wherever they are made: a step grows the pool
    inside `torch.inference_mode()`, and a prefix reused at a request's admission writes into it outside; an
    inference tensor refuses that write (the load bench's second room lost all 30 requests to it, now and then)."""

    @torch.inference_mode(False)
    def __init__(self, n_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device,
                 block: int = BLOCK, n_blocks: int | None = None):
        n_blocks = n_blocks or FIRST_BLOCKS
        self.block, self.n_blocks = block, n_blocks
        shape = (n_blocks * block, kv_heads, head_dim)                   # [slots, KVH, D]
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.free = list(range(n_blocks - 1, NULL, -1))                  # pop() hands out the lowest first
        # K and V of one block in every layer; growing keeps it. A plain int: the scheduler asks for it per row
        # per step, and reading it off a tensor each time cost a 30-row step a tenth of its host time.
        self.bytes_per_block = 2 * n_layers * block * kv_heads * head_dim * self.keys[0].element_size()
        self.resid: torch.Tensor | None = None                            # [L + 1, slots, d_model], once needed
        self.resid_bytes_per_block = 0
        self.reclaim: Callable[[], bool] | None = None   # frees held blocks when none is free (`PagedBatch.settle`)

    @torch.inference_mode(False)
    def ensure_residual(self, d_model: int, dtype: torch.dtype) -> torch.Tensor:
        """The residual pool beside K and V (made at the first request that captures; kept while the pool lives)."""
        if self.resid is None:
            self.resid = torch.zeros((len(self.keys) + 1, self.n_blocks * self.block, d_model), dtype=dtype,
                                     device=self.keys[0].device)
            self.resid_bytes_per_block = self.resid.shape[0] * self.block * d_model * self.resid.element_size()
        return self.resid

    def allocate(self) -> int:
        while not self.free and self.reclaim is not None and self.reclaim():
            pass
        if not self.free:
            self._grow()
        return self.free.pop()

    def release(self, blocks: list[int]) -> None:
        self.free.extend(blocks)
        self.free.sort(reverse=True)

    def slots(self, table: list[int], lo: int, hi: int) -> torch.Tensor:
        """Slot ids of positions lo..hi-1 of the request that owns `table`."""
        p = torch.arange(lo, hi)
        blocks = torch.tensor(table, dtype=torch.long)[p // self.block]
        return (blocks * self.block + p % self.block).to(self.keys[0].device)

    @torch.inference_mode(False)
    def _grow(self) -> None:
        """Double the pool: the existing slots keep their ids, so no block table changes."""
        n = self.n_blocks
        self.keys = [torch.cat([k, torch.zeros_like(k)]) for k in self.keys]
        self.values = [torch.cat([v, torch.zeros_like(v)]) for v in self.values]
        if self.resid is not None:
            self.resid = torch.cat([self.resid, torch.zeros_like(self.resid)], dim=1)
        self.free = list(range(2 * n - 1, n - 1, -1)) + self.free
        self.n_blocks = 2 * n


class PagedLayer(CacheLayerMixin):
    """One layer's view of the paged batch: writes the step's new K/V into blocks, returns the gathered rows."""

    is_sliding = False

    def __init__(self, batch: PagedBatch, index: int):
        super().__init__()
        self.batch, self.index, self.is_initialized = batch, index, True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        return self.batch.write_and_gather(self.index, key_states, value_states)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.batch.width + query_length, 0

    def get_seq_length(self) -> int:
        return self.batch.width

    def get_max_length(self) -> int:
        return -1


class PagedBatch:
    """The running batch: its requests (slots), their block tables, and the HF cache the forward reads."""

    def __init__(self, block: int = BLOCK, pool: BlockPool | None = None):
        """`pool`: a pool made beforehand and kept for good (a CUDA graph reads and writes its tensors in place,
        so they must never move); by default one is made at the first request and dropped when the batch
        empties."""
        self.block = pool.block if pool is not None else block
        self.pool, self.kept_pool = pool, pool
        if pool is not None:
            self.cache = Cache(layers=[PagedLayer(self, i) for i in range(len(pool.keys))])
            pool.reclaim = self._settle_one
        self.slots: list[Any] = []                    # runner Slots, in batch order; each has .length
        self.tables: dict[Any, list[int]] = {}
        self.held: dict[Any, list[int]] = {}          # finished runs' KeptInputs -> the blocks their residual is in
        if pool is None:
            self.cache: Cache | None = None
        self._write: torch.Tensor | None = None       # [B, T] slot each new token goes to (SCRATCH: none)
        self._resid_write: torch.Tensor | None = None  # [B * T] the same for its residual; SCRATCH: keeps none
        self._gather: torch.Tensor | None = None      # [B, S] slots attention reads, NULL for pads

    @property
    def width(self) -> int:
        """Positions of the longest row: the left-padded view's width before this step."""
        return max((s.length for s in self.slots), default=0)

    def pads(self) -> list[int]:
        return [self.width - s.length for s in self.slots]

    def admit(self, slot: Any, spec: Any, dtype: torch.dtype, device: torch.device) -> None:
        """A newcomer gets a block table (empty) before its prompt is prefilled: its prompt's K/V, and its residual
        when it keeps one (`slot.kept`), are written straight into the pool by the prefill steps (`plan`); it
        decodes with the batch once it `join`s. `spec`: the model's shapes, for the pool made at the first request."""
        if self.pool is None:
            self.pool = BlockPool(spec.n_layers, spec.n_kv_heads, spec.head_dim, dtype, device, self.block)
            self.cache = Cache(layers=[PagedLayer(self, i) for i in range(spec.n_layers)])
            self.pool.reclaim = self._settle_one
        self.tables[slot] = []
        kept = getattr(slot, "kept", None)
        if kept is not None:
            self.pool.ensure_residual(kept.d_model, kept.dtype)
            kept.enter_pool(self.pool, self.tables[slot])

    def load(self, slot: Any, keys: list[torch.Tensor], values: list[torch.Tensor], n: int) -> torch.Tensor:
        """An admitted slot's first n positions from stored K/V (per layer [1, KVH, >= n, D]: a reused prefix);
        returns their slots [n] (where the residual of those positions goes)."""
        table = self.tables[slot]
        while n > len(table) * self.block:
            table.append(self.pool.allocate())
        where = self.pool.slots(table, 0, n)
        for i, (k, v) in enumerate(zip(keys, values)):
            self.pool.keys[i][where] = k[0, :, :n].transpose(0, 1)                 # [n, KVH, D]
            self.pool.values[i][where] = v[0, :, :n].transpose(0, 1)
        return where

    def join(self, slot: Any) -> None:
        """An admitted slot whose prompt is in decodes with the batch from the next step."""
        self.slots.append(slot)

    def own_cache(self, slot: Any, config: Any) -> DynamicCache:
        """A slot's K/V alone (copied out of the pool), as a cache of its own (batch of one)."""
        where = self.pool.slots(self.tables[slot], 0, slot.length)
        own = DynamicCache(config=config)
        for layer, k_pool, v_pool in zip(own.layers, self.pool.keys, self.pool.values):
            k, v = (p[where].transpose(0, 1).unsqueeze(0).contiguous() for p in (k_pool, v_pool))  # [1, KVH, n, D]
            layer.lazy_initialization(k, v)
            layer.keys, layer.values = k, v
        return own

    def drop(self, gone: set, hold: bool = False) -> None:
        """Requests leave, in the batch or still prefilling; their blocks go back to the pool at once (a residual
        copied out first), or with `hold` (runs that finished in a decode step) those whose residual is in them stay
        held: it is read there until `settle` copies it out, off the step that finished them."""
        for slot in [s for s in self.tables if s in gone]:
            kept = getattr(slot, "kept", None)
            if hold and kept is not None and kept.in_pool:
                self.held[kept] = self.tables.pop(slot)
                continue
            if kept is not None:
                kept.leave_pool()
            self.pool.release(self.tables.pop(slot))
        self.slots = [s for s in self.slots if s not in gone]
        self._maybe_empty()

    def settle(self) -> None:
        """Every held run's residual copied out of the pool into buffers of its own; its blocks given back."""
        while self._settle_one():
            pass

    def _settle_one(self) -> bool:
        """The oldest held run settled (the pool needs a block, or nothing else runs); False when none is held."""
        if not self.held:
            return False
        kept = next(iter(self.held))
        kept.leave_pool()
        self.pool.release(self.held.pop(kept))
        self._maybe_empty()
        return True

    def _maybe_empty(self) -> None:
        if not self.tables and not self.held and self.kept_pool is None:  # an idle server gives the memory back
            self.pool = self.cache = None

    def step_mask(self, rows: int | None = None, width: int | None = None) -> torch.Tensor:
        """Plan one decode step (a new block for each row whose last one is full); its mask [B, W + 1] (1: a key
        the row reads). With `rows` and `width` (a CUDA graph's fixed shapes), see `plan`."""
        return self.plan([1] * len(self.slots), rows, width).long()

    def plan(self, new: list[int], rows: int | None = None, width: int | None = None,
             slots: list | None = None) -> torch.Tensor:
        """Plan a step in which row b feeds `new[b]` tokens after its `length` (1: a decode row; more: a chunk of a
        prompt): blocks for them, where their K/V and residual go and which slots attention reads. Returns the keys
        each row reads, [R, S] (True: real), right-aligned: row b's new tokens are its last new[b] columns and the
        step's T = max(new) queries sit on the last T columns, left-padded (`engine.core.lean.causal_mask`).

        With `rows` and `width` (a CUDA graph's fixed shapes): more keys on the left, all hidden, and rows of padding
        after the batch's, each reading the null slot and writing a scratch slot nobody reads. `slots`: the rows
        (admitted ones, e.g. newcomers prefilling), by default the batch's."""
        slots = self.slots if slots is None else slots
        for slot, n in zip(slots, new):
            while slot.length + n > len(self.tables[slot]) * self.block:
                self.tables[slot].append(self.pool.allocate())
        k, t = len(slots), max(new)
        rows = rows or k
        ends = torch.tensor([s.length + n for s, n in zip(slots, new)] + [1] * (rows - k))      # [R]
        width = width or int(ends.max())
        longest = max(len(self.tables[s]) for s in slots)
        tables = torch.tensor([self.tables[s] + [NULL] * (longest - len(self.tables[s])) for s in slots]
                              + [[NULL] * longest] * (rows - k))
        p = torch.arange(width) - (width - ends)[:, None]                            # [R, S] own positions
        real = p >= 0
        p = p.clamp(min=0)
        gather = torch.where(real, tables.gather(1, p // self.block) * self.block + p % self.block, NULL)
        fed = torch.tensor(list(new) + [t] * (rows - k))                             # padding rows: any
        write = torch.where(torch.arange(t)[None, :] >= (t - fed)[:, None], gather[:, width - t:], SCRATCH)
        write[k:] = SCRATCH                                                          # [R, T] the new tokens
        keeps = torch.tensor([getattr(s, "kept", None) is not None for s in slots] + [False] * (rows - k))
        device = self.pool.keys[0].device
        self._gather, self._write = gather.to(device), write.to(device)
        self._resid_write = torch.where(keeps[:, None], write, SCRATCH).flatten().to(device)
        return real.to(device)

    def segment(self, slot: Any, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One row of a flattened step feeding `n` tokens after its `length` (a prefill chunk): blocks for them;
        the slots its attention reads [length + n] (its own, no pads), its new tokens' K/V slots [n] and their
        residual's [n] (SCRATCH where it keeps none)."""
        table = self.tables[slot]
        while slot.length + n > len(table) * self.block:
            table.append(self.pool.allocate())
        reads = self.pool.slots(table, 0, slot.length + n)
        write = reads[slot.length:]
        keeps = getattr(slot, "kept", None) is not None
        return reads, write, write if keeps else torch.full_like(write, SCRATCH)

    @property
    def reads(self) -> torch.Tensor:
        """[R, S] the slots each row reads in the step planned last (`plan`), NULL for pads."""
        return self._gather

    @property
    def writes(self) -> torch.Tensor:
        """[R, T] the slot each new token's K/V goes to in the step planned last (SCRATCH: none)."""
        return self._write

    @property
    def residual_slots(self) -> torch.Tensor:
        """[B * T] the slot each new token's residual goes to in this step (SCRATCH for rows that keep none)."""
        return self._resid_write

    def keep_residual(self, hidden_states: tuple[torch.Tensor, ...]) -> None:
        """A decode step's hidden states (L + 1 of [B, 1, d_model]) into the residual pool at the new tokens' slots."""
        write_residual(self.pool.resid, self._resid_write, hidden_states)

    def write_and_gather(self, layer: int, key: torch.Tensor, value: torch.Tensor):
        # key, value: [B, KVH, T, D] new -> pools at the planned slots; returns [B, KVH, S, D], pads reading the null
        # slot
        return write_and_gather(self.pool.keys[layer], self.pool.values[layer], self._write, self._gather, key, value)

    def plan_into(self, index: np.ndarray) -> None:
        """Plan a decode step of the batch's rows into a graph's index buffer, in place: `index` [R, 4 + W] (numpy,
        over the host's staging tensor; engine.serving.graphed.StepInputs), row b holding its token id, its
        position, the slot its K/V goes to, the slot its residual goes to (SCRATCH where it keeps none) and the W
        slots it reads, left-padded with NULL; rows past the batch's are padding (they read NULL, write SCRATCH).
        The same slots as `plan(..., rows, width)` (tests/test_paged.py), without a tensor made per step."""
        slots, block = self.slots, self.block
        for slot in slots:
            while slot.length + 1 > len(self.tables[slot]) * block:
                self.tables[slot].append(self.pool.allocate())
        k, width = len(slots), index.shape[1] - GATHER
        lengths = np.fromiter((s.length for s in slots), np.int64, k)                  # [B] the new tokens' positions
        tables = np.full((k, max(len(self.tables[s]) for s in slots)), NULL, np.int64)
        for b, slot in enumerate(slots):
            tables[b, :len(self.tables[slot])] = self.tables[slot]
        p = np.arange(width) - (width - 1 - lengths)[:, None]                         # [B, W] own positions
        own = np.maximum(p, 0)
        gather = np.where(p >= 0, np.take_along_axis(tables, own // block, 1) * block + own % block, NULL)
        index[:k, GATHER:] = gather
        index[:k, IDS] = [s.token.id for s in slots]
        index[:k, POS] = lengths
        index[:k, WRITE] = gather[:, -1]
        index[:k, RESID] = np.where([getattr(s, "kept", None) is not None for s in slots], gather[:, -1], SCRATCH)
        pad_rows(index[k:], index[0, IDS])

    def row_cache(self, b: int, config: Any) -> DynamicCache:
        """Row b's K/V alone, as a cache of its own (batch of one): for probing a failure."""
        return self.own_cache(self.slots[b], config)

    def state(self, length: int) -> CacheState:
        """A request's cache as if it were alone: the bytes of its `length` positions."""
        per_layer = length * self.pool.bytes_per_block // (self.block * len(self.pool.keys))
        return CacheState(length, per_layer * len(self.pool.keys), [per_layer] * len(self.pool.keys))

    def table(self) -> BlockTable | None:
        if self.pool is None:
            return None
        admitted = [s for s in self.tables if s not in self.slots]      # newcomers prefilling into their blocks
        rows = tuple((s.label, tuple(self.tables[s]), s.length) for s in [*self.slots, *admitted])
        return BlockTable(self.block, self.pool.n_blocks - 1, len(self.pool.free), rows, self.pool.bytes_per_block,
                          self.pool.resid_bytes_per_block, sum(map(len, self.held.values())))


def pad_rows(index: np.ndarray, token: int = 0) -> None:
    """Rows of a graph's index buffer [R, 4 + W] as padding, in place: any real token at position 0, reading the
    null slot, writing K/V and residual to the scratch slot."""
    index[:, IDS], index[:, POS], index[:, WRITE], index[:, RESID], index[:, GATHER:] = token, 0, SCRATCH, SCRATCH, NULL


def write_and_gather(k_pool: torch.Tensor, v_pool: torch.Tensor, write: torch.Tensor, gather: torch.Tensor,
                     key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's new K/V into its pools [slots, KVH, D] at `write` (B * T slots), and the keys and values each row
    reads, gathered at `gather` [B, S] (NULL for pads): key, value [B, KVH, T, D] -> [B, KVH, S, D] each."""
    where = write.reshape(-1)
    k_pool[where] = key.transpose(1, 2).reshape(-1, *k_pool.shape[1:])
    v_pool[where] = value.transpose(1, 2).reshape(-1, *v_pool.shape[1:])
    b, w = gather.shape
    flat = gather.reshape(-1)
    k = k_pool.index_select(0, flat).view(b, w, *k_pool.shape[1:]).transpose(1, 2)
    v = v_pool.index_select(0, flat).view(b, w, *v_pool.shape[1:]).transpose(1, 2)
    return k, v


def write_residual(resid: torch.Tensor, write: torch.Tensor, hidden_states: tuple[torch.Tensor, ...]) -> None:
    """Each row's newest hidden states into the residual pool: resid [L + 1, slots, d_model], write [R] (a slot per
    row), hidden_states L + 1 of [R, T, d_model]. One in-place copy at fixed addresses (a CUDA graph replays it)."""
    resid.index_copy_(1, write, torch.stack([h[:, -1] for h in hidden_states]))


class SoloBatch:
    """A batch of one on the request's own HF cache: for models whose layers keep a sliding window of
    positions (each layer its own), which neither pad nor page together."""

    def __init__(self) -> None:
        self.slots: list[Any] = []
        self.cache: DynamicCache | None = None

    @property
    def width(self) -> int:
        return self.slots[0].length if self.slots else 0

    def pads(self) -> list[int]:
        return [0] * len(self.slots)

    def add(self, slot: Any, own: DynamicCache) -> None:
        if self.slots:
            raise ValueError("a solo batch holds one request")
        self.slots, self.cache = [slot], own

    def drop(self, gone: set, hold: bool = False) -> None:
        if any(s in gone for s in self.slots):
            self.slots, self.cache = [], None

    def step_mask(self) -> torch.Tensor:
        return torch.ones((1, self.width + 1), dtype=torch.long, device=self.cache.layers[0].keys.device)

    def keep_residual(self, hidden_states: tuple[torch.Tensor, ...]) -> None:
        """The step's hidden states (L + 1 of [1, 1, d_model]) into the request's own kept buffers."""
        slot = self.slots[0]
        slot.kept.write_states(slot.length, [h[0] for h in hidden_states])

    def row_cache(self, b: int, config: Any) -> DynamicCache:
        return self.cache

    def state(self, length: int) -> CacheState:
        return row_cache_state(self.cache, length)

    def table(self) -> None:
        return None


def row_cache_state(cache: DynamicCache, length: int) -> CacheState:
    """One request's own cache: the bytes of its `length` positions (a windowed layer holds fewer: only the
    rows it keeps)."""
    per_layer = [min(length, layer.keys.shape[-2]) * layer.keys[:1, :, :1].numel() * layer.keys.element_size() * 2
                 for layer in cache.layers if getattr(layer, "keys", None) is not None]
    return CacheState(length, sum(per_layer), per_layer)
