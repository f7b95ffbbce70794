"""Figures for the speculative-decoding page: the round-by-round timeline, acceptance per draft position,
where each round's time went, and tokens per pass and speedup against k (measured and projected).
Each builder takes plain data and returns a Plotly figure.
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.ui.format import plot_text
from engine.speculative.decode import SpecRoundRecord

ACCEPTED, REJECTED, CORRECTION, BONUS, ALONE = 0, 1, 2, 3, 4
CELL_COLORS = ("#9fdcb1", "#f3a59e", "#a9c7f5", "#cdb5f4", "#dedede")
CELL_NAMES = ("accepted draft", "rejected draft", "target's correction", "bonus (all drafts accepted)",
              "target alone (nothing drafted)")
MEASURED_COLOR, PROJECTED_COLOR, THEORY_COLOR = "#e8833a", "#7a5bd6", "#3a7be8"
DRAFT_COLOR, VERIFY_COLOR = "#f0b37e", "#6f9fe8"
ROW_PX = 26


def _colorscale() -> list[list]:
    n = len(CELL_COLORS) - 1
    return [[i / n, color] for i, color in enumerate(CELL_COLORS)]


def _drafted_cell(j: int, tok, accepted: bool) -> tuple[int, str]:
    verdict = "accepted" if accepted else "rejected"
    hover = (f"draft {j + 1}: {plot_text(tok.text)} — {verdict}<br>draft's probability q = {tok.draft_prob:.3f}"
             f"<br>target's probability p = {tok.target_prob:.3f}")
    return (ACCEPTED if accepted else REJECTED), hover


def _target_cell(rec: SpecRoundRecord) -> tuple[int, str] | None:
    if len(rec.emitted) <= rec.accepted:            # the answer ended inside the accepted drafts
        return None
    if not rec.drafted:
        return ALONE, f"{plot_text(rec.bonus.text)} — nothing was drafted: a plain decoding step<br>p = {rec.bonus.prob:.3f}"
    bonus = rec.accepted == len(rec.drafted)
    what = "bonus: every draft passed, so the verify pass gives one more" if bonus else \
        f"correction: the target's own token where draft {rec.accepted + 1} was rejected"
    return (BONUS if bonus else CORRECTION), f"{plot_text(rec.bonus.text)} — {what}<br>p = {rec.bonus.prob:.3f}"


def timeline_rows(rounds: list[SpecRoundRecord], k: int) -> tuple[list[list], list[list[str]], list[list[str]]]:
    """Per round: k draft cells then the target's cell; (category or None, cell text, hover text)."""
    z, text, hover = [], [], []
    for rec in rounds:
        cells: list[tuple[int, str] | None] = [_drafted_cell(j, t, t.accepted) for j, t in enumerate(rec.drafted)]
        cells += [None] * (k - len(rec.drafted)) + [_target_cell(rec)]
        texts = [plot_text(t.text, 10) for t in rec.drafted] + [""] * (k - len(rec.drafted))
        texts.append(plot_text(rec.bonus.text, 10) if cells[-1] else "")
        z.append([c[0] if c else None for c in cells])
        hover.append([c[1] if c else "" for c in cells])
        text.append(texts)
    return z, text, hover


def timeline_figure(rounds: list[SpecRoundRecord], k: int) -> go.Figure:
    """One row per round: the drafted tokens coloured by the verdict, then the target's own token."""
    z, text, hover = timeline_rows(rounds, k)
    labels = [f"round {r.round} · {r.accepted}/{len(r.drafted)}" for r in rounds]
    columns = [f"draft {j}" for j in range(1, k + 1)] + ["target"]
    fig = go.Figure(go.Heatmap(
        z=z, x=columns, y=labels, text=text, texttemplate="%{text}", hovertext=hover, hoverinfo="text",
        hoverongaps=False, zmin=0, zmax=len(CELL_COLORS) - 1, colorscale=_colorscale(), showscale=False,
        xgap=2, ygap=2, textfont=dict(family="monospace", size=12, color="#1b1b1b")))
    for name, color in zip(CELL_NAMES, CELL_COLORS):   # a legend for the four colours
        fig.add_scatter(x=[None], y=[None], mode="markers", name=name,
                        marker=dict(symbol="square", size=12, color=color))
    fig.update_yaxes(autorange="reversed", type="category", tickfont=dict(size=12))
    fig.update_xaxes(side="top", type="category")
    fig.update_layout(height=90 + ROW_PX * max(len(rounds), 3), margin=dict(l=0, r=0, t=30, b=0),
                      legend=dict(orientation="h", y=-0.02, yanchor="top", x=0), plot_bgcolor="white")
    return fig


def position_figure(by_position: list[float], a: float) -> go.Figure:
    """Accepted / drafted at each draft position against a^j, what independent acceptance at rate a gives."""
    xs = list(range(1, len(by_position) + 1))
    # A label inside its bar's top, clear of the dotted line; above the bar where the bar is too short to hold it
    # (plotly's "auto"). Inside only, a short bar's label ran out of its foot over the axis' numbers, white on white.
    fig = go.Figure(go.Bar(x=xs, y=by_position, name="measured: accepted / drafted", marker_color=MEASURED_COLOR,
                           text=[f"{v:.0%}" for v in by_position], textposition="auto", insidetextanchor="end",
                           insidetextfont=dict(color="white"), outsidetextfont=dict(color="#1b1b1b"),
                           cliponaxis=False, hovertemplate="draft position %{x}: %{y:.0%} accepted<extra></extra>"))
    fig.add_scatter(x=xs, y=[a ** j for j in xs], mode="lines+markers", name=f"a^j with a = {a:.0%}",
                    line=dict(color=THEORY_COLOR, dash="dot"),
                    hovertemplate="a^%{x} = %{y:.0%}<extra></extra>")
    fig.update_xaxes(title="draft position j", dtick=1)
    fig.update_yaxes(title="accepted", range=[0, 1.12], tickformat=".0%")
    fig.update_layout(height=300, margin=dict(l=0, r=0, t=10, b=0), legend=dict(orientation="h", y=1.12))
    return fig


def round_time_figure(rounds: list[SpecRoundRecord], plain_step: float | None) -> go.Figure:
    """Each round's draft and verify time, against what plain decoding needs for the tokens it produced."""
    xs = [r.round for r in rounds]
    fig = go.Figure()
    fig.add_bar(x=xs, y=[1e3 * r.draft_seconds for r in rounds], name="draft", marker_color=DRAFT_COLOR,
                hovertemplate="round %{x}: drafting %{y:.1f} ms<extra></extra>")
    fig.add_bar(x=xs, y=[1e3 * r.verify_seconds for r in rounds], name="verify (one target pass)",
                marker_color=VERIFY_COLOR, hovertemplate="round %{x}: verifying %{y:.1f} ms<extra></extra>")
    if plain_step:
        fig.add_scatter(x=xs, y=[1e3 * plain_step * len(r.emitted) for r in rounds], mode="markers",
                        name="plain decoding, same tokens", marker=dict(color="black", symbol="line-ew-open", size=14,
                                                                       line=dict(width=2)),
                        hovertemplate="plain decoding: %{y:.1f} ms for this round's tokens<extra></extra>")
    fig.update_layout(barmode="stack", height=280, margin=dict(l=0, r=0, t=10, b=0),
                      legend=dict(orientation="h", y=1.15), xaxis_title="round", yaxis_title="ms")
    return fig


def k_figure(ks: list[int], expected: list[float], measured_k: int, measured_tpp: float,
             curves: list[tuple[str, list[float], str, str]], measured_speedup: float | None) -> go.Figure:
    """Left: tokens per target pass against k. Right: speedup against k for each cost ratio, with the
    measured point. `curves`: (name, speedups, colour, dash)."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=("tokens per verify pass", "speedup over plain decoding"))
    fig.add_scatter(x=ks, y=expected, mode="lines+markers", name="expected (1 − a^(k+1)) / (1 − a)",
                    line=dict(color=THEORY_COLOR), row=1, col=1,
                    hovertemplate="k = %{x}: %{y:.2f} tokens per pass<extra></extra>")
    fig.add_scatter(x=[measured_k], y=[measured_tpp], mode="markers", name="measured on this machine",
                    marker=dict(color=MEASURED_COLOR, size=14, symbol="diamond"), row=1, col=1,
                    hovertemplate="measured at k = %{x}: %{y:.2f} tokens per pass<extra></extra>")
    for name, ys, color, dash in curves:
        fig.add_scatter(x=ks, y=ys, mode="lines+markers", name=name, line=dict(color=color, dash=dash),
                        row=1, col=2, hovertemplate="k = %{x}: %{y:.2f}×<extra></extra>")
    if measured_speedup is not None:
        fig.add_scatter(x=[measured_k], y=[measured_speedup], mode="markers", showlegend=False,
                        marker=dict(color=MEASURED_COLOR, size=14, symbol="diamond"), row=1, col=2,
                        hovertemplate="measured at k = %{x}: %{y:.2f}×<extra></extra>")
    fig.add_hline(y=1.0, line=dict(color="#999", dash="dot", width=1), row=1, col=2)
    fig.update_xaxes(title="k (tokens drafted per round)", dtick=1)
    fig.update_yaxes(rangemode="tozero")
    fig.update_layout(height=380, margin=dict(l=0, r=0, t=30, b=0),
                      legend=dict(orientation="h", y=-0.2, yanchor="top", x=0))
    return fig
