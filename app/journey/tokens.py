"""Token chips: the prompt as the model reads it, one coloured box per token with its id underneath.

A token is a run of bytes, not always a whole character: where the tokenizer cut a character's UTF-8 bytes
(CJK, emoji), a chip shows its bytes in hex (<E4 BD>) and a bracket under the tokens of one character shows
the character they spell together (engine/core/token_bytes.py).

Drawn as a Plotly figure (bars for the boxes, text traces for labels), so token text is plot text
escaped with `html.escape`, never HTML. Layout is computed in character cells of a monospace font, and the page
draws the figure at its own pixel width (`plot(..., width="content")`): a chart stretched or squeezed to the column
moves its boxes but not its text, which is how chips once ran into each other at 1024x768.
"""
from __future__ import annotations

import html
from dataclasses import dataclass

import plotly.graph_objects as go

from app.ui.format import plot_text, visible
from engine.core.token_bytes import char_groups, is_fragment, readable

PALETTE = ("#cfe8fc", "#ffe3c2", "#d8f5d0", "#f6d5f2", "#fff3b0", "#d9dcff", "#c9f1ee", "#ffd6d6")
SPECIAL_COLOR = "#e4e4e4"
CHAR_PX = 7.8         # width of one monospace character at FONT_SIZE
FONT_SIZE = 13
ROW_PX = 46
ROW_CHARS = 88        # characters per row before wrapping: 706 px, inside the 720 px a 1024-px projector gives a page
MAX_LABEL = 18
GROUPED_PITCH = 1.45  # row spacing (in rows) when brackets under split characters need room


@dataclass(frozen=True)
class Chip:
    index: int
    id: int
    label: str        # visible, escaped text shown in the box (a byte fragment as hex: <E4 BD>)
    x0: float         # in character cells
    width: float
    row: int
    special: bool
    group: int = 0    # which character group it belongs to (tokens that together spell whole characters)
    hover: str = ""


@dataclass(frozen=True)
class Bracket:
    """A line under the chips of one character group on one row, with the characters they spell."""

    x0: float
    x1: float
    row: int
    label: str        # escaped


def chip_width(label_len: int, token_id: int) -> int:
    return max(label_len, len(str(token_id)), 2) + 1


def chip_label(text: str, raw: bytes | None) -> str:
    """What a chip shows: the token's text, or its bytes in hex where it is part of a character."""
    if raw is not None and is_fragment(raw):
        return readable(raw, visible)
    return visible(text)


def layout_chips(texts: list[str], ids: list[int], special: list[bool] | None = None,
                 row_chars: int = ROW_CHARS, pieces: list[bytes] | None = None) -> list[Chip]:
    """Place chips left to right, wrapping to a new row when the next one does not fit. With `pieces` (each
    token's bytes), tokens that together spell a character share a group."""
    special = special or [False] * len(texts)
    groups = char_groups(pieces) if pieces is not None else [range(i, i + 1) for i in range(len(texts))]
    group_of = {i: g for g, run in enumerate(groups) for i in run}
    chips, x, row = [], 0.0, 0
    for i, (text, tid) in enumerate(zip(texts, ids)):
        raw = pieces[i] if pieces is not None else None
        shown = chip_label(text, raw)
        shown = shown if len(shown) <= MAX_LABEL else shown[:MAX_LABEL - 1] + "…"
        width = chip_width(len(shown), tid)
        if x > 0 and x + width > row_chars:
            x, row = 0.0, row + 1
        hover = f"#{i} id {tid}<br>{html.escape(shown, quote=False)}"
        if raw is not None:
            hover += "<br>bytes " + (" ".join(f"{b:02X}" for b in raw) or "none")
        chips.append(Chip(i, tid, html.escape(shown, quote=False), x, width, row, special[i], group_of[i], hover))
        x += width + 0.6
    return chips


def brackets(chips: list[Chip], pieces: list[bytes] | None) -> list[Bracket]:
    """One bracket per row of each group of two or more tokens (a character split into byte fragments)."""
    if pieces is None:
        return []
    out = []
    for run in char_groups(pieces):
        if len(run) < 2 or run.stop > len(chips):
            continue
        text = b"".join(pieces[i] for i in run).decode("utf-8", errors="replace")
        for row in sorted({chips[i].row for i in run}):
            on_row = [chips[i] for i in run if chips[i].row == row]
            out.append(Bracket(on_row[0].x0, on_row[-1].x0 + on_row[-1].width, row, plot_text(text.strip() or text, 8)))
    return out


def chip_colors(chips: list[Chip]) -> list[str]:
    return [SPECIAL_COLOR if c.special else PALETTE[c.group % len(PALETTE)] for c in chips]


def chips_figure(texts: list[str], ids: list[int], special: list[bool] | None = None,
                 row_chars: int = ROW_CHARS, pieces: list[bytes] | None = None) -> go.Figure:
    """One chip per token: text inside, id below; special (template) tokens in grey. With `pieces`, a token that
    is part of a character shows its bytes, and a bracket under the tokens of one character shows it."""
    chips = layout_chips(texts, ids, special, row_chars, pieces)
    marks = brackets(chips, pieces)
    pitch = GROUPED_PITCH if marks else 1.0              # rows move apart to make room for the brackets
    rows = (chips[-1].row + 1) if chips else 1
    fig = go.Figure()
    fig.add_bar(orientation="h", base=[c.x0 for c in chips], x=[c.width for c in chips],
                y=[c.row * pitch for c in chips], width=0.52, marker_color=chip_colors(chips),
                marker_line=dict(color="#8a8a8a", width=0.6), hovertext=[c.hover for c in chips], hoverinfo="text")
    fig.add_scatter(x=[c.x0 + c.width / 2 for c in chips], y=[c.row * pitch for c in chips], mode="text",
                    text=[c.label for c in chips], textfont=dict(family="monospace", size=FONT_SIZE),
                    hoverinfo="skip")
    fig.add_scatter(x=[c.x0 + c.width / 2 for c in chips], y=[c.row * pitch + 0.42 for c in chips], mode="text",
                    text=[str(c.id) for c in chips], textfont=dict(family="monospace", size=12, color="#666"),
                    hoverinfo="skip")
    if marks:
        add_brackets(fig, marks, pitch)
    width_px = int(row_chars * CHAR_PX) + 20
    bottom = (rows - 1) * pitch + (1.05 if marks else 0.65)
    fig.update_layout(width=width_px, height=int(rows * pitch * ROW_PX) + 16, showlegend=False, bargap=0,
                      margin=dict(l=4, r=4, t=4, b=4), plot_bgcolor="rgba(0,0,0,0)")
    fig.update_xaxes(range=[-0.5, row_chars + 0.5], visible=False, fixedrange=True)
    fig.update_yaxes(range=[bottom, -0.45], visible=False, fixedrange=True)
    return fig


def add_brackets(fig: go.Figure, marks: list[Bracket], pitch: float) -> None:
    """A thin line under each split character's chips, the character it spells beneath the line."""
    xs, ys = [], []
    for m in marks:
        y = m.row * pitch + 0.6
        xs += [m.x0 + 0.2, m.x0 + 0.2, m.x1 - 0.2, m.x1 - 0.2, None]
        ys += [y - 0.08, y, y, y - 0.08, None]
    fig.add_scatter(x=xs, y=ys, mode="lines", line=dict(color="#555", width=1.2), hoverinfo="skip")
    fig.add_scatter(x=[(m.x0 + m.x1) / 2 for m in marks], y=[m.row * pitch + 0.82 for m in marks], mode="text",
                    text=[m.label for m in marks], textfont=dict(size=FONT_SIZE + 1, color="#222"),
                    hoverinfo="skip")


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
