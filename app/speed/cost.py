"""Sections of the cost calculator: one projection in full (memory, prefill, decode, throughput, cost), what a
mixture of experts reads, the roofline with its prefill and decode points, and the sweep over batch sizes. All
from engine/projection/cost.py. A configuration that does not fit says why and what would fit; it is not priced.
"""
from __future__ import annotations

import streamlit as st

from app.speed import figures as charts
from app.ui.format import fmt_bytes, fmt_ms, fmt_rate
from app.ui.hardware import HardwareChoice, memory_line
from app.ui.format import efficiency_note
from app.runs.widgets import plot
from engine.projection.card import active_param_counts, expected_experts_touched, param_counts
from engine.projection.cost import Projection, roofline, sweep_batch

SWEEP = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MOE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def speed_metrics(p: Projection) -> None:
    cols = st.columns(4)
    cols[0].metric("Prefill", fmt_ms(p.prefill_ms / 1e3), help=f"{p.batch} prompt(s) of {p.prompt_tokens:,} tokens")
    cols[1].metric("Time to first token", fmt_ms(p.ttft_ms / 1e3),
                   help="Queueing + prefill: the prefill pass yields the first token. The batch arrives together, so "
                        "nobody queues here.")
    cols[2].metric("Decode step", fmt_ms(p.decode_step_ms / 1e3), f"{p.decode_bound}-bound", delta_color="off")
    cols[3].metric("Whole request", fmt_ms(p.request_ms / 1e3),
                   help=f"prefill (first token) + {max(p.output_tokens - 1, 0)} decode steps")
    cols = st.columns(4)
    cols[0].metric("Per user", fmt_rate(p.per_user_tok_s),
                   help=efficiency_note(p.bandwidth_efficiency, p.flops_efficiency).capitalize())
    cols[1].metric("Total", fmt_rate(p.total_tok_s), help=f"{p.replicas} replica(s) × {p.batch} users")
    cols[2].metric("Ceiling per user", fmt_rate(p.ceiling_tok_s_per_user), help="the same step at 100% of both peaks")
    cols[3].metric("$ per million output tokens", f"${p.cost_per_million_tokens:,.3f}",
                   help=f"{p.gpus_per_replica} GPU(s) per replica at ${p.dollars_per_hour:g} an hour each")
    if p.gpus_per_replica > 1:
        st.caption(f"Between GPUs: {fmt_ms(p.comm_decode_ms / 1e3)} of each decode step and "
                   f"{fmt_ms(p.comm_prefill_ms / 1e3)} of the prefill go to communication"
                   + (f": two all-reduces per layer over {p.tensor_parallel} GPUs" if p.tensor_parallel > 1 else "")
                   + (f", {p.pipeline_parallel - 1} hand-off(s) between pipeline stages" if p.pipeline_parallel > 1 else "")
                   + ". Each costs a fixed ~10 µs plus the activations over the link at its spec bandwidth.")


def explain(p: Projection) -> str:
    spread = f" over its {p.gpus_per_replica} GPUs" if p.gpus_per_replica > 1 else ""
    return (f"A decode step moves {(p.weight_bytes_read + p.kv_bytes_total) / 1e9:,.2f} GB{spread} (the weights it needs "
            f"once, plus the KV cache of {'the one user' if p.batch == 1 else f'all {p.batch} users'}) and does "
            f"{p.decode_intensity:,.1f} FLOPs per byte; a GPU needs {p.ridge_point:,.0f} FLOPs per byte to be busy "
            f"computing. So the step uses {p.decode_flops_utilization:.1%} of the peak FLOP/s: memory "
            f"({fmt_ms(p.decode_memory_ms / 1e3)}) against compute ({fmt_ms(p.decode_compute_ms / 1e3)}). Batching "
            "raises the FLOPs per byte read: the weight read is shared by every user in the batch.")


def not_fit_section(p: Projection) -> None:
    st.markdown("**It does not run:** " + "; ".join(p.problems) + ". Nothing is timed or priced.")
    if p.to_fit:
        st.markdown("**What would fit instead:**\n" + "\n".join(f"- {fix}" for fix in p.to_fit))


def projection_section(choice: HardwareChoice) -> Projection:
    p = choice.project()
    st.markdown(f"**{choice.label}**, {p.weight_dtype.upper()} weights, {p.kv_dtype.upper()} KV cache, batch "
                f"{p.batch} per replica, {p.context:,} tokens per user, {p.gpus} GPU(s) in all, "
                f"{efficiency_note(p.bandwidth_efficiency, p.flops_efficiency)}.")
    (st.success if p.fits else st.error)(memory_line(p))
    if not p.fits:
        not_fit_section(p)
        return p
    speed_metrics(p)
    st.markdown(explain(p))
    return p


def moe_section(choice: HardwareChoice, p: Projection) -> None:
    """Total against active parameters, and the routed experts a decode step reads as the batch grows."""
    spec = choice.spec
    if not st.toggle("Show what a mixture of experts holds and reads", value=True, key="cost.moe"):
        return
    total, active = param_counts(spec).total, active_param_counts(spec).total
    cols = st.columns(4)
    cols[0].metric("Parameters held", f"{total / 1e9:,.1f} B", help="every expert stays in memory")
    cols[1].metric("Active per token", f"{active / 1e9:,.1f} B",
                   help=f"{spec.experts_per_token} of {spec.n_experts} routed experts per layer, plus everything else")
    cols[2].metric(f"Experts read per step at batch {p.batch}", f"{expected_experts_touched(spec, p.batch):,.1f} "
                   f"of {spec.n_experts}", help="distinct routed experts per MoE layer, with balanced routing")
    cols[3].metric("Weights read per step", fmt_bytes(p.weight_bytes_read), help="of " + fmt_bytes(p.weight_bytes))
    touched = [expected_experts_touched(spec, b) for b in MOE_BATCHES]
    plot(charts.experts_figure(MOE_BATCHES, touched, spec.n_experts, spec.experts_per_token), "cost.experts")
    st.caption(f"Each token picks {spec.experts_per_token} of {spec.n_experts} experts per layer. One user reads only "
               f"its own; a batch of b tokens misses a given expert with probability (1 − {spec.experts_per_token}/"
               f"{spec.n_experts})^b, so a large batch reads nearly all of them: decode then costs what the whole "
               "model weighs, while the FLOPs stay those of the active parameters.")


def roofline_section(choice: HardwareChoice, p: Projection) -> None:
    if not p.fits:
        st.info("Nothing to place on the roofline: this configuration does not run.")
        return
    line = roofline(choice.gpu, choice.weight_dtype)
    plot(charts.projected_roofline_figure(line, p, choice.label), "cost.roofline")
    st.caption("The roofline of one GPU: attainable FLOP/s = min(peak, intensity × bandwidth). Each point is placed at "
               "the FLOP/s per GPU the projection says the step achieves; move the batch size and watch decode climb "
               "the slope towards the ridge while prefill sits on the flat roof.")


def sweep_section(choice: HardwareChoice) -> None:
    projs = sweep_batch(choice.spec, choice.gpu, SWEEP, weight_dtype=choice.weight_dtype, kv_dtype=choice.kv_dtype,
                        context=choice.context, output_tokens=choice.output_tokens,
                        flops_efficiency=choice.flops_efficiency, bandwidth_efficiency=choice.bandwidth_efficiency,
                        dollars_per_hour=choice.dollars_per_hour, layout=choice.layout)
    running = [p for p in projs if p.fits]
    if len(running) < 2:
        st.info(f"At {choice.context:,} tokens per user, {'no batch size' if not running else 'only batch 1'} fits "
                "on these GPUs, so there is nothing to sweep.")
        return
    plot(charts.batch_sweep_figure(running, choice.label), "cost.sweep")
    first, last = running[0], running[-1]
    left_out = [p.batch for p in projs if not p.fits]
    st.markdown(f"From batch 1 to {last.batch}, cost per million tokens falls from ${first.cost_per_million_tokens:,.2f} "
                f"to ${last.cost_per_million_tokens:,.3f} (**{first.cost_per_million_tokens / last.cost_per_million_tokens:,.0f}×** "
                f"cheaper) while each user's speed drops from {fmt_rate(first.per_user_tok_s)} to "
                f"{fmt_rate(last.per_user_tok_s)}."
                + (f" Batches of {', '.join(map(str, left_out))} do not fit at {choice.context:,} tokens per user, so "
                   "they are left out." if left_out else ""))
