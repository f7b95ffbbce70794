"""Figures for the FlashAttention and quantization pages (the cache on and off and attention arithmetic draw
theirs in app/kv/figures.py and app/attention/figures.py).

Each builder takes plain data and returns a Plotly figure. Measured series are orange, projected ones blue,
as on the speed pages.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.ui.format import si_label
from app.ui.style import MARGIN, MEASURED_COLOR, PROJECTED_COLOR, log_axis

EAGER_COLOR, FUSED_COLOR = "#c0392b", "#27ae60"


def fusion_measured_figure(points: Sequence[dict]) -> go.Figure:
    """Time and bytes of one layer's attention against N, eager against fused (measured / counted here)."""
    ns = [p["tokens"] for p in points]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("time (measured)", "bytes written + read (counted)"))
    for name, key, color in (("eager", "eager", EAGER_COLOR), ("fused (SDPA)", "fused", FUSED_COLOR)):
        fig.add_scatter(x=ns, y=[p[f"{key}_seconds"] * 1e3 for p in points], name=f"{name}: time",
                        mode="lines+markers", line=dict(color=color), row=1, col=1)
        fig.add_scatter(x=ns, y=[p[f"{key}_bytes"] for p in points], name=f"{name}: bytes",
                        mode="lines+markers", line=dict(color=color, dash="dot"), row=1, col=2)
    fig.update_xaxes(type="log", title="prompt tokens (N)", tickmode="array", tickvals=ns,
                     ticktext=[si_label(n) for n in ns])
    log_axis(fig, "y", [p[f"{k}_seconds"] * 1e3 for p in points for k in ("eager", "fused")], unit="s", scale=1e-3,
             title="time", row=1, col=1)
    log_axis(fig, "y", [p[f"{k}_bytes"] for p in points for k in ("eager", "fused")], unit="B", title="bytes",
             row=1, col=2)
    fig.update_layout(height=340, margin=dict(l=0, r=0, t=30, b=0), legend=dict(orientation="h", y=-0.3))
    return fig


def fusion_projected_figure(rows: Sequence[dict], title: str) -> go.Figure:
    """Projected prefill time against prompt length: eager and fused attention on top of the linear layers."""
    ns = [r["tokens"] for r in rows]
    fig = go.Figure()
    series = (("prefill, eager attention", [r["linear_ms"] + r["eager_ms"] for r in rows], EAGER_COLOR, "solid"),
              ("prefill, fused attention", [r["linear_ms"] + r["fused_ms"] for r in rows], FUSED_COLOR, "solid"),
              ("the linear layers alone", [r["linear_ms"] for r in rows], "#7f8c8d", "dot"))
    for name, ys, color, dash in series:
        fig.add_scatter(x=ns, y=ys, name=name, mode="lines+markers", line=dict(color=color, dash=dash))
    fig.update_xaxes(type="log", title="prompt tokens", tickmode="array", tickvals=ns,
                     ticktext=[r["label"] for r in rows])
    log_axis(fig, "y", [y for _, ys, _, _ in series for y in ys], unit="s", scale=1e-3,
             title="prefill time (projected)")
    fig.update_layout(height=360, margin=dict(l=0, r=0, t=40, b=0), title=dict(text=title, font=dict(size=14)),
                      legend=dict(orientation="h", y=-0.25))
    return fig


def channels_figure(max_abs: np.ndarray, mean_abs: np.ndarray, title: str, threshold: float | None) -> go.Figure:
    """Per input channel: the largest |x| and the mean |x| (one layer), with LLM.int8's threshold."""
    ch = list(range(len(max_abs)))
    fig = go.Figure()
    fig.add_scatter(x=ch, y=max_abs, name="largest |value|", mode="lines", line=dict(color=MEASURED_COLOR))
    fig.add_scatter(x=ch, y=mean_abs, name="mean |value|", mode="lines", line=dict(color="#34495e"))
    top = max(float(np.max(max_abs)), threshold or 0.0)
    bottom = max(float(np.min(mean_abs[mean_abs > 0])) if np.any(mean_abs > 0) else 1e-6, 1e-12)
    if threshold is not None:
        fig.add_hline(y=threshold, line=dict(color="grey", dash="dash"),
                      annotation_text=f"LLM.int8 threshold {threshold:g}", annotation_position="top left")
    fig.update_xaxes(title="channel")
    log_axis(fig, "y", [bottom, top], title="|value|")
    fig.update_layout(height=300, margin=dict(l=0, r=0, t=30, b=0), title=dict(text=title, font=dict(size=13)),
                      legend=dict(orientation="h", y=-0.3))
    return fig


def levels_figure(levels: dict[str, Sequence[float]]) -> go.Figure:
    """The 16 levels of each 4-bit grid on one axis, scaled to [-1, 1]."""
    fig = go.Figure()
    for i, (name, vals) in enumerate(levels.items()):
        fig.add_scatter(x=list(vals), y=[name] * len(vals), mode="markers", name=name,
                        marker=dict(size=10, color=[PROJECTED_COLOR, MEASURED_COLOR, "#27ae60"][i % 3]))
    fig.update_xaxes(title="level (fraction of the group's largest |w|)", range=[-1.1, 1.1])
    fig.update_layout(height=200, margin=MARGIN, showlegend=False)
    return fig
