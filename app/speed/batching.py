"""Sections of the batching page: a simulated serving engine on projected hardware (static against continuous
batching with goodput against latency targets; chunked prefill and prefill/decode disaggregation on long
prompts; a sweep of the batch limit), and real batched generation on this machine.
"""
from __future__ import annotations

import math
from dataclasses import replace

import streamlit as st

from app.speed import figures as charts
from app.ui.format import fmt_rate, fmt_tokens
from app.ui.format import MEASURED, measured_caption
from app.ui.hardware import HardwareChoice
from app.runs.live import measure_in_box
from app.runs.widgets import measured, plot
from engine.service.client import ModelClient
from engine.projection.cost import INTERNODE_GBS
from engine.projection.serving_sim import ServerConfig, SimResult, Targets, Workload, rescore, simulate, sweep_max_batch
from engine.projection.specs import GPUSpec, ModelSpec
from engine.lab.speed import DeviceRoof, device_cost_model

REAL_BATCHES = (1, 2, 4, 8)
REAL_POINTS = "batching.points"
REAL_ROUNDS = 2
SIM_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
POLICIES = ("static", "continuous")
SPLITS = ((1, 1), (1, 2), (2, 1), (1, 3), (2, 2), (3, 1), (2, 6), (4, 4), (6, 2))    # (prefill, decode) GPUs
LINKS = {"NVLink": 0.0, "InfiniBand": INTERNODE_GBS}          # 0: the GPU's own link
BUDGETS = (128, 256, 512, 1024, 2048, 4096)


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


def target_inputs() -> Targets:
    cols = st.columns(2)
    ttft = cols[0].number_input("Target: time to first token (s)", 0.01, 60.0, 0.5, 0.05, key="batching.ttft_target")
    itl = cols[1].number_input("Target: time between tokens (ms, mean over a request)", 1.0, 2000.0, 25.0, 1.0,
                               key="batching.itl_target")
    return Targets(float(ttft), float(itl) / 1e3)


ROWS = (("throughput (tok/s)", lambda r: _num(r.throughput_tok_s)),
        ("goodput (requests/s within both targets)", lambda r: _num(r.goodput.requests_per_s)),
        ("goodput (output tok/s of those requests)", lambda r: _num(r.goodput.tokens_per_s)),
        ("requests within both targets", lambda r: f"{r.goodput.share:.0%}"),
        ("TTFT p50 / p95 (s)", lambda r: f"{_num(r.ttft_p50)} / {_num(r.ttft_p95)}"),
        ("time between tokens p50 / p99 (ms)", lambda r: f"{_num(r.itl_p50 * 1e3)} / {_num(r.itl_p99 * 1e3)}"),
        ("per-user speed, median (tok/s)", lambda r: _num(r.per_user_tok_s)),
        ("latency p50 / p95 (s)", lambda r: f"{_num(r.latency_p50)} / {_num(r.latency_p95)}"),
        ("GPUs, busy", lambda r: f"{r.gpus}, {r.busy_fraction:.0%}"),
        ("K/V hand-off, mean (ms)", lambda r: _num(r.kv_handoff_mean * 1e3) if r.policy == "disaggregated" else "–"),
        ("mean batch", lambda r: _num(r.mean_batch)),
        ("$ per 1M output tokens", lambda r: f"${r.cost_per_million_tokens:,.3f}"))


def summary_table(results: dict[str, SimResult]) -> None:
    table = {"": [label for label, _ in ROWS]}
    for policy, res in results.items():
        table[policy] = [cell(res) for _, cell in ROWS]
    st.table(table)


def scored(results: dict[str, SimResult], targets: Targets) -> dict[str, SimResult]:
    """The cached runs against this session's targets (nothing simulated again)."""
    return {policy: rescore(res, targets) for policy, res in results.items()}


def simulated(choice: HardwareChoice, workload: Workload, servers: tuple[ServerConfig, ...],
             targets: Targets) -> dict[str, SimResult] | None:
    """Each server simulated on the workload (cached) and scored against the targets; None after an error shown."""
    try:
        with st.spinner("Simulating…"):
            return scored(run_policies(choice.spec, choice.gpu, workload, servers), targets)
    except ValueError as err:
        st.error(str(err))
        return None


def simulation_section(choice: HardwareChoice, targets: Targets) -> None:
    workload, max_batch = workload_inputs()
    servers = tuple(server(choice, p, max_batch) for p in POLICIES)
    results = simulated(choice, workload, servers, targets)
    if results is None:
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
    st.markdown(goodput_text(results, targets))


def goodput_text(results: dict[str, SimResult], targets: Targets) -> str:
    parts = [f"{policy} {res.goodput.requests_per_s:,.2f} requests/s ({res.goodput.share:.0%} of them)"
             for policy, res in results.items()]
    return (f"**Goodput** counts only the requests served within both targets (first token within "
            f"{targets.ttft:g} s, on average at most {targets.itl * 1e3:g} ms between tokens): "
            + ", ".join(parts) + ". Throughput counts every token, however late; goodput is what users were "
            "promised.")


# --- long prompts: chunked prefill and disaggregation ----------------------------------------------------

def split_label(split: tuple[int, int]) -> str:
    return f"{sum(split)} GPUs: {split[0]} prefill + {split[1]} decode"


def long_prompt_inputs(choice: HardwareChoice) -> tuple[Workload, tuple[ServerConfig, ...]]:
    cols = st.columns(3)
    rate = cols[0].slider("Arrivals (requests/s)", 0.5, 50.0, 12.0, 0.5, key="split.rate")
    prompt = cols[1].slider("Prompt tokens (min, max)", 16, 16384, (256, 8192), key="split.prompt")
    output = cols[2].slider("Output tokens (min, max)", 1, 2048, (16, 256), key="split.output")
    cols = st.columns([4, 3, 3])
    split = cols[0].selectbox("GPUs (disaggregated: how they split)", SPLITS, format_func=split_label, key="split.gpus")
    budget = cols[1].select_slider("Tokens per step (chunked prefill)", BUDGETS, value=512, key="split.budget")
    link = cols[2].selectbox("K/V hand-off (disaggregated)", list(LINKS), key="split.link",
                             help="NVLink: prefill and decode GPUs in one node (half the spec sheet's both-ways figure "
                                  f"each way). InfiniBand: in different nodes, {INTERNODE_GBS:g} GB/s per GPU.")
    base = ServerConfig(max_batch=64, weight_dtype=choice.weight_dtype, kv_dtype=choice.kv_dtype,
                        token_budget=int(budget))
    servers = (replace(base, policy="continuous", gpus=sum(split)), replace(base, policy="chunked", gpus=sum(split)),
               replace(base, policy="disaggregated", prefill_gpus=split[0], decode_gpus=split[1],
                       kv_link_gbs=LINKS[link]))
    return Workload(200, float(rate), prompt[0], prompt[1], output[0], output[1]), servers


def long_prompt_section(choice: HardwareChoice, targets: Targets) -> None:
    workload, servers = long_prompt_inputs(choice)
    results = simulated(choice, workload, servers, targets)
    if results is None:
        return
    gpus = servers[0].gpus
    st.markdown(f"**{choice.label}**, {gpus} GPUs, the same {workload.n_requests} requests for each policy "
                f"(arriving at {workload.arrival_rate:g}/s). Colocated, each GPU serves every other request; "
                "disaggregated, prefill GPUs only read prompts and decode GPUs only generate.")
    summary_table(results)
    plot(charts.sim_policies_figure(results, targets), "batching.policies")
    st.markdown(long_prompt_text(results))


def long_prompt_text(results: dict[str, SimResult]) -> str:
    stall, chunk, split = results["continuous"], results["chunked"], results["disaggregated"]
    return (f"Without chunking, a newcomer's whole prompt is read in a pass of its own and everyone already "
            f"decoding waits for it: 1 gap in 100 between two tokens is {stall.itl_p99 * 1e3:,.0f} ms or longer. "
            f"**Chunked prefill** cuts prompts into pieces that ride along with the decode steps (the weights are "
            f"read once for both): that gap is {chunk.itl_p99 * 1e3:,.0f} ms, while each prompt is read in "
            f"pieces over several steps (TTFT p50 {chunk.ttft_p50:.2f} s, against {stall.ttft_p50:.2f} s unchunked). "
            f"**Disaggregation** takes prefill off the decoding GPUs altogether ({split.itl_p99 * 1e3:,.0f} ms) "
            f"and pays with a K/V hand-off per request ({split.kv_handoff_mean * 1e3:.1f} ms on average, in the first "
            f"gap of each answer) and a fixed split: TTFT p50 {split.ttft_p50:.2f} s, rising "
            "steeply when the prefill GPUs cannot keep up with the prompts: try another split. Goodput: "
            + ", ".join(f"{p} {r.goodput.requests_per_s:,.2f}" for p, r in results.items()) + " requests/s.")


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

def measure_real(lm: ModelClient) -> None:
    points = measure_in_box(lm, "Running the model batched…", "batching.real",
                            {"batches": list(REAL_BATCHES), "rounds": REAL_ROUNDS})
    if points is not None:
        st.session_state[REAL_POINTS] = points


def device_ceiling(lm: ModelClient, roof: DeviceRoof, batches, context: int = 40) -> list[float]:
    """Total tok/s this device could reach at each batch size (its measured peaks, the projection's formula)."""
    cm = device_cost_model(lm, roof)
    return [b / cm.decode_seconds(b, b * context) for b in batches]


def real_section(lm: ModelClient, roof: DeviceRoof) -> None:
    st.caption(measured_caption(lm) + f" Batch sizes {', '.join(map(str, REAL_BATCHES))}: different prompts of about "
               "32 tokens, left-padded, one forward pass per step for the whole batch, 12 greedy tokens each; the sizes "
               f"run interleaved, {REAL_ROUNDS} rounds, and each keeps its median step.")
    points = measured("Measure batched generation", "batching.measure", REAL_POINTS, lambda: measure_real(lm),
                      "Press the button to run the model at each batch size.")
    if points is None:
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
