"""The cost page's input-against-output section: why an output token costs several times an input token, from
the throughput of prefill and of decode, measured on this machine and projected on a GPU (engine/projection/economics.py).
"""
from __future__ import annotations

import streamlit as st

from app.speed import figures as charts
from app.ui.format import fmt_tokens
from app.ui.format import MEASURED, measured_caption
from app.ui.hardware import HardwareChoice
from app.runs.live import measure_in_box
from app.runs.widgets import measured, plot
from engine.projection.economics import PRICE_BATCHES, TokenPrices, projected_token_prices, token_prices
from engine.service.client import ModelClient

PHASES = "cost.phases"
MEASURED_BATCHES = (1, 2, 4, 8)
MEASURED_PROMPT, MEASURED_NEW, MEASURED_ROUNDS = 128, 8, 2
DEFAULT_MACHINE_PRICE = 0.10


def _row_text(p: TokenPrices) -> str:
    return (f"batch {p.batch}: input {p.prefill_tok_s:,.0f} tok/s, output {p.decode_tok_s:,.0f} tok/s: one output "
            f"token costs **{p.output_per_input:,.1f}×** an input token")


def bullets(first: TokenPrices, other: TokenPrices) -> None:
    """Batch 1 and one larger batch, in words."""
    st.markdown("\n".join(f"- {_row_text(p)}" for p in ([first, other] if other is not first else [first])))


def projected_column(choice: HardwareChoice) -> None:
    rows = projected_token_prices(choice.spec, choice.gpu, PRICE_BATCHES, choice.context, choice.weight_dtype,
                                  choice.kv_dtype, choice.flops_efficiency, choice.bandwidth_efficiency,
                                  choice.dollars_per_hour, choice.layout)
    st.markdown(f"**{choice.label}**")
    if not rows:
        st.info(f"No batch fits with {fmt_tokens(choice.context)} tokens per user on these GPUs: nothing to price.")
        return
    st.caption(f"Prompts of {choice.context:,} tokens (the context per user above), all of a batch's prompts read in "
               f"one pass; then decode steps with every user holding {choice.context:,} tokens. "
               f"${choice.dollars_per_hour:g} per GPU-hour, {choice.layout.per_replica} GPU(s).")
    plot(charts.token_prices_figure(rows, measured=False), "cost.tokens.projected")
    chosen = next((r for r in rows if r.batch == choice.batch and r.batch > 1), rows[-1])
    bullets(rows[0], chosen)


def measure(lm: ModelClient, prompt: int) -> None:
    points = measure_in_box(lm, "Prefilling and decoding at each batch size…", "cost.phases",
                            {"batches": list(MEASURED_BATCHES), "prompt": prompt, "new": MEASURED_NEW,
                             "rounds": MEASURED_ROUNDS})
    if points is not None:
        st.session_state[PHASES] = points


def measured_column(lm: ModelClient | None) -> None:
    st.markdown(f"**{MEASURED}**")
    if lm is None:
        st.info("No model is loaded on this server, so nothing can be measured here.")
        return
    prompt = min(MEASURED_PROMPT, lm.spec.max_context - MEASURED_NEW)
    st.caption(measured_caption(lm) + f" At each batch size, {prompt}-token prompts read in one pass (timed: input "
               f"tokens/s), then {MEASURED_NEW - 1} decode steps of the whole batch (median step: output tokens/s); "
               f"the sizes interleaved, {MEASURED_ROUNDS} rounds.")
    price = st.number_input("This machine's price ($ per hour, your figure)", 0.0, 100.0, DEFAULT_MACHINE_PRICE,
                            0.01, key="cost.machine_price", help="What you pay for this machine; not a measurement.")
    points = measured("Measure prefill and decode here", "cost.measure_phases", PHASES, lambda: measure(lm, prompt),
                      "Press the button to time both phases on the loaded model.")
    if points is None:
        return
    rows = [token_prices(p["prefill_tok_s"], p["decode_tok_s"], float(price), p["batch"]) for p in points]
    plot(charts.token_prices_figure(rows, measured=True), "cost.tokens.measured")
    bullets(rows[0], rows[-1])


def token_cost_section(choice: HardwareChoice, lm: ModelClient | None) -> None:
    st.write("A GPU costs the same per hour whether it is reading prompts or writing answers, so a token costs the "
             "time its phase needs: output ÷ input = (input tokens/s in prefill) ÷ (output tokens/s in decode). "
             "Prefill pushes every prompt token through each weight it reads: one read serves the whole prompt, and "
             "the pass is compute-bound. Decode gives each user one token per step and reads all the weights (and "
             "every user's cache) again for it: the step is bandwidth-bound. Batching shares the weight read among "
             "the users of a step and narrows the gap, but the caches are still read every step, so an output "
             "token stays several times dearer. API price lists, too, charge more for an output token than for an "
             "input token.")
    left, right = st.columns(2)
    with left:
        measured_column(lm)
    with right:
        projected_column(choice)
