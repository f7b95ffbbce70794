"""The attention page's context-length slider: the first N tokens of a long public-domain text fed to the model,
every head summarised at full length as N grows, with the prefill time and the bytes held beside; and the same
quantities projected for Llama 3.1 8B at 32K tokens on an H100.

The measurement is a job on the model server (queued like the speed lab's, with progress and Stop): each length's
point comes back as soon as it is measured and the figures are redrawn from `st.session_state[POINTS]`.
"""
from __future__ import annotations

import math
from typing import Any

import streamlit as st

from app.attention import figures as charts
from app.attention import numbers as att
from app.ui.format import fmt_bytes, measured_caption
from app.runs.live import run_on_model, status_progress
from app.runs.widgets import plot
from engine.errors import EngineError
from engine.lab.long_context import MIN_TOKENS, TEXT_NAME, lengths_up_to
from engine.projection.attention_capture import project_long_context
from engine.projection.specs import GPU_PRESETS, MODEL_PRESETS
from engine.service.client import ModelClient
from engine.serving.limits import GPU_LIMITS

POINTS, ERROR = "attention.context.points", "attention.context.error"
TARGET_TOKENS = 32768


def top_length(lm: ModelClient) -> int:
    return min(lm.spec.max_context, lm.limits.max_prompt_tokens)


def length_options(lm: ModelClient) -> list[int]:
    """128, 256, ... doubling up to what this server reads, and that length itself."""
    return lengths_up_to(top_length(lm)) if top_length(lm) >= MIN_TOKENS else [top_length(lm)]


def limit_note(lm: ModelClient) -> str:
    if lm.limits.max_prompt_tokens < lm.spec.max_context:
        return (f"This server reads at most {lm.limits.max_prompt_tokens:,} tokens of prompt (`--max-prompt-tokens`), "
                f"so N stops there; {lm.label} itself reads {lm.spec.max_context:,}.")
    return f"N goes to {lm.label}'s whole context, {lm.spec.max_context:,} tokens."


def point_row(p: Any) -> dict:
    return {"n": p.n, "prefill_seconds": p.prefill_seconds, "summary_seconds": p.summaries.seconds,
            "kv_bytes": p.kv_bytes, "kept_bytes": p.kept_bytes, "attention_bytes": p.attention_bytes, "point": p}


def measure(lm: ModelClient, n: int, slot: Any) -> None:
    """Every length up to n, as a job; the figures in `slot` redrawn as each length arrives."""
    def partial(points: list[Any]) -> None:
        st.session_state[POINTS] = [point_row(p) for p in points]
        with slot.container():
            draw(lm, f".{len(points)}")                     # keys of their own: drawn again when the job ends

    with st.status(f"Feeding the model up to {n:,} tokens of the text…", expanded=True) as box:
        try:
            run_on_model(lm, "attention.context", {"lengths": lengths_up_to(n), "window": att.LOCAL_WINDOW},
                         status_progress(box), partial)
        except EngineError as err:
            st.session_state[ERROR] = str(err)
            box.update(label="Stopped", state="error")
            return
        box.update(label=f"Measured up to N = {n:,}", state="complete", expanded=False)


def controls(lm: ModelClient) -> tuple[int, bool, Any]:
    """The length slider and Measure, above the charts they drive: (N, pressed, the Stop button's slot)."""
    options = length_options(lm)
    n = st.select_slider("Context length N (tokens of the text)", options=options,
                         value=options[min(2, len(options) - 1)], key="attention.context.n")
    st.caption(limit_note(lm))
    row = st.container(horizontal=True)
    pressed = row.button(f"Measure up to N = {n:,}", type="primary", key="attention.context.run",
                         help=f"Measures N = {', '.join(f'{x:,}' for x in lengths_up_to(n))} in turn.")
    return n, pressed, row.empty()


def draw(lm: ModelClient, suffix: str = "") -> None:
    points = st.session_state.get(POINTS) or []
    if not points:
        st.info("Nothing measured yet: choose N and press **Measure**.")
        return
    latest = points[-1]
    plot(charts.context_figure(points), key="attention.context.curves" + suffix)
    st.caption(f"N = {latest['n']:,}: prefill {latest['prefill_seconds']:.2f} s, KV cache "
               f"{fmt_bytes(latest['kv_bytes'])}, kept to recompute attention {fmt_bytes(latest['kept_bytes'])}; "
               f"Hugging Face's output_attentions would hold {fmt_bytes(latest['attention_bytes'])} of maps. "
               f"Every head summarised in {latest['summary_seconds']:.1f} s.")
    plot(charts.summary_figure(att.from_summaries(latest["point"].summaries)), key="attention.context.summary" + suffix)


def context_section(lm: ModelClient) -> None:
    st.write(f"The first N tokens of {TEXT_NAME}, read by the model in one prefill. Each head is then summarised over "
             "every query row, exactly, without ever holding an N×N map. Watch the sink grow on the first token, "
             "local heads stay local, and some heads reach far back as N grows.")
    st.caption(measured_caption(lm) + " Each length's prefill alone (capture off), then every layer's heads over "
               "the whole length. It runs as a job on the model, in its turn, like the speed lab's.")
    n, pressed, stop = controls(lm)
    st.session_state[ERROR] = None
    slot = st.empty()
    if pressed:
        stop.button("Stop", key="attention.context.stop", help="Stops the measurement; what was measured stays.")
        measure(lm, n, slot)
        stop.empty()
    if st.session_state.get(ERROR):
        st.error(st.session_state[ERROR])
    with slot.container():
        draw(lm)


def target_section() -> None:
    """Llama 3.1 8B at 32K tokens on one H100 SXM, with a GPU server's default capture budget: projected."""
    spec, gpu = MODEL_PRESETS["llama-3.1-8b"], GPU_PRESETS["h100-sxm"]
    budget = GPU_LIMITS.max_capture_bytes
    p = project_long_context(spec, gpu, TARGET_TOKENS, budget)
    within = (f"{p.kept_layers} of {spec.n_layers} layers ({fmt_bytes(p.kept_bytes)}); any other is rebuilt from "
              f"the one below, at most {p.rebuild_seconds:.2f} s" if p.kept_layers else
              "no layer: each is rebuilt from the embeddings up, at most one prefill")
    st.table({"": ["KV cache (bf16)", "kept to recompute attention, every layer",
                   f"kept within a GPU server's {fmt_bytes(budget)} capture budget", "output_attentions (every map)",
                   "prefill", "every head summarised (the q·k products alone)"],
              "Llama 3.1 8B, 32K tokens, H100 SXM (projected)": [
                  fmt_bytes(p.kv_bytes), f"{fmt_bytes(p.kept_per_token)} per token, {fmt_bytes(p.kept_per_token * p.tokens)}",
                  within, fmt_bytes(p.output_attentions_bytes), f"{p.prefill_seconds:.2f} s",
                  f"{p.summaries_seconds:.2f} s"]})
    cards = math.ceil(p.output_attentions_bytes / gpu.memory_bytes)
    st.caption("Projected from the public config and the H100's spec sheet at 60% of peak: bytes are counts, times "
               f"are FLOPs ÷ throughput. The maps themselves would fill {cards} H100s; what the engine keeps grows with "
               "N, not N² (a room on one H100 can raise --max-capture-mb to keep every layer).")
