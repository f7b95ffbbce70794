"""The figures' shared style: measured series in orange, projected ones in blue (so the two planes never blur
together), the margins, room for a bar's label, and log axes labelled in SI. Plotly only; no Streamlit.
"""
from __future__ import annotations

from typing import Iterable

import plotly.graph_objects as go

from app.format import log_ticks

MEASURED_COLOR, PROJECTED_COLOR = "#e8833a", "#3a7be8"
MARGIN = dict(l=0, r=0, t=30, b=0)
TEXT_ROOM = 0.3        # share of a bar chart's value axis added past the longest bar, for its label


def log_axis(fig: go.Figure, axis: str, values: Iterable[float | None], unit: str = "", prefix: str = "",
             scale: float = 1.0, **where) -> None:
    """Make the x or y axis (of the subplot `where` picks) logarithmic with labelled SI ticks only: 1-2-5 or
    decades, each with its unit or '$', never plotly's bare minor digits (app.format.log_ticks)."""
    update = fig.update_xaxes if axis == "x" else fig.update_yaxes
    update(**log_ticks(values, unit, prefix, scale), **where)
