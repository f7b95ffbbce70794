"""What a run keeps so that its attention can be computed again, exactly, when someone asks: the residual stream
entering chosen layers at every position, in the model's own dtype. Memory grows with the length, not its square.

    kept = KeptInputs(layers=(0, 10, 20), d_model=576, dtype=torch.float32, device="cpu", capacity=1200)
    kept.write(layer=10, start=0, hidden=x)       # x: (T, d_model), the layer's input at positions start..start+T-1
    kept.commit()                                  # after each forward pass: positions every kept layer holds
    kept.input(10)                                 # (n, d_model): the layer's input at positions 0..n-1

Writes name their first position, so a pass that is run again (a batched step retried after a fault, a speculative
verify pass whose drafts were rejected) overwrites what it wrote before instead of appending twice.
"""
from __future__ import annotations

import threading
from typing import Any

import torch

GROWTH = 2                       # a buffer that fills up grows by this factor


class KeptInputs:
    """Per kept layer, a (capacity, d_model) buffer of layer inputs, filled position by position. Thread-safe."""

    def __init__(self, layers: tuple[int, ...], d_model: int, dtype: torch.dtype, device: torch.device | str,
                 capacity: int = 256):
        self.layers, self.d_model, self.dtype = tuple(sorted(layers)), d_model, dtype
        self.device = torch.device(device)
        self._buffers: dict[int, torch.Tensor] = {}
        self._ends: dict[int, int] = {i: 0 for i in self.layers}
        self._capacity = max(1, capacity)
        self._lock = threading.Lock()
        self.length = 0                            # positions committed: held by every kept layer
        self.recomputed: dict[int, torch.Tensor] = {}   # layer -> (n, d_model) built on demand (at most one kept)

    @property
    def capacity(self) -> int:
        """Positions the buffers make room for at first (a run's prompt and new tokens)."""
        return self._capacity

    @property
    def bytes_per_position(self) -> int:
        return len(self.layers) * self.d_model * torch.empty((), dtype=self.dtype).element_size()

    @property
    def nbytes(self) -> int:
        held = sum(b.numel() * b.element_size() for b in self._buffers.values())
        return held + sum(t.numel() * t.element_size() for t in self.recomputed.values())

    def write(self, layer: int, start: int, hidden: torch.Tensor) -> None:
        # hidden: (T, d_model) the residual entering `layer` at positions start..start+T-1
        if layer not in self._ends:
            return
        end = start + hidden.shape[0]
        with self._lock, torch.inference_mode():        # buffers made in a forward pass are inference tensors
            buf = self._room(layer, end)
            buf[start:end].copy_(hidden.detach())
            self._ends[layer] = end

    def _room(self, layer: int, end: int) -> torch.Tensor:
        buf = self._buffers.get(layer)
        if buf is None or buf.shape[0] < end:
            size = max(end, self._capacity, GROWTH * (buf.shape[0] if buf is not None else 0))
            grown = torch.empty((size, self.d_model), dtype=self.dtype, device=self.device)
            if buf is not None:
                grown[: buf.shape[0]].copy_(buf)
            self._buffers[layer] = buf = grown
        return buf

    def commit(self) -> None:
        """After a forward pass: the positions every kept layer now holds are readable."""
        with self._lock:
            self.length = min(self._ends.values(), default=0)

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
        """Each kept layer's input at positions 0..n-1 (views), for the prefix cache to copy."""
        with self._lock:
            return {i: b[:n] for i, b in self._buffers.items() if self._ends[i] >= n}

    def input(self, layer: int) -> torch.Tensor | None:
        """(n, d_model): the residual entering `layer` at every committed position, or None when not kept."""
        if layer in self.recomputed and self.recomputed[layer].shape[0] >= self.length:
            return self.recomputed[layer][: self.length]
        buf = self._buffers.get(layer)
        return None if buf is None or layer not in self.layers else buf[: self.length]

    def keep_recomputed(self, layer: int, x: torch.Tensor) -> None:
        """A layer's input rebuilt from a kept one below it; only the newest such layer is kept (bounded)."""
        self.recomputed = {layer: x}

    def below(self, layer: int) -> int | None:
        """The nearest kept layer at or below `layer` (None: start from the embeddings)."""
        return max((i for i in self.layers if i <= layer), default=None)


def kept_for(lm: Any, policy: Any, capacity: int) -> KeptInputs | None:
    """Where a run keeps the inputs of the layers its capture policy names (room for `capacity` positions at
    first), or None when it keeps none. What a page's run keeps (engine/service/service.py), and a benchmark's."""
    if not policy.keeps_inputs:
        return None
    return KeptInputs(policy.input_ids(lm.spec.n_layers), lm.spec.d_model, lm.dtype, lm.device, capacity)
