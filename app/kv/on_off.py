"""Sections of the KV-cache-on-and-off page: the same generation with and without the cache, measured here,
and the per-token cost projected on a GPU."""
from __future__ import annotations

import streamlit as st

from app.kv import figures as charts
from app.ui.format import fmt_ms, fmt_tokens
from app.ui.format import MEASURED, efficiency_note, measured_caption
from app.ui.hardware import gpu_picker, model_picker
from app.runs.live import run_on_model, status_progress
from app.runs.widgets import measured, plot
from engine.lab.kv_cache import compare_runs, project_answer_seconds, project_token, slope
from engine.errors import EngineError
from engine.projection.cost import DEFAULT_FLOPS_EFFICIENCY
from engine.service.client import ModelClient

RESULT = "cache.result"
PROMPTS = (8, 64, 256)
PROJECTED_LENGTHS = (1024, 8192, 32768, 131072)
ANSWER_PROMPT, ANSWER_TOKENS = 1024, 1000


def inputs(lm: ModelClient) -> tuple[int, int]:
    cols = st.columns(2)
    prompts = [n for n in PROMPTS if n + 16 < lm.spec.max_context]
    prompt = cols[0].segmented_control("Prompt tokens", prompts, default=prompts[0], key="cache.prompt", required=True)
    top = min(96, lm.spec.max_context - prompt - 1)
    steps = cols[1].slider("Tokens to generate", 8, top, min(32, top), key="cache.steps")
    return int(prompt), int(steps)


def measure(lm: ModelClient, prompt: int, steps: int) -> None:
    with st.status("Generating with the cache and without, token by token…", expanded=True) as box:
        report = status_progress(box)
        try:
            on, off, text = run_on_model(lm, "kv.on_off", {"prompt": prompt, "steps": steps}, report)
            rows = compare_runs(lm.spec, on, off)
        except (EngineError, ValueError) as err:
            box.update(label="Stopped", state="error")
            st.error(str(err))
            return
        st.session_state[RESULT] = {"rows": [r.__dict__ | {"saved": r.flops_saved} for r in rows],
                                    "text": text, "prompt": prompt,
                                    "slope_on": slope(rows, "seconds_on"), "slope_off": slope(rows, "seconds_off"),
                                    "total_on": sum(on.seconds), "total_off": sum(off.seconds)}
        box.update(label="Measured", state="complete", expanded=False)


def metrics(result: dict) -> None:
    rows = result["rows"]
    first = f"first token: {fmt_ms(rows[0]['seconds_on'])} with the cache, {fmt_ms(rows[0]['seconds_off'])} without"
    cols = st.columns(4)
    cols[0].metric("Last token, cache", fmt_ms(rows[-1]["seconds_on"]), help=first)
    cols[1].metric("Last token, no cache", fmt_ms(rows[-1]["seconds_off"]), help=first)
    cols[2].metric("Answer, cache", f"{result['total_on']:.2f} s", help="Every token, the prefill included.")
    cols[3].metric("Answer, no cache", f"{result['total_off']:.2f} s", help="Every token, the prefill included.")


def measured_section(lm: ModelClient) -> None:
    st.caption(measured_caption(lm) + " The same greedy answer twice, token by token in turn: with the cache (prefill "
               "once, then one token per forward pass) and without (every step runs the whole sequence again). Each "
               "token is timed; the prefill, the same work both ways, is left out. The trend is the median slope "
               "between every pair of points, so a slow step on a busy machine does not tip it. FLOPs come from the "
               "projection's formulas.")
    prompt, steps = inputs(lm)
    result = measured("Generate both ways", "cache.measure", RESULT, lambda: measure(lm, prompt, steps),
                      "Press the button. Without the cache the run takes several times longer: that is the point.")
    if result is None:
        return
    metrics(result)
    plot(charts.cache_figure(result["rows"]), "cache.chart")
    st.markdown(measured_text(result))
    with st.expander("The answer (identical both ways)"):
        st.text(result["text"])


def measured_text(result: dict) -> str:
    rows, per100 = result["rows"], 100e3
    on, off = result["slope_on"], result["slope_off"]
    flat = ("flat within the noise" if on < 0.2 * off else "growing too, but less" if on < off else
            "no better: the machine was too busy to tell them apart; measure again")
    return (f"{MEASURED}: without the cache each token took **{result['slope_off'] * per100:.1f} ms more per 100 "
            f"tokens of context**; with it, {result['slope_on'] * per100:+.1f} ms ({flat}). Without the cache, token "
            f"n recomputes the keys and values of all n - 1 earlier positions: work that grows with n, so the whole "
            f"answer costs O(N²). With the cache each step does one token's work and reads the stored K/V, which at "
            f"these lengths is small beside the weights. At the last token the cache avoided "
            f"{rows[-1]['saved']:.1%} of the FLOPs ({rows[-1]['flops_off'] / rows[-1]['flops_on']:,.0f}× fewer).")


def projected_section(lm: ModelClient) -> None:
    cols = st.columns(2)
    spec, gpu = model_picker("cache", lm, cols[0]), gpu_picker("cache", cols[1])
    lengths = [n for n in PROJECTED_LENGTHS if n <= spec.max_context]
    projs = [project_token(spec, gpu, n) for n in lengths]
    reached = efficiency_note(flops=DEFAULT_FLOPS_EFFICIENCY).removeprefix("projected ")
    st.caption(f"Projected for {spec.name} on {gpu.name}, BF16, batch 1, {reached}, as on every page: "
               "with the cache a token is one decode step (every weight and the cache read once); without, a prefill "
               "of the whole sequence.")
    st.table({"sequence length": [fmt_tokens(p.length) for p in projs],
              "with the cache": [fmt_ms(p.seconds_on) for p in projs],
              "without": [fmt_ms(p.seconds_off) for p in projs],
              "without / with": [f"{p.ratio:,.0f}×" for p in projs]})
    if ANSWER_PROMPT + ANSWER_TOKENS <= spec.max_context:
        on, off = project_answer_seconds(spec, gpu, ANSWER_PROMPT, ANSWER_TOKENS)
        st.markdown(f"A {ANSWER_TOKENS:,}-token answer to a {ANSWER_PROMPT:,}-token prompt: **{on:.1f} s** with the "
                    f"cache, **{off:,.0f} s** without ({off / on:,.0f}× longer). The cache costs memory instead: "
                    "see the KV cache page for how much.")
