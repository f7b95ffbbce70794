"""Numbers and token text as people read them. Pure functions; no Streamlit.

Sizes come from engine/units.py, shared with the engine's messages and CLI: decimal KB, MB and GB, and a
GPU's capacity stated once as "80 GiB = 85.90 GB".

Token text comes from the user or from the model, so it is never rendered as HTML or Markdown:
`plot_text` escapes the few characters Plotly treats as markup, and `visible` makes whitespace
(which tokens are full of) something a reader can see.
"""
from __future__ import annotations

import html
import re

from engine.units import CONVENTION, card_size, fmt_bytes  # noqa: F401  (one convention: engine/units.py)


def fmt_ms(seconds: float | None) -> str:
    """Seconds as milliseconds for latency metrics; an en dash when unknown."""
    if seconds is None:
        return "–"
    ms = seconds * 1e3
    return f"{ms:,.0f} ms" if ms >= 100 else f"{ms:,.1f} ms"


def fmt_rate(per_second: float | None) -> str:
    return "–" if not per_second else f"{per_second:,.1f} tok/s"


def fmt_tokens(n: int) -> str:
    """Context lengths the way people say them: 1024 -> '1K', 131072 -> '128K', 1500 -> '1,500'."""
    if n >= 1024 and n % 1024 == 0:
        return f"{n // 1024}K"
    return f"{n:,}"


_TOKENS_RE = re.compile(r"^\s*([0-9][0-9_,]*(?:\.[0-9]+)?)\s*([kK])?\s*$")


def parse_tokens(text: str, low: int = 1024, high: int = 131_072) -> int:
    """'32K' -> 32768, '4096' -> 4096, '1.5k' -> 1536. Raises ValueError with a readable message."""
    match = _TOKENS_RE.match(str(text))
    if not match:
        raise ValueError("that is not a token count; write e.g. 8192, 8K or 32k")  # never echo user text
    value = float(match.group(1).replace(",", "").replace("_", ""))
    tokens = int(round(value * 1024)) if match.group(2) else int(round(value))
    if not low <= tokens <= high:
        raise ValueError(f"{fmt_tokens(tokens)} tokens is outside {fmt_tokens(low)} to {fmt_tokens(high)}")
    return tokens


def visible(text: str) -> str:
    """Token text with its whitespace made visible: ' the' -> '·the', '\\n' -> '⏎'."""
    if text == "":
        return "∅"
    return text.replace(" ", "·").replace("\n", "⏎").replace("\t", "⇥").replace("\r", "␍")


def plot_text(text: str, limit: int = 24) -> str:
    """Token text safe for Plotly labels: whitespace visible, markup characters escaped, long text cut."""
    shown = visible(text)
    if len(shown) > limit:
        shown = shown[: limit - 1] + "…"
    return html.escape(shown, quote=False)


def axis_labels(texts: list[str], limit: int = 12) -> list[str]:
    """Position-tagged labels for a plot axis: '12 ·the' (duplicates stay distinct)."""
    return [f"{i} {plot_text(t, limit)}" for i, t in enumerate(texts)]
