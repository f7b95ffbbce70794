"""Numbers and token text as people read them. Pure functions; no Streamlit.

Sizes come from engine/projection/units.py, shared with the engine's messages and CLI: decimal KB, MB and GB, and a
GPU's capacity stated once as "80 GiB = 85.90 GB".

Token text comes from the user or from the model, so it is never rendered as HTML or Markdown:
`plot_text` escapes the few characters Plotly treats as markup, and `visible` makes whitespace
(which tokens are full of) something a reader can see.
"""
from __future__ import annotations

import html
import math
import re
from typing import TYPE_CHECKING, Iterable

from engine.projection.cost import DEFAULT_BANDWIDTH_EFFICIENCY
from engine.projection.units import CONVENTION, card_size, fmt_bytes  # noqa: F401  (one convention: engine/projection/units.py)

if TYPE_CHECKING:
    from engine.service.client import ModelClient


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


def token_words(text: str, ends_answer: bool = False) -> str:
    """A token as a sentence names it: quoted with its whitespace visible, or what it is when it has no text."""
    if ends_answer and not text.strip():
        return "the end-of-answer token (the model's signal that it is done)"
    return f"'{visible(text)}'" if text else "a token with no text of its own"


def plot_text(text: str, limit: int = 24) -> str:
    """Token text safe for Plotly labels: whitespace visible, markup characters escaped, long text cut."""
    shown = visible(text)
    if len(shown) > limit:
        shown = shown[: limit - 1] + "…"
    return html.escape(shown, quote=False)


_SI = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
_SMALL_SI = ((1e-3, "m"), (1e-6, "µ"), (1e-9, "n"))
SI_UNITS = ("s", "B", "B/s", "FLOP/s", "FLOPs")            # units that take an SI prefix: 'ms', 'GB', 'TFLOP/s'
LOG_MANTISSAS = ((1, 1.5, 2, 3, 5, 7), (1, 2, 5), (1,))   # within a decade, up to two decades, beyond


def si_label(value: float, unit: str = "", prefix: str = "") -> str:
    """A tick label: 1e14 'FLOP/s' -> '100 TFLOP/s', 0.02 's' -> '20 ms', 2000 'tok/s' -> '2k tok/s',
    0.5 with prefix '$' -> '$0.5'. Units of SI_UNITS take the prefix letter; any other number keeps k, M, G ..."""
    scale, letter = next(((f, n) for f, n in _SI if abs(value) >= f * 0.999), (1.0, ""))
    small = 1.0 if unit in SI_UNITS else 1e-3                # '20 ms', but '0.5 tok/s' and '0.01'
    if 0 < abs(value) < small * 0.999:
        scale, letter = next(((f, n) for f, n in _SMALL_SI if abs(value) >= f * 0.999), _SMALL_SI[-1])
    number = f"{round(value / scale, 6):g}"
    if unit in SI_UNITS:
        return f"{prefix}{number} {letter}{unit}"
    return f"{prefix}{number}{letter} {unit}" if unit else f"{prefix}{number}{letter}"


def log_ticks(values: Iterable[float | None], unit: str = "", prefix: str = "", scale: float = 1.0) -> dict:
    """Tick values, labels and range for a log axis over `values` (labels read value x scale: data in ms, unit 's'
    and scale 1e-3 label 20 as '20 ms').

    1-2-5 in each decade up to two decades, one tick a decade beyond (every other decade beyond eight; a decade
    mark the data come within a factor 2 of is taken in), at least
    two ticks, every label in SI with its unit or prefix: the axis never prints plotly's bare minor digits."""
    pos = [float(v) for v in values if v is not None and math.isfinite(float(v)) and float(v) > 0]
    lo, hi = (min(pos), max(pos)) if pos else (1.0, 10.0)
    span = math.log10(hi / lo)
    mantissas = LOG_MANTISSAS[0] if span < 1 else LOG_MANTISSAS[1] if span <= 2 else LOG_MANTISSAS[2]
    every = 2 if span > 8 else 1
    grid = [float(f"{m * 10.0 ** e:.12g}") for e in range(math.floor(math.log10(lo)) - 2, math.ceil(math.log10(hi)) + 2)
            if e % every == 0 for m in mantissas]
    inside = [t for t in grid if lo / 1.0001 <= t <= hi * 1.0001]
    below, above = [t for t in grid if t < lo / 1.0001], [t for t in grid if t > hi * 1.0001]
    if mantissas == LOG_MANTISSAS[-1]:                       # decades: take in a decade mark the data nearly reach
        if above and above[0] / hi <= 2:
            inside.append(above.pop(0))
        if below and lo / below[-1] <= 2:
            inside.insert(0, below.pop())
    while len(inside) < 2:                                   # widen to the nearer neighbouring tick
        if below and (not above or lo / below[-1] <= above[0] / hi):
            inside.insert(0, below.pop())
        else:
            inside.append(above.pop(0))
    low, high = min(lo, inside[0]), max(hi, inside[-1])
    pad = 0.04 * max(math.log10(high / low), 0.5)
    return dict(type="log", tickmode="array", tickvals=inside,
                ticktext=[si_label(t * scale, unit, prefix) for t in inside],
                range=[math.log10(low) - pad, math.log10(high) + pad])


# --- the two planes' labels: measured figures are introduced by MEASURED, projected ones by projected_label ------

MEASURED = "Measured on this machine"


def projected_label(model: str, gpu: str) -> str:
    return f"Projected for {model} on {gpu}"


def efficiency_note(bandwidth: float = DEFAULT_BANDWIDTH_EFFICIENCY, flops: float | None = None) -> str:
    """Where the efficiency enters a projected number: 'projected at 70% of peak bandwidth'."""
    note = f"projected at {bandwidth:.0%} of peak bandwidth"
    return note + (f" (decode) and {flops:.0%} of peak FLOP/s (prefill)" if flops is not None else "")


def measured_caption(lm: ModelClient) -> str:
    return f"{MEASURED}: {lm.label}, {lm.dtype_name}, on {lm.device}."
