"""Figures for the journey page: the shapes diagram, the step timeline, the next-token distribution,
the logit lens and residual norms. Each builder takes plain data and returns a Plotly figure.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

from app.format import plot_text
from engine.card import forward_shapes
from engine.hooks import LayerCapture
from engine.specs import ModelSpec

PREFILL_COLOR, DECODE_COLOR, CHOSEN_COLOR, OTHER_COLOR = "#e8833a", "#3a7be8", "#e8833a", "#9db9e8"


def dims(shape: tuple[int, ...]) -> str:
    """(1, 12, 576) -> '[12, 576]': the batch dimension of 1 is dropped."""
    parts = shape[1:] if len(shape) > 1 and shape[0] == 1 else shape
    return "[" + ", ".join(f"{d:,}" for d in parts) + "]"


@dataclass(frozen=True)
class Node:
    x: float
    y: float
    w: float
    h: float
    title: str
    lines: tuple[str, ...]
    color: str


def shape_nodes(spec: ModelSpec, tokens: int) -> list[Node]:
    """The boxes of the forward pass, each with the real shapes of the loaded model."""
    s = forward_shapes(spec, tokens)
    t, hd = tokens, spec.head_dim
    attn = (f"Q  {spec.n_heads} heads × [{t:,}, {hd}]", f"K  {spec.n_kv_heads} heads × [{t:,}, {hd}]",
            f"V  {spec.n_kv_heads} heads × [{t:,}, {hd}]", f"scores {dims(s['attention_scores'])}",
            f"heads joined {dims(s['attention_out'])}", f"W_O → {dims(s['o_proj'])}")
    mlp = (f"gate {dims(s['mlp_gate_up'])}", f"up {dims(s['mlp_gate_up'])}", "SiLU(gate) × up",
           f"down → {dims(s['mlp_down'])}")
    return [
        Node(0.0, 0, 1.5, 2.2, "token ids", (dims(s["input_ids"]),), "#f1f1f1"),
        Node(1.9, 0, 1.7, 2.2, "embedding", (f"table [{spec.vocab_size:,}, {spec.d_model}]",
                                             dims(s["embedding"])), "#cfe8fc"),
        Node(4.2, 0, 2.6, 3.6, "attention", ("RMSNorm", *attn), "#ffe3c2"),
        Node(7.1, 0, 2.2, 3.6, "SwiGLU MLP", ("RMSNorm", *mlp), "#d8f5d0"),
        Node(9.9, 0, 1.6, 2.2, "final norm", (dims(s["final_norm"]),), "#f6d5f2"),
        Node(11.9, 0, 1.8, 2.2, "logits", ("last position", dims(s["logits"])), "#fff3b0"),
        Node(14.1, 0, 1.8, 2.2, "probabilities", ("softmax", dims(s["probabilities"])), "#d9dcff"),
        Node(16.3, 0, 1.4, 2.2, "next token", ("sample → 1 id",), "#c9f1ee"),
    ]


def shapes_figure(spec: ModelSpec, tokens: int) -> go.Figure:
    """ids -> embedding -> L x (attention, MLP) -> final norm -> logits -> probabilities -> token."""
    nodes = shape_nodes(spec, tokens)
    fig = go.Figure()
    for n in nodes:
        fig.add_shape(type="rect", x0=n.x, x1=n.x + n.w, y0=-n.h / 2, y1=n.h / 2, fillcolor=n.color,
                      line=dict(color="#777", width=1), layer="below")
        body = "<br>".join(n.lines)
        fig.add_annotation(x=n.x + n.w / 2, y=0, text=f"<b>{n.title}</b><br>{body}", showarrow=False,
                           font=dict(size=11, family="monospace"), align="center")
    for a, b in zip(nodes, nodes[1:]):
        fig.add_annotation(x=b.x, y=0, ax=a.x + a.w, ay=0, xref="x", yref="y", axref="x", ayref="y",
                           showarrow=True, arrowhead=2, arrowwidth=1.3, text="")
    layer_x0, layer_x1 = nodes[2].x - 0.15, nodes[3].x + nodes[3].w + 0.15
    fig.add_shape(type="rect", x0=layer_x0, x1=layer_x1, y0=-2.1, y1=2.3, line=dict(color="#444", dash="dash"))
    fig.add_annotation(x=(layer_x0 + layer_x1) / 2, y=2.1, showarrow=False, font=dict(size=12),
                       text=f"<b>× {spec.n_layers} layers</b>  residual stream [{tokens:,}, {spec.d_model}] "
                            f"added back after each block")
    fig.update_xaxes(visible=False, range=[-0.1, 17.8], fixedrange=True)
    fig.update_yaxes(visible=False, range=[-2.2, 2.45], fixedrange=True)
    fig.update_layout(height=300, margin=dict(l=0, r=0, t=0, b=0), plot_bgcolor="rgba(0,0,0,0)")
    return fig


def timeline_figure(step_seconds: list[float]) -> go.Figure:
    """Prefill and decode as two phases: each step a bar from its start to its end (ms)."""
    starts = np.concatenate([[0.0], np.cumsum(step_seconds)[:-1]]) * 1e3 if step_seconds else np.array([])
    durations = np.asarray(step_seconds) * 1e3
    phase = ["prefill"] + ["decode"] * (len(step_seconds) - 1)
    fig = go.Figure()
    for name, color in (("prefill", PREFILL_COLOR), ("decode", DECODE_COLOR)):
        idx = [i for i, p in enumerate(phase) if p == name]
        if idx:
            fig.add_bar(orientation="h", base=starts[idx], x=durations[idx], y=[name] * len(idx), name=name,
                        marker_color=color, marker_line=dict(color="white", width=0.5),
                        hovertext=[f"{name} step {i}: {durations[i]:.1f} ms" for i in idx], hoverinfo="text")
    fig.update_layout(height=170, barmode="overlay", margin=dict(l=0, r=0, t=10, b=0), showlegend=False,
                      xaxis_title="time since the request started (ms)")
    fig.update_yaxes(categoryorder="array", categoryarray=["decode", "prefill"])
    return fig


def distribution_figure(labels: list[str], probs: np.ndarray, chosen: int | None) -> go.Figure:
    """Candidates (most likely at the top) with their probability; the chosen one highlighted."""
    colors = [CHOSEN_COLOR if i == chosen else OTHER_COLOR for i in range(len(labels))]
    fig = go.Figure(go.Bar(x=probs, y=labels, orientation="h", marker_color=colors,
                           text=[f"{p:.1%}" for p in probs], textposition="outside", cliponaxis=False))
    fig.update_layout(height=max(220, 26 * len(labels) + 40), margin=dict(l=0, r=40, t=10, b=0),
                      xaxis=dict(title="probability", range=[0, max(1e-9, float(np.max(probs, initial=0))) * 1.18]))
    fig.update_yaxes(autorange="reversed", type="category")
    return fig


def lens_figure(captures: dict[int, LayerCapture], decode, chosen_id: int) -> go.Figure:
    """Rows: layers (last at the top); columns: the top predictions after each layer; colour: probability."""
    layers = sorted(i for i, c in captures.items() if c.lens)
    k = max((len(captures[i].lens) for i in layers), default=0)
    z = np.full((len(layers), k), np.nan)
    text = [[""] * k for _ in layers]
    for r, i in enumerate(layers):
        for c, (tid, p) in enumerate(captures[i].lens):
            z[r, c] = p
            label = plot_text(decode(tid), 14)
            text[r][c] = f"<b>{label}</b>" if tid == chosen_id else label
    fig = go.Figure(go.Heatmap(z=z, x=[f"#{c + 1}" for c in range(k)], y=[f"layer {i}" for i in layers],
                               text=text, texttemplate="%{text}", colorscale="Blues", zmin=0, zmax=1,
                               colorbar=dict(title="p"), hovertemplate="%{y} %{x}: %{text} (%{z:.1%})<extra></extra>"))
    fig.update_layout(height=max(260, 20 * len(layers) + 60), margin=dict(l=0, r=0, t=10, b=0))
    fig.update_yaxes(type="category")  # layer 0 at the bottom, the last layer on top
    return fig


def resid_norm_figure(captures: dict[int, LayerCapture]) -> go.Figure:
    """The residual stream's norm leaving each layer, at the position that predicts the token."""
    layers = sorted(i for i, c in captures.items() if c.resid_norm is not None)
    fig = go.Figure(go.Scatter(x=[captures[i].resid_norm for i in layers], y=layers, mode="lines+markers",
                               line=dict(color=DECODE_COLOR)))
    fig.update_layout(height=max(260, 20 * len(layers) + 60), margin=dict(l=0, r=0, t=10, b=0),
                      xaxis_title="‖residual‖", yaxis_title="layer")
    return fig
