"""Token chips: the prompt as the model reads it, one coloured box per token with its id underneath.

Drawn as a Plotly figure (bars for the boxes, text traces for labels), so token text is plot text
escaped by `plot_text`, never HTML. Layout is computed in character cells of a monospace font.
"""
from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from app.format import plot_text, visible

PALETTE = ("#cfe8fc", "#ffe3c2", "#d8f5d0", "#f6d5f2", "#fff3b0", "#d9dcff", "#c9f1ee", "#ffd6d6")
SPECIAL_COLOR = "#e4e4e4"
CHAR_PX = 7.8         # width of one monospace character at FONT_SIZE
FONT_SIZE = 13
ROW_PX = 46
ROW_CHARS = 110       # characters per row before wrapping
MAX_LABEL = 18


@dataclass(frozen=True)
class Chip:
    index: int
    id: int
    label: str        # visible, escaped text shown in the box
    x0: float         # in character cells
    width: float
    row: int
    special: bool


def chip_width(label_len: int, token_id: int) -> int:
    return max(label_len, len(str(token_id)), 2) + 1


def layout_chips(texts: list[str], ids: list[int], special: list[bool] | None = None,
                 row_chars: int = ROW_CHARS) -> list[Chip]:
    """Place chips left to right, wrapping to a new row when the next one does not fit."""
    special = special or [False] * len(texts)
    chips, x, row = [], 0.0, 0
    for i, (text, tid) in enumerate(zip(texts, ids)):
        shown = visible(text)[:MAX_LABEL]
        width = chip_width(len(shown), tid)
        if x > 0 and x + width > row_chars:
            x, row = 0.0, row + 1
        chips.append(Chip(i, tid, plot_text(text, MAX_LABEL), x, width, row, special[i]))
        x += width + 0.6
    return chips


def chip_colors(chips: list[Chip]) -> list[str]:
    return [SPECIAL_COLOR if c.special else PALETTE[c.index % len(PALETTE)] for c in chips]


def chips_figure(texts: list[str], ids: list[int], special: list[bool] | None = None,
                 row_chars: int = ROW_CHARS) -> go.Figure:
    """One chip per token: text inside, id below; special (template) tokens in grey."""
    chips = layout_chips(texts, ids, special, row_chars)
    rows = (chips[-1].row + 1) if chips else 1
    hover = [f"#{c.index} id {c.id}<br>{c.label}" for c in chips]
    fig = go.Figure()
    fig.add_bar(orientation="h", base=[c.x0 for c in chips], x=[c.width for c in chips],
                y=[c.row for c in chips], width=0.52, marker_color=chip_colors(chips),
                marker_line=dict(color="#8a8a8a", width=0.6), hovertext=hover, hoverinfo="text")
    fig.add_scatter(x=[c.x0 + c.width / 2 for c in chips], y=[c.row for c in chips], mode="text",
                    text=[c.label for c in chips], textfont=dict(family="monospace", size=FONT_SIZE),
                    hoverinfo="skip")
    fig.add_scatter(x=[c.x0 + c.width / 2 for c in chips], y=[c.row + 0.42 for c in chips], mode="text",
                    text=[str(c.id) for c in chips], textfont=dict(family="monospace", size=9, color="#666"),
                    hoverinfo="skip")
    width_px = int(row_chars * CHAR_PX) + 20
    fig.update_layout(width=width_px, height=rows * ROW_PX + 16, showlegend=False, bargap=0,
                      margin=dict(l=4, r=4, t=4, b=4), plot_bgcolor="rgba(0,0,0,0)")
    fig.update_xaxes(range=[-0.5, row_chars + 0.5], visible=False, fixedrange=True)
    fig.update_yaxes(range=[rows - 0.35, -0.45], visible=False, fixedrange=True)
    return fig


def chars_per_token(text: str, n_tokens: int) -> float:
    return len(text) / n_tokens if n_tokens else 0.0


def special_mask(ids: list[int], prompt_ids: list[int], special_ids: set[int]) -> list[bool]:
    """Which input tokens belong to the chat template rather than the prompt text.

    The prompt's own ids appear as one contiguous run inside the templated ids; everything outside
    that run (and any special token) is template.
    """
    n = len(prompt_ids)
    start = next((i for i in range(len(ids) - n + 1) if ids[i:i + n] == prompt_ids), None) if n else None
    if start is None:
        return [i in special_ids for i in ids]
    return [not (start <= j < start + n) or tid in special_ids for j, tid in enumerate(ids)]
