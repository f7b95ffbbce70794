"""What a run keeps: the residual stream at every position, in the model's own dtype. From it any view is computed
again, exactly, when someone asks (engine/core/views.py). Memory grows with the length, not its square.

    kept = KeptInputs(layers=(0, 10, 20, 30), d_model=576, dtype=torch.float32, device="cpu", capacity=1200)
    kept.write_states(start=0, states=out.hidden_states_of_row)   # hidden state i: (T, d_model) at start..start+T-1
    kept.commit()                                  # after each forward pass: positions every kept state holds
    kept.input(10)                                 # (n, d_model): the residual entering layer 10 at positions 0..n-1
    kept.rows(30, [5])                             # (1, d_model): the final norm's input at position 5

`layers` are hidden-state indices as transformers numbers them (hooks.py): i < L is the input of layer i, L the final
norm's input. A run's rows live in buffers of its own while its prompt is prefilled (and for a run outside the
batch: the command line, a speculative run); in the batch they live in the paged residual pool beside the run's
K/V blocks (`enter_pool`, engine/serving/paged.py), written by the batched step itself; when the run leaves the batch
they are copied back into buffers of its own (`leave_pool`) before its blocks are freed. Readers (a page asking for a
row while the run streams) take the same lock, so they never read a block that was given back.

Writes name their first position, so a pass that is run again (a speculative verify pass whose drafts were rejected)
overwrites what it wrote before instead of appending twice.
"""
from __future__ import annotations

import threading
from typing import Any, Sequence

import torch

GROWTH = 2                       # a buffer that fills up grows by this factor


class KeptInputs:
    """Per kept hidden state, (capacity, d_model) rows filled position by position, or rows of a residual pool.
    Thread-safe."""

    def __init__(self, layers: tuple[int, ...], d_model: int, dtype: torch.dtype, device: torch.device | str,
                 capacity: int = 256):
        self.layers, self.d_model, self.dtype = tuple(sorted(layers)), d_model, dtype
        self.device = torch.device(device)
        self._buffers: dict[int, torch.Tensor] = {}
        self._ends: dict[int, int] = {i: 0 for i in self.layers}
        self._capacity = max(1, capacity)
        self._lock = threading.RLock()
        self._pool: tuple[Any, list[int]] | None = None   # (BlockPool, the run's block table) while in the batch
        self.length = 0                            # positions committed: held by every kept state
        self.recomputed: dict[int, torch.Tensor] = {}   # layer -> (n, d_model) built on demand (at most one kept)

    @property
    def capacity(self) -> int:
        """Positions the buffers make room for at first (a run's prompt and new tokens)."""
        return self._capacity

    @property
    def bytes_per_position(self) -> int:
        return len(self.layers) * self.d_model * torch.empty((), dtype=self.dtype).element_size()

    @property
    def in_pool(self) -> bool:
        return self._pool is not None

    @property
    def nbytes(self) -> int:
        held = (self.length * self.bytes_per_position if self.in_pool
                else sum(b.numel() * b.element_size() for b in self._buffers.values()))
        return held + sum(t.numel() * t.element_size() for t in self.recomputed.values())

    # --- writing ---------------------------------------------------------------------------------------------

    def write(self, layer: int, start: int, hidden: torch.Tensor) -> None:
        # hidden: (T, d_model), hidden state `layer` at positions start..start+T-1
        if layer not in self._ends:
            return
        end = start + hidden.shape[0]
        with self._lock, torch.inference_mode():        # buffers made in a forward pass are inference tensors
            buf = self._room(layer, end)
            buf[start:end].copy_(hidden.detach())
            self._ends[layer] = end

    def write_states(self, start: int, states: Sequence[torch.Tensor | None]) -> None:
        """One pass's hidden states of one row (states[i]: (T, d_model), None where not selected) at start..."""
        for i in self.layers:
            if i < len(states) and states[i] is not None:
                self.write(i, start, states[i])

    def _room(self, layer: int, end: int) -> torch.Tensor:
        buf = self._buffers.get(layer)
        if buf is None or buf.shape[0] < end:
            size = max(end, self._capacity, GROWTH * (buf.shape[0] if buf is not None else 0))
            grown = torch.empty((size, self.d_model), dtype=self.dtype, device=self.device)
            if buf is not None:
                grown[: buf.shape[0]].copy_(buf)
            self._buffers[layer] = buf = grown
        return buf

    def commit(self, length: int | None = None) -> None:
        """After a forward pass: the positions every kept state now holds are readable (in the pool: `length`, which
        the batch knows)."""
        with self._lock:
            self.length = length if length is not None else min(self._ends.values(), default=0)

    # --- the batch's residual pool ---------------------------------------------------------------------------

    def enter_pool(self, pool: Any, table: list[int]) -> None:
        """The run joins the batch: its rows so far go into the pool at its blocks' slots; the batched step writes
        the next ones there itself. `table` is the run's block table (the batch appends to it)."""
        with self._lock, torch.inference_mode():
            if self.length:                        # a newcomer admitted before its prefill holds nothing yet
                where = pool.slots(table, 0, self.length)
                for i in self.layers:
                    pool.resid[i, where] = self._buffers[i][: self.length].to(pool.resid.dtype)
            self._buffers, self._pool = {}, (pool, table)

    def leave_pool(self) -> None:
        """The run leaves the batch (done, stopped, failed): its rows come back into buffers of its own, exactly as
        long as what it holds, before its blocks are given back."""
        with self._lock, torch.inference_mode():
            if self._pool is None:
                return
            pool, table = self._pool
            where = pool.slots(table, 0, self.length)
            self._buffers = {i: pool.resid[i].index_select(0, where).to(self.dtype) for i in self.layers}
            self._ends = {i: self.length for i in self.layers}
            self._pool = None

    # --- reading ---------------------------------------------------------------------------------------------

    def rewind(self, n: int) -> None:
        """Positions from `n` on are no longer the run's (a speculative round's rejected drafts): dropped from what
        is readable; the next pass writes over them."""
        with self._lock:
            self.length = min(self.length, n)
            self._ends = {i: min(e, n) for i, e in self._ends.items()}

    def truncate(self, n: int) -> None:
        """The run holds `n` positions (a speculative run's rejected drafts beyond it are dropped); buffers shrink to
        what they hold, so a finished run keeps no spare room."""
        with self._lock, torch.inference_mode():
            self.length = min(self.length, n)
            for i, buf in self._buffers.items():
                self._ends[i] = min(self._ends[i], n)
                if buf.shape[0] > n:
                    self._buffers[i] = buf[:n].clone()

    def prompt(self, n: int) -> dict[int, torch.Tensor]:
        """Each kept state at positions 0..n-1 (views of its buffers, copies out of the pool), for the prefix cache."""
        with self._lock:
            if self._pool is not None:
                return {i: self._read(i, torch.arange(n)) for i in self.layers} if self.length >= n else {}
            return {i: b[:n] for i, b in self._buffers.items() if self._ends[i] >= n}

    def input(self, layer: int) -> torch.Tensor | None:
        """(n, d_model): hidden state `layer` (the residual entering it) at every committed position, or None when it
        was not kept."""
        with self._lock:
            if layer in self.recomputed and self.recomputed[layer].shape[0] >= self.length:
                return self.recomputed[layer][: self.length]
            if layer not in self.layers:
                return None
            return self._read(layer, None)

    def rows(self, layer: int, positions: Sequence[int]) -> torch.Tensor | None:
        """(len(positions), d_model): hidden state `layer` at some committed positions (a page's one token)."""
        with self._lock:
            if any(not 0 <= p < self.length for p in positions):
                raise IndexError(f"positions {list(positions)[:4]} outside the {self.length} this run holds")
            if layer in self.recomputed and self.recomputed[layer].shape[0] >= self.length:
                return self.recomputed[layer][list(positions)]
            if layer not in self.layers:
                return None
            return self._read(layer, torch.tensor(list(positions), dtype=torch.long, device=self.device))

    def _read(self, layer: int, positions: torch.Tensor | None) -> torch.Tensor:
        # positions: [n] committed positions, None: every one; the lock is held
        if self._pool is None:
            buf = self._buffers[layer][: self.length]
            return buf if positions is None else buf[positions]
        pool, table = self._pool
        if positions is None:
            positions = torch.arange(self.length)
        blocks = torch.tensor(table[: -(-self.length // pool.block)], dtype=torch.long)
        where = blocks[positions.cpu() // pool.block] * pool.block + positions.cpu() % pool.block
        return pool.resid[layer].index_select(0, where.to(pool.resid.device))

    def keep_recomputed(self, layer: int, x: torch.Tensor) -> None:
        """A layer's input rebuilt from a kept one below it; only the newest such layer is kept (bounded)."""
        self.recomputed = {layer: x}

    def below(self, layer: int) -> int | None:
        """The nearest kept state at or below `layer` (None: start from the embeddings)."""
        return max((i for i in self.layers if i <= layer), default=None)


def kept_for(lm: Any, policy: Any, capacity: int) -> KeptInputs | None:
    """Where a run keeps the hidden states its capture policy names (room for `capacity` positions at first), or None
    when it keeps none. What a page's run keeps (engine/service/service.py), and a benchmark's."""
    ids = policy.residual_ids(lm.spec.n_layers)
    if not ids:
        return None
    return KeptInputs(ids, lm.spec.d_model, lm.dtype, lm.device, capacity)
