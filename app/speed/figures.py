"""Figures for the speed and cost pages. Each builder takes plain data and returns a Plotly figure.

Measured series are drawn in orange, projected ones in blue, so the two planes never blur together.
"""
from __future__ import annotations

import math
from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.ui.format import log_ticks
from app.ui.style import MARGIN, MEASURED_COLOR, PROJECTED_COLOR, TEXT_ROOM, log_axis
from engine.projection.economics import TokenPrices
from engine.projection.cost import Projection, RooflinePoint
from engine.projection.serving_sim import SimResult, SweepRow, Targets
from engine.lab.speed import CurveFit, DecodePlacement, DeviceRoof

PREFILL_COLOR, DECODE_COLOR = "#8e44ad", "#2a9d8f"
POLICY_COLORS = {"static": "#bbbbbb", "continuous": "#3a7be8", "chunked": "#2a9d8f", "disaggregated": "#8e44ad"}
LABEL_AT = {"prefill": "bottom center", "decode": "bottom right"}   # under the roof, clear of its line


def context_figure(points: Sequence[dict], fit: CurveFit | None, onset: int | None,
                   ceiling_ms: Sequence[float] | None = None) -> go.Figure:
    """TTFT and inter-token latency against prompt length: measured points, the fitted curve, the N^2 onset."""
    pts = sorted(points, key=lambda p: p["tokens"])
    ns = [p["tokens"] for p in pts]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("time to first token (prefill)", "inter-token latency (decode)"))
    fig.add_scatter(x=ns, y=[p["ttft"] * 1e3 for p in pts], mode="markers+lines", name="measured TTFT",
                    marker=dict(color=MEASURED_COLOR, size=8), line=dict(color=MEASURED_COLOR, width=1), row=1, col=1)
    if fit is not None and ns:
        grid = [ns[0] + (ns[-1] - ns[0]) * i / 60 for i in range(61)]
        fig.add_scatter(x=grid, y=[fit.predict(n) * 1e3 for n in grid], mode="lines", name="a + bN + cN² fit",
                        line=dict(color="black", dash="dot", width=1), row=1, col=1)
    if ceiling_ms is not None:
        fig.add_scatter(x=ns, y=list(ceiling_ms), mode="lines", name="projected for this device at its measured peaks",
                        line=dict(color=PROJECTED_COLOR, dash="dash"), row=1, col=1)
    fig.add_scatter(x=ns, y=[p["itl"] * 1e3 for p in pts], mode="markers+lines", name="measured ITL",
                    marker=dict(color=DECODE_COLOR, size=8), line=dict(color=DECODE_COLOR, width=1), row=1, col=2)
    if onset is not None and ns and onset <= max(ns) * 1.5:
        fig.add_vline(x=onset, line=dict(color="grey", dash="dash"), row=1, col=1)
    fig.update_xaxes(title="prompt tokens (N)")
    fig.update_yaxes(title="ms", rangemode="tozero")
    fig.update_layout(height=360, margin=MARGIN, legend=dict(orientation="h", y=-0.25))
    return fig


def _roof_trace(fig: go.Figure, xs: Sequence[float], ys: Sequence[float], name: str, color: str) -> None:
    fig.add_scatter(x=list(xs), y=list(ys), mode="lines", name=name, line=dict(color=color, width=2),
                    hovertemplate="%{x:.3g} FLOPs/byte: %{y:.3g} FLOP/s<extra></extra>")


def trace_values(fig: go.Figure, axis: str) -> list[float]:
    """Every x (or y) value the figure's traces draw."""
    return [v for trace in fig.data for v in (getattr(trace, axis) or ()) if v is not None]


def _log_axes(fig: go.Figure, title: str) -> go.Figure:
    """The roofline's axes: one SI format on both, FLOP/s with its unit on every tick."""
    log_axis(fig, "x", trace_values(fig, "x"), title="arithmetic intensity (FLOPs per byte moved)")
    log_axis(fig, "y", trace_values(fig, "y"), unit="FLOP/s", title="attainable and achieved FLOP/s")
    fig.update_layout(height=400, margin=MARGIN, title=dict(text=title, font=dict(size=14)),
                      legend=dict(orientation="h", y=-0.2))
    return fig


def device_roofline_figure(roof: DeviceRoof, decode: DecodePlacement | None,
                           prefill: tuple[float, float] | None) -> go.Figure:
    """This device's roofline (its measured peaks) with the measured decode step and prefill placed on it.

    prefill: (intensity, achieved FLOP/s) of the longest measured prefill.
    """
    lo, hi = 0.05, max(roof.ridge_point * 30, 1e3)
    xs = sorted({lo, roof.ridge_point, hi})
    fig = go.Figure()
    _roof_trace(fig, xs, [roof.attainable(x) for x in xs], f"{roof.name} ({roof.source} peaks)", "black")
    if decode is not None:
        fig.add_scatter(x=[decode.intensity], y=[decode.achieved_flops], mode="markers+text", name="decode step (measured)",
                        text=["decode"], textposition=LABEL_AT["decode"], cliponaxis=False,
                        marker=dict(color=DECODE_COLOR, size=12))
        fig.add_scatter(x=[decode.intensity], y=[roof.attainable(decode.intensity)], mode="markers",
                        name="decode ceiling", marker=dict(color=DECODE_COLOR, size=12, symbol="circle-open"))
    if prefill is not None:
        fig.add_scatter(x=[prefill[0]], y=[prefill[1]], mode="markers+text", name="prefill (measured)",
                        text=["prefill"], textposition=LABEL_AT["prefill"], cliponaxis=False,
                        marker=dict(color=PREFILL_COLOR, size=12))
    return _log_axes(fig, "Measured on this machine")


def projected_roofline_figure(line: Sequence[RooflinePoint], proj: Projection, title: str) -> go.Figure:
    """One GPU's roofline with the projected prefill and decode of the chosen batch placed at the FLOP/s each GPU
    of the replica achieves (a tensor-parallel group shares the work)."""
    fig = go.Figure()
    _roof_trace(fig, [p.intensity for p in line], [p.attainable_flops for p in line], "roofline (spec sheet)", "black")
    share = proj.tensor_parallel
    points = [("prefill", proj.prefill_intensity, proj.prefill_flops / (proj.prefill_ms / 1e3) / share, PREFILL_COLOR),
              ("decode", proj.decode_intensity, proj.decode_flops / (proj.decode_step_ms / 1e3) / share, DECODE_COLOR)]
    for name, x, y, color in points:
        fig.add_scatter(x=[x], y=[y], mode="markers+text", text=[f"{name}, batch {proj.batch}"],
                        textposition=LABEL_AT[name], cliponaxis=False, name=name, marker=dict(color=color, size=12),
                        hovertemplate=f"{name}: %{{x:.3g}} FLOPs/byte, %{{y:.3g}} FLOP/s<extra></extra>")
    fig.add_vline(x=proj.ridge_point, line=dict(color="grey", dash="dot"))
    return _log_axes(fig, title)


def experts_figure(batches: Sequence[int], touched: Sequence[float], n_experts: int, per_token: int) -> go.Figure:
    """Distinct routed experts one decode step reads per MoE layer, against the batch size."""
    fig = go.Figure()
    fig.add_scatter(x=list(batches), y=list(touched), mode="lines+markers", name="experts read per step",
                    line=dict(color=PROJECTED_COLOR), hovertemplate="batch %{x}: %{y:.1f} experts<extra></extra>")
    fig.add_hline(y=n_experts, line=dict(color="grey", dash="dot"), annotation_text=f"all {n_experts} experts",
                  annotation_position="bottom right")
    fig.add_hline(y=per_token, line=dict(color=DECODE_COLOR, dash="dot"),
                  annotation_text=f"one token: {per_token}", annotation_position="top left")
    log_axis(fig, "x", batches, title="batch size (tokens per decode step)")
    fig.update_yaxes(title="distinct experts per layer", rangemode="tozero")
    fig.update_layout(height=320, margin=MARGIN, showlegend=False)
    return fig


def batch_sweep_figure(projs: Sequence[Projection], title: str) -> go.Figure:
    """Total and per-user tokens/s, and cost per million tokens, against batch size (log-log)."""
    bs = [p.batch for p in projs]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("tokens per second", "$ per million output tokens"))
    fig.add_scatter(x=bs, y=[p.total_tok_s for p in projs], name="total", mode="lines+markers",
                    line=dict(color=PROJECTED_COLOR), row=1, col=1)
    fig.add_scatter(x=bs, y=[p.per_user_tok_s for p in projs], name="per user", mode="lines+markers",
                    line=dict(color=PROJECTED_COLOR, dash="dash"), row=1, col=1)
    fig.add_scatter(x=bs, y=[p.cost_per_million_tokens for p in projs], name="cost", mode="lines+markers",
                    line=dict(color="#c0392b"), row=1, col=2)
    log_axis(fig, "x", bs, title="batch size")
    log_axis(fig, "y", [v for p in projs for v in (p.total_tok_s, p.per_user_tok_s)], unit="tok/s", row=1, col=1)
    log_axis(fig, "y", [p.cost_per_million_tokens for p in projs], prefix="$", row=1, col=2)
    fig.update_layout(height=360, margin=dict(l=0, r=0, t=70, b=0), title=dict(text=title, font=dict(size=14)),
                      legend=dict(orientation="h", y=-0.3))
    return fig


def token_prices_figure(rows: Sequence[TokenPrices], measured: bool) -> go.Figure:
    """$ per million input and output tokens at each batch size (log), each output bar marked with its ratio."""
    color, light = (MEASURED_COLOR, "#f5c49c") if measured else (PROJECTED_COLOR, "#a9c6f5")
    labels = [str(r.batch) for r in rows]
    fig = go.Figure()
    fig.add_bar(x=labels, y=[r.input_per_million for r in rows], name="input token", marker_color=light,
                hovertemplate="batch %{x}: $%{y:.4g} per million input tokens<extra></extra>")
    fig.add_bar(x=labels, y=[r.output_per_million for r in rows], name="output token", marker_color=color,
                text=[f"{r.output_per_input:,.0f}×" if r.output_per_input >= 10 else f"{r.output_per_input:.1f}×"
                      for r in rows], textposition="outside", cliponaxis=False,
                hovertemplate="batch %{x}: $%{y:.4g} per million output tokens<extra></extra>")
    low = min(r.input_per_million for r in rows)                    # log bars start at the axis floor: set it lower
    high = max(r.output_per_million for r in rows)
    fig.update_xaxes(title="batch size", type="category")
    fig.update_yaxes(type="log", title="$ per million tokens", range=[math.log10(low) - 1, math.log10(high) + 0.4],
                     dtick=1, tickprefix="$")
    fig.update_layout(height=340, margin=dict(l=0, r=24, t=20, b=0), barmode="group",   # r: the last label's half
                      legend=dict(orientation="h", y=-0.25))                             # past its narrow bar
    return fig


def sim_series_figure(results: dict[str, SimResult]) -> go.Figure:
    """Requests in the batch and KV tokens held, over time, for each batching policy."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, subplot_titles=("requests in the batch", "KV cache (tokens)"))
    for policy, res in results.items():
        color = POLICY_COLORS.get(policy, "black")
        t = [p.time for p in res.series]
        fig.add_scatter(x=t, y=[p.batch for p in res.series], name=policy, mode="lines", line=dict(color=color),
                        row=1, col=1)
        fig.add_scatter(x=t, y=[p.kv_tokens for p in res.series], name=f"{policy}: used", mode="lines",
                        line=dict(color=color), showlegend=False, row=2, col=1)
    fig.update_xaxes(title="seconds", row=2, col=1)
    fig.update_layout(height=460, margin=MARGIN, legend=dict(orientation="h", y=1.12))
    return fig


def sim_latency_figure(results: dict[str, SimResult]) -> go.Figure:
    """TTFT and total latency, p50 and p95, per policy."""
    labels = ["TTFT p50", "TTFT p95", "latency p50", "latency p95"]
    fig = go.Figure()
    for policy, res in results.items():
        values = [res.ttft_p50, res.ttft_p95, res.latency_p50, res.latency_p95]
        fig.add_bar(x=labels, y=values, name=policy, marker_color=POLICY_COLORS.get(policy, "black"),
                    text=[f"{v:.2f} s" for v in values], textposition="outside", cliponaxis=False)
    fig.update_yaxes(title="seconds")
    fig.update_layout(height=320, margin=MARGIN, barmode="group", legend=dict(orientation="h", y=1.15))
    return fig


def sim_policies_figure(results: dict[str, SimResult], targets: Targets) -> go.Figure:
    """Per policy: TTFT p50 and p95, the gap between tokens p50 and p99 (both in ms, with the targets as lines),
    and goodput."""
    fig = make_subplots(rows=1, cols=3, subplot_titles=("time to first token (ms)", "time between tokens (ms)",
                                                        "goodput (requests/s)"))
    for policy, res in results.items():
        color = POLICY_COLORS.get(policy, "black")
        bars = [(1, ["p50", "p95"], [res.ttft_p50, res.ttft_p95]), (2, ["p50", "p99"], [res.itl_p50, res.itl_p99])]
        for col, labels, seconds in bars:
            fig.add_bar(x=labels, y=[s * 1e3 for s in seconds], name=policy, marker_color=color, legendgroup=policy,
                        showlegend=col == 1, row=1, col=col)
        fig.add_bar(x=[policy], y=[res.goodput.requests_per_s], name=policy, marker_color=color, legendgroup=policy,
                    showlegend=False, text=[f"{res.goodput.share:.0%}"], textposition="outside", cliponaxis=False,
                    row=1, col=3)
    target_line = dict(color="#c0392b", dash="dot")
    for col, target in ((1, targets.ttft), (2, targets.itl)):        # no hline annotation: it breaks log axes
        fig.add_hline(y=target * 1e3, line=target_line, row=1, col=col)
        fig.update_yaxes(type="log", dtick=1, row=1, col=col)
    fig.add_scatter(x=[None], y=[None], mode="lines", line=target_line, name="target", row=1, col=1)
    fig.update_xaxes(showticklabels=False, row=1, col=3)
    fig.update_layout(height=340, margin=dict(l=0, r=0, t=50, b=0), barmode="group",
                      legend=dict(orientation="h", y=-0.12))
    return fig


def sim_sweep_figure(rows: Sequence[SweepRow]) -> go.Figure:
    """The throughput/latency trade as the batch limit grows (simulated)."""
    bs = [r.max_batch for r in rows]
    fig = make_subplots(rows=1, cols=3, subplot_titles=("throughput (tok/s)", "median latency (s)", "$ per 1M tokens"))
    fig.add_scatter(x=bs, y=[r.throughput_tok_s for r in rows], mode="lines+markers", line=dict(color=PROJECTED_COLOR),
                    name="throughput", row=1, col=1)
    fig.add_scatter(x=bs, y=[r.latency_p50 for r in rows], mode="lines+markers", line=dict(color="#7f8c8d"),
                    name="latency p50", row=1, col=2)
    fig.add_scatter(x=bs, y=[r.cost_per_million_tokens for r in rows], mode="lines+markers",
                    line=dict(color="#c0392b"), name="cost", row=1, col=3)
    log_axis(fig, "x", bs, title="batch limit")
    log_axis(fig, "y", [r.throughput_tok_s for r in rows], unit="tok/s", row=1, col=1)
    log_axis(fig, "y", [r.latency_p50 for r in rows], unit="s", row=1, col=2)
    log_axis(fig, "y", [r.cost_per_million_tokens for r in rows], prefix="$", row=1, col=3)
    fig.update_layout(height=320, margin=MARGIN, showlegend=False)
    return fig


def measured_batching_figure(points: Sequence[dict], ceiling: Sequence[float]) -> go.Figure:
    """Measured total and per-user tok/s against batch size, beside this device's projected ceiling (total)."""
    bs = [p["batch"] for p in points]
    fig = go.Figure()
    fig.add_scatter(x=bs, y=[p["total_tok_s"] for p in points], name="total (measured)", mode="lines+markers",
                    line=dict(color=MEASURED_COLOR))
    fig.add_scatter(x=bs, y=[p["per_user_tok_s"] for p in points], name="per user (measured)", mode="lines+markers",
                    line=dict(color=MEASURED_COLOR, dash="dash"))
    fig.add_scatter(x=bs, y=list(ceiling), name="total, ceiling on this device (projected)", mode="lines+markers",
                    line=dict(color=PROJECTED_COLOR, dash="dot"))
    log_axis(fig, "x", bs, title="batch size")
    log_axis(fig, "y", trace_values(fig, "y"), unit="tok/s", title="tokens per second")
    fig.update_layout(height=340, margin=MARGIN, legend=dict(orientation="h", y=-0.25))
    return fig


def precision_bars(labels: Sequence[str], values: Sequence[float], title: str, unit: str,
                   color: str = MEASURED_COLOR) -> go.Figure:
    """One bar per precision."""
    fig = go.Figure(go.Bar(x=list(labels), y=list(values), marker_color=color,
                           text=[f"{v:,.3g} {unit}" for v in values], textposition="outside", cliponaxis=False))
    fig.update_layout(height=280, margin=MARGIN, title=dict(text=title, font=dict(size=14)))
    fig.update_yaxes(rangemode="tozero", showticklabels=False)
    return fig


def rates_figure(names: Sequence[str], rates: Sequence[float], chosen: float,
                 measured: Sequence[bool] | None = None) -> go.Figure:
    """Tokens per second of each preset (log scale) with the chosen rate as a line; measured bars in orange."""
    colors = [MEASURED_COLOR if m else PROJECTED_COLOR for m in (measured or [False] * len(names))]
    fig = go.Figure(go.Bar(y=list(names), x=list(rates), orientation="h", marker_color=colors,
                           text=[f"{r:,.0f} tok/s" for r in rates], textposition="outside", cliponaxis=False))
    fig.add_vline(x=chosen, line=dict(color=MEASURED_COLOR, width=2))
    ticks = log_ticks([*rates, chosen, min(rates, default=1) / 3], unit="tok/s")   # the shortest bar stays visible
    low, high = ticks.pop("range")
    fig.update_xaxes(**ticks, range=[low, high + TEXT_ROOM * (high - low)], title="tokens per second")
    fig.update_layout(height=60 + 36 * len(names), margin=MARGIN)
    return fig
