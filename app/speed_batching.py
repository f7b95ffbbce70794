"""Sections of the batching page: a simulated serving engine on projected hardware (static against continuous
batching, and a sweep of the batch limit), and real batched generation on this machine.
"""
from __future__ import annotations

import math

import streamlit as st

from app import speed_charts as charts
from app.format import fmt_rate, fmt_tokens
from app.speed_view import MEASURED, HardwareChoice, measured_caption, run_on_model, status_progress
from app.view import plot
from engine.batching import measure_batching
from engine.errors import EngineError
from engine.loader import LoadedModel
from engine.serving_sim import ServerConfig, SimResult, Workload, simulate, sweep_max_batch
from engine.specs import GPUSpec, ModelSpec
from engine.speedlab import DeviceRoof, device_cost_model

REAL_BATCHES = (1, 2, 4, 8)
REAL_POINTS = "batching.points"
REAL_ROUNDS = 2
SIM_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
POLICIES = ("static", "continuous")


def workload_inputs() -> tuple[Workload, int]:
    cols = st.columns(3)
    rate = cols[0].slider("Arrivals (requests/s)", 0.5, 100.0, 20.0, 0.5, key="batching.rate")
    n = cols[1].select_slider("Requests", [50, 100, 200, 300, 500], value=300, key="batching.n")
    max_batch = cols[2].select_slider("Batch limit", list(SIM_BATCHES), value=64, key="batching.max_batch")
    cols = st.columns([5, 5, 4])                      # room for both length options on a 1024-pixel projector
    prompt = cols[0].slider("Prompt tokens (min, max)", 16, 8192, (64, 1024), key="batching.prompt")
    output = cols[1].slider("Output tokens (min, max)", 1, 2048, (16, 512), key="batching.output")
    dist = cols[2].segmented_control("Lengths", ["uniform", "lognormal"], default="uniform", key="batching.dist",
                                     required=True)
    return Workload(int(n), float(rate), prompt[0], prompt[1], output[0], output[1], dist or "uniform"), int(max_batch)


def server(choice: HardwareChoice, policy: str, max_batch: int) -> ServerConfig:
    return ServerConfig(policy=policy, max_batch=max_batch, weight_dtype=choice.weight_dtype, kv_dtype=choice.kv_dtype)


@st.cache_data(max_entries=32, show_spinner=False)
def run_policies(spec: ModelSpec, gpu: GPUSpec, workload: Workload, servers: tuple[ServerConfig, ...]) -> dict[str, SimResult]:
    return {s.policy: simulate(spec, gpu, workload, s) for s in servers}


@st.cache_data(max_entries=16, show_spinner=False)
def run_sweep(spec: ModelSpec, gpu: GPUSpec, workload: Workload, base: ServerConfig) -> list:
    return sweep_max_batch(spec, gpu, workload, base, SIM_BATCHES)


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:,.3g}"


def summary_table(results: dict[str, SimResult]) -> None:
    rows = {"throughput (tok/s)": "throughput_tok_s", "per-user speed, median (tok/s)": "per_user_tok_s",
            "TTFT p50 (s)": "ttft_p50", "TTFT p95 (s)": "ttft_p95", "latency p50 (s)": "latency_p50",
            "latency p95 (s)": "latency_p95", "GPU busy": "busy_fraction", "mean batch": "mean_batch",
            "$ per 1M tokens": "cost_per_million_tokens"}
    table = {"": list(rows)}
    for policy, res in results.items():
        summary = res.summary()
        table[policy] = [f"{summary[key]:.0%}" if key == "busy_fraction" else _num(summary[key]) for key in rows.values()]
    st.table(table)


def simulation_section(choice: HardwareChoice) -> None:
    workload, max_batch = workload_inputs()
    servers = tuple(server(choice, p, max_batch) for p in POLICIES)
    try:
        with st.spinner("Simulating…"):
            results = run_policies(choice.spec, choice.gpu, workload, servers)
    except ValueError as err:
        st.error(str(err))
        return
    st.markdown(f"**{choice.label}** ({choice.weight_dtype.upper()} weights): a simulated server, "
                f"{workload.n_requests} requests arriving at {workload.arrival_rate:g}/s, KV cache paged in blocks of "
                f"16 tokens within the GPU's memory ({fmt_tokens(results['continuous'].kv_capacity_tokens)} tokens).")
    summary_table(results)
    plot(charts.sim_series_figure(results), "batching.series")
    plot(charts.sim_latency_figure(results), "batching.latency")
    st.caption("Static batching takes a group, runs it until its longest answer is finished, and only then admits "
               "the next group: short answers wait as padding and new arrivals wait outside. Continuous batching "
               "rebuilds the batch before every step: finished requests leave and waiting ones join at once.")


def sweep_section(choice: HardwareChoice) -> None:
    workload = Workload(300, math.inf, 64, 512, 64, 256)
    try:
        rows = run_sweep(choice.spec, choice.gpu, workload, server(choice, "continuous", 1))
    except ValueError as err:
        st.error(str(err))
        return
    plot(charts.sim_sweep_figure(rows), "batching.sweep")
    first, last = rows[0], rows[-1]
    st.markdown(f"**{choice.label}**, 300 requests waiting at once (prompts 64–512, answers 64–256 tokens), "
                f"continuous batching: from a batch limit of 1 to {last.max_batch}, throughput rises "
                f"{last.throughput_tok_s / first.throughput_tok_s:,.0f}× and the cost per million tokens falls from "
                f"${first.cost_per_million_tokens:,.2f} to ${last.cost_per_million_tokens:,.3f} "
                f"(**{first.cost_per_million_tokens / last.cost_per_million_tokens:,.0f}× cheaper**), while each "
                f"user's speed falls from {fmt_rate(first.per_user_tok_s)} to {fmt_rate(last.per_user_tok_s)}.")


# --- real batching on this machine ----------------------------------------------------------------------

def measure_real(lm: LoadedModel) -> None:
    with st.status("Running the model batched…", expanded=True) as box:
        report = status_progress(box)
        try:
            points = run_on_model(lm, "the batching measurement",
                                  lambda progress: measure_batching(lm, REAL_BATCHES, rounds=REAL_ROUNDS,
                                                                    progress=progress), report)
        except EngineError as err:
            box.update(label="Stopped", state="error")
            st.error(str(err))
            return
        st.session_state[REAL_POINTS] = [p.to_dict() for p in points]
        box.update(label="Measured", state="complete", expanded=False)


def device_ceiling(lm: LoadedModel, roof: DeviceRoof, batches, context: int = 40) -> list[float]:
    """Total tok/s this device could reach at each batch size (its measured peaks, the projection's formula)."""
    cm = device_cost_model(lm, roof)
    return [b / cm.decode_seconds(b, b * context) for b in batches]


def real_section(lm: LoadedModel, roof: DeviceRoof) -> None:
    st.caption(measured_caption(lm) + f" Batch sizes {', '.join(map(str, REAL_BATCHES))}: different prompts of about "
               "32 tokens, left-padded, one forward pass per step for the whole batch, 12 greedy tokens each; the sizes "
               f"run interleaved, {REAL_ROUNDS} rounds, and each keeps its median step.")
    if st.button("Measure batched generation", type="primary", key="batching.measure"):
        measure_real(lm)
    points = st.session_state.get(REAL_POINTS)
    if not points:
        st.info("Press the button to run the model at each batch size.")
        return
    plot(charts.measured_batching_figure(points, device_ceiling(lm, roof, [p["batch"] for p in points])),
         "batching.real")
    st.table({"batch": [p["batch"] for p in points],
              "total tok/s": [f"{p['total_tok_s']:,.1f}" for p in points],
              "per-user tok/s": [f"{p['per_user_tok_s']:,.1f}" for p in points],
              "decode step": [f"{p['step_ms']:,.1f} ms" for p in points]})
    gain = points[-1]["total_tok_s"] / points[0]["total_tok_s"]
    st.markdown(f"{MEASURED}: batch {points[-1]['batch']} gives **{gain:,.1f}×** the total tokens per second of batch 1. "
                "The weights are read once per step whatever the batch, so extra rows cost only their own arithmetic "
                "and KV reads, until the device runs out of compute. On a CPU that point comes early; on a GPU, "
                "whose ridge point is in the hundreds of FLOPs per byte, it comes at batches of a hundred or more.")
