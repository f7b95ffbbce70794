"""The figures' shared style: measured series in orange, projected ones in blue (so the two planes never blur
together), the margins, room for a bar's label, and log axes labelled in SI. Plotly only; no Streamlit.
"""
from __future__ import annotations

from typing import Iterable

import plotly.graph_objects as go

from app.ui.format import log_ticks

MEASURED_COLOR, PROJECTED_COLOR = "#e8833a", "#3a7be8"
MARGIN = dict(l=0, r=0, t=30, b=0)
TEXT_ROOM = 0.3        # share of a bar chart's value axis added past the longest bar, for its label


def log_axis(fig: go.Figure, axis: str, values: Iterable[float | None], unit: str = "", prefix: str = "",
             scale: float = 1.0, **where) -> None:
    """Make the x or y axis (of the subplot `where` picks) logarithmic with labelled SI ticks only: 1-2-5 or
    decades, each with its unit or '$', never plotly's bare minor digits (app.ui.format.log_ticks)."""
    update = fig.update_xaxes if axis == "x" else fig.update_yaxes
    update(**log_ticks(values, unit, prefix, scale), **where)


# --- type a projector can show --------------------------------------------------------------------------------

MIN_TEXT_PX = 12       # the smallest chart text any page draws (plotly's own default size); tests/test_browser_type.py
TRACE_FONTS = ("textfont", "insidetextfont", "outsidetextfont", "colorbar.tickfont", "colorbar.title.font",
               "marker.colorbar.tickfont", "marker.colorbar.title.font")
FITTED_TEXT = ("heatmap", "histogram2d")        # text plotly shrinks to its cell unless given a size
SHRUNK_TEXT = ("bar", "funnel", "waterfall", "pie")   # text plotly shrinks to its bar unless uniformtext says not


def _small_fonts(node, path: str, out: list[str], px: int) -> None:
    """Paths (plotly's 'a.b[0].c' form) of every font size under `px` in a layout's JSON."""
    if isinstance(node, dict):
        for key, value in node.items():
            where = f"{path}.{key}" if path else key
            if key == "size" and path.endswith("font") and isinstance(value, (int, float)) and value < px:
                out.append(where)
            elif isinstance(value, (dict, list)):
                _small_fonts(value, where, out, px)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            if isinstance(value, dict):
                _small_fonts(value, f"{path}[{i}]", out, px)


def _trace_fixes(trace, px: int) -> list[str]:
    """The trace's font sizes under `px` (or left for plotly to fit to a heatmap's cells), as property paths."""
    out = []
    for name in TRACE_FONTS:
        if name not in trace:          # this trace type has no such font: asked so, not by catching plotly's error,
            continue                   # whose "did you mean" ranks every property by edit distance (ms a figure)
        size = trace[f"{name}.size"]
        if size is None and name == "textfont" and trace.type in FITTED_TEXT and (trace["text"] is not None):
            out.append(f"{name}.size")
        elif isinstance(size, (int, float)) and size < px:
            out.append(f"{name}.size")
    return out


def at_least(fig: go.Figure, px: int = MIN_TEXT_PX, base: int | None = None) -> go.Figure:
    """The figure with no text under `px` pixels (and its base font at `base` when given): `fig` itself when nothing
    needs changing, else a changed copy (a figure may be shared between sessions, `app.journey.figures`). Bars keep
    their labels at `px` or more (plotly would shrink a label to its bar), heatmaps their cell text."""
    layout_fixes: list[str] = []
    _small_fonts(fig.layout.to_plotly_json(), "", layout_fixes, px)
    trace_fixes = [(i, path) for i, trace in enumerate(fig.data) for path in _trace_fixes(trace, px)]
    bars = any(t.type in SHRUNK_TEXT for t in fig.data) and (fig.layout.uniformtext.minsize or 0) < px
    rebase = base is not None and fig.layout.font.size != base
    if not (layout_fixes or trace_fixes or bars or rebase):
        return fig
    fig = go.Figure(fig)
    for path in layout_fixes:
        fig.layout[path] = px
    for i, path in trace_fixes:
        fig.data[i][path] = px
    if bars:
        fig.layout.uniformtext = dict(minsize=px, mode="show")
    if rebase:
        fig.layout.font.size = base
    return fig
