"""Attention maps, rows and per-head summaries from a layer's Q and K, a tile of query rows at a time: never the
whole N x N matrix at once, so any length that fits the model fits here.

    rows = attention_rows(qk, heads=[0, 3], start=100, stop=101)      # (2, 1, 101) exact probabilities
    m = attention_map(qk, head=3, cells=160)                          # pooled overview, saying how it was pooled
    s = head_stats(qk, local=16)                                      # entropy, sink, distance, local mass per head

Scores follow the model: q·k x scaling, then the soft-cap when the layer has one, then the mask (causal, or the
sliding window), then softmax in float32. The summaries go over key tiles with an online softmax, as FlashAttention
does: a running max and sum per row, rescaled when the max grows, so no row is held whole.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from engine.core.recompute import AttentionInputs, layer_qk, run_layers

ROW_TILE = 256          # query rows computed together
KEY_TILE = 1024         # keys per tile of the online softmax
LOG2 = math.log(2.0)


def scores(qk: AttentionInputs, heads: list[int], q0: int, q1: int, k0: int, k1: int) -> torch.Tensor:
    """(h, q1-q0, k1-k0) float32 logits of query rows q0..q1-1 against keys k0..k1-1; -inf where masked."""
    q = qk.q[heads, q0:q1].float()                                                  # (h, Tq, D)
    k = qk.k[[qk.kv_head(h) for h in heads], k0:k1].float()                          # (h, Tk, D)
    s = torch.matmul(q, k.transpose(-1, -2)) * qk.scaling
    if qk.softcap is not None:
        s = torch.tanh(s / qk.softcap) * qk.softcap
    seen = qk.visible(torch.arange(q0, q1, device=s.device), torch.arange(k0, k1, device=s.device))
    return s.masked_fill(~seen, float("-inf"))


def attention_rows(qk: AttentionInputs, heads: list[int], start: int, stop: int) -> torch.Tensor:
    """(h, stop-start, stop) probabilities of query rows start..stop-1 over keys 0..stop-1 (0 where masked)."""
    return torch.softmax(scores(qk, heads, start, stop, 0, stop), dim=-1)


@dataclass(frozen=True)
class AttentionMap:
    """One head's map over a region of (query, key) positions: exact, or pooled into f x f blocks."""

    layer: int
    head: int
    kv_head: int
    values: np.ndarray          # (rows, cols) float32: probabilities (factor 1) or block means; NaN: nothing visible
    factor: int                 # positions per cell along each axis (1: every weight itself)
    rows: tuple[int, int]       # query positions covered, [start, stop)
    keys: tuple[int, int]       # key positions covered, [start, stop)
    n: int                      # positions in the run

    @property
    def how(self) -> str:
        if self.factor == 1:
            return "exact: every weight"
        return (f"pooled: each cell is the mean of the visible weights in a {self.factor}x{self.factor} block of "
                "positions (masked ones left out)")


def pool_factor(rows: tuple[int, int], keys: tuple[int, int], cells: int) -> int:
    return max(1, -(-max(rows[1] - rows[0], keys[1] - keys[0]) // cells))


def attention_map(qk: AttentionInputs, head: int, cells: int, rows: tuple[int, int] | None = None,
                  keys: tuple[int, int] | None = None) -> AttentionMap:
    """A head's map of a region (default: all of it) in at most `cells` cells per axis, a tile of rows at a time."""
    rows, keys = rows or (0, qk.n), keys or (0, qk.n)
    f = pool_factor(rows, keys, cells)
    tile = f * max(1, ROW_TILE // f)
    parts = [_pooled_tile(qk, head, r0, min(r0 + tile, rows[1]), keys, f) for r0 in range(rows[0], rows[1], tile)]
    values = np.concatenate(parts, axis=0) if parts else np.zeros((0, 0), np.float32)
    return AttentionMap(qk.layer, head, qk.kv_head(head), values, f, rows, keys, qk.n)


def _pooled_tile(qk: AttentionInputs, head: int, r0: int, r1: int, keys: tuple[int, int], f: int) -> np.ndarray:
    """Rows r0..r1-1 of the map, softmax over every key they see, cut to `keys`, as (ceil(Tq/f), ceil(Tk/f))."""
    s = scores(qk, [head], r0, r1, 0, max(r1, keys[1]))[0]                          # (Tq, K) whole rows
    p = torch.softmax(s, dim=-1).nan_to_num_(0.0)[:, keys[0]:keys[1]]                # rows that see nothing: 0
    seen = torch.isfinite(s[:, keys[0]:keys[1]])
    if f == 1:
        return torch.where(seen, p, torch.nan).cpu().numpy()
    total, count = _block_sum(p, f), _block_sum(seen.float(), f)
    return torch.where(count > 0, total / count.clamp(min=1), torch.nan).cpu().numpy()


def _block_sum(a: torch.Tensor, f: int) -> torch.Tensor:
    """Sums of f x f blocks of a (R, C) tensor, zero-padded to multiples of f."""
    r, c = -(-a.shape[0] // f) * f, -(-a.shape[1] // f) * f
    padded = torch.nn.functional.pad(a, (0, c - a.shape[1], 0, r - a.shape[0]))
    return padded.reshape(r // f, f, c // f, f).sum(dim=(1, 3))


# --- per-head summaries over the whole length --------------------------------------------------------------------

@dataclass(frozen=True)
class HeadStats:
    """One layer's heads summarised over every query row after the first (position 0 sees only itself)."""

    layer: int
    entropy: np.ndarray         # (H,) bits, mean over rows
    sink: np.ndarray            # (H,) mean weight on position 0
    distance: np.ndarray        # (H,) mean positions looked back, Σ p_ij (i - j)
    local: np.ndarray           # (H,) mean weight on the `window` most recent positions (i - j < window)
    window: int
    rows: int                   # query rows averaged


@dataclass
class _Running:
    """Per (head, row) sums of the online softmax, all relative to the running max m."""

    m: torch.Tensor             # (H, Tq) running max of the logits
    total: torch.Tensor         # Σ e, e = exp(s - m)
    es: torch.Tensor            # Σ e·s       (entropy = log Σ e + m - Σ e·s / Σ e)
    ej: torch.Tensor            # Σ e·j       (mean distance = i - Σ e·j / Σ e)
    local: torch.Tensor         # Σ e over i - j < window
    sink: torch.Tensor          # e at j = 0
    first_tile: bool = True     # the next tile added starts at key 0

    @classmethod
    def empty(cls, shape: tuple[int, int], device: torch.device) -> "_Running":
        zeros = lambda: torch.zeros(shape, device=device)  # noqa: E731
        return cls(torch.full(shape, float("-inf"), device=device), zeros(), zeros(), zeros(), zeros(), zeros())

    def add(self, s: torch.Tensor, k_pos: torch.Tensor, q_pos: torch.Tensor, window: int) -> None:
        # s: (H, Tq, Tk) logits, -inf where masked; k_pos: (Tk,) from k_pos[0] on; q_pos: (Tq,)
        m = torch.maximum(self.m, s.amax(dim=-1))
        base = torch.where(torch.isfinite(m), m, torch.zeros_like(m))              # rows that saw nothing yet: 0
        scale = torch.exp(self.m - base)                                            # old sums to the new max
        e = torch.exp(s - base[..., None])                                          # masked: exp(-inf) = 0
        near = (q_pos[:, None] - k_pos[None, :]) < window                            # (Tq, Tk)
        self.total = self.total * scale + e.sum(-1)
        self.es = self.es * scale + (e * s.nan_to_num(neginf=0.0)).sum(-1)
        self.ej = self.ej * scale + torch.matmul(e, k_pos.float())
        self.local = self.local * scale + (e * near).sum(-1)
        self.sink = self.sink * scale + (e[..., 0] if self.first_tile else 0.0)
        self.first_tile = False
        self.m = m


def head_stats(qk: AttentionInputs, window: int = 16, should_stop: Callable[[], bool] | None = None) -> HeadStats:
    """Entropy, sink, mean distance and local mass of every head of one layer, exactly, over all N rows: tiles of
    ROW_TILE query rows against KEY_TILE keys, the online softmax across key tiles."""
    heads = list(range(qk.q.shape[0]))
    sums = torch.zeros((4, len(heads)), dtype=torch.float64)
    for r0 in range(1, qk.n, ROW_TILE):
        if should_stop is not None and should_stop():
            break
        r1 = min(r0 + ROW_TILE, qk.n)
        sums += _tile_stats(qk, heads, r0, r1, window)
    rows = max(qk.n - 1, 1)
    entropy, sink, distance, local = (sums / rows).numpy()
    return HeadStats(qk.layer, entropy, sink, distance, local, window, qk.n - 1)


def _tile_stats(qk: AttentionInputs, heads: list[int], r0: int, r1: int, window: int) -> torch.Tensor:
    """(4, H) sums over rows r0..r1-1 of entropy (bits), sink, distance and local mass."""
    device = qk.q.device
    q_pos = torch.arange(r0, r1, device=device)
    first = 0 if qk.window is None else max(0, r0 - qk.window + 1)                   # keys no row here can see: skipped
    run = _Running.empty((len(heads), r1 - r0), device)
    run.first_tile = first < KEY_TILE
    for k0 in range(first - first % KEY_TILE, r1, KEY_TILE):
        k1 = min(k0 + KEY_TILE, r1)
        run.add(scores(qk, heads, r0, r1, k0, k1), torch.arange(k0, k1, device=device), q_pos, window)
    log_total = torch.log(run.total)
    entropy = (log_total + run.m - run.es / run.total) / LOG2
    distance = q_pos.float() - run.ej / run.total
    parts = (entropy, run.sink / run.total, distance, run.local / run.total)
    return torch.stack([p.double().sum(-1) for p in parts]).cpu()


@dataclass(frozen=True)
class Summaries:
    """Every head of every layer summarised at full length (the attention page's across-layers maps)."""

    layers: tuple[int, ...]
    entropy: np.ndarray         # (L, H) bits
    sink: np.ndarray            # (L, H) weight on position 0
    distance: np.ndarray        # (L, H) positions looked back
    local: np.ndarray           # (L, H) weight on the `window` most recent positions
    window: int
    n: int                      # positions
    seconds: float              # time it took (rebuilding layers not kept included)
    rebuilt: int = 0            # layers whose input was rebuilt from the one below (a layer's forward each)

    @classmethod
    def of(cls, stats: list[HeadStats], n: int, seconds: float, rebuilt: int) -> "Summaries":
        pick = lambda name: np.stack([getattr(s, name) for s in stats])  # noqa: E731
        return cls(tuple(s.layer for s in stats), pick("entropy"), pick("sink"), pick("distance"), pick("local"),
                   stats[0].window if stats else 0, n, seconds, rebuilt)


def summarise(model: Any, first: torch.Tensor, inputs: Callable[[int], torch.Tensor | None], n_layers: int,
              window: int = 16, progress: Callable[[int, str], None] | None = None) -> Summaries:
    """Every layer's HeadStats, layer by layer: each layer's input is the one kept (`inputs(i)`), else computed from
    the layer below by running it (so only one layer's input is held at a time). first: (N, d_model) entering layer 0
    when layer 0 was not kept."""
    t0, stats, rebuilt = time.perf_counter(), [], 0
    x = first
    for i in range(n_layers):
        kept = inputs(i)
        if kept is None and i > 0:
            x, rebuilt = run_layers(model, x, i - 1, i), rebuilt + 1
        x = kept if kept is not None else x
        if progress is not None:
            progress(i, f"layer {i + 1} of {n_layers}: every head over {x.shape[0]:,} positions")
        stats.append(head_stats(layer_qk(model, i, x), window))
    sync(x.device)
    return Summaries.of(stats, x.shape[0], time.perf_counter() - t0, rebuilt)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
