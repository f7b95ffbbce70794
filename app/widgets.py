"""Small rendering helpers shared by the pages: placeholders that can be redrawn many times in one run."""
from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st

from app.layout import plot_font
from app.run import Throttle

PLOT_CONFIG = {"displaylogo": False, "modeBarButtonsToRemove": ["select2d", "lasso2d"]}


def sized(fig: go.Figure) -> go.Figure:
    """The figure with this session's chart text size (larger in the presenter layout)."""
    font = plot_font()
    return fig.update_layout(font_size=font) if font else fig


class ChartSlot:
    """An `st.empty` that takes a new figure on every update (each with its own element key)."""

    def __init__(self, name: str, parent=None):
        self.name, self.n = name, 0
        self.box = (parent or st).empty()

    def plot(self, fig: go.Figure) -> None:
        self.n += 1
        self.box.plotly_chart(sized(fig), key=f"{self.name}.{self.n}", config=PLOT_CONFIG)


def plot(fig: go.Figure, key: str, parent=None) -> None:
    """A chart drawn once per run."""
    (parent or st).plotly_chart(sized(fig), key=key, config=PLOT_CONFIG)


class ProgressLine:
    """One line that follows a streaming run: how many tokens so far, and the answer."""

    def __init__(self) -> None:
        self.box = st.empty()
        self.throttle = Throttle(0.2)

    def update(self, run) -> None:
        if self.throttle() or run.done is not None:
            self.box.text(f"{len(run.tokens)} tokens: {run.text}")
