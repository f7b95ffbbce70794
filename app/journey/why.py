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
from app.runs.widgets import plot
from engine.errors import EngineError
from engine.projection.cost import project
from engine.projection.specs import GPU_PRESETS, ModelSpec

WAIT_COLOR, OTHER_PREFILL, OTHER_DECODE = "#9a9a9a", "#f3c39b", "#c5d7f5"
MOST_ROWS = 12                       # rows drawn: you and the others you shared most steps with
SMALL = 0.0005                       # parts under half a millisecond are left out of the line
DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def fmt_s(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1e3:,.0f} ms" if seconds >= 0.01 else \
        f"{seconds * 1e3:.1f} ms"


def _parts(split: dict[str, Any], timings: dict[str, Any], reason: str) -> list[str]:
    """The parts of a split in words, largest first, those over half a millisecond."""
    behind = timings.get("behind") or []
    top = behind[0] if behind else None
    others = (f"behind request {top['id']}'s {top['tokens']:,}-token prompt" if top and len(behind) == 1 else
              f"behind others' prompts (request {top['id']}'s {top['tokens']:,} tokens most)" if top else
              "behind others' prompts")
    words = [("queue", "waiting for a place" + (f" ({reason})" if reason else "")), ("prefill", "your prefill"),
             ("decode", "your tokens at one row's pace"), ("batch", "the batch's other rows"),
             ("others_prefill", others), ("between_steps", "the server between steps")]
    shown = sorted(((split[k], text) for k, text in words if split.get(k, 0) >= SMALL), reverse=True)
    return [f"{fmt_s(v)} {text}" for v, text in shown]


def why_line(timeline: dict[str, Any]) -> str:
    """One line for the time to the first token, one for the whole answer, from a run's timeline."""
    t = timeline["timings"]
    reason = t.get("wait_reason") or ""
    lines = []
    if t.get("first_token_split") is not None:
        first = t["first_token_split"]
        lines.append(f"**{fmt_s(first['total'])} to the first token**: " + ", ".join(_parts(first, t, reason)) + ".")
    whole = t["split"]
    end = "to its Stop" if t.get("stopped") else "in all"
    lines.append(f"**{fmt_s(whole['total'])} {end}**: " + ", ".join(_parts(whole, t, reason)) + ".")
    return "  \n".join(lines)


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
    prefill part of a step is split among its prompts by tokens, in their order."""
    rows: dict[int, list[tuple[float, float, str]]] = {}
    for step in timeline["steps"]:
        start, prefill = step["start"], step["prefill_seconds"]
        total, at = sum(n for _, n in step["prefills"]), start
        for rid, n in step["prefills"]:
            rows.setdefault(rid, []).append((at, prefill * n / total, "prefill"))
            at += prefill * n / total
        for rid in step["rows"]:
            rows.setdefault(rid, []).append((start + prefill, step["seconds"] - prefill, "decode"))
    return rows


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
                "The parts in the line add up to its wall time.")


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
    """Pick any recent request (a person's or an API client's) and see why it took its time."""
    try:
        stories = recent_stories(lm.run_list(limit=40))
    except EngineError as err:
        st.caption(f"The recent requests cannot be listed: {err}")
        return
    if not stories:
        st.caption("No finished request yet: once someone's answer ends, pick it here to see where its time went.")
        return
    label = st.selectbox("A recent request", list(stories), key=f"{key}.pick")
    info = stories[label]
    why_section(info.timeline, lm.spec, lm.dtype_name, key)
    st.caption(f"Its run opens on every page at ?run={info.id}.")
