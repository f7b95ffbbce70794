"""Why was my answer slow: one line under the answer and a chart of the steps it lived through, from the run's
timeline (engine/serving/timeline.py: the scheduler's own step log, its parts adding up to the wall time).

    why_line(timeline)                 # "2.1 s to the first token: 0.4 s waiting for a place, ..."
    why_figure(timeline)               # its row highlighted among the batch's, step by step
    why_section(timeline, spec, dtype) # both, and the alone estimate beside the projection for a GPU
"""
from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
import streamlit as st

from app.ui.hardware import DEFAULT_GPU
from app.journey.figures import DECODE_COLOR, PREFILL_COLOR
from app.room.presenter import RUN_KEY, presenter_board, push_button
from app.runs.widgets import plot
from engine.errors import EngineError
from engine.projection.cost import project
from engine.projection.specs import GPU_PRESETS, ModelSpec
from engine.serving.timeline import RESOLUTION, SPLIT_PARTS, prefill_spans

WAIT_COLOR, OTHER_PREFILL, OTHER_DECODE = "#9a9a9a", "#f3c39b", "#c5d7f5"
HELD_COLOR = "#d9d9d9"               # admitted, its prompt held while others' prefills took the step
MOST_ROWS = 12                       # rows drawn: you and the others you shared most steps with
SMALL = 0.0005                       # parts under half a millisecond are left out of the line
DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def fmt_s(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1e3:,.0f} ms" if seconds >= 0.01 else \
        f"{seconds * 1e3:.1f} ms"


def _parts(split: dict[str, Any], behind: list[dict[str, Any]], reason: str, after_first: bool = False) -> list[str]:
    """The parts of a split in words, largest first, those over half a millisecond; `behind`: whose prefills shared
    that stretch, most time first. After the first token its own prefill part is what the step of its last chunk did
    for it after sampling that token: the token handed to its stream, its cache moved into the batch's pages."""
    top = behind[0] if behind else None
    others = (f"behind request {top['id']}'s {top['tokens']:,}-token prompt" if top and len(behind) == 1 else
              f"behind others' prompts (request {top['id']}'s {top['tokens']:,} tokens most)" if top else
              "behind others' prompts")
    own = "your prompt's cache moving into the batch, after its first token" if after_first else "your prefill"
    words = [("queue", "waiting for a place" + (f" ({reason})" if reason else "")), ("prefill", own),
             ("decode", "your tokens at one row's pace"), ("batch", "the batch's other rows"),
             ("others_prefill", others), ("between_steps", "the server between steps")]
    shown = sorted(((split[k], text) for k, text in words if split.get(k, 0) >= SMALL), reverse=True)
    return [f"{fmt_s(v)} {text}" for v, text in shown]


def after_first(timings: dict[str, Any]) -> dict[str, float] | None:
    """The stretch from the first token to the end taken apart: the whole split less the split to the first token,
    part by part (each part is a sum of overlaps, engine.serving.timeline.split, so the difference is the split of
    the rest); None when it had no first token."""
    first = timings.get("first_token_split")
    if first is None:
        return None
    return {k: timings["split"][k] - first[k] for k in SPLIT_PARTS}


def behind_in(timeline: dict[str, Any], lo: float, hi: float) -> list[dict[str, Any]]:
    """Others whose prefill ran in its steps between `lo` and `hi` (seconds since it was submitted), with their tokens
    there and the seconds they added, most first: engine.serving.timeline.behind, for a stretch of a stored story."""
    tokens: dict[int, int] = {}
    seconds: dict[int, float] = {}
    for step in timeline["steps"]:
        for rid, a, b in prefill_spans(step["start"], step["prefill_seconds"], step["prefills"]):
            if rid != timeline["id"] and (part := max(min(b, hi) - max(a, lo), 0.0)) > RESOLUTION:
                tokens[rid] = tokens.get(rid, 0) + dict(step["prefills"])[rid]
                seconds[rid] = seconds.get(rid, 0.0) + part
    ranked = sorted(tokens, key=lambda r: -seconds[r])
    return [{"id": r, "tokens": tokens[r], "seconds": seconds[r]} for r in ranked]


def why_line(timeline: dict[str, Any]) -> str:
    """One line for the time to the first token, one for the rest of the answer (the two add up to the whole)."""
    t = timeline["timings"]
    reason, whole, rest = t.get("wait_reason") or "", t["split"], after_first(t)
    end = ("to the time limit" if timeline.get("finish_reason") == "timeout" else   # the server stopped it, not you
           "to its Stop" if t.get("stopped") else "to the end")
    if rest is None:
        return f"**{fmt_s(whole['total'])} {end}**: " + ", ".join(_parts(whole, t["behind"], reason)) + "."
    first = t["first_token_split"]
    cut = first["total"]                                 # the first token, in seconds since it was submitted
    return (f"**{fmt_s(cut)} to the first token**: " + ", ".join(_parts(first, behind_in(timeline, 0.0, cut), reason))
            + f".  \n**then {fmt_s(rest['total'])} {end}** ({fmt_s(whole['total'])} in all): "
            + ", ".join(_parts(rest, behind_in(timeline, cut, whole["total"]), reason, after_first=True)
                        or ["nothing more"]) + ".")


def alone_line(timeline: dict[str, Any], spec: ModelSpec | None, dtype: str, gpu_key: str) -> str:
    """Alone on an idle server (this server's measured pace), beside the projection for a GPU."""
    t = timeline["timings"]
    measured = (f"Alone on this idle server it would have taken about **{fmt_s(t['alone_seconds'])}** "
                f"({t['alone_how']})." if t.get("alone_seconds") is not None else
                f"Alone: {t.get('alone_how') or 'not measured yet'}.")
    projected = projected_seconds(timeline, spec, dtype, gpu_key)
    if projected is None:
        return measured
    return measured + f" Projected for {spec.name} on one {GPU_PRESETS[gpu_key].name}: {fmt_s(projected)}."


def projected_seconds(timeline: dict[str, Any], spec: ModelSpec | None, dtype: str, gpu_key: str) -> float | None:
    """The same request alone on `gpu_key`, on the speed pages' roofline (engine.projection.cost.project)."""
    prompt, generated = int(timeline.get("prompt_tokens") or 0), int(timeline.get("generated") or 0)
    if spec is None or prompt < 1 or gpu_key not in GPU_PRESETS:
        return None
    try:
        p = project(spec, GPU_PRESETS[gpu_key], DTYPES.get(dtype, "bf16"), DTYPES.get(dtype, "bf16"), batch=1,
                    context=prompt + generated, prompt_tokens=prompt, output_tokens=generated)
    except (ValueError, EngineError):
        return None
    return None if p.request_ms is None else p.request_ms / 1e3


# --- the chart ------------------------------------------------------------------------------------------------------

def segments(timeline: dict[str, Any]) -> dict[int, list[tuple[float, float, str]]]:
    """Per request id: (start, seconds, "prefill" or "decode") of each step it was in, as the step log has it; the
    prefill part of a step laid out as its prompts' spans, in their order (the split's own layout)."""
    rows: dict[int, list[tuple[float, float, str]]] = {}
    for step in timeline["steps"]:
        start, prefill = step["start"], step["prefill_seconds"]
        for rid, a, b in prefill_spans(start, prefill, step["prefills"]):
            rows.setdefault(rid, []).append((a, b - a, "prefill"))
        for rid in step["rows"]:
            rows.setdefault(rid, []).append((start + prefill, step["seconds"] - prefill, "decode"))
    return rows


def held_spans(timeline: dict[str, Any]) -> list[tuple[float, float, str]]:
    """The steps it lived through with no part of its own (admitted, its prompt held while others' prefills took
    the step's chunk): drawn in its row, so the chart shows where the line's "behind ..." went."""
    me, held = timeline["id"], []
    for s in timeline["steps"]:
        mine = [a for rid, a, _ in prefill_spans(s["start"], s["prefill_seconds"], s["prefills"]) if rid == me]
        if not mine and me in s["rows"]:
            continue                                                # a decode step of its own
        width = mine[0] - s["start"] if mine else s["seconds"]      # its own chunk, when the step had one, ends it
        if width > RESOLUTION:
            held.append((s["start"], width, "held"))
    return held


def why_figure(timeline: dict[str, Any]) -> go.Figure:
    """The steps it lived through: its row (and its wait) highlighted, the others' rows beside it (seconds since it
    was submitted)."""
    me, rows = timeline["id"], segments(timeline)
    others = sorted((r for r in rows if r != me), key=lambda r: -len(rows[r]))[:MOST_ROWS - 1]
    names = {me: f"you (request {me})", **{r: f"request {r}" for r in others}}
    fig = go.Figure()
    admitted = timeline["events"].get("admitted")
    if admitted:
        _bars(fig, [(0.0, admitted, "wait")], names[me], "you: waiting", WAIT_COLOR)
    _bars(fig, held_spans(timeline), names[me], "you: behind others' prefill", HELD_COLOR)
    for rid in [me, *others]:
        for kind in ("prefill", "decode"):
            color = (PREFILL_COLOR if kind == "prefill" else DECODE_COLOR) if rid == me else \
                (OTHER_PREFILL if kind == "prefill" else OTHER_DECODE)
            label = f"{'you' if rid == me else 'others'}: {kind}"
            _bars(fig, [s for s in rows.get(rid, []) if s[2] == kind], names[rid], label, color)
    for event, symbol in (("first_token", "star"), ("stopped", "x")):
        if (at := timeline["events"].get(event)) is not None:
            fig.add_scatter(x=[at], y=[names[me]], mode="markers", name=event.replace("_", " "),
                            marker=dict(symbol=symbol, size=14, color="#222"), hoverinfo="name+x")
    fig.update_layout(height=120 + 30 * len(names), barmode="overlay", margin=dict(l=0, r=10, t=50, b=0),
                      xaxis_title="seconds since it was submitted", font=dict(size=13),
                      legend=dict(orientation="h", x=0, y=1.02, yanchor="bottom"))
    seen = {}
    for trace in fig.data:                       # one legend entry per kind
        trace.showlegend = trace.name not in seen
        seen[trace.name] = True
    fig.update_yaxes(categoryorder="array", categoryarray=[names[r] for r in reversed([me, *others])])
    return fig


def _bars(fig: go.Figure, spans: list[tuple[float, float, str]], row: str, name: str, color: str) -> None:
    if spans:
        fig.add_bar(orientation="h", base=[s[0] for s in spans], x=[s[1] for s in spans], y=[row] * len(spans),
                    name=name, marker_color=color, marker_line=dict(width=0),
                    hovertext=[f"{name}: {s[1] * 1e3:.1f} ms at {s[0]:.3f} s" for s in spans], hoverinfo="text")


def why_section(timeline: dict[str, Any] | None, spec: ModelSpec | None, dtype: str, key: str,
                parent: Any = None) -> None:
    """The line, the alone estimate with a GPU to project on, and the chart; a caption when the run has none."""
    box = parent or st
    if not timeline:
        box.caption("This run carries no timeline (made before the playground kept one, or by a job).")
        return
    box.markdown(why_line(timeline))
    gpus = list(GPU_PRESETS)
    gpu = box.selectbox("Project the same request alone on", gpus, index=gpus.index(DEFAULT_GPU),
                        format_func=lambda k: GPU_PRESETS[k].name, key=f"{key}.gpu")
    box.caption(alone_line(timeline, spec, dtype, gpu))
    plot(why_figure(timeline), f"{key}.chart", box)
    box.caption(f"Each bar is one batch step it lived through ({len(timeline['steps'])} in all), split into the "
                "newcomers' prefill and the decode pass, as the server timed them; its own row is the dark one. "
                "The parts in the two lines add up to its wall time.")


# --- the room page: any recent request ------------------------------------------------------------------------------

def recent_stories(infos: list[Any]) -> dict[str, Any]:
    """Recent runs that carry a timeline, by a label a person can pick (newest first)."""
    out = {}
    for info in infos:
        timeline = getattr(info, "timeline", None)
        if timeline:
            who = "an API client" if info.source == "api" else "a person" if info.source == "page" else info.source
            out[f"request {timeline['id']} · {who} · {fmt_s(timeline['timings']['split']['total'])}"] = info
    return out


def pick_section(lm: Any, key: str = "room.why") -> None:
    """Pick any recent request (a person's or an API client's) and see why it took its time; the presenter pushes
    the one picked to every follower, whose room page then shows it picked."""
    try:
        stories = recent_stories(lm.run_list(limit=40))
        pushed = adopt_pushed(lm, stories, key)
    except EngineError as err:
        st.caption(f"The recent requests cannot be listed: {err}")
        return
    if pushed:
        st.caption(pushed)
    if not stories:
        st.caption("No finished request yet: once someone's answer ends, pick it here to see where its time went.")
        return
    label = st.selectbox("A recent request", list(stories), key=f"{key}.pick")
    info = stories[label]
    push_button(presenter_board(), "room", "room", run=info.id, label="Push this request to everyone")
    why_section(info.timeline, lm.spec, lm.dtype_name, key)
    st.caption(f"Its run opens on every page at ?run={info.id}.")


def adopt_pushed(lm: Any, stories: dict[str, Any], key: str) -> str:
    """A request the presenter pushed (once per push): picked in the box, fetched by its id when it is no longer among
    the recent ones. Returns a line for the page: what the presenter pushed, or why it cannot be shown."""
    run_id = st.session_state.pop(RUN_KEY, None)
    if run_id is None:
        return ""
    label = next((label for label, info in stories.items() if info.id == run_id), None)
    if label is None:
        try:
            info = lm.run_slice(run_id, 1 << 30).info           # its info only: no records past the end
        except EngineError as err:
            return f"The presenter pushed a request that cannot be shown: {err}"
        if not info.timeline:
            return "The presenter pushed a request that carries no timeline."
        label, info = next(iter(recent_stories([info]).items()))
        stories[label] = info
    st.session_state[f"{key}.pick"] = label
    return "The presenter pushed this request: here is why it took its time."
