"""Figures for the journey page: the shapes diagram, the step timeline, the next-token distribution,
the logit lens and residual norms. Each builder takes plain data and returns a Plotly figure.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import plotly.graph_objects as go

from app.ui.format import fmt_ms, plot_text
from engine.projection.card import forward_shapes
from engine.core.hooks import LayerCapture
from engine.projection.specs import ModelSpec

PREFILL_COLOR, DECODE_COLOR, CHOSEN_COLOR, OTHER_COLOR = "#e8833a", "#3a7be8", "#e8833a", "#9db9e8"


def dims(shape: tuple[int, ...]) -> str:
    """(1, 12, 576) -> '[12, 576]': the batch dimension of 1 is dropped."""
    parts = shape[1:] if len(shape) > 1 and shape[0] == 1 else shape
    return "[" + ", ".join(f"{d:,}" for d in parts) + "]"


CHAR_PX, LINE_PX, FONT_PX = 7.4, 16, 12     # monospace 12 px (the projector minimum): one character wide, one line high
GAP = 3                        # characters between boxes
MAX_WIDTH_PX = 720             # a 1024-px projector's page: a wider diagram is drawn with smaller type


@dataclass(frozen=True)
class Node:
    title: str
    lines: tuple[str, ...]
    color: str

    @property
    def width(self) -> int:
        return max(len(self.title), *(len(line) for line in self.lines)) + 3

    @property
    def height(self) -> int:
        return len(self.lines) + 2


def shape_nodes(spec: ModelSpec, tokens: int) -> tuple[list[Node], list[Node]]:
    """The boxes of the forward pass with the loaded model's real shapes: (the stack, what follows it)."""
    s = forward_shapes(spec, tokens)
    t, hd = tokens, spec.head_dim
    attn = ("RMSNorm", f"Q  {spec.n_heads} heads × [{t:,}, {hd}]", f"K  {spec.n_kv_heads} heads × [{t:,}, {hd}]",
            f"V  {spec.n_kv_heads} heads × [{t:,}, {hd}]", f"scores {dims(s['attention_scores'])}",
            f"heads joined {dims(s['attention_out'])}", f"W_O → {dims(s['o_proj'])}")
    mlp = ("RMSNorm", f"gate {dims(s['mlp_gate_up'])}", f"up   {dims(s['mlp_gate_up'])}", "SiLU(gate) × up",
           f"down → {dims(s['mlp_down'])}")
    top = [Node("token ids", (dims(s["input_ids"]),), "#f1f1f1"),
           Node("embedding", (f"table [{spec.vocab_size:,}, {spec.d_model}]", f"→ {dims(s['embedding'])}"), "#cfe8fc"),
           Node("attention", attn, "#ffe3c2"),
           Node("SwiGLU MLP", mlp, "#d8f5d0")]
    bottom = [Node("final norm", (dims(s["final_norm"]),), "#f6d5f2"),
              Node("LM head → logits", ("last position only", dims(s["logits"])), "#fff3b0"),
              Node("probabilities", ("softmax", dims(s["probabilities"])), "#d9dcff"),
              Node("next token", ("sample → 1 id",), "#c9f1ee")]
    return top, bottom


def place_row(nodes: list[Node], x0: float, y_mid: float) -> list[tuple[Node, float, float]]:
    """(node, left x, middle y) for boxes laid left to right from x0."""
    out, x = [], x0
    for n in nodes:
        out.append((n, x, y_mid))
        x += n.width + GAP
    return out


def draw_box(fig: go.Figure, node: Node, x: float, y: float, font: float) -> None:
    h = node.height
    fig.add_shape(type="rect", x0=x, x1=x + node.width, y0=y - h / 2, y1=y + h / 2, fillcolor=node.color,
                  line=dict(color="#777", width=1), layer="below")
    text = "<br>".join([f"<b>{node.title}</b>", *node.lines])
    fig.add_annotation(x=x + node.width / 2, y=y, text=text, showarrow=False, align="center",
                       font=dict(size=font, family="monospace"))


def arrow(fig: go.Figure, x0: float, y0: float, x1: float, y1: float) -> None:
    fig.add_annotation(x=x1, y=y1, ax=x0, ay=y0, xref="x", yref="y", axref="x", ayref="y", text="",
                       showarrow=True, arrowhead=2, arrowwidth=1.3)


def elbow(fig: go.Figure, start: tuple[float, float], end: tuple[float, float]) -> None:
    """From the layers' frame down to the first box below: down, across, then an arrow down into the box."""
    (x0, y0), (x1, y1) = start, end
    bend = (y0 + y1) / 2
    fig.add_shape(type="path", path=f"M {x0},{y0} V {bend} H {x1}", line=dict(color="#444", width=1.3))
    arrow(fig, x1, bend, x1, y1)


def draw_row(fig: go.Figure, row: list[tuple[Node, float, float]], font: float) -> None:
    for node, x, y in row:
        draw_box(fig, node, x, y, font)
    for (a, ax, ay), (b, bx, by) in zip(row, row[1:]):
        arrow(fig, ax + a.width, ay, bx, by)


def draw_layer_frame(fig: go.Figure, x0: float, x1: float, y_mid: float, half: float, label: str, font: float) -> None:
    """The dashed frame around attention + MLP: the part repeated once per layer."""
    fig.add_shape(type="rect", x0=x0, x1=x1, y0=y_mid - half, y1=y_mid + half, line=dict(color="#444", dash="dash"))
    fig.add_annotation(x=x0, y=y_mid - half - 0.9, xanchor="left", showarrow=False, font=dict(size=font), text=label)


@lru_cache(maxsize=32)
def shapes_figure(spec: ModelSpec, tokens: int) -> go.Figure:
    """ids -> embedding -> L x (attention, MLP) -> final norm -> logits -> probabilities -> token.

    Laid out in character cells so the monospace text always fits its box, and drawn at its own pixel size (the
    page shows it with `width="content"`: never stretched or squeezed), at most MAX_WIDTH_PX wide: a longer prompt's
    wider numbers get smaller type rather than a squeezed chart whose labels cross its boxes.
    Built once per model and prompt length and shared by every session (about 0.1 s of the server's time
    each, on every run of the journey page: a room of followers draws it at the same moment). Never
    changed after: `app.runs.widgets.sized` copies a figure before it changes its font.
    """
    top, bottom = shape_nodes(spec, tokens)
    half = max(n.height for n in top) / 2 + 1
    row1_mid = half + 2
    row2_mid = row1_mid + half + 2 + max(n.height for n in bottom) / 2
    placed = place_row(top, 1, row1_mid)
    frame_x0 = placed[2][1] - 1.5
    frame_x1 = placed[3][1] + placed[3][0].width + 1.5
    placed2 = place_row(bottom, 1, row2_mid)                  # from the left edge: the page's width is the limit
    width = max(frame_x1, placed2[-1][1] + placed2[-1][0].width) + 1
    height = row2_mid + max(n.height for n in bottom) / 2 + 1
    scale = min(1.0, MAX_WIDTH_PX / (width * CHAR_PX))
    fig = go.Figure()
    draw_row(fig, placed, FONT_PX * scale)
    draw_row(fig, placed2, FONT_PX * scale)
    draw_layer_frame(fig, frame_x0, frame_x1, row1_mid, half,
                     f"<b>× {spec.n_layers} layers</b>, each adding to the residual stream [{tokens:,}, {spec.d_model}]",
                     (FONT_PX + 1) * scale)
    first, fx, fy = placed2[0]
    elbow(fig, (frame_x0 + 4, row1_mid + half), (fx + first.width / 2, fy - first.height / 2))
    fig.update_xaxes(visible=False, range=[0, width], fixedrange=True)
    fig.update_yaxes(visible=False, range=[height, 0], fixedrange=True)
    fig.update_layout(width=int(width * CHAR_PX * scale), height=int(height * LINE_PX * scale),
                      margin=dict(l=0, r=0, t=0, b=0), plot_bgcolor="rgba(0,0,0,0)")
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


def observer_figure(off_seconds: float, on_seconds: float) -> go.Figure:
    """One decode step with capture off and on (ms, measured)."""
    values = [off_seconds * 1e3, on_seconds * 1e3]
    fig = go.Figure(go.Bar(x=values, y=["capture off", "capture on"], orientation="h",
                           marker_color=[DECODE_COLOR, CHOSEN_COLOR], text=[fmt_ms(v / 1e3) for v in values],
                           textposition="outside", cliponaxis=False))
    fig.update_layout(height=150, margin=dict(l=0, r=60, t=10, b=0), xaxis_title="one decode step (ms, measured)",
                      xaxis=dict(rangemode="tozero"))
    return fig


RAW_COLOR = "#b8b8b8"
PERCENT_TICKS = [0, 25, 50, 75, 100]


def distribution_figure(labels: list[str], probs: np.ndarray, chosen: int | None, raw: np.ndarray | None = None,
                        name: str = "at the sliders' settings") -> go.Figure:
    """Candidates (most likely at the top) with their probability in %, on one fixed 0-100% axis; the chosen one
    highlighted; `raw`: the plain softmax (temperature 1) beside each, in grey."""
    colors = [CHOSEN_COLOR if i == chosen else OTHER_COLOR for i in range(len(labels))]
    pct = 100 * np.asarray(probs, dtype=float)
    fig = go.Figure(go.Bar(x=pct, y=labels, orientation="h", marker_color=colors, name=name,
                           text=[f"{p:.1f}%" for p in pct], textposition="outside", cliponaxis=False))
    if raw is not None:
        raw_pct = 100 * np.asarray(raw, dtype=float)
        fig.add_bar(x=raw_pct, y=labels, orientation="h", marker_color=RAW_COLOR, name="plain softmax (temperature 1)",
                    text=[f"{p:.1f}%" for p in raw_pct], textposition="outside", cliponaxis=False)
    rows = len(labels) * (2 if raw is not None else 1)
    fig.update_layout(height=max(220, 22 * rows + 70), margin=dict(l=0, r=50, t=30 if raw is not None else 10, b=0),
                      barmode="group", showlegend=raw is not None,
                      legend=dict(orientation="h", x=0, y=1.0, yanchor="bottom"),
                      xaxis=dict(title="probability (%)", range=[0, 118], tickvals=PERCENT_TICKS, ticksuffix="%",
                                 fixedrange=True))
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
    # categories, or plotly reads '#1'..'#5' as numbers and labels the axis only '2, 4'
    fig.update_xaxes(type="category", title="the layer's 1st to 5th most likely next token")
    return fig


def resid_norm_figure(captures: dict[int, LayerCapture]) -> go.Figure:
    """The residual stream's norm leaving each layer, at the position that predicts the token."""
    layers = sorted(i for i, c in captures.items() if c.resid_norm is not None)
    fig = go.Figure(go.Scatter(x=[captures[i].resid_norm for i in layers], y=layers, mode="lines+markers",
                               line=dict(color=DECODE_COLOR)))
    fig.update_layout(height=max(260, 20 * len(layers) + 60), margin=dict(l=0, r=0, t=10, b=0),
                      xaxis_title="‖residual‖", yaxis_title="layer")
    return fig
