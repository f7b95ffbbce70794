"""Sections of the FlashAttention page: eager against fused attention measured here, and projected on a GPU."""
from __future__ import annotations

import streamlit as st

from app.explainers import figures as charts
from app.ui.format import card_size, fmt_bytes, fmt_ms, fmt_tokens
from app.ui.format import MEASURED, efficiency_note, measured_caption
from app.ui.hardware import gpu_picker, model_picker
from app.runs.live import run_on_model, status_progress
from app.runs.widgets import measured, plot
from engine.errors import EngineError
from engine.projection.card import kv_bytes_per_token, weight_bytes
from engine.lab.fusion import (MAX_SCORE_BYTES, AttentionShape, FusionProjection, decode_row_bytes,
                               largest_intermediate_bytes, project_fusion)
from engine.projection.cost import DEFAULT_FLOPS_EFFICIENCY
from engine.projection.specs import ModelSpec
from engine.service.client import ModelClient
from engine.projection.units import card_bytes

POINTS = "fusion.points"
LENGTHS = (64, 128, 256, 512, 1024, 2048, 4096)
DEFAULT_LENGTHS = (256, 512, 1024, 2048)
REPEATS = 2
PROJECTED_LENGTHS = (1024, 4096, 16384, 32768, 131072)


def lengths_for(lm: ModelClient) -> list[int]:
    """The lengths this model's context and the score-matrix limit allow."""
    itemsize = lm.dtype.itemsize
    return [n for n in LENGTHS if n <= lm.spec.max_context
            and largest_intermediate_bytes(AttentionShape.of_spec(lm.spec, n, itemsize)) <= MAX_SCORE_BYTES]


def measure(lm: ModelClient, lengths: list[int]) -> None:
    with st.status("Timing eager and fused attention…", expanded=True) as box:
        report = status_progress(box)
        try:
            points = run_on_model(lm, "fusion.sweep", {"lengths": list(lengths), "repeats": REPEATS},
                                  report)                                                # alone, for clean timings
        except EngineError as err:
            box.update(label="Stopped", state="error")
            st.error(f"The measurement stopped: {err}")
            return
        st.session_state[POINTS] = points
        box.update(label=f"Measured {len(points)} lengths", state="complete", expanded=False)


def results_table(points: list[dict]) -> None:
    st.table({"N": [f"{p['tokens']:,}" for p in points],
              "eager": [fmt_ms(p["eager_seconds"]) for p in points],
              "fused": [fmt_ms(p["fused_seconds"]) for p in points],
              "eager / fused": [f"{p['eager_seconds'] / p['fused_seconds']:.1f}×" for p in points],
              "eager bytes moved": [fmt_bytes(p["eager_bytes"]) for p in points],
              "fused bytes moved": [fmt_bytes(p["fused_bytes"]) for p in points],
              "largest eager tensor": [fmt_bytes(p["largest_bytes"]) for p in points],
              "largest difference": [f"{p['max_difference']:.1e}" for p in points]})


def measured_section(lm: ModelClient) -> None:
    st.caption(measured_caption(lm) + f" One layer's attention with the loaded model's shapes ({lm.spec.n_heads} "
               f"query heads, {lm.spec.n_kv_heads} K/V heads, head_dim {lm.spec.head_dim}) on random Q, K, V (the "
               f"values do not change the work), best of {REPEATS} runs each. Bytes are counted from the tensors each "
               "eager step wrote and read; the fused kernel's are Q, K, V and the output, once each.")
    options = lengths_for(lm)
    default = [n for n in options if n in DEFAULT_LENGTHS] or options[-3:]
    chosen = st.pills("Prompt lengths N", options, default=default, selection_mode="multi", key="fusion.lengths")
    points = measured("Measure eager against fused", "fusion.measure", POINTS, lambda: measure(lm, sorted(chosen)),
                      "Press the button: each length runs the attention of one layer both ways.", disabled=not chosen)
    if points is None:
        return
    plot(charts.fusion_measured_figure(points), "fusion.measured")
    results_table(points)
    last = points[-1]
    times, traffic = last["eager_seconds"] / last["fused_seconds"], last["eager_bytes"] / last["fused_bytes"]
    st.markdown(
        f"{MEASURED}: at N = {last['tokens']:,} the eager path took **{times:.1f}×** as long as the fused kernel and "
        f"moved {fmt_bytes(last['eager_bytes'])} against {fmt_bytes(last['fused_bytes'])} ({traffic:,.0f}× more). "
        f"Both give the same answer (largest difference {last['max_difference']:.1e}): fusion changes where the "
        "numbers live, not what they are.")


def projection_rows(projs: list[FusionProjection]) -> list[dict]:
    return [{"tokens": p.tokens, "label": fmt_tokens(p.tokens), "linear_ms": p.linear_seconds * 1e3, "eager_ms": p.eager_seconds * 1e3,
             "fused_ms": p.fused_seconds * 1e3} for p in projs]


def projected_table(projs: list[FusionProjection], memory_gb: float) -> None:
    st.table({"prompt": [fmt_tokens(p.tokens) for p in projs],
              "attention, eager": [fmt_ms(p.eager_seconds) for p in projs],
              "attention, fused": [fmt_ms(p.fused_seconds) for p in projs],
              "TTFT eager → fused": [f"{fmt_ms(p.eager_ttft)} → {fmt_ms(p.fused_ttft)}" for p in projs],
              "HBM traffic eager / fused": [f"{fmt_bytes(p.eager_bytes)} / {fmt_bytes(p.fused_bytes)}" for p in projs],
              "one layer's float32 scores": [fmt_bytes(p.largest_bytes) + ("" if p.fits else f" > {fmt_bytes(card_bytes(memory_gb))}")
                                             for p in projs]})


def projected_section(lm: ModelClient) -> None:
    cols = st.columns(2)
    spec, gpu = model_picker("fusion", lm, cols[0]), gpu_picker("fusion", cols[1])
    projs = [project_fusion(spec, gpu, n) for n in PROJECTED_LENGTHS if n <= spec.max_context]
    title = f"Projected for {spec.name} on {gpu.name}"
    reached = efficiency_note(flops=DEFAULT_FLOPS_EFFICIENCY).removeprefix("projected ")
    st.caption(f"{title}, BF16, one prompt, {reached}, as on every page (spec "
               f"sheet: {gpu.bf16_tflops:,.0f} TFLOP/s, {gpu.bandwidth_tbs} TB/s). Each attention step takes "
               "max(FLOPs ÷ FLOP/s reached, bytes ÷ bandwidth reached); eager moves every N × N matrix through memory "
               "as counted above, fused moves Q, K, V and the output.")
    plot(charts.fusion_projected_figure(projection_rows(projs), title), "fusion.projected")
    projected_table(projs, gpu.memory_gb)
    st.markdown(projected_text(projs, gpu.memory_gb) + " " + decode_text(spec, projs[-1].tokens))


def decode_text(spec: ModelSpec, context: int) -> str:
    """How little fusion changes a decode step's traffic: its score rows against the weights and the KV read."""
    rows = decode_row_bytes(spec, context, 2)
    step = weight_bytes(spec, "bf16") + context * kv_bytes_per_token(spec, "bf16")
    return (f"A decode step scores one query row per head against the cache, a vector rather than a matrix: at "
            f"{fmt_tokens(context)} tokens its eager score rows move {fmt_bytes(rows)} beside the {fmt_bytes(step)} "
            f"of weights and KV cache the step reads anyway ({rows / step:.1%}), so there fusion saves far less.")


def projected_text(projs: list[FusionProjection], memory_gb: float) -> str:
    short, long_ = projs[0], projs[-1]
    too_big = [fmt_tokens(p.tokens) for p in projs if not p.fits]
    fit = (f" From {too_big[0]} tokens on, one layer's float32 scores alone exceed the card's {card_size(memory_gb)}: "
           "without fusion such a prompt cannot even be run in one piece." if too_big else "")
    return (f"At {fmt_tokens(short.tokens)} tokens the linear layers dominate the prefill and fusion saves "
            f"{fmt_ms(short.eager_ttft - short.fused_ttft)}. At {fmt_tokens(long_.tokens)} eager attention would take "
            f"{fmt_ms(long_.eager_seconds)} against {fmt_ms(long_.fused_seconds)} fused: the score matrices grow with "
            f"N², and the eager path writes and re-reads each of them five times, so it is bound by memory "
            f"bandwidth while the fused kernel stays bound by arithmetic.{fit} That is why fusion matters most for "
            "long prefill.")
