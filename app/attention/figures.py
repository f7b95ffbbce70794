"""Figures for the attention page: heatmaps with token text on both axes, small multiples of all heads,
per-head summaries across layers, the grouped-query attention diagram and a decode step's row.
"""
from __future__ import annotations

import html
from typing import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.attention.numbers import HeadSummary, Pooled, gqa_groups
from app.ui.format import log_ticks, plot_text

MASK_COLOR = "#e9e9ee"      # the small multiples' background shows through NaN cells: the masked future
HATCH_COLOR, GAP_COLOR = "#b4b4c0", "#8c8c99"   # the main map: hatched future, solid grey rows not captured
MAX_TICKS = 40
GROUP_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                "#bcbd22", "#17becf")


def cell_labels(texts: list[str], factor: int, n_cells: int) -> list[str]:
    """One label per pooled cell: the position and text of the first token it covers."""
    return [f"{i * factor} {plot_text(texts[i * factor], 10)}" if i * factor < len(texts) else str(i * factor)
            for i in range(n_cells)]


def tick_every(n_cells: int) -> int:
    return max(1, -(-n_cells // MAX_TICKS))


def shown(values: np.ndarray, stretch: bool) -> np.ndarray:
    """√p spreads the small probabilities that a single large one (the sink) would wash out."""
    return np.sqrt(values) if stretch else values


def future_outline(m: int) -> tuple[list[float], list[float]]:
    """The staircase around the cells (query i, key j > i) of an m x m map: the future the causal mask hides."""
    xs, ys = [0.5], [-0.5]
    for i in range(m - 1):
        xs += [i + 0.5, i + 1.5]
        ys += [i + 0.5, i + 0.5]
    xs += [m - 0.5, 0.5]
    ys += [-0.5, -0.5]
    return xs, ys


def mask_traces(values: np.ndarray) -> list[go.BaseTraceType]:
    """The causal mask, hatched, and rows that were not captured, in solid grey, each named in the legend."""
    m = values.shape[0]
    xs, ys = future_outline(m)
    traces: list[go.BaseTraceType] = [go.Scatter(
        x=xs, y=ys, fill="toself", mode="lines", line=dict(width=0), fillcolor="white", hoverinfo="skip",
        fillpattern=dict(shape="/", fgcolor=HATCH_COLOR, size=8, solidity=0.15), name="the future: causal mask")]
    seen = np.tril(np.ones_like(values, dtype=bool))
    gaps = np.isnan(values) & seen
    if gaps.any():
        traces.append(go.Heatmap(z=np.where(gaps, 1.0, np.nan), colorscale=[[0, GAP_COLOR], [1, GAP_COLOR]],
                                 showscale=False, hoverinfo="skip", name="not captured"))
        traces.append(go.Scatter(x=[None], y=[None], mode="markers", name="not captured",
                                 marker=dict(symbol="square", size=12, color=GAP_COLOR)))
    return traces


def heatmap_figure(pooled: Pooled, texts: list[str], stretch: bool = True, height: int = 620) -> go.Figure:
    """Query positions down, key positions across; the masked future hatched, uncaptured rows solid grey."""
    z = pooled.values
    labels = cell_labels(texts, pooled.factor, z.shape[0])
    step = tick_every(z.shape[0])
    ticks = list(range(0, z.shape[0], step))
    fig = go.Figure(go.Heatmap(
        z=shown(z, stretch), customdata=z, colorscale="Viridis", zmin=0, zmax=1 if not stretch else None,
        colorbar=dict(title="√p" if stretch else "p"), hoverongaps=False, name="attention",
        hovertemplate="query %{y}<br>key %{x}<br>p = %{customdata:.3f}<extra></extra>"))
    fig.add_traces(mask_traces(z))                   # only over empty cells: the attention stays untouched
    axis = dict(tickmode="array", tickvals=ticks, ticktext=[labels[i] for i in ticks], tickfont=dict(size=12),
                showgrid=False, zeroline=False, constrain="domain")
    fig.update_xaxes(title="key (attended to)", tickangle=-60, **axis)
    fig.update_yaxes(title="query (attending)", autorange="reversed", scaleanchor="x", **axis)
    fig.update_layout(height=height, margin=dict(l=0, r=0, t=30, b=0), plot_bgcolor="white",
                      showlegend=True, legend=dict(orientation="h", x=0, y=1.0, yanchor="bottom"))
    return fig


def grid_shape(n: int) -> tuple[int, int]:
    cols = min(n, 8 if n > 16 else (4 if n > 9 else 3))
    return -(-n // cols), cols


def heads_grid_figure(pooled: list[Pooled], heads: tuple[int, ...], kv_heads: tuple[int, ...],
                      stretch: bool = True) -> go.Figure:
    """All heads of one layer as small multiples sharing one colour scale; titles name each head's K/V group."""
    rows, cols = grid_shape(len(pooled))
    titles = [f"head {h} · KV {g}" for h, g in zip(heads, kv_heads)]
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, horizontal_spacing=0.02,
                        vertical_spacing=0.06 if rows > 1 else 0.0)
    for i, p in enumerate(pooled):
        fig.add_trace(go.Heatmap(z=shown(p.values, stretch), customdata=p.values, coloraxis="coloraxis",
                                 hoverongaps=False, hovertemplate="p = %{customdata:.3f}<extra></extra>"),
                      row=i // cols + 1, col=i % cols + 1)
    fig.update_xaxes(showticklabels=False, showgrid=False, zeroline=False)
    fig.update_yaxes(showticklabels=False, showgrid=False, zeroline=False, autorange="reversed")
    fig.update_annotations(font_size=12)
    fig.update_layout(height=150 * rows + 60, margin=dict(l=0, r=0, t=30, b=0), plot_bgcolor=MASK_COLOR,
                      coloraxis=dict(colorscale="Viridis", colorbar=dict(title="√p" if stretch else "p")))
    return fig


def summary_figure(summary: HeadSummary) -> go.Figure:
    """Layer x head maps: entropy (how spread), sink (share on the first token), distance (how far back) and, when
    known, local mass (share on the last few positions).

    Each map's colour bar lies flat under it, as wide as the map, so no bar overlaps the next column."""
    maps = [(summary.entropy, "Blues", "entropy (bits)"), (summary.sink, "Oranges", "attention to the first token"),
            (summary.distance, "Greens", "mean distance (tokens)")]
    if summary.local is not None:
        maps.append((summary.local, "Purples", f"on the last {summary.window} tokens"))
    fig = make_subplots(rows=1, cols=len(maps), horizontal_spacing=0.05, subplot_titles=[m[2] for m in maps])
    x = [str(h) for h in summary.heads]
    y = [str(layer) for layer in summary.layers]
    height = max(300, 16 * len(summary.layers) + 150)
    for col, (z, scale, _) in enumerate(maps, start=1):
        d0, d1 = fig.layout[f"xaxis{'' if col == 1 else col}"].domain
        bar = dict(orientation="h", x=(d0 + d1) / 2, xanchor="center", len=(d1 - d0) * 0.9, lenmode="fraction",
                   y=-75 / height, yanchor="top", thickness=10)
        fig.add_trace(go.Heatmap(z=z, x=x, y=y, colorscale=scale, colorbar=bar,
                                 hovertemplate="layer %{y} head %{x}: %{z:.2f}<extra></extra>"), row=1, col=col)
        fig.update_yaxes(type="category", showticklabels=col == 1, title="layer" if col == 1 else None, col=col)
    fig.update_xaxes(title=dict(text="head", standoff=4), type="category")
    fig.update_annotations(font_size=12)
    fig.update_layout(height=height, margin=dict(l=0, r=0, t=30, b=90))
    return fig


def context_figure(points: list[dict]) -> go.Figure:
    """Measured at each N: prefill time (left axis) and the bytes a run holds (right, log): the KV cache, what the
    engine keeps to recompute attention, and what output_attentions would hold."""
    n = [p["n"] for p in points]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("time (s)", "bytes held (log scale)"),
                        horizontal_spacing=0.12)
    fig.add_scatter(x=n, y=[p["prefill_seconds"] for p in points], mode="lines+markers", name="prefill",
                    row=1, col=1)
    fig.add_scatter(x=n, y=[p["summary_seconds"] for p in points], mode="lines+markers", name="every head summarised",
                    row=1, col=1)
    for key, name, dash in (("kv_bytes", "KV cache", "solid"), ("kept_bytes", "kept to recompute attention", "solid"),
                            ("attention_bytes", "output_attentions (n² per head)", "dot")):
        fig.add_scatter(x=n, y=[p[key] for p in points], mode="lines+markers", name=name, line=dict(dash=dash),
                        row=1, col=2)
    fig.update_xaxes(title="N (tokens)", **log_ticks(n, prefix=""))
    fig.update_yaxes(title="seconds", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title="bytes", row=1, col=2, **log_ticks([p[k] for p in points for k in
                                                               ("kv_bytes", "kept_bytes", "attention_bytes")], "B"))
    fig.update_layout(height=330, margin=dict(l=0, r=0, t=30, b=0), legend=dict(orientation="h", y=-0.25))
    return fig


def gqa_figure(n_heads: int, n_kv_heads: int, title: str) -> go.Figure:
    """Query heads on top, K/V heads below, a line from each query head to the K/V head it reads."""
    groups = gqa_groups(n_heads, n_kv_heads)
    size = n_heads // n_kv_heads
    kv_x = [(g + 0.5) * size - 0.5 for g in range(n_kv_heads)]
    fig = go.Figure()
    for h, g in enumerate(groups):
        fig.add_scatter(x=[h, kv_x[g]], y=[1, 0], mode="lines", hoverinfo="skip",
                        line=dict(color=GROUP_COLORS[g % len(GROUP_COLORS)], width=1.4))
    label_q = n_heads <= 32
    fig.add_scatter(x=list(range(n_heads)), y=[1] * n_heads, mode="markers+text" if label_q else "markers",
                    marker=dict(symbol="square", size=14 if n_heads <= 16 else 9,
                                color=[GROUP_COLORS[g % len(GROUP_COLORS)] for g in groups]),
                    text=[str(h) if n_heads <= 16 or h % size == 0 else "" for h in range(n_heads)],
                    textposition="top center",        # beyond 16 heads, each group's first: 12-px labels fit
                    hovertext=[f"query head {h} reads K/V head {g}" for h, g in enumerate(groups)], hoverinfo="text")
    fig.add_scatter(x=kv_x, y=[0] * n_kv_heads, mode="markers+text",
                    marker=dict(symbol="diamond", size=20, color=[GROUP_COLORS[g % len(GROUP_COLORS)]
                                                                  for g in range(n_kv_heads)]),
                    text=[f"KV {g}" for g in range(n_kv_heads)], textposition="bottom center",
                    hovertext=[f"K/V head {g}: shared by {size} query heads" for g in range(n_kv_heads)],
                    hoverinfo="text")
    fig.update_layout(title=dict(text=html.escape(title), font=dict(size=14)), showlegend=False, height=230,
                      margin=dict(l=10, r=10, t=40, b=10))
    fig.update_xaxes(visible=False, range=[-1, n_heads])
    fig.update_yaxes(visible=False, range=[-0.45, 1.3])
    return fig


def step_row_figure(row: np.ndarray, factor: int, texts: list[str], heads: tuple[int, ...],
                    stretch: bool = True) -> go.Figure:
    """One decode step: every head's attention over the positions before it (heads down, keys across)."""
    labels = cell_labels(texts, factor, row.shape[1])
    step = tick_every(row.shape[1])
    ticks = list(range(0, row.shape[1], step))
    fig = go.Figure(go.Heatmap(z=shown(row, stretch), customdata=row, y=[f"head {h}" for h in heads],
                               colorscale="Viridis", colorbar=dict(title="√p" if stretch else "p"),
                               hovertemplate="%{y}, key %{x}: p = %{customdata:.3f}<extra></extra>"))
    fig.update_xaxes(tickmode="array", tickvals=ticks, ticktext=[labels[i] for i in ticks], tickangle=-60,
                     tickfont=dict(size=12), title="key position")
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_layout(height=22 * len(heads) + 170, margin=dict(l=0, r=0, t=10, b=0))
    return fig


def matrix_figure(z: np.ndarray, tokens: Sequence[str], title: str, colorscale: str = "RdBu",
                  mid: float | None = 0.0, height: int = 360) -> go.Figure:
    """A (T, T) query-by-key matrix with token text; -inf cells (the mask) are left empty."""
    shown = np.where(np.isfinite(z), z, np.nan)
    labels = [f"{i} {plot_text(t, 8)}" for i, t in enumerate(tokens)]
    fig = go.Figure(go.Heatmap(z=shown, x=labels, y=labels, colorscale=colorscale, zmid=mid, hoverongaps=False,
                               hovertemplate="query %{y}<br>key %{x}<br>%{z:.4f}<extra></extra>"))
    fig.update_xaxes(title="key", tickangle=-60, tickfont=dict(size=12))
    fig.update_yaxes(title="query", autorange="reversed", tickfont=dict(size=12))
    fig.update_layout(height=height, margin=dict(l=0, r=0, t=30, b=0), plot_bgcolor="#e9e9ee",
                      title=dict(text=title, font=dict(size=13)))
    return fig
