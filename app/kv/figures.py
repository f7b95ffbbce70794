"""Figures for the KV-cache page: live growth per layer, users against context, GQA against full MHA,
and paged against contiguous allocation.
"""
from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go
from plotly.colors import sample_colorscale
from plotly.subplots import make_subplots

from app.ui.format import fmt_bytes, fmt_tokens, log_ticks
from app.ui.style import TEXT_ROOM
from engine.projection.paging import PagingComparison, PagingRequest
from engine.core.records import CacheState

WITH_CACHE_COLOR, WITHOUT_CACHE_COLOR = "#27ae60", "#c0392b"   # as fused and eager on the FlashAttention page

def growth_figure(states: list[CacheState], bytes_per_token: float) -> go.Figure:
    """Bytes held by the real cache after each step, stacked by layer, against the formula's straight line; a
    dotted line where prefill (the first state) ends."""
    xs = [0] + [s.length for s in states]
    n_layers = len(states[0].bytes_per_layer) if states else 0
    colors = sample_colorscale("Viridis", [i / max(1, n_layers - 1) for i in range(n_layers)])
    fig = go.Figure()
    for layer in range(n_layers):
        ys = [0] + [s.bytes_per_layer[layer] / 1e6 for s in states]
        fig.add_scatter(x=xs, y=ys, stackgroup="layers", name=f"layer {layer}", mode="lines",
                        line=dict(width=0.5, color=colors[layer]), hovertemplate=f"layer {layer}: %{{y:.3f}} MB<extra></extra>")
    top = xs[-1] if xs else 0
    fig.add_scatter(x=[0, top], y=[0, top * bytes_per_token / 1e6], mode="lines", name="formula",
                    line=dict(color="black", dash="dash", width=1.5))
    if states:                                          # the first state is the cache after prefill
        fig.add_vline(x=states[0].length, line=dict(color="#555", dash="dot", width=1),
                      annotation_text=f"prefill: {states[0].length:,} tokens in one pass",
                      annotation_position="top left")
    fig.update_layout(height=250, margin=dict(l=0, r=0, t=24, b=0), showlegend=False,   # whole under Generate at 768 px
                      xaxis_title="tokens in the cache", yaxis_title="KV cache (MB)")
    return fig


def users_figure(contexts: list[int], users: list[int], chosen: int, ideal: list[int] | None = None) -> go.Figure:
    """Users that fit against context length (log scale), with a server's headroom (blue; the chosen context
    orange) beside the best case of all of the card (grey). Only the chosen context's bar is labelled: twenty
    labels at a projector's 12 px would run into each other, and the table beside the chart lists every number."""
    fig = go.Figure()
    xs = [fmt_tokens(c) for c in contexts]
    if ideal is not None:
        fig.add_bar(x=xs, y=[u or None for u in ideal], name="all of the card", marker_color="#cccccc",
                    customdata=[f"{u:,}" for u in ideal],
                    hovertemplate="%{x} tokens: %{customdata} users with all of the card<extra></extra>")
    colors = ["#e8833a" if c == chosen else "#3a7be8" for c in contexts]
    fig.add_bar(x=xs, y=[u or None for u in users], name="a server's share", marker_color=colors,
                text=[f"{u:,}" if c == chosen else "" for c, u in zip(contexts, users)], textposition="outside",
                cliponaxis=False, customdata=[f"{u:,}" for u in users],
                hovertemplate="%{x} tokens: %{customdata} users<extra></extra>")
    ticks = log_ticks([1, *users, *(ideal or [])])
    low, high = ticks.pop("range")
    fig.update_yaxes(**ticks, range=[low, high + TEXT_ROOM * (high - low)], title="users that fit")
    fig.update_xaxes(type="category", title="context per user (tokens)")
    fig.update_layout(height=340, margin=dict(l=0, r=0, t=20, b=0), barmode="group", showlegend=False)
    return fig


def gqa_mha_figure(labels: list[str], per_user: list[float], users: list[int], context: str) -> go.Figure:
    """Bars per attention variant: KV cache per user at the context, and users that fit."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=(f"KV cache per user at {context}", "users that fit"))
    colors = ["#3a7be8"] + ["#bbbbbb"] * (len(labels) - 1)
    fig.add_bar(x=list(labels), y=list(per_user), marker_color=colors,
                text=[fmt_bytes(b) for b in per_user], textposition="outside", cliponaxis=False, row=1, col=1)
    fig.add_bar(x=list(labels), y=list(users), marker_color=colors, text=[f"{u:,}" for u in users],
                textposition="outside", cliponaxis=False, row=1, col=2)
    fig.update_layout(height=320, showlegend=False, margin=dict(l=0, r=0, t=30, b=0))
    fig.update_yaxes(showticklabels=False)
    return fig


def block_cells(used: int, max_len: int, block: int) -> list[float]:
    """Per block of a max_len reservation: 1 = full, the used share for the last one, 0 = never needed."""
    cells = []
    for b in range(max_len // block):
        filled = min(block, max(0, used - b * block))
        cells.append(filled / block)
    return cells


def block_map_figure(requests: list[PagingRequest], lengths: list[int], max_len: int, block: int) -> go.Figure:
    """One row per request, one cell per block of `block` tokens across its max_len reservation.

    Contiguous allocation holds the whole row; paging holds only the coloured cells (the last one
    partly filled).
    """
    z = [block_cells(used, max_len, block) for used in lengths]
    text = [[f"request {r.rid}, block {b}: {int(round(v * block))}/{block} tokens"
             + ("" if v else " (reserved by contiguous, never used)") for b, v in enumerate(row)]
            for r, row in zip(requests, z)]
    fig = go.Figure(go.Heatmap(
        z=z, y=[f"request {r.rid} ({u:,} tok)" for r, u in zip(requests, lengths)], text=text, hoverinfo="text",
        xgap=1, ygap=3, zmin=0, zmax=1, showscale=False,
        colorscale=[[0, "#e6e6e6"], [0.0001, "#cfe0fb"], [0.999, "#6a9ff0"], [1, "#2f6fd6"]]))
    fig.update_xaxes(title=f"blocks of {block} tokens (a contiguous reservation is the whole row: {max_len:,} tokens)")
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(height=60 + 34 * len(requests), margin=dict(l=0, r=0, t=10, b=0))
    return fig


def paging_timeline_figure(comparison: PagingComparison) -> go.Figure:
    """Per step: requests running, and the share of allocated KV memory holding real tokens."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("requests running at once", "allocated memory in use (%)"))
    for result, color in ((comparison.contiguous, "#bbbbbb"), (comparison.paged, "#3a7be8")):
        steps = result.steps
        fig.add_scatter(x=[s.step for s in steps], y=[s.running for s in steps], name=result.mode, mode="lines",
                        line=dict(color=color), row=1, col=1)
        use = [100 * s.used_tokens / s.allocated_tokens if s.allocated_tokens else None for s in steps]
        fig.add_scatter(x=[s.step for s in steps], y=use, name=result.mode, mode="lines", showlegend=False,
                        line=dict(color=color), row=1, col=2)
    fig.update_xaxes(title="decode step")
    fig.update_layout(height=320, margin=dict(l=0, r=0, t=30, b=0), legend=dict(orientation="h", y=-0.25))
    return fig


def cache_figure(rows: Sequence[dict]) -> go.Figure:
    """Per-token time with and without the cache (measured), and the FLOPs each needs (from the formula)."""
    ns = [r["length"] for r in rows]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("time per token (measured)", "FLOPs per token (formula)"))
    for name, key, color in (("with the cache", "on", WITH_CACHE_COLOR), ("without", "off", WITHOUT_CACHE_COLOR)):
        fig.add_scatter(x=ns, y=[r[f"seconds_{key}"] * 1e3 for r in rows], name=f"{name}: time",
                        mode="lines+markers", line=dict(color=color), marker=dict(size=5), row=1, col=1)
        fig.add_scatter(x=ns, y=[r[f"flops_{key}"] for r in rows], name=f"{name}: FLOPs", mode="lines",
                        line=dict(color=color, dash="dot"), row=1, col=2)
    fig.update_xaxes(title="sequence length the token attends over")
    fig.update_yaxes(title="ms", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title="FLOPs", exponentformat="SI", rangemode="tozero", row=1, col=2)
    fig.update_layout(height=340, margin=dict(l=0, r=0, t=30, b=0), legend=dict(orientation="h", y=-0.3))
    return fig
