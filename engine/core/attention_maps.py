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

MAP_ROWS = 256          # query rows of a map computed together
ROW_TILE = 128          # query rows of the summaries computed together (measured fastest here: tiles stay in cache)
KEY_TILE = 512          # keys per tile of the online softmax
LOG2 = math.log(2.0)


def scores(qk: AttentionInputs, heads: list[int], q0: int, q1: int, k0: int, k1: int) -> torch.Tensor:
    """(h, q1-q0, k1-k0) float32 logits of query rows q0..q1-1 against keys k0..k1-1; -inf where masked."""
    q = qk.q[heads, q0:q1].float()                                                  # (h, Tq, D)
    k = qk.k[[qk.kv_head(h) for h in heads], k0:k1].float()                          # (h, Tk, D)
    s = torch.matmul(q, k.transpose(-1, -2)).mul_(qk.scaling)
    if qk.softcap is not None:
        s = torch.tanh(s.div_(qk.softcap)).mul_(qk.softcap)
    for a, b in masked_spans(qk, q0, q1, k0, k1):                                   # only keys some row cannot see
        seen = qk.visible(torch.arange(q0, q1, device=s.device), torch.arange(a, b, device=s.device))
        s[..., a - k0:b - k0].masked_fill_(~seen, float("-inf"))
    return s


def masked_spans(qk: AttentionInputs, q0: int, q1: int, k0: int, k1: int) -> list[tuple[int, int]]:
    """The key ranges of a tile that some of its rows may not see: after the first row (the causal mask) and,
    with a sliding window, before the last row's window; every other key is seen by every row."""
    spans = [(max(k0, q0 + 1), k1)]
    if qk.window is not None:
        spans.append((k0, min(k1, q1 - qk.window)))
    return [(a, b) for a, b in spans if a < b]


def seen_whole(qk: AttentionInputs, q0: int, q1: int, k0: int, k1: int) -> bool:
    """Does every query row of the tile see every key of it (no mask to apply)?"""
    return not masked_spans(qk, q0, q1, k0, k1)


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
    tile = f * max(1, MAP_ROWS // f)
    parts = [_pooled_tile(qk, head, r0, min(r0 + tile, rows[1]), keys, f) for r0 in range(rows[0], rows[1], tile)]
    values = np.concatenate(parts, axis=0) if parts else np.zeros((0, 0), np.float32)
    return AttentionMap(qk.layer, head, qk.kv_head(head), values, f, rows, keys, qk.n)


def _pooled_tile(qk: AttentionInputs, head: int, r0: int, r1: int, keys: tuple[int, int], f: int) -> np.ndarray:
    """Rows r0..r1-1 of the map, softmax over every key they see, cut to `keys`, as (ceil(Tq/f), ceil(Tk/f))."""
    width = max(r1, keys[1])                                    # every row sees itself: no row is all -inf
    p = torch.softmax(scores(qk, [head], r0, r1, 0, width)[0], dim=-1)[:, keys[0]:keys[1]]    # (Tq, Tk)
    seen = qk.visible(torch.arange(r0, r1, device=p.device), torch.arange(keys[0], keys[1], device=p.device))
    if f == 1:
        return torch.where(seen, p, torch.nan).cpu().numpy()
    total, count = _block_sum(p, f), _block_sum(seen, f)
    return torch.where(count > 0, total / count.clamp(min=1), torch.nan).cpu().numpy()


def _block_sum(a: torch.Tensor, f: int) -> torch.Tensor:
    """float32 sums of f x f blocks of a (R, C) tensor (the last block of each axis may be shorter); no copy of a."""
    return _group_sum(_group_sum(a, f, 1), f, 0)


def _group_sum(a: torch.Tensor, f: int, dim: int) -> torch.Tensor:
    n = a.shape[dim]
    main = n // f * f
    parts = [a.narrow(dim, 0, main).unflatten(dim, (n // f, f)).sum(dim + 1, dtype=torch.float32)]
    if main < n:
        parts.append(a.narrow(dim, main, n - main).sum(dim, keepdim=True, dtype=torch.float32))
    return torch.cat(parts, dim)


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

    def add(self, s: torch.Tensor, k0: int, q_pos: torch.Tensor, window: int, masked: bool, local: bool) -> None:
        # s: (H, Tq, Tk) logits of keys k0..k0+Tk-1, -inf where masked (only when `masked`); q_pos: (Tq,);
        # `local`: some (query, key) pair of the tile is within `window` positions
        m = torch.maximum(self.m, s.amax(dim=-1))
        base = torch.where(torch.isfinite(m), m, torch.zeros_like(m))              # rows that saw nothing yet: 0
        scale = torch.exp(self.m - base)                                            # old sums to the new max
        shifted = s.sub_(base[..., None])                                           # in place: s is ours
        e = torch.exp(shifted)                                                      # masked: exp(-inf) = 0
        if masked:
            shifted.nan_to_num_(neginf=0.0)
        j = torch.arange(k0, k0 + s.shape[-1], device=s.device, dtype=s.dtype)
        total = e.sum(-1)
        self.es = self.es * scale + torch.linalg.vecdot(e, shifted) + base * total   # Σ e·s = Σ e·(s - base) + base Σ e
        self.total = self.total * scale + total
        self.ej = self.ej * scale + torch.matmul(e, j)
        self.local = self.local * scale
        if local:
            self.local += torch.linalg.vecdot(e, ((q_pos[:, None] - j[None, :]) < window).to(e.dtype))
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
        run.add(scores(qk, heads, r0, r1, k0, k1), k0, q_pos, window, not seen_whole(qk, r0, r1, k0, k1),
                r0 - (k1 - 1) < window)
    entropy = (torch.log(run.total) + run.m - run.es / run.total) / LOG2
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
