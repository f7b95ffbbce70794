"""Sections of the cost calculator: one projection in full (memory, prefill, decode, throughput, cost), the
roofline with its prefill and decode points, and the sweep over batch sizes. All from engine/projection.py.
"""
from __future__ import annotations

import streamlit as st

from app import speed_charts as charts
from app.format import fmt_ms, fmt_rate
from app.speed_view import HardwareChoice, memory_line
from app.view import plot
from engine.projection import Projection, roofline, sweep_batch

SWEEP = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def speed_metrics(p: Projection) -> None:
    cols = st.columns(4)
    cols[0].metric("Prefill", fmt_ms(p.prefill_ms / 1e3), help=f"{p.batch} prompt(s) of {p.prompt_tokens:,} tokens")
    cols[1].metric("Time to first token", fmt_ms(p.ttft_ms / 1e3), help="prefill + the first decode step")
    cols[2].metric("Decode step", fmt_ms(p.decode_step_ms / 1e3), f"{p.decode_bound}-bound", delta_color="off")
    cols[3].metric("Whole request", fmt_ms(p.request_ms / 1e3), help=f"prefill + {p.output_tokens} decode steps")
    cols = st.columns(4)
    cols[0].metric("Per user", fmt_rate(p.per_user_tok_s))
    cols[1].metric("Total", fmt_rate(p.total_tok_s))
    cols[2].metric("Ceiling per user", fmt_rate(p.ceiling_tok_s_per_user), help="the same step at 100% of both peaks")
    cols[3].metric("$ per million output tokens", f"${p.cost_per_million_tokens:,.3f}")


def explain(p: Projection) -> str:
    return (f"A decode step moves {(p.weight_bytes + p.kv_bytes_total) / 1e9:,.2f} GB (weights once, plus the KV "
            f"cache of {'the one user' if p.batch == 1 else f'all {p.batch} users'}) and does {p.decode_intensity:,.1f} FLOPs per byte; the GPU needs "
            f"{p.ridge_point:,.0f} FLOPs per byte to be busy computing. So the step uses "
            f"{p.decode_flops_utilization:.1%} of the peak FLOP/s: memory ({fmt_ms(p.decode_memory_ms / 1e3)}) against "
            f"compute ({fmt_ms(p.decode_compute_ms / 1e3)}). Batching raises the FLOPs per byte read: the weight read "
            "is shared by every user in the batch.")


def projection_section(choice: HardwareChoice) -> Projection:
    p = choice.project()
    st.markdown(f"**{choice.label}**, {p.weight_dtype.upper()} weights, {p.kv_dtype.upper()} KV cache, batch "
                f"{p.batch}, {p.context:,} tokens per user.")
    (st.success if p.fits else st.error)(memory_line(p))
    speed_metrics(p)
    st.markdown(explain(p))
    return p


def roofline_section(choice: HardwareChoice, p: Projection) -> None:
    line = roofline(choice.gpu, choice.weight_dtype)
    plot(charts.projected_roofline_figure(line, p, choice.label), "cost.roofline")
    st.caption("The roofline: attainable FLOP/s = min(peak, intensity × bandwidth). Each point is placed at the "
               "FLOP/s the projection says the step achieves; move the batch size and watch decode climb the slope "
               "towards the ridge while prefill sits on the flat roof.")


def sweep_section(choice: HardwareChoice) -> None:
    projs = sweep_batch(choice.spec, choice.gpu, SWEEP, weight_dtype=choice.weight_dtype, kv_dtype=choice.kv_dtype,
                        context=choice.context, output_tokens=choice.output_tokens,
                        flops_efficiency=choice.flops_efficiency, bandwidth_efficiency=choice.bandwidth_efficiency,
                        dollars_per_hour=choice.dollars_per_hour)
    plot(charts.batch_sweep_figure(projs, choice.label), "cost.sweep")
    first, last = projs[0], projs[-1]
    fits = [p.batch for p in projs if not p.fits]
    st.markdown(f"From batch 1 to {last.batch}, cost per million tokens falls from ${first.cost_per_million_tokens:,.2f} "
                f"to ${last.cost_per_million_tokens:,.3f} (**{first.cost_per_million_tokens / last.cost_per_million_tokens:,.0f}×** "
                f"cheaper) while each user's speed drops from {fmt_rate(first.per_user_tok_s)} to "
                f"{fmt_rate(last.per_user_tok_s)}."
                + (f" Batches of {', '.join(map(str, fits))} do not fit in memory at {choice.context:,} tokens per "
                   "user; the figures show what the arithmetic would give." if fits else ""))
