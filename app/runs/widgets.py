"""Widgets shared by the pages: chart slots that can be redrawn many times in one run, a line that follows
a streaming run, one number entered three ways (slider, preset buttons, typed value) kept in step, and the
request form (prompt box, sampling controls, Generate and Stop).

Every widget key is namespaced by the page (`journey.temperature`, `kv.prompt`, ...)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import plotly.graph_objects as go
import streamlit as st

from app.ui.layout import plot_font
from app.ui.style import MIN_TEXT_PX, at_least
from app.room.presenter import may_generate, presenter_board
from app.runs.request import DEFAULT_PROMPT, MAX_NEW_LIMIT, Prepared, Sampling, new_token_limit, prepare, sanitize_settings
from app.runs.run import Throttle
from engine.service.client import ModelClient

# No toolbar: it appears over the top right of a chart whenever the pointer is on it, where it covered bar labels and
# column headers on a projector. Double-click still resets a zoom.
PLOT_CONFIG = {"displayModeBar": False, "displaylogo": False}


def sized(fig: go.Figure) -> go.Figure:
    """The figure with this session's chart text size (larger in the presenter layout) and no text under
    MIN_TEXT_PX anywhere: a copy when anything changes, since a figure may be shared between sessions
    (`app.journey.figures.shapes_figure`)."""
    return at_least(fig, MIN_TEXT_PX, plot_font())


class ChartSlot:
    """An `st.empty` that takes a new figure on every update (each with its own element key)."""

    def __init__(self, name: str, parent=None):
        self.name, self.n = name, 0
        self.box = (parent or st).empty()

    def plot(self, fig: go.Figure) -> None:
        self.n += 1
        self.box.plotly_chart(sized(fig), key=f"{self.name}.{self.n}", config=PLOT_CONFIG)


def plot(fig: go.Figure, key: str, parent=None, width: str = "stretch") -> None:
    """A chart drawn once per run. `width="content"`: at the figure's own pixel width, never stretched or squeezed
    (a figure laid out in character cells, whose text keeps its size while a stretched chart's boxes would not)."""
    (parent or st).plotly_chart(sized(fig), key=key, config=PLOT_CONFIG, width=width)


class ProgressLine:
    """One line that follows a streaming run: how many tokens so far, and the answer."""

    def __init__(self) -> None:
        self.box = st.empty()
        self.throttle = Throttle(0.2)

    def update(self, run) -> None:
        if self.throttle() or run.done is not None:
            self.box.text(f"{len(run.tokens)} tokens: {run.text}")


# --- one number, three ways: a slider, preset buttons, a typed value, kept in step --------------------------------

@dataclass(frozen=True)
class Preset:
    label: str
    value: float
    help: str | None = None


@dataclass(frozen=True)
class LinkedNumber:
    """One whole number a page reads, entered by a slider, preset buttons or a typed value, all kept in step.

    `st.session_state[key]` holds the number; the widgets use `key` + "_slider", "_typed" (a number box) or
    "_text" (a text box read by `parse`, whose ValueError is shown under it) and "_error", and ".preset.<i>".
    """

    key: str
    label: str
    low: int
    high: int
    default: int
    options: tuple[int, ...] | None = None    # a select slider over these; a typed value snaps it to the nearest
    presets: tuple[Preset, ...] = ()
    typed_label: str | None = None            # a typed value beside the slider
    parse: Callable[[str], int] | None = None  # read the typed value as text (e.g. "24K") instead of a number box
    fmt: Callable[[int], str] = str
    placeholder: str | None = None


def set_number(w: LinkedNumber, value: float) -> None:
    """Put every widget of `w` at `value` (rounded, within low..high)."""
    value = min(max(int(round(value)), w.low), w.high)
    state = st.session_state
    state[w.key] = value
    state[f"{w.key}_slider"] = min(w.options, key=lambda c: abs(c - value)) if w.options else value
    if w.typed_label is not None:
        state[f"{w.key}_text" if w.parse else f"{w.key}_typed"] = w.fmt(value) if w.parse else value
    state[f"{w.key}_error"] = None


def _from_text(w: LinkedNumber) -> None:
    try:
        set_number(w, w.parse(st.session_state[f"{w.key}_text"]))
    except ValueError as err:
        st.session_state[f"{w.key}_error"] = str(err)


def linked_number(w: LinkedNumber) -> int:
    """Draw the slider, the presets and the typed value; the number they agree on."""
    if w.key not in st.session_state or not w.low <= st.session_state[w.key] <= w.high:
        set_number(w, w.default)
    typed = w.typed_label is not None
    if w.presets:
        slider_at = st
        row = st.columns([1] * len(w.presets) + ([3] if typed else []))
        typed_at = row[-1] if typed else None
    else:
        slider_at, typed_at = st.columns([4, 1]) if typed else (st, None)
    sync = dict(on_change=lambda: set_number(w, st.session_state[f"{w.key}_slider"]), key=f"{w.key}_slider")
    if w.options:
        slider_at.select_slider(w.label, options=w.options, format_func=w.fmt, **sync)
    else:
        slider_at.slider(w.label, w.low, w.high, **sync)
    for i, (col, p) in enumerate(zip(row if w.presets else (), w.presets)):
        col.button(p.label, key=f"{w.key}.preset.{i}", help=p.help, on_click=set_number, args=(w, p.value),
                   width="stretch")
    if typed_at is not None:
        _typed_input(w, typed_at)
    return int(st.session_state[w.key])


def _typed_input(w: LinkedNumber, parent) -> None:
    if w.parse is None:
        parent.number_input(w.typed_label, w.low, w.high, key=f"{w.key}_typed",
                            on_change=lambda: set_number(w, st.session_state[f"{w.key}_typed"]))
        return
    parent.text_input(w.typed_label, key=f"{w.key}_text", on_change=_from_text, args=(w,),
                      label_visibility="collapsed", placeholder=w.placeholder)
    if st.session_state.get(f"{w.key}_error"):
        parent.error(st.session_state[f"{w.key}_error"])


# --- the request form ---------------------------------------------------------------------------------------

def state_defaults(values: dict[str, Any]) -> None:
    """Widget values set in Session State before the widgets draw, never as their `value=`: a recording, a push or a
    link may have set them already, and Streamlit warns of a widget given both."""
    for key, value in values.items():
        st.session_state.setdefault(key, value)


def prompt_box(ns: str, default: str = DEFAULT_PROMPT, height: int = 110) -> str:
    key = f"{ns}.prompt"
    if key not in st.session_state:                # a push or a recording may have set it already
        st.session_state[key] = default
    return st.text_area("Prompt", height=height, key=key,
                        help="For instruct models the prompt is wrapped in the chat template before tokenizing.")


def sampling_controls(ns: str, max_new_default: int = 48, max_new_limit: int = MAX_NEW_LIMIT) -> Sampling:
    for message in sanitize_settings(ns, max_new_limit):
        st.warning(message)
    defaults = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0, "max_new": min(max_new_default, max_new_limit)}
    for name, value in defaults.items():           # set here, not as the widgets' values: a push, a recording or a
        st.session_state.setdefault(f"{ns}.{name}", value)   # link may have set them (Streamlit warns of both)
    cols = st.columns(5)
    temperature = cols[0].slider("Temperature", 0.0, 2.0, step=0.05, key=f"{ns}.temperature",
                                 help="0 picks the most likely token every time (greedy).")
    top_k = cols[1].number_input("Top-k", 0, 1000, step=1, key=f"{ns}.top_k",
                                 help="Keep only the k most likely tokens; 0 = off.")
    top_p = cols[2].slider("Top-p", 0.05, 1.0, step=0.05, key=f"{ns}.top_p",
                           help="Keep the smallest set of tokens whose probabilities add up to p; 1 = off.")
    seed = cols[3].number_input("Seed", 0, 2**31 - 1, step=1, key=f"{ns}.seed", help="Same seed, same sampled answer.")
    max_new = cols[4].number_input("Max new tokens", 1, max_new_limit, step=1, key=f"{ns}.max_new",
                                   help=f"This server allows at most {max_new_limit}.")
    return Sampling(float(temperature), int(top_k), float(top_p), int(seed), int(max_new))


STOPPED_IN_LINE = "Stopped before its first token: the request left the line, and nothing was generated."


STOPPED_IN_LINE_KEY = "live.stopped_in_line"


def stopped_in_line() -> set[str]:
    """The pages (namespaces) whose last request was stopped before its first token: app/runs/live.py's run_live adds
    one, and the next run of that page says so. A set kept in the session and changed in place, since a stopped
    run's own `st.session_state` refuses writes (Streamlit raises its StopException again)."""
    return st.session_state.setdefault(STOPPED_IN_LINE_KEY, set())


def generate_button(ns: str, prepared: Prepared, disabled: bool = False,
                    parent=None) -> tuple[bool, st.delta_generator.DeltaGenerator]:
    """The Generate button and an empty slot beside it where Stop appears while the answer streams."""
    allowed = may_generate(st.session_state, presenter_board())
    cols = (parent or st).columns([3, 2, 7] if parent is None else [1, 1, 1])   # "Generate" whole at 1024 px
    left, right = cols[0], cols[1]
    clicked = left.button("Generate", type="primary", key=f"{ns}.generate",
                          disabled=disabled or prepared.error is not None or not allowed)
    if not allowed:
        st.caption("The presenter runs the model for the room: their run appears here as it streams, and every "
                   "page draws it. Generating your own is off until the presenter allows it.")
    said = stopped_in_line()
    if ns in said and not clicked:
        st.caption(STOPPED_IN_LINE)
    said.discard(ns)
    return clicked, right.empty()


def quick_form(lm: ModelClient, ns: str, default: str = DEFAULT_PROMPT,
               max_new_default: int = 16) -> tuple[Prepared, bool, st.delta_generator.DeltaGenerator]:
    """A prompt, a token limit and Generate / Stop (greedy), for pages that run a request of their own.

    The returned slot is Stop's; `run_live` puts the queue position and messages under the button.
    """
    prompt = prompt_box(ns, default, height=90)
    limit = new_token_limit(lm)
    for message in sanitize_settings(ns, limit):
        st.warning(message)
    row = st.columns([2, 3], vertical_alignment="bottom")    # the token limit beside Generate: one row less above
    max_new = row[0].number_input("Max new tokens", 1, limit, min(max_new_default, limit), 1, key=f"{ns}.max_new")
    prepared = prepare(lm, prompt, Sampling(max_new_tokens=int(max_new)), chat=lm.has_chat_template)
    if prepared.error:
        st.error(prepared.error)
    clicked, stop_slot = generate_button(ns, prepared, parent=row[1])
    return prepared, clicked, stop_slot


def measured(label: str, key: str, result_key: str, measure: Callable[[], None], hint: str,
             disabled: bool = False) -> Any | None:
    """A primary button that runs `measure` (which stores its result in `st.session_state[result_key]`), then the
    stored result: None, with `hint` shown, until there is one."""
    if st.button(label, type="primary", key=key, disabled=disabled):
        measure()
    result = st.session_state.get(result_key)
    if not result:
        st.info(hint)
        return None
    return result
