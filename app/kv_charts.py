"""Figures for the KV-cache page: live growth per layer, users against context, GQA against full MHA,
and paged against contiguous allocation.
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.colors import sample_colorscale
from plotly.subplots import make_subplots

from app.format import fmt_bytes, fmt_tokens
from engine.paging import PagingComparison, PagingRequest
from engine.records import CacheState

REQUEST_COLORS = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6", "#9d755d")


def growth_figure(states: list[CacheState], bytes_per_token: float) -> go.Figure:
    """Bytes held by the real cache after each step, stacked by layer, against the formula's straight line."""
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
    fig.update_layout(height=360, margin=dict(l=0, r=0, t=10, b=0), showlegend=False,
                      xaxis_title="tokens in the cache", yaxis_title="KV cache (MB)")
    return fig


def users_figure(contexts: list[int], users: list[int], chosen: int) -> go.Figure:
    """Users that fit against context length (log scale); the chosen context highlighted."""
    colors = ["#e8833a" if c == chosen else "#3a7be8" for c in contexts]
    fig = go.Figure(go.Bar(x=[fmt_tokens(c) for c in contexts], y=[max(u, 0.5) for u in users], marker_color=colors,
                           text=[f"{u:,}" for u in users], textposition="outside", cliponaxis=False,
                           hovertemplate="%{x} tokens: %{text} users<extra></extra>"))
    fig.update_yaxes(type="log", title="users that fit")
    fig.update_xaxes(type="category", title="context per user (tokens)")
    fig.update_layout(height=340, margin=dict(l=0, r=0, t=20, b=0))
    return fig


def gqa_mha_figure(labels: tuple[str, str], per_token: tuple[float, float], users: tuple[int, int]) -> go.Figure:
    """Two bars per panel: KV bytes per token, and users that fit, for GQA and full multi-head attention."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("KV cache per token", "users that fit"))
    colors = ["#3a7be8", "#bbbbbb"]
    fig.add_bar(x=list(labels), y=list(per_token), marker_color=colors, text=[fmt_bytes(b, binary=True) for b in per_token],
                textposition="outside", cliponaxis=False, row=1, col=1)
    fig.add_bar(x=list(labels), y=list(users), marker_color=colors, text=[f"{u:,}" for u in users],
                textposition="outside", cliponaxis=False, row=1, col=2)
    fig.update_layout(height=300, showlegend=False, margin=dict(l=0, r=0, t=30, b=0))
    fig.update_yaxes(showticklabels=False)
    return fig


def block_map_figure(requests: list[PagingRequest], lengths: list[int], max_len: int, block: int) -> go.Figure:
    """The same requests in memory two ways: each reserving max_len (contiguous), or blocks of `block` (paged)."""
    fig = make_subplots(rows=2, cols=1, vertical_spacing=0.25, subplot_titles=(
        f"contiguous: each request reserves {max_len:,} tokens", f"paged: blocks of {block} tokens, handed out as needed"))
    x = 0
    for i, (req, used) in enumerate(zip(requests, lengths)):
        color = REQUEST_COLORS[i % len(REQUEST_COLORS)]
        fig.add_bar(x=[used], base=[x], y=["memory"], orientation="h", marker_color=color, row=1, col=1,
                    hovertext=f"request {req.rid}: {used:,} tokens used", hoverinfo="text")
        fig.add_bar(x=[max_len - used], base=[x + used], y=["memory"], orientation="h", marker_color=color,
                    opacity=0.22, row=1, col=1, hovertext=f"request {req.rid}: {max_len - used:,} reserved, unused",
                    hoverinfo="text")
        x += max_len
    x, n_blocks = 0, 0
    for i, (req, used) in enumerate(zip(requests, lengths)):
        color = REQUEST_COLORS[i % len(REQUEST_COLORS)]
        blocks = -(-used // block)
        fig.add_bar(x=[block] * blocks, base=[x + b * block for b in range(blocks)], y=["memory"] * blocks,
                    orientation="h", marker=dict(color=color, line=dict(color="white", width=0.6)), row=2, col=1,
                    hovertext=f"request {req.rid}: {blocks} blocks for {used:,} tokens", hoverinfo="text")
        x += blocks * block
        n_blocks += blocks
    total = len(requests) * max_len
    fig.update_xaxes(range=[0, total], title="tokens of KV memory")
    fig.update_yaxes(showticklabels=False)
    fig.update_layout(height=280, barmode="overlay", showlegend=False, margin=dict(l=0, r=0, t=30, b=0))
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
