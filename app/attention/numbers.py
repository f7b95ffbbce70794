"""Attention numbers the attention page draws, computed from a stored run (numpy only, no Streamlit).

A run's captures come as pieces: the prefill pass gives a (heads, T_q, T_k) block, each decode step
one more row. `head_matrix` puts them back into one causal (N, N) matrix over every cached position;
`pool` shrinks a matrix for drawing; `head_summary` condenses each (layer, head) into three numbers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from app.runs.run import Run
from engine.core.hooks import LayerCapture


def layer_pieces(run: Run, layer: int) -> list[LayerCapture]:
    """The captures of one layer, in order: prefill first, then every decode step that captured it."""
    pieces = [run.captures(i).get(layer) for i in range(len(run.tokens))]
    return [p for p in pieces if p is not None and p.attention is not None]


def captured_layers(run: Run) -> list[int]:
    """Layers whose attention this run kept."""
    return sorted(i for i, cap in (run.prefill.captures.items() if run.prefill else ()) if cap.attention is not None)


def captured_heads(run: Run, layer: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(query heads, the K/V head each reads) kept for a layer."""
    cap = run.prefill.captures[layer]
    return cap.heads, cap.kv_heads


def n_positions(run: Run) -> int:
    return run.n_prompt + len(run.steps)


def run_ids(run: Run) -> list[int]:
    """Token ids of every cached position: the prompt, then each generated token that was fed back."""
    return [p.id for p in run.prefill.prompt] + [t.id for t in run.tokens[:-1]]


def head_matrix(run: Run, layer: int, head_index: int) -> tuple[np.ndarray, np.ndarray]:
    """(N, N) attention of one head over all cached positions, and which rows were captured (N,).

    Entries above the diagonal (the future) and rows that were not captured are 0.
    """
    n = n_positions(run)
    out = np.zeros((n, n), dtype=np.float32)
    rows = np.zeros(n, dtype=bool)
    for cap in layer_pieces(run, layer):
        block = cap.attention[head_index].astype(np.float32)     # (T_q, T_k_kept)
        q0, k0 = cap.query_start, cap.key_start
        q1, k1 = q0 + block.shape[0], k0 + block.shape[1]
        out[q0:q1, k0:k1] = block
        rows[q0:q1] = True
    return out, rows


def valid_mask(n: int, rows: np.ndarray) -> np.ndarray:
    """(N, N) True where a captured query row may look: keys at or before its own position."""
    causal = np.tril(np.ones((n, n), dtype=bool))
    return causal & rows[:, None]


@dataclass(frozen=True)
class Pooled:
    values: np.ndarray   # (n_rows, n_cols), NaN where nothing valid fell in the cell
    factor: int          # positions per cell along each axis (1 = not pooled)
    n: int               # positions before pooling


def block_sum(a: np.ndarray, f: int) -> np.ndarray:
    """Sum f x f blocks of a 2-D array (padded with zeros to a multiple of f)."""
    r, c = -(-a.shape[0] // f) * f, -(-a.shape[1] // f) * f
    padded = np.zeros((r, c), dtype=np.float64)
    padded[: a.shape[0], : a.shape[1]] = a
    return padded.reshape(r // f, f, c // f, f).sum(axis=(1, 3))


def pool(matrix: np.ndarray, valid: np.ndarray, max_cells: int) -> Pooled:
    """Mean of the valid entries in f x f blocks, f chosen so at most max_cells remain per axis."""
    n = matrix.shape[0]
    f = max(1, -(-n // max_cells))
    if f == 1:
        return Pooled(np.where(valid, matrix, np.nan), 1, n)
    total = block_sum(np.where(valid, matrix, 0.0), f)
    count = block_sum(valid.astype(np.float64), f)
    with np.errstate(invalid="ignore", divide="ignore"):
        values = np.where(count > 0, total / count, np.nan)
    return Pooled(values, f, n)


def pool_row(row: np.ndarray, max_cells: int) -> tuple[np.ndarray, int]:
    """Mean of f consecutive entries of a 1-D row so at most max_cells remain."""
    f = max(1, -(-row.shape[-1] // max_cells))
    if f == 1:
        return row, 1
    pad = -(-row.shape[-1] // f) * f - row.shape[-1]
    padded = np.concatenate([row, np.zeros(row.shape[:-1] + (pad,), row.dtype)], axis=-1)
    counts = np.concatenate([np.ones(row.shape[-1]), np.zeros(pad)]).reshape(-1, f).sum(-1)
    return padded.reshape(row.shape[:-1] + (-1, f)).sum(-1) / counts, f


def step_row(run: Run, layer: int, step: int) -> np.ndarray | None:
    """(heads, N_step) attention of the token fed at decode step `step` (1-based) over all earlier positions."""
    cap = run.steps[step - 1].captures.get(layer)
    if cap is None or cap.attention is None:
        return matrix_row(run, layer, run.n_prompt + step - 1)
    row = cap.attention[:, -1].astype(np.float32)                   # (h, T_k_kept)
    if cap.key_start:
        row = np.concatenate([np.zeros((row.shape[0], cap.key_start), np.float32), row], axis=1)
    return row


def matrix_row(run: Run, layer: int, position: int) -> np.ndarray | None:
    """(heads, position + 1): the query row at `position` from a layer's prefill capture when it covers it."""
    cap = run.prefill.captures.get(layer)
    if cap is None or cap.attention is None or cap.key_start:
        return None
    q = position - cap.query_start
    if not 0 <= q < cap.attention.shape[1]:
        return None
    return cap.attention[:, q, : position + 1].astype(np.float32)


LOCAL_WINDOW = 16         # "local": the weight on this many most recent positions (the query's own included)


@dataclass(frozen=True)
class HeadSummary:
    layers: list[int]
    heads: tuple[int, ...]
    entropy: np.ndarray    # (layers, heads) bits, mean over query rows
    sink: np.ndarray       # (layers, heads) attention paid to position 0
    distance: np.ndarray   # (layers, heads) mean positions looked back
    rows: int              # query rows averaged per (layer, head)
    local: np.ndarray | None = None   # (layers, heads) weight on the `window` most recent positions
    window: int = LOCAL_WINDOW


def from_summaries(s: Any) -> HeadSummary:
    """The server's blockwise summaries (engine.core.attention_maps.Summaries) as the page draws them."""
    return HeadSummary(list(s.layers), tuple(range(s.entropy.shape[1])), s.entropy, s.sink, s.distance, s.n - 1,
                       s.local, s.window)


def piece_stats(cap: LayerCapture, window: int = LOCAL_WINDOW) -> tuple[np.ndarray, ...]:
    """Sums over this capture's query rows (position > 0) of entropy, sink, distance and local mass per head, and
    the rows counted."""
    q_pos = cap.query_start + np.arange(cap.attention.shape[1])
    k_pos = cap.key_start + np.arange(cap.attention.shape[2])
    keep = q_pos > 0                                                 # position 0 can only see itself
    back = np.clip(q_pos[keep, None] - k_pos[None, :], 0, None)      # (T_q, T_k) positions looked back
    near = (q_pos[keep, None] - k_pos[None, :] < window) & (q_pos[keep, None] >= k_pos[None, :])
    sums = np.zeros((4, cap.attention.shape[0]))
    for h in range(cap.attention.shape[0]):                          # one head at a time bounds memory
        a = cap.attention[h][keep].astype(np.float32)                # (T_q, T_k)
        sums[:, h] = (-np.sum(a * np.log2(np.maximum(a, 1e-30))), a[:, 0].sum() if cap.key_start == 0 else 0.0,
                      np.sum(a * back), np.sum(a * near))
    return (*sums, int(keep.sum()))


def head_summary(run: Run) -> HeadSummary | None:
    """Entropy, sink, distance and local mass for every captured (layer, head), averaged over all captured rows."""
    layers = captured_layers(run)
    if not layers:
        return None
    heads = captured_heads(run, layers[0])[0]
    sums = np.zeros((4, len(layers), len(heads)))
    count = 0
    for r, layer in enumerate(layers):
        count = 0
        for cap in layer_pieces(run, layer):
            *parts, n = piece_stats(cap)
            sums[:, r] += np.stack(parts)
            count += n
        if count:
            sums[:, r] /= count
    return HeadSummary(layers, heads, sums[0], sums[1], sums[2], count, sums[3])


def gqa_groups(n_heads: int, n_kv_heads: int) -> list[int]:
    """The K/V head each query head reads: query head h uses K/V head h // (n_heads / n_kv_heads)."""
    group = n_heads // n_kv_heads
    return [h // group for h in range(n_heads)]
