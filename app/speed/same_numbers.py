"""Same question, same numbers (issue 51), on the room page: one prompt answered alone and inside a batch of 8, with
the batch-invariant kernels off and on, token by token; and one sum of the model's own numbers in two orders.

The measurement is engine.lab.invariance, run where the model is as short jobs (engine/service/jobs.py): one per
run (alone or in the batch) and setting, so the room's requests wait for at most one of them, never for the whole
lesson."""
from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go
import streamlit as st

from app.runs.live import run_on_model, status_progress
from app.runs.widgets import plot
from engine.errors import EngineError
from engine.lab.invariance import DEFAULT_PROMPT, LANES, MINE, NEW_TOKENS, OTHERS, Comparison, TwoOrders, comparison
from engine.service.client import ModelClient

PROMPT_KEY, RESULT_KEY = "room.same.prompt", "room.same.result"
OFF, ON = "#d62728", "#2ca02c"


@dataclass(frozen=True)
class Lesson:
    """What the comparison measured, kept in the session so a rerun draws it without the model."""

    prompt: str
    parts: list[Comparison]
    sums: TwoOrders


def settings_for(lm: ModelClient) -> list[tuple[str, bool]]:
    """(dtype, kernels on) of every part: the model's own dtype off and on, then bfloat16 off and on where the model
    is not already in it."""
    dtypes = [lm.dtype_name] + (["bfloat16"] if lm.dtype_name != "bfloat16" else [])
    return [(dtype, on) for dtype in dtypes for on in (False, True)]


def measure(lm: ModelClient, prompt: str) -> Lesson | None:
    """Every run of every setting in turn inside one status box, with progress; None (the reason on screen) when one
    fails."""
    plan = [(dtype, on, batch) for dtype, on in settings_for(lm) for batch in (False, True)]
    with st.status("Comparing: alone and in a batch of 8", expanded=True) as box:
        report = status_progress(box)
        answers = []
        try:
            for i, (dtype, on, batch) in enumerate(plan):
                part = lambda f, text, i=i: report((i + f) / len(plan), f"{label(dtype, on)}: {text}")  # noqa: E731
                answers.append(run_on_model(lm, "invariance.answer", {"prompt": prompt, "dtype": dtype, "on": on,
                                                                       "new": NEW_TOKENS, "batch": batch}, part))
            sums = lm.quick("invariance.sum", {"prompt": prompt})
        except EngineError as err:
            box.update(label="Stopped", state="error")
            st.error(str(err))
            return None
        box.update(label="Compared", state="complete", expanded=False)
    pairs = zip(settings_for(lm), answers[0::2], answers[1::2])
    return Lesson(prompt, [comparison(dtype, on, alone, batch) for (dtype, on), alone, batch in pairs], sums)


def label(dtype: str, on: bool) -> str:
    return f"{dtype}, invariant kernels {'on' if on else 'off'}"


def gaps_figure(parts: list[Comparison]) -> go.Figure:
    """Per token, the largest difference in log-probability between alone and in the batch: one line per setting."""
    fig = go.Figure()
    for part in parts:
        fig.add_scatter(x=list(range(1, len(part.gaps) + 1)), y=part.gaps, mode="lines+markers",
                        name=label(part.dtype, part.on), line=dict(color=ON if part.on else OFF,
                                                                   dash="solid" if part.on else "dot"))
    top = max((g for p in parts for g in p.gaps), default=0.0) or 1e-6
    fig.update_layout(height=320, margin=dict(l=10, r=10, t=30, b=10), legend=dict(orientation="h", y=1.18),
                      xaxis=dict(title="token of the answer", tickmode="auto", nticks=12),
                      yaxis=dict(title="largest |Δ log p|", range=[-0.05 * top, top * 1.12], exponentformat="e"))
    return fig


def parting(lm: ModelClient, part: Comparison) -> str:
    """One sentence: where the lone and the batched answers part, in words, or that they do not."""
    name = f"**{label(part.dtype, part.on)}**"
    largest = max(part.gaps, default=0.0)
    if part.parted is None and largest == 0:
        return f"{name}: the same {len(part.alone)} tokens alone and in the batch, every log-probability equal."
    if part.parted is None:
        return (f"{name}: the same {len(part.alone)} tokens alone and in the batch, the log-probabilities not (by up "
                f"to {largest:.3g}): no token here was a close enough call to tip; on another prompt one can be, "
                "and from that token on the two answers differ.")
    i, text = part.parted, lm.tokenizer.decode
    return (f"{name}: the answers part at token {i + 1}: after “{text(part.alone[:i])[-60:]}”, alone the model "
            f"says “{text(part.alone[i:i + 6])}…”, in the batch “{text(part.in_batch[i:i + 6])}…”.")


def table_rows(parts: list[Comparison]) -> list[dict]:
    return [{"setting": label(p.dtype, p.on), "largest |Δ log p|": f"{max(p.gaps, default=0.0):.3g}",
             "answers": "the same" if p.parted is None else f"part at token {p.parted + 1}",
             "longest wait for the room": f"{p.longest:.1f} s"} for p in parts]


def sums_note(s: TwoOrders) -> str:
    return (f"The {s.length} products w·x of output {s.row} of `{s.weight}` for “{s.token.strip() or s.token}”, "
            f"the last token of your prompt, added up in float32: left to right, one term at a time, and in {LANES} "
            f"partial sums (term i into sum i mod {LANES}, as an {LANES}-wide vector unit adds) that are then added "
            f"together. The terms are the same numbers; only the order differs. In this product {s.rows_differ} of "
            f"its {s.rows} outputs come out different in the two orders. A matrix-multiply routine picks its order "
            "from the shape it is given, so a row alone and the same row among others are added up differently.")


def draw(lm: ModelClient, lesson: Lesson) -> None:
    plot(gaps_figure([p for p in lesson.parts if p.dtype == lesson.parts[0].dtype]), "room.same.gaps")
    st.caption(f"Each point: token i of the answer to “{lesson.prompt[:80]}”, the largest difference over the "
               f"{lm.spec.vocab_size:,}-token vocabulary between its log-probabilities alone and in the batch "
               f"({lesson.parts[0].dtype}). Invariant kernels on: 0 exactly, at every token.")
    for part in lesson.parts:
        st.markdown(parting(lm, part))
    st.dataframe(table_rows(lesson.parts), hide_index=True, width="stretch")
    s = lesson.sums
    left, mid, right = st.columns(3)
    left.metric("Left to right", f"{s.in_order:.9g}")
    mid.metric(f"In {LANES} partial sums", f"{s.in_lanes:.9g}")
    right.metric("Difference", f"{s.in_order - s.in_lanes:.3g}")
    st.caption(sums_note(s) + f" Added exactly, the sum is {s.exact:.12g}.")


def section(lm: ModelClient) -> None:
    """The section: the prompt, the button, and what the last comparison measured."""
    st.subheader("Same question, same numbers?")
    st.write(f"Does sharing the model change your answer? Here one prompt is answered twice: alone, and as one of "
             f"{len(OTHERS) + 1} requests decoded together (row {MINE + 1}, among {len(OTHERS)} other questions), "
             "first with the usual kernels and then with batch-invariant ones (the server's "
             "PLAYGROUND_INVARIANT setting), token by token. Each run is one short job on the model alone, so the "
             "room's requests wait for one run at a time (the table says how long), never for the whole comparison.")
    prompt = st.text_input("Prompt to compare", DEFAULT_PROMPT, key=PROMPT_KEY, max_chars=2000)
    if st.button("Compare alone and in a batch", key="room.same.go"):
        if not prompt.strip():
            st.warning("Type a prompt first.")
        else:
            lesson = measure(lm, prompt)
            if lesson is not None:
                st.session_state[RESULT_KEY] = lesson
    lesson = st.session_state.get(RESULT_KEY)
    if isinstance(lesson, Lesson):
        draw(lm, lesson)
