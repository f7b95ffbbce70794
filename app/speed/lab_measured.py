"""Sections of the speed lab measured on this machine: the context sweep (TTFT and ITL against N) and
the measured decode step on this device's roofline, beside the ceiling the projection gives for it.

The measured points live in `st.session_state[POINTS]` as plain dicts, so the curve grows as the
user measures more lengths, and survives moving to other pages and back.
"""
from __future__ import annotations

import math

import streamlit as st

from app.speed import figures as charts
from app.ui.format import fmt_bytes, fmt_ms, fmt_rate
from app.ui.format import MEASURED, measured_caption
from app.ui.hardware import remeasure_roof
from app.runs.live import run_on_model, status_progress
from app.runs.widgets import LinkedNumber, linked_number, plot
from engine.errors import EngineError
from engine.service.client import ModelClient
from engine.projection.cost import prefill_flops
from engine.projection.specs import MODEL_PRESETS
from engine.lab.speed import (DEFAULT_DECODE_STEPS, ContextPoint, DeviceRoof, attention_onset, ceiling_prefill_seconds,
                              fit_ttft, kv_bytes_per_token_loaded, place_decode)

POINTS, CTX, ERROR = "speed.points", "speed.context", "speed.error"
SWEEP = (16, 32, 64, 128, 256, 512, 1024, 1536, 2048)
SWEEP_POINTS = 6
REPEATS = 2              # fastest prefill and median decode step of two runs: a noisy neighbour hits less
MAX_MEASURED_TOKENS = 8192
ONSET_SHARE = 0.1


def max_tokens(lm: ModelClient) -> int:
    return min(lm.spec.max_context - DEFAULT_DECODE_STEPS, MAX_MEASURED_TOKENS)


def sweep_lengths(lm: ModelClient) -> list[int]:
    """The longest few of SWEEP that fit the model's context."""
    return [s for s in SWEEP if s <= max_tokens(lm)][-SWEEP_POINTS:]


def measured_points() -> list[dict]:
    return st.session_state.setdefault(POINTS, [])


def add_point(point: ContextPoint) -> None:
    """Keep one point per length: a new measurement of a length replaces the old one."""
    kept = [p for p in measured_points() if p["tokens"] != point.tokens]
    st.session_state[POINTS] = sorted(kept + [point.to_dict()], key=lambda p: p["tokens"])


def context_input(lm: ModelClient) -> int:
    """Prompt length N: a slider and a typed value kept in step, up to what this model can measure."""
    top = max_tokens(lm)
    return linked_number(LinkedNumber(CTX, "Prompt length N (tokens)", 1, top, min(256, top), typed_label="Or type N"))


def measure_lengths(lm: ModelClient, lengths: list[int]) -> None:
    """Prefill and decode at each length under the model's lock, with progress; errors next to the buttons."""
    with st.status(f"Measuring {len(lengths)} prompt length(s)…", expanded=True) as box:
        report = status_progress(box)
        try:
            for point in run_on_model(lm, "speed.context", {"lengths": list(lengths), "repeats": REPEATS}, report):
                add_point(point)
        except EngineError as err:
            st.session_state[ERROR] = str(err)
            box.update(label="Stopped", state="error")
            return
        report(1.0, "done")
        box.update(label=f"Measured {len(lengths)} length(s)", state="complete", expanded=False)


def context_controls(lm: ModelClient) -> None:
    n = context_input(lm)
    row = st.container(horizontal=True)              # buttons as wide as their words, at any screen width
    st.session_state[ERROR] = None
    sweep = sweep_lengths(lm)
    if row.button("Measure N", type="primary", key="speed.measure"):
        measure_lengths(lm, [n])
    if row.button(f"Sweep {len(sweep)} lengths", key="speed.sweep",
                  help=f"Measures N = {', '.join(map(str, sweep))} in one go."):
        measure_lengths(lm, sweep)
    if row.button("Clear", key="speed.clear"):
        st.session_state[POINTS] = []
    if st.session_state.get(ERROR):
        st.error(st.session_state[ERROR])


def onset_text(lm: ModelClient) -> str:
    ours, llama = attention_onset(lm.spec, ONSET_SHARE), attention_onset(MODEL_PRESETS["llama-3.1-8b"], ONSET_SHARE)
    half = attention_onset(lm.spec, 0.5)
    return (f"**Where N² starts to show (projected from the FLOPs).** Every prompt token costs 2 FLOPs per parameter "
            f"in the linear layers, a cost that grows with N; scoring every (query, key) pair grows with N². For "
            f"{lm.label} attention reaches {ONSET_SHARE:.0%} of the prefill FLOPs at N ≈ {ours:,} tokens and half of "
            f"them at N ≈ {half:,}; for Llama 3.1 8B (far more parameters per layer of attention) the "
            f"{ONSET_SHARE:.0%} mark is at N ≈ {llama:,}.")


def fit_text(fit) -> str:
    if fit is None:
        return "Measure at least four lengths to fit the curve."
    if fit.onset is None:
        return ("**Measured:** the fitted curve has no upward bend yet (no positive N² term); measure longer prompts.")
    per_k, per_k2 = fit.b * 1e3 * 1e3, fit.c * 1e3 * 1e6            # ms per 1,000 tokens, per (1,000 tokens)²
    return (f"**Measured:** TTFT ≈ {ms3(fit.a * 1e3)} ms + {ms3(per_k)} ms × K + {ms3(per_k2)} ms × K², where K = N / "
            f"1,000 tokens; the N² term reaches {ONSET_SHARE:.0%} of the length-dependent time at N ≈ {fit.onset:,}. "
            "On a CPU, attention runs less efficiently than the big matrix multiplies, so it often shows earlier than "
            "the FLOPs say.")


def ms3(x: float) -> str:
    """A time in ms to three significant figures, with thousands separated: 26.2, 2,170, 0.565."""
    if x == 0:
        return "0"
    x = round(x, 2 - math.floor(math.log10(abs(x))))          # 9.996 -> 10.0, then written as 10.0
    return f"{x:,.{max(0, 2 - math.floor(math.log10(abs(x))))}f}"


def decode_text(points: list[dict], weight_bytes: float, kv_per_token: float) -> str:
    """How the decode latency (the right panel) moves between the shortest and longest prompt measured, beside how
    the bytes a decode step reads (every weight, and the K/V of every cached token) move over the same range."""
    pts = sorted(points, key=lambda p: p["tokens"])
    if len(pts) < 2:
        return "The decode latency (right): measure a second length to see how it moves with N."
    lo, hi = pts[0], pts[-1]
    grew = hi["itl"] / lo["itl"]
    read = (weight_bytes + hi["tokens"] * kv_per_token) / (weight_bytes + lo["tokens"] * kv_per_token)
    verb = "barely moves" if abs(grew - 1) < 0.1 else "grows" if grew > 1 else "falls"
    text = (f"The decode latency (right) {verb}: {fmt_ms(lo['itl'])} a token at N = {lo['tokens']:,}, "
            f"{fmt_ms(hi['itl'])} at N = {hi['tokens']:,} ({grew - 1:+.0%}). A decode step reads every weight "
            f"({fmt_bytes(weight_bytes)}) whatever N, and beside them the K/V of the cached tokens "
            f"({fmt_bytes(lo['tokens'] * kv_per_token)} at N = {lo['tokens']:,}, "
            f"{fmt_bytes(hi['tokens'] * kv_per_token)} at N = {hi['tokens']:,}): {read - 1:.0%} more bytes to read.")
    if grew - 1 > 1.5 * (read - 1) + 0.05:
        text += (" The step grew more than its bytes: on a CPU, attention over a longer cache costs arithmetic too, "
                 "not only reading.")
    return text


def context_section(lm: ModelClient, roof: DeviceRoof) -> None:
    st.caption(measured_caption(lm) + " Each point is a real prefill of exactly N tokens (a repeated text, cut "
               f"to length) followed by {DEFAULT_DECODE_STEPS} greedy decode steps, run {REPEATS} times: the fastest "
               "prefill and the median step are kept.")
    context_controls(lm)
    pts = measured_points()
    st.markdown(onset_text(lm))
    if not pts:
        st.info("No measurements yet: press **Measure N** or **Sweep**.")
        return
    fit = fit_ttft([ContextPoint(**p) for p in pts], ONSET_SHARE)
    ceiling = [ceiling_prefill_seconds(lm, roof, p["tokens"]) * 1e3 for p in pts]
    plot(charts.context_figure(pts, fit, attention_onset(lm.spec, ONSET_SHARE), ceiling), "speed.context_chart")
    st.markdown(fit_text(fit))
    st.caption("The dashed blue line is the projection's prefill time for this device at 100% of the peaks "
               "measured below; the grey line marks the projected 10% attention share. "
               + decode_text(pts, lm.weight_bytes, kv_bytes_per_token_loaded(lm)))


# --- the decode step on this device's roofline ------------------------------------------------------

def prefill_placement(lm: ModelClient, point: dict) -> tuple[float, float]:
    """(FLOPs per byte, achieved FLOP/s) of a measured prefill: its FLOPs over weights + K/V written."""
    n = point["tokens"]
    flops = prefill_flops(lm.spec, n)
    nbytes = lm.weight_bytes + n * kv_bytes_per_token_loaded(lm)
    return flops / nbytes, flops / point["ttft"]


def roof_metrics(roof: DeviceRoof) -> None:
    cols = st.columns(3)
    how = "copy benchmark" if roof.source == "measured" else "spec sheet"
    cols[0].metric(f"Peak bandwidth ({how})", f"{roof.bandwidth / 1e9:,.1f} GB/s")
    cols[1].metric(f"Peak FLOP/s ({'matmul benchmark' if roof.source == 'measured' else 'spec sheet'})",
                   f"{roof.peak_flops / 1e9:,.1f} GFLOP/s")
    cols[2].metric("Ridge point", f"{roof.ridge_point:,.1f} FLOPs/byte",
                   help="Below this arithmetic intensity a kernel waits on memory; above it, on arithmetic.")


def roofline_section(lm: ModelClient, roof: DeviceRoof) -> None:
    st.caption(f"{MEASURED}: {roof.name}. " + ("Peaks measured here once per server: copying a 256 MB tensor and a "
               "2048×2048 matrix multiply, best of 5 each." if roof.source == "measured" else
               "Peaks from the GPU's spec sheet."))
    roof_metrics(roof)
    if roof.source == "measured":
        st.button("Measure the peaks again", key="speed.remeasure", on_click=remeasure_roof,
                  help="If the machine was busy the first time, the peaks came out low.")
    pts = measured_points()
    if not pts:
        st.info("Measure at least one prompt length above to place the decode step on this roofline.")
        plot(charts.device_roofline_figure(roof, None, None), "speed.roof_chart")
        return
    latest = max(pts, key=lambda p: p["tokens"])
    place = place_decode(lm, roof, latest["itl"], latest["tokens"])
    cols = st.columns(4)
    cols[0].metric("Decode speed (measured)", fmt_rate(1 / place.step_seconds), help=f"step {fmt_ms(place.step_seconds)}")
    cols[1].metric("Ceiling on this device (projected)", fmt_rate(1 / place.ceiling_step_seconds),
                   help="The projection's decode step with this device's measured peaks at 100%.")
    cols[2].metric("Measured / ceiling", f"{place.ratio * 100:.2g}%")
    cols[3].metric("Effective bandwidth", f"{place.effective_bandwidth / 1e9:,.2f} GB/s",
                   f"{place.bandwidth_share:.0%} of peak", delta_color="off")
    plot(charts.device_roofline_figure(roof, place, prefill_placement(lm, latest)), "speed.roof_chart")
    st.markdown(
        f"A decode step at N = {latest['tokens']:,} reads {fmt_bytes(place.bytes_read)} (every weight once plus the "
        f"KV cache) and does {place.flops / 1e9:,.2f} GFLOPs: {place.intensity:.2f} FLOPs per byte, far left of the "
        f"ridge at {roof.ridge_point:,.1f}. It is bandwidth-bound, so its speed is bytes ÷ bandwidth, not FLOPs ÷ "
        "peak. A prefill does the same weight read for N tokens at once and sits much further right. The gap between "
        "the measured point and the ceiling is a plain PyTorch engine's overhead: Python, small kernels launched one "
        "by one, and memory traffic beyond the weights.")
