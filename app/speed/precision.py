"""Sections of the precision page: quantized copies of the loaded model measured on this machine (memory,
decode speed, agreement, perplexity), and the projected effect of precision on a GPU.
"""
from __future__ import annotations

import streamlit as st

from app.speed import figures as charts
from app.ui.format import fmt_bytes, fmt_rate
from app.ui.format import MEASURED, measured_caption
from app.ui.hardware import HardwareChoice
from app.runs.live import run_on_model, status_progress
from app.runs.widgets import measured, plot
from engine.errors import EngineError
from engine.core.loader import EMBEDDED, ALIASES
from engine.lab.quantize import GROUP_SIZES
from engine.service.client import ModelClient

RESULTS = "precision.results"
GPU_PRECISIONS = ("fp32", "bf16", "fp8", "int8", "int4")


def inputs() -> tuple[list[str], int]:
    cols = st.columns([2, 1, 3])
    schemes = cols[0].pills("Precisions", ["INT8", "INT4"], default=["INT8", "INT4"], selection_mode="multi",
                            key="precision.schemes")
    group = cols[1].selectbox("INT4 group size", GROUP_SIZES, key="precision.group",
                              help="Inputs that share one scale and one minimum.")
    return [s.lower() for s in schemes or []], int(group)


def measure(lm: ModelClient, schemes: list[str], group: int) -> None:
    """Quantized copies (kept on the server), compared on a fixed text and timed decoding, interleaved with the
    loaded model, alone on the model in its turn."""
    with st.status("Quantizing and measuring…", expanded=True) as box:
        try:
            result = run_on_model(lm, "precision.compare", {"schemes": schemes, "group": group},
                                  status_progress(box))
        except EngineError as err:
            box.update(label="Stopped", state="error")
            st.error(str(err))
            return
        st.session_state[RESULTS] = result                        # rows, tokens
        box.update(label="Measured", state="complete", expanded=False)


def results_table(rows: list[dict]) -> None:
    """The measured rows; a copy whose weights did not move says so in its own cells."""
    same = {r["precision"] for r in on_its_grid(rows)}
    st.table({
        "precision": [r["precision"] for r in rows],
        "weights held": [fmt_bytes(r["stored_bytes"]) for r in rows],
        "bits per quantized weight": [f"{r['bits_per_weight']:.2f}" for r in rows],
        "weight error": [f"{r['weight_error']:.2%}" + (" (already on this grid)" if r["precision"] in same else "")
                         for r in rows],
        "top-1 agreement": [f"{r['agreement']:.1%}" for r in rows],
        "perplexity": [(f"{r['ppl']:.2f} ({r['ppl_change']:+.1%}"
                        + (", activations only)" if r["precision"] in same else ")")) if r["ppl"] else "reference"
                       for r in rows],
        "decode": [fmt_rate(r["tok_s"]) for r in rows],
        "matmul": [f"{r['mode']} ({r['compute']})" for r in rows],
    })


def on_its_grid(rows: list[dict]) -> list[dict]:
    """The quantized copies that reproduce the weights almost exactly (their grid is the one the weights were on)."""
    return [r for r in rows[1:] if r["weight_error"] < 1e-3]


def speed_text(rows: list[dict]) -> str:
    base = rows[0]
    parts = [f"{r['precision']} decodes at {r['tok_s'] / base['tok_s']:.2f}× the speed of {base['precision']}"
             for r in rows[1:]]
    slower = [r["precision"] for r in rows[1:] if r["tok_s"] < base["tok_s"]]
    why = ("Decode is bandwidth-bound, so fewer bytes per weight should mean proportionally faster steps, but only "
           "when a kernel reads the small integers directly and unpacks them next to the arithmetic. ")
    if slower:
        verdict = (f"Here {' and '.join(slower)} ran slower than {base['precision']}: this CPU has no fast path for "
                   "them (or loses more unpacking than it saves in bytes), and a model this small spends much of "
                   "each step outside the matrix multiplies. ")
    else:
        verdict = ("Here the quantized copies ran faster, though less than the bytes alone predict: the rest of each "
                   "step (attention, norms, the float LM head, Python) does not shrink, and the kernels also take "
                   "their activations in BF16. ")
    return (f"{MEASURED}: " + "; ".join(parts) + ". " + why + verdict +
            "On a GPU with fused low-bit kernels the bytes are what counts; see the projection below.")


def origin_note(rows: list[dict], from_4bit_file: bool) -> str | None:
    """Why a copy shows no weight error, and why its perplexity may then beat a finer format's: computed from the
    rows, shown above the table."""
    exact = on_its_grid(rows)
    if not exact:
        return None
    first = exact[0]
    where = (" The embedded model was converted from a 4-bit GGUF file, so its float weights already sit on such a "
             "grid." if from_4bit_file else "")
    text = (f"{', '.join(r['precision'] for r in exact)}: weight error {first['weight_error']:.2%}, because "
            f"round-to-nearest found the grid the weights were already on, so no weight moved.{where} Its "
            f"perplexity change ({first['ppl_change']:+.1%}) comes from the activations, which the kernel takes in "
            f"{first['compute'].upper()}, not from the weights.")
    behind = [r for r in rows[1:] if r not in exact and r["ppl"] and r["ppl_change"] > first["ppl_change"]]
    if behind:
        text += (f" That is why it comes out ahead of {', '.join(r['precision'] for r in behind)} "
                 f"({', '.join(format(r['ppl_change'], '+.1%') for r in behind)}): not better weights, but unmoved "
                 "ones, where the finer format rounded every weight a little.")
    return text


def measured_section(lm: ModelClient) -> None:
    st.caption(measured_caption(lm) + " Round-to-nearest weight-only quantization of the decoder's linear layers "
               "(embeddings, norms and the LM head stay as loaded), on a copy: the model every session uses is untouched.")
    schemes, group = inputs()
    result = measured("Quantize and measure", "precision.run", RESULTS, lambda: measure(lm, schemes, group),
                      "Press the button: quantizing takes a few seconds, timing a few more.", disabled=not schemes)
    if result is None:
        return
    rows = result["rows"]
    if note := origin_note(rows, ALIASES.get(lm.name, lm.name) in EMBEDDED):
        st.info(note, icon=":material/grid_on:")
    results_table(rows)
    cols = st.columns(3)
    labels = [r["precision"] for r in rows]
    with cols[0]:
        plot(charts.precision_bars(labels, [r["stored_bytes"] / 1e6 for r in rows], "weights held", "MB"), "precision.mem")
    with cols[1]:
        plot(charts.precision_bars(labels, [r["tok_s"] for r in rows], "decode speed", "tok/s"), "precision.speed")
    with cols[2]:
        plot(charts.precision_bars(labels, [100 * r["agreement"] for r in rows], "top-1 agreement", "%"),
             "precision.agree")
    st.caption(f"Agreement and perplexity over a fixed {result['tokens']}-token English text: at each position, does "
               "the quantized copy pick the same most likely next token, and how surprised is it by the real one?")
    st.markdown(speed_text(rows))


def projected_section(choice: HardwareChoice) -> None:
    projs = [choice.project(weight_dtype=w, context=1024) for w in GPU_PRECISIONS]
    names = [w.upper() for w in GPU_PRECISIONS]
    st.markdown(f"**{choice.label}**, batch 1, 1K tokens of context:")
    st.table({"weights": names, "weight memory": [fmt_bytes(p.weight_bytes) for p in projs],
              "fits": ["yes" if p.fits else "no" for p in projs],
              "decode ceiling": [fmt_rate(p.ceiling_tok_s_per_user) if p.fits else "does not fit" for p in projs],
              f"at {choice.bandwidth_efficiency:.0%} of peak bandwidth": [fmt_rate(p.per_user_tok_s) if p.fits else "–" for p in projs],
              "users at 1K tokens": [f"{p.users_that_fit:,}" for p in projs]})
    running = [(n, p) for n, p in zip(names, projs) if p.fits]
    if not running:
        st.info(f"{choice.spec.name} does not fit on one {choice.gpu.name} in any of these precisions; the cost page "
                "shows how many GPUs it needs.")
        return
    plot(charts.precision_bars([n for n, _ in running], [p.ceiling_tok_s_per_user for _, p in running],
                               "batch-1 decode ceiling", "tok/s", charts.PROJECTED_COLOR), "precision.projected")
    st.markdown("Fewer bytes per weight raise the batch-1 ceiling in proportion to the bytes a decode step reads, "
                "because a step takes bytes ÷ bandwidth: "
                + ", ".join(f"{fmt_rate(p.ceiling_tok_s_per_user)} in {n} ({fmt_bytes(p.weight_bytes_read)} read)"
                            for n, p in running)
                + ". Real 8- and 4-bit checkpoints add scales and keep the embeddings and the LM head in 16-bit, so "
                  "their files are larger than parameters × bits. The memory saved also holds more users' KV caches.")
