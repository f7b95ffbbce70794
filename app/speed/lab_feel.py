"""'Feel the speed': a stored answer streamed at exactly a chosen number of tokens per second, beside the rate
measured on this machine and the rate projected for chosen hardware.

Token i appears at time i / rate after the first; the page redraws at most every FRAME seconds and
shows every token that is due, so 2,000 tok/s streams as fast as 20 tok/s looks smooth.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import streamlit as st

from app.speed import figures as charts
from app.ui.format import fmt_rate
from app.ui.hardware import HardwareChoice, hardware_controls
from app.ui.format import MEASURED, efficiency_note
from app.runs.widgets import LinkedNumber, Preset as WidgetPreset, linked_number, plot
from engine.service.client import ModelClient
from engine.projection.cost import project
from engine.projection.specs import GPU_PRESETS, MODEL_PRESETS
from engine.speculative.decode import expected_tokens_per_pass

FRAME = 0.05
MIN_RATE, MAX_RATE = 1, 2000
RATE = "feel.rate"
ANSWER = (
    "A refrigerator does not make cold; it moves heat. Inside the walls a fluid called the refrigerant runs in a "
    "closed loop. In the coils behind the food compartment it evaporates at low pressure, and evaporating takes "
    "heat from whatever is around it, so the air inside the fridge gets colder. A compressor then squeezes the warm "
    "vapour, which raises its pressure and its temperature, and pushes it through the coils at the back or bottom "
    "of the cabinet. There it is hotter than the kitchen, so it gives its heat to the room and condenses back into "
    "a liquid. The liquid passes through a narrow valve, its pressure drops, it cools sharply, and the loop starts "
    "again. A thermostat switches the compressor on when the inside warms past a set point and off when it is cold "
    "enough, which is why you hear the fridge hum for a while and then go quiet. Good door seals and thick "
    "insulation matter as much as the machinery: every bit of heat that leaks in has to be pumped out again. That "
    "is also why the coils at the back feel warm, and why a fridge with its door open makes the kitchen warmer, "
    "not cooler: it moves heat from the room into the room, and the motor adds its own on top."
)
READING_WORDS_PER_MINUTE = 250      # a typical adult reading silently
TOKENS_PER_WORD = 1.3               # English text through a Llama-style tokenizer


def due_count(elapsed: float, rate: float, total: int) -> int:
    """Tokens shown `elapsed` seconds after the first one appeared: token i is due at i / rate."""
    if elapsed < 0:
        return 0
    return min(total, math.floor(elapsed * rate + 1e-9) + 1)


def answer_pieces(lm: ModelClient | None, text: str = ANSWER) -> tuple[list[str], str]:
    """The answer cut into the loaded tokenizer's tokens (cumulative text after each), or into words when the
    tokenizer cannot reproduce the text. Returns (prefixes, what the pieces are)."""
    if lm is not None:
        ids = lm.tokenizer(text, add_special_tokens=False)["input_ids"]
        if lm.tokenizer.decode(ids) == text:
            return [lm.tokenizer.decode(ids[: i + 1]) for i in range(len(ids))], f"tokens of {lm.label}'s tokenizer"
    words = text.split(" ")
    return [" ".join(words[: i + 1]) for i in range(len(words))], "words (this tokenizer cannot spell the text)"


def stream(slot, prefixes: list[str], rate: float) -> float:
    """Show the answer at `rate` tokens per second; returns the rate actually shown."""
    start, shown = time.perf_counter(), 0
    while shown < len(prefixes):
        due = due_count(time.perf_counter() - start, rate, len(prefixes))
        if due > shown:
            shown = due
            slot.markdown(prefixes[shown - 1] + (" ▌" if shown < len(prefixes) else ""))
        next_due = shown / rate
        time.sleep(max(0.0, min(FRAME, next_due - (time.perf_counter() - start))))
    elapsed = time.perf_counter() - start
    return (len(prefixes) - 1) / elapsed if elapsed > 0 and len(prefixes) > 1 else float(rate)


# --- the presets ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Preset:
    name: str
    rate: float
    how: str
    short: str = ""


def reading_rate() -> float:
    return READING_WORDS_PER_MINUTE * TOKENS_PER_WORD / 60


def speculative_rate(base_tok_s: float, acceptance: float = 0.8, k: int = 4, draft_cost: float | None = None) -> float:
    """Tokens/s with a draft model: expected tokens per target pass over the cost of one pass plus k draft steps."""
    if draft_cost is None:   # Llama 3.2 1B drafting for 3.1 8B: a draft step costs its share of the weights
        from engine.projection.card import param_counts
        draft_cost = param_counts(MODEL_PRESETS["llama-3.2-1b"]).total / param_counts(MODEL_PRESETS["llama-3.1-8b"]).total
    return base_tok_s * expected_tokens_per_pass(acceptance, k) / (1 + k * draft_cost)


def presets(measured: float | None) -> list[Preset]:
    h100 = project(MODEL_PRESETS["llama-3.1-8b"], GPU_PRESETS["h100-sxm"])    # the cost page's defaults
    ceiling, tuned = h100.ceiling_tok_s_per_user, h100.per_user_tok_s
    fast = project(MODEL_PRESETS["llama-3.1-8b"], GPU_PRESETS["b200"], weight_dtype="fp8").ceiling_tok_s_per_user
    out = [Preset("A person reading", reading_rate(), f"{READING_WORDS_PER_MINUTE} words/min × {TOKENS_PER_WORD} "
                  "tokens/word", "Reading")]
    if measured:
        out.append(Preset("This machine (measured)", measured, MEASURED, "This machine"))
    out += [Preset("H100, Llama 3.1 8B, batch 1", tuned, f"{efficiency_note()}, 1K tokens of context", "H100"),
            Preset("H100, Llama 3.1 8B, batch 1: ceiling", ceiling, "projected: bandwidth ÷ bytes a step reads",
                   "H100 ceiling"),
            Preset("H100 + speculative decoding", speculative_rate(tuned),
                   "projected: Llama 3.2 1B drafting, k = 4, 80% acceptance", "Speculative"),
            Preset("A fast chip: B200, FP8 weights, batch 1", fast, "projected ceiling", "B200 FP8")]
    return [Preset(p.name, min(max(p.rate, MIN_RATE), MAX_RATE), p.how, p.short) for p in out]


def rate_input(options: list[Preset]) -> int:
    """Tokens per second: a slider and one button per preset rate."""
    buttons = tuple(WidgetPreset(f"{p.short} · {p.rate:,.0f}", p.rate, f"{p.name}: {p.how}") for p in options)
    return linked_number(LinkedNumber(RATE, "Tokens per second", MIN_RATE, MAX_RATE, 20, presets=buttons))


def feel_section(lm: ModelClient | None, measured: float | None) -> None:
    options = presets(measured)
    rate = rate_input(options)
    choice: HardwareChoice = hardware_controls("feel", lm, full=False)
    projection = choice.project()                   # batch 1, 1K tokens of context, the default efficiency
    projected = projection.per_user_tok_s            # None: it does not fit, so it has no speed
    cols = st.columns(3)
    cols[0].metric("Chosen rate", f"{rate:,} tok/s")
    cols[1].metric(MEASURED, fmt_rate(measured) if measured else "–",
                   help="The decode speed of the loaded model, from the latest measurement on this page.")
    cols[2].metric(choice.label + " (batch 1)", fmt_rate(projected) if projected else "does not fit",
                   help=f"{efficiency_note().capitalize()}, 1K tokens of context, as on the cost page." if projected
                   else "; ".join(projection.problems))
    extra = [(choice.label, projected)] if projected else []
    names = [p.name for p in options] + [n for n, _ in extra]
    plot(charts.rates_figure(names, [p.rate for p in options] + [r for _, r in extra], rate,
                             [p.how == MEASURED for p in options] + [False] * len(extra)), "feel.rates")
    prefixes, unit = answer_pieces(lm)
    if st.button("Stream the answer", type="primary", key="feel.play"):
        slot = st.empty()
        shown = stream(slot, prefixes, rate)
        st.caption(f"{len(prefixes)} {unit} in {len(prefixes) / rate:.1f} s: {shown:,.1f} per second shown.")
    else:
        st.caption(f"The answer is {len(prefixes)} {unit} long: {len(prefixes) / rate:.1f} s at this rate.")
