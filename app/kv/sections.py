"""Sections of the KV-cache page: the live cache of a real run, the users calculator (with a server's headroom and
with all of the card), what grouped-query attention, latent attention and windows save, and the paging simulation.
Numbers come from engine/projection/card.py, engine/projection/cost.py and engine/projection/paging.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from app.kv import figures as charts
from app.ui.format import card_size, fmt_bytes, fmt_tokens, parse_tokens
from app.runs.run import Run, Throttle
from app.runs.widgets import ChartSlot, LinkedNumber, Preset, linked_number, plot
from engine.projection.card import kv_bytes_per_token, kv_bytes_per_user, residual_bytes_per_token
from engine.service.client import ModelClient
from engine.errors import EngineError
from engine.lab.memory import MemoryLedger
from engine.projection.paging import PagingConfig, compare
from engine.projection.cost import (GPU_COUNTS, IDEAL, Layout, MemoryPlan, memory_plan, smallest_layout, standard_layout,
                                    users_table, users_that_fit)
from engine.projection.specs import GPU_PRESETS, MODEL_PRESETS, GPUSpec, ModelSpec, dtype_bytes

CALC_MODELS = ("llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "llama-3.2-1b", "llama-3.2-3b", "mistral-7b-v0.1",
               "gemma-2-9b", "gemma-3-27b", "mixtral-8x7b", "qwen3-30b-a3b", "llama-4-scout", "deepseek-v3")
CACHE_DTYPES = {"BF16": "bf16", "FP8": "fp8", "INT4": "int4"}
CONTEXT_OPTIONS = (1024, 2048, 4096, 8192, 10240, 16384, 32768, 65536, 102400, 131072)
CONTEXT_PRESETS = (1024, 10240, 102400, 131072)


def formula_text(spec: ModelSpec, dtype: str) -> str:
    """Bytes one token adds to the cache, with the numbers filled in: K and V per KV head, or MLA's latent."""
    b = dtype_bytes(dtype)
    total = kv_bytes_per_token(spec, dtype)
    if spec.is_mla:
        text = (f"({spec.kv_lora_rank} latent + {spec.qk_rope_head_dim} RoPE dims, shared by all {spec.n_heads} heads) "
                f"× {spec.n_layers} layers × {b:g} bytes ({dtype}) = {total:,.0f} bytes per token")
    else:
        text = (f"2 (K and V) × {spec.n_layers} layers × {spec.n_kv_heads} KV heads × {spec.head_dim} dims × "
                f"{b:g} bytes ({dtype}) = {total:,.0f} bytes per token")
    if spec.windowed_layers:
        text += (f"; {spec.windowed_layers} of the {spec.n_layers} layers keep only the last {spec.window - 1:,} "
                 f"tokens ({spec.window_kind} window of {spec.window:,})")
    return text


def residual_text(spec: ModelSpec, dtype: str) -> str:
    """Bytes one token's residual stream takes when a run captures (what every map, norm and lens derives from)."""
    b = dtype_bytes(dtype)
    return (f"A run that captures keeps its residual stream beside it, in the same blocks: ({spec.n_layers} layers + "
            f"the final norm) × {spec.d_model} values × {b:g} bytes = {residual_bytes_per_token(spec, b):,.0f} bytes "
            "per token")


CHARTED = "kv.charted_run"


def follow_charted_run(run: Run | None) -> None:
    """Put the prompt of the run the chart draws into the box whenever a run this page has not shown yet is
    charted (one made on another page, pushed by the presenter, or opened from a recording)."""
    if run is None or st.session_state.get(CHARTED) == run.id:
        return
    st.session_state[CHARTED] = run.id
    st.session_state["kv.prompt"] = run.request.prompt


def growth_caption(run: Run) -> str:
    """What the growth chart shows, with this run's numbers: in tokens, prefill and decode lie on one line."""
    cached = run.cache_states()[-1].length if run.cache_states() else 0
    return (f"Each band is one layer's K and V tensors, read from the cache object after every step; the dashed line "
            f"is the formula (written under this caption). The first {run.n_prompt:,} tokens (the prompt in its chat "
            f"template) entered the cache in one pass, prefill, up to the dotted line; then each decode step added one token, "
            f"{cached:,} in all. Counted in tokens it is one straight line: a token costs the same bytes whether it "
            "came in with the prompt or was generated. In time, prefill is a single step (the journey page's "
            "timeline).")


class GrowthView:
    """The real cache of a run, redrawn while it streams."""

    def __init__(self, spec: ModelSpec, dtype: str):
        self.per_token = kv_bytes_per_token(spec, dtype)
        words, picture = st.columns([2, 3])         # made right under Generate, side by side: where the room looks
        self.answer = words.empty()
        self.line = words.empty()
        self.chart = ChartSlot("kv.growth", picture)
        self.throttle = Throttle(0.4)

    def update(self, run: Run, final: bool = False) -> None:
        states = run.cache_states()
        if not states or not (final or self.throttle()):
            return
        self.answer.text(run.text or "…")
        last = states[-1]
        measured = last.bytes / last.length if last.length else 0
        verdict = "matches the formula" if abs(measured - self.per_token) < 0.5 else "differs from the formula"
        self.line.text(f"{last.length:,} tokens cached ({cached_positions(run, last.length)}): "
                       f"{fmt_bytes(last.bytes)} in {len(last.bytes_per_layer)} layers = {measured:,.0f} bytes per "
                       f"token, measured on the cache object; {verdict}.")
        self.chart.plot(charts.growth_figure(states, self.per_token))


def cached_positions(run: Run, cached: int) -> str:
    """Which tokens the cache holds: the prompt and every generated token but the newest, which is sampled from the
    last step's logits and enters the cache only with the step after it (a finished run's last token never does)."""
    fed = cached - run.n_prompt
    waiting = len(run.tokens) - fed
    text = f"the {run.n_prompt:,}-token prompt and {fed:,} of the {len(run.tokens):,} generated"
    if waiting == 1:
        text += ": the newest enters with the next step" if run.status == "running" else \
            ": the last one was never fed back"
    return text


# --- memory on this device, measured ----------------------------------------------------------------------

def ledger_table(ledger: MemoryLedger) -> dict[str, list[str]]:
    """The measured ledger beside the card's formula, one row per part (decimal units)."""
    rows = [("Weights", ledger.weights, ledger.weights_formula)]
    if ledger.kv_tokens:
        rows.append((f"KV cache of the last run ({ledger.kv_tokens:,} tokens)", ledger.kv, ledger.kv_formula))
    if ledger.resid_tokens:
        rows.append((f"Residual stream the last run keeps ({ledger.resid_tokens:,} tokens)", ledger.resid,
                     ledger.resid_formula))
    if ledger.resid_pool:
        rows.append((f"Residual pool beside it ({ledger.kv_pool_tokens:,} positions)", ledger.resid_pool, None))
    if ledger.kv_pool:
        rows.append((f"Batch K/V pool kept for CUDA graphs ({ledger.kv_pool_tokens:,} positions)", ledger.kv_pool,
                     None))
    if ledger.peak_reserved is not None:
        rows += [("Allocated now (torch.cuda.memory_allocated)", ledger.allocated, ledger.weights_formula),
                 ("Peak reserved (torch.cuda.max_memory_reserved)", ledger.peak_reserved, None),
                 ("Workspace at the peak: peak reserved − weights − KV" + (" − pool" if ledger.kv_pool else ""),
                  ledger.workspace, None),
                 ("GPU memory (torch.cuda.mem_get_info)", ledger.device_total, None)]
    else:
        if ledger.packed:
            rows.append(("Weights packed again for batched steps (small-batch kernel)", ledger.packed, None))
        rows += [("Process resident memory (RSS)", ledger.process_rss, None),
                 ("Rest of the process: RSS − weights − packed − KV" if ledger.packed else
                  "Rest of the process: RSS − weights − KV", ledger.workspace, None)]
    return {"": [r[0] for r in rows], "measured": [fmt_bytes(r[1]) for r in rows],
            "formula (model card)": [fmt_bytes(r[2]) if r[2] is not None else "–" for r in rows]}


def memory_section(lm: ModelClient, run: Run | None) -> None:
    """Measured memory of the process serving the model (open by default on a GPU)."""
    states = run.cache_states() if run is not None and run.source is None else []
    last = states[-1] if states else None
    try:
        ledger = lm.quick("memory.ledger", {"cache_length": last.length if last else 0,
                                            "cache_bytes": last.bytes if last else 0,
                                            "run_id": run.id if states and run.policy.enabled else None})
    except EngineError as err:
        st.caption(f"The memory of the model's process could not be read: {err}")
        return
    on_gpu = ledger.peak_reserved is not None
    with st.expander("Memory on this GPU, measured" if on_gpu else "Memory of this process, measured (CPU)",
                     expanded=on_gpu):
        st.dataframe(ledger_table(ledger), hide_index=True, key="kv.ledger")
        scope = ("Peaks count since the server started, across every session it serves." if on_gpu else
                 "Resident memory is the whole process: Python, libraries, the model and every session's data.")
        st.caption(f"Measured by {ledger.measured_by}; the formula column is the model card. {scope}")


# --- the calculator ---------------------------------------------------------------------------------------

CONTEXT = LinkedNumber("kv.context", "Context length per user (tokens)", 1024, 131_072, 8192, options=CONTEXT_OPTIONS,
                       presets=tuple(Preset(fmt_tokens(t), t) for t in CONTEXT_PRESETS),
                       typed_label="Or type a length (1K to 128K)", parse=parse_tokens, fmt=fmt_tokens,
                       placeholder="e.g. 24K or 24576")


@dataclass(frozen=True)
class Choice:
    spec: ModelSpec
    kv_dtype: str
    weight_dtype: str
    gpu_key: str
    context: int
    layout: Layout = Layout()


def gpus_label(n: int) -> str:
    return f"{n} GPU{'s' if n > 1 else ''}" + (f" ({n // 8} nodes)" if n > 8 else "")


def calculator_inputs(loaded: ModelSpec, label: str) -> Choice:
    specs = {"loaded": loaded, **{k: MODEL_PRESETS[k] for k in CALC_MODELS}}
    names = {"loaded": f"{label} (loaded)", **{k: MODEL_PRESETS[k].name for k in CALC_MODELS}}
    cols = st.columns([3, 2, 2])
    model = cols[0].selectbox("Model", list(specs), index=1, format_func=names.get, key="kv.model")
    gpu = cols[1].selectbox("GPU", list(GPU_PRESETS), format_func=lambda k: GPU_PRESETS[k].name, key="kv.gpu")
    n = cols[2].selectbox("GPUs", GPU_COUNTS, format_func=gpus_label, key="kv.gpus",
                          help="Tensor parallel inside a node of 8 (weights and KV heads split), then 8-GPU pipeline stages.")
    cols = st.columns(2)
    kv = cols[0].segmented_control("Cache dtype", list(CACHE_DTYPES), default="BF16", key="kv.cache_dtype",
                                   required=True)
    weights = cols[1].segmented_control("Weights dtype", list(CACHE_DTYPES), default="BF16", key="kv.weight_dtype",
                                        required=True)
    context = linked_number(CONTEXT)
    return Choice(specs[model], CACHE_DTYPES[kv or "BF16"], CACHE_DTYPES[weights or "BF16"], gpu, context,
                  standard_layout(int(n)))


def calculator_section(choice: Choice) -> None:
    spec, gpu, ctx, layout = choice.spec, GPU_PRESETS[choice.gpu_key], choice.context, choice.layout
    plan = memory_plan(spec, gpu, choice.weight_dtype, choice.kv_dtype, 1, ctx, layout)
    beyond = ctx > spec.max_context
    users = users_that_fit(spec, gpu, ctx, choice.weight_dtype, choice.kv_dtype, layout=layout)
    ideal = users_that_fit(spec, gpu, ctx, choice.weight_dtype, choice.kv_dtype, IDEAL, layout)
    each = " per GPU" if layout.per_replica > 1 else ""
    top, low = st.columns(3), st.columns(3)
    top[0].metric("KV cache per token", fmt_bytes(kv_bytes_per_token(spec, choice.kv_dtype)),
                  help="while the token is inside every layer's window")
    top[1].metric(f"Cache per user at {fmt_tokens(ctx)}", fmt_bytes(kv_bytes_per_user(spec, ctx, choice.kv_dtype)))
    top[2].metric("Weights" + each, fmt_bytes(plan.weights))
    low[0].metric("Left for the cache" + each, fmt_bytes(max(0.0, plan.usable - plan.weights)),
                  help=f"{fmt_bytes(plan.usable)} a server fills (90% of the card, less "
                       f"{fmt_bytes(plan.reserve)} of CUDA context and activation workspace), minus the weights")
    low[1].metric("Users that fit", "–" if beyond else f"{users:,}", help="with a server's headroom")
    low[2].metric("With all of the card", "–" if beyond else f"{ideal:,}",
                  help="the best case: weights and cache get every byte of the card, nothing held back")
    st.text(formula_text(spec, choice.kv_dtype))
    if plan.weights <= plan.usable:
        st.text(budget_text(plan, gpu, each))
    if beyond:
        st.error(f"{spec.name} reads at most {fmt_tokens(spec.max_context)} tokens: a longer context is not something "
                 "it can serve, so it is not counted.")
    elif plan.weights > plan.usable:
        st.warning(weights_warning(choice, plan.weights, plan.usable))
    users_table_section(choice)


def budget_text(plan: MemoryPlan, gpu: GPUSpec, each: str = "") -> str:
    """The card split so that the numbers on screen add up: weights + room for the cache + headroom = card."""
    free = plan.card - plan.usable - plan.reserve            # the share a server leaves unfilled (10%)
    return (f"{gpu.name}{each}: {card_size(gpu.memory_gb)} = {fmt_bytes(plan.weights)} weights + "
            f"{fmt_bytes(plan.usable - plan.weights)} left for the cache + {fmt_bytes(free + plan.reserve)} headroom "
            f"({fmt_bytes(free)} a server keeps free, {fmt_bytes(plan.reserve)} of CUDA context and activation "
            "workspace).")


def weights_warning(choice: Choice, weights: float, usable: float) -> str:
    gpu = GPU_PRESETS[choice.gpu_key]
    need = smallest_layout(choice.spec, gpu, choice.weight_dtype, choice.kv_dtype, 1,
                           min(choice.context, choice.spec.max_context))
    hint = f"at least {need.describe()}" if need else "more GPUs than this calculator offers"
    return (f"The weights alone ({fmt_bytes(weights)} per GPU) do not fit in the {fmt_bytes(usable)} a server fills on "
            f"one {gpu.name}: {choice.spec.name} needs {hint} in {choice.weight_dtype.upper()}, or fewer bytes per weight.")


def users_table_section(choice: Choice) -> None:
    spec, gpu = choice.spec, GPU_PRESETS[choice.gpu_key]
    contexts = sorted(set(CONTEXT_OPTIONS) | {choice.context})
    rows = users_table(spec, gpu, choice.kv_dtype, choice.weight_dtype, contexts, choice.layout)
    served = [r.context <= spec.max_context for r in rows]
    left, right = st.columns([1, 1])                # the table's four columns whole on a 1024-pixel projector
    left.dataframe({"context": [fmt_tokens(r.context) for r in rows],
                    "cache per user": [fmt_bytes(r.kv_bytes_per_user) for r in rows],
                    "users": [r.users if ok else None for r, ok in zip(rows, served)],
                    "all of the card": [r.users_ideal if ok else None for r, ok in zip(rows, served)]},
                   hide_index=True, key="kv.users_table")
    shown = [r for r, ok in zip(rows, served) if ok]
    with right:
        plot(charts.users_figure([r.context for r in shown], [r.users for r in shown], choice.context,
                                 [r.users_ideal for r in shown]), key="kv.users_chart")
    st.caption(f"{gpu.name}: {card_size(gpu.memory_gb)} of memory per GPU. A server fills 90% of it (vLLM's default) "
               "and keeps its CUDA context and an activation workspace out; the rest, less the weights, is shared out as KV "
               "cache (blue). Grey: the best case, where weights and cache get all of the card."
               + ("" if all(served) else f" Contexts beyond {spec.name}'s {fmt_tokens(spec.max_context)} maximum are "
                  "left empty."))


def attention_variants(spec: ModelSpec) -> list[tuple[str, ModelSpec]]:
    """The model as built, then with each KV saving it uses taken away: windows, grouped-query or latent attention."""
    plain = spec.without_mla() if spec.is_mla else spec.with_full_mha()
    saves_heads = spec.is_mla or spec.n_kv_heads < spec.n_heads
    out = [("as built", spec)]
    if spec.windowed_layers:
        out.append(("no window", spec.without_window()))
    if saves_heads:
        out.append(("plain MHA" if spec.is_mla else f"full MHA ({spec.n_heads} KV heads)", plain))
    if spec.windowed_layers and saves_heads:
        out.append(("neither", plain.without_window()))
    return out


def savings_text(spec: ModelSpec, dtype: str, ctx: int) -> str:
    per_user = kv_bytes_per_user(spec, ctx, dtype)
    lines = []
    if spec.is_mla:
        ratio = kv_bytes_per_user(spec.without_mla(), ctx, dtype) / per_user
        lines.append(f"{spec.name} caches one {spec.kv_lora_rank}-value latent plus a {spec.qk_rope_head_dim}-dim RoPE "
                     f"key per layer instead of K and V for {spec.n_heads} heads: {ratio:.0f}× smaller.")
    elif spec.n_kv_heads < spec.n_heads:
        ratio = kv_bytes_per_user(spec.with_full_mha(), ctx, dtype) / per_user
        lines.append(f"{spec.name}: {spec.n_heads} query heads share {spec.n_kv_heads} K/V heads, so the cache is "
                     f"{ratio:g}× smaller than with one K/V head per query head.")
    if spec.windowed_layers:
        ratio = kv_bytes_per_user(spec.without_window(), ctx, dtype) / per_user
        lines.append(f"{spec.windowed_layers} of {spec.n_layers} layers keep only the last {spec.window - 1:,} tokens: "
                     f"at {fmt_tokens(ctx)} tokens the cache is {ratio:.1f}× smaller than if every layer kept them all.")
    return " ".join(lines) or f"{spec.name} keeps K and V for every head and every token: nothing saved."


def gqa_vs_mha_section(choice: Choice) -> None:
    """KV per user and users that fit for the model as built and without each of its KV savings."""
    gpu, ctx = GPU_PRESETS[choice.gpu_key], min(choice.context, choice.spec.max_context)
    variants = attention_variants(choice.spec)
    per_user = [kv_bytes_per_user(s, ctx, choice.kv_dtype) for _, s in variants]
    users = [users_that_fit(s, gpu, ctx, choice.weight_dtype, choice.kv_dtype, layout=choice.layout)
             for _, s in variants]
    plot(charts.gqa_mha_figure([label for label, _ in variants], per_user, users, fmt_tokens(ctx)), key="kv.gqa_mha")
    st.text(savings_text(choice.spec, choice.kv_dtype, ctx) + f" At {fmt_tokens(ctx)} tokens: "
            + ", ".join(f"{label} {fmt_bytes(b)} per user, {u:,} users" for (label, _), b, u
                        in zip(variants, per_user, users)) + ".")


# --- paged against contiguous ------------------------------------------------------------------------------

def paging_inputs() -> PagingConfig:
    cols = st.columns(5)
    capacity = cols[0].select_slider("KV memory (tokens)", options=(16384, 32768, 65536, 131072), value=32768,
                                     format_func=fmt_tokens, key="kv.paging.capacity")
    max_len = cols[1].select_slider("Max length", options=(1024, 2048, 4096), value=2048, format_func=fmt_tokens,
                                    key="kv.paging.max_len", help="What contiguous allocation reserves per request.")
    block = cols[2].select_slider("Block size", options=(8, 16, 32, 64), value=16, key="kv.paging.block")
    n = cols[3].number_input("Requests", 20, 600, 300, 10, key="kv.paging.n")
    seed = cols[4].number_input("Seed", 0, 10_000, 0, 1, key="kv.paging.seed")
    return PagingConfig(capacity_tokens=int(capacity), max_len=int(max_len), block_size=int(block),
                        n_requests=int(n), seed=int(seed), prompt_max=min(512, int(max_len) // 2),
                        output_max=min(512, int(max_len) // 2))


def paging_section(config: PagingConfig) -> None:
    try:
        result = compare(config)
    except ValueError as err:
        st.error(str(err))
        return
    cont, paged = result.contiguous, result.paged
    cols = st.columns(4)
    cols[0].metric("Wasted, contiguous", f"{cont.waste_pct:.0f}%")
    cols[1].metric("Wasted, paged", f"{paged.waste_pct:.1f}%")
    cols[2].metric("Requests at once", f"{paged.mean_running:.1f} vs {cont.mean_running:.1f}",
                   delta=f"{paged.mean_running / cont.mean_running:.1f}× more" if cont.mean_running else None,
                   help="Mean number of requests held in memory, paged vs contiguous.")
    cols[3].metric("Steps to serve all", f"{paged.makespan:,} vs {cont.makespan:,}",
                   help="Decode steps until every request finished, paged vs contiguous.")
    sample = result.requests[:6]
    lengths = [r.prompt + max(1, r.output // 2) for r in sample]
    plot(charts.block_map_figure(sample, lengths, config.max_len, config.block_size), key="kv.block_map")
    used = sum(-(-n // config.block_size) for n in lengths) * config.block_size
    st.caption(f"The first {len(sample)} requests halfway through their answers. Contiguous allocation reserves "
               f"the whole row for each ({len(sample) * config.max_len:,} tokens); paging hands out blocks of "
               f"{config.block_size} tokens as they grow (blue), {used:,} tokens in all, so the same memory holds "
               "many more requests.")
    plot(charts.paging_timeline_figure(result), key="kv.paging_timeline")
    st.caption(f"{config.n_requests} requests (prompts {config.prompt_min}–{config.prompt_max} tokens, answers "
               f"{config.output_min}–{config.output_max}) arriving at random into {fmt_tokens(config.capacity_tokens)} "
               f"tokens of KV memory. Paging preempted {paged.preemptions} requests when memory ran out (they "
               "were recomputed later).")
