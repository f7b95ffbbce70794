"""Sections of the quantization page: outlier channels in the real activations, 4-bit grids that do and do not
line up with the weights, what each costs, and the bits of one weight in FP32, BF16 and FP16."""
from __future__ import annotations

import numpy as np
import streamlit as st

from app.explainers import figures as charts
from app.ui.format import MEASURED, measured_caption
from app.runs.live import measure_in_box, run_alone
from app.runs.widgets import measured, plot
from engine.errors import EngineError
from engine.lab.floatbits import FORMATS, float_bits, format_range
from engine.lab.quant_detail import OUTLIER_THRESHOLD, SCHEMES, nf4_levels
from engine.service.client import ModelClient

OUTLIERS, GRIDS = "quantlab.outlier_data", "quantlab.grid_data"
SCHEME_NAMES = {"rtn-asym-g32": "RTN, min + scale per 32", "rtn-asym-g64": "RTN, min + scale per 64",
                "rtn-sym-g32": "RTN, symmetric per 32", "rtn-sym-g64": "RTN, symmetric per 64",
                "nf4-b64": "NF4, absmax per 64"}


def measure_outliers(lm: ModelClient) -> None:
    try:
        with st.spinner("One forward pass over the text, every layer's inputs kept…"):
            st.session_state[OUTLIERS] = run_alone(lm, "quant.outliers")   # normed, resid, errors, tokens
    except EngineError as err:
        st.error(str(err))


def outlier_metrics(data: dict, layer: int) -> None:
    normed, resid, err = data["normed"], data["resid"], data["errors"][layer]
    cols = st.columns(3)
    cols[0].metric("Outlier ratio", f"{normed.ratio()[layer]:,.0f}×",
                   help="Input to q_proj: the largest channel's max |x| over the median channel's max |x|.")
    cols[1].metric(f"Channels |x| ≥ {OUTLIER_THRESHOLD:g}", f"{normed.outliers()[layer]}",
                   help="Input channels of q_proj that reach LLM.int8's outlier threshold on some token.")
    cols[2].metric("Largest residual", f"{resid.max_abs[layer].max():,.1f}",
                   help=f"The residual stream; the median channel's largest is {np.median(resid.max_abs[layer]):,.1f}.")
    cols = st.columns(3)
    cols[0].metric("INT8, per tensor", f"{err.per_tensor:.1%}",
                   help="Relative error of x Wᵀ with one INT8 scale for the whole activation matrix.")
    cols[1].metric("INT8, per token", f"{err.per_token:.1%}", help="One INT8 scale per token (row of x).")
    cols[2].metric("LLM.int8", f"{err.mixed:.1%}", help="Outlier channels kept in 16-bit, the rest INT8 per token.")


def outliers_section(lm: ModelClient) -> None:
    st.caption(measured_caption(lm) + " The input of every layer's attention projections (after its RMSNorm) and "
               "the residual stream, over a fixed English text: for each channel the largest and the mean |value| "
               "across its tokens.")
    data = measured("Measure the activations", "quantlab.outliers", OUTLIERS, lambda: measure_outliers(lm),
                    "Press the button: one forward pass over the text.")
    if data is None:
        return
    layer = st.slider("Layer", 0, lm.spec.n_layers - 1, min(15, lm.spec.n_layers - 1), key="quantlab.layer")
    outlier_metrics(data, layer)
    cols = st.columns(2)
    normed = data["normed"]
    with cols[0]:
        plot(charts.channels_figure(normed.max_abs[layer], normed.mean_abs[layer], f"layer {layer}: {normed.where}",
                                    OUTLIER_THRESHOLD), "quantlab.normed")
    with cols[1]:
        w_max, w_mean = lm.quick("quant.weight_rows", {"layer": layer})
        plot(charts.channels_figure(w_max, w_mean, f"layer {layer}: q_proj weights per input channel", None),
             "quantlab.weights")
    st.markdown(outliers_text(data, layer))


def outliers_text(data: dict, layer: int) -> str:
    err = data["errors"][layer]
    return (f"{MEASURED} over {data['tokens']} tokens. A few channels carry values far above the rest, on every "
            "token: the outlier features LLM.int8 found in large models. INT8 with one scale for the whole "
            "activation matrix must stretch its 255 levels to cover the largest value, so the ordinary channels "
            f"fall into a handful of levels (error {err.per_tensor:.1%} on this layer's q_proj output); a scale per "
            f"token helps a little ({err.per_token:.1%}); LLM.int8 keeps the {err.outlier_columns} outlier "
            f"channel(s) in 16-bit and quantizes the rest per token ({err.mixed:.1%}). The weights (right) are "
            "tamer, which is why weight-only quantization is the easy case and activations the hard one "
            "(SmoothQuant moves the difficulty from activations to weights with a per-channel scale).")


# --- grids and what they cost ------------------------------------------------------------------------------

def measure_grids(lm: ModelClient, schemes: list[str]) -> None:
    result = measure_in_box(lm, "Quantizing copies and comparing…", "quant.grids", {"schemes": schemes})
    if result is not None:
        st.session_state[GRIDS] = result                         # rows, share, tokens


def grids_table(rows: list[dict]) -> None:
    st.table({"scheme": [SCHEME_NAMES[r["scheme"]] for r in rows],
              "bits per weight": [f"{r['bits_per_weight']:.2f}" for r in rows],
              "weight error": [f"{r['weight_error']:.2%}" for r in rows],
              "top-1 agreement": [f"{r['top1_agreement']:.1%}" for r in rows],
              "perplexity": [f"{r['ppl']:.2f} ({r['ppl'] / r['ppl_reference'] - 1:+.1%})" for r in rows],
              "KL (nats/token)": [f"{r['mean_kl']:.4f}" for r in rows]})


def grids_section(lm: ModelClient) -> None:
    st.caption(measured_caption(lm) + " Each scheme rounds every decoder-block linear of a copy (the shared model is "
               "untouched), then both models read the same text once and are compared token by token.")
    plot(charts.levels_figure({"RTN (even steps)": np.linspace(-1, 1, 16).tolist(),
                                      "NF4 (normal quantiles)": nf4_levels().tolist()}),
         "quantlab.levels")
    schemes = st.pills("Schemes", list(SCHEMES), default=list(SCHEMES), format_func=SCHEME_NAMES.get,
                       selection_mode="multi", key="quantlab.schemes")
    chosen = [s for s in SCHEMES if s in schemes]
    data = measured("Quantize and compare", "quantlab.grids", GRIDS, lambda: measure_grids(lm, chosen),
                    "Press the button: a second or two per scheme.", disabled=not schemes)
    if data is None:
        return
    grids_table(data["rows"])
    st.markdown(grids_text(data))


def grids_text(data: dict) -> str:
    share = data["share"]
    aligned = (f"**{share:.1%} of the groups of 32 weights already sit on a 16-level grid** (measured): "
               + ("this model was converted from a 4-bit GGUF (Q4_1: a scale and a minimum per 32 weights), so "
                  "round-to-nearest with the same layout finds the very levels the weights came from and shows "
                  "0.00% error. That says nothing about 4-bit quality. " if share > 0.99 else
                  "the weights were never on such a grid, so every scheme pays for its rounding. "))
    return (f"{MEASURED} over {data['tokens']} tokens. " + aligned +
            "A grid that does not line up with the source (a group of 64 spans two source groups with different "
            "scales; a symmetric grid has no minimum; NF4 has uneven levels) rounds every weight again, and its cost "
            "is the real cost of 4-bit rounding on this model. Compare schemes at equal bits per weight: NF4 puts "
            "more levels near zero, where most weights are. Small models tend to lose more than large ones.")


def methods_text() -> str:
    return ("**How GPTQ, AWQ and NF4 differ from round-to-nearest.** RTN rounds each weight on its own and "
            "minimises the weight error. **GPTQ** quantizes one input column at a time and adjusts the columns not "
            "yet rounded to cancel the error so far, using the inverse of the Hessian XᵀX of a few hundred "
            "calibration sequences: it minimises the layer's *output* error. **AWQ** notes that weights meeting "
            "large activations matter most; it scales those input channels up before rounding (and the activations "
            "down by the same factor), so they get finer steps, with scales chosen on calibration data. **NF4** "
            "(QLoRA) changes the grid, not the rounding: 16 levels at the quantiles of a normal distribution, since "
            "weights are roughly normal, scaled by each block's absmax. Below, GPTQ and AWQ run on one real layer "
            "against RTN on the same grid.")


# --- GPTQ and AWQ against RTN on one layer ---------------------------------------------------------------

METHODS = "quantlab.method_data"


def measure_methods(lm: ModelClient, layer: int) -> None:
    try:
        with st.spinner("One forward pass for the layer's inputs, then RTN, GPTQ and AWQ on its q_proj…"):
            result = run_alone(lm, "quant.methods", {"layer": layer})
    except EngineError as err:
        st.error(str(err))
        return
    st.session_state[METHODS] = {"layer": layer, "result": result}


def methods_section(lm: ModelClient) -> None:
    cols = st.columns([2, 3], vertical_alignment="bottom")
    top = lm.spec.n_layers - 1
    layer = cols[0].number_input("Layer", 0, top, min(15, top), key="quantlab.m_layer")
    if cols[1].button("Compare RTN, GPTQ and AWQ on this layer's q_proj", key="quantlab.methods"):
        measure_methods(lm, int(layer))
    data = st.session_state.get(METHODS)
    if not data:
        return
    r = data["result"]
    st.table({"method": [m.method for m in r.rows], "weight error": [f"{m.weight_error:.2%}" for m in r.rows],
              "output error on held-out tokens": [f"{m.output_error:.2%}" for m in r.rows]})
    rtn_, gptq_, awq_ = r.rows
    st.markdown(f"{MEASURED}, layer {data['layer']}, symmetric INT4 per 32 inputs: calibrated on "
                f"{r.calibration_tokens} tokens of the text, tested on the other {r.test_tokens}. RTN has the "
                f"smallest weight error ({rtn_.weight_error:.1%}) but GPTQ's output error is {gptq_.output_error:.1%} "
                f"against RTN's {rtn_.output_error:.1%}, and AWQ's (α = {r.awq_alpha:g}) {awq_.output_error:.1%}: what "
                "the layer computes matters more than how close each weight is.")


# --- bits ------------------------------------------------------------------------------------------------------

def bits_section(lm: ModelClient) -> None:
    weights = lm.quick("quant.notable_weights")
    label = st.selectbox("A real weight of the loaded model", range(len(weights)),
                         format_func=lambda i: f"{weights[i][0]}: {weights[i][1]:.8g}", key="quantlab.weight")
    value = weights[label][1]
    rows = [float_bits(value, fmt) for fmt in FORMATS]
    st.table({"format": [b.fmt.upper() for b in rows], "sign": [b.sign for b in rows],
              "exponent": [b.exponent for b in rows], "mantissa": [b.mantissa for b in rows],
              "hex": [b.hex for b in rows],
              "= 2^e × 1.m": [f"2^{b.power} × {b.stored / 2.0 ** b.power:.6g}" for b in rows],
              "stored value": [f"{b.stored:.10g}" for b in rows],
              "rounding error": [f"{b.relative_error:.2e}" for b in rows]})
    ranges = [format_range(fmt) for fmt in FORMATS]
    st.table({"format": [r.fmt.upper() for r in ranges], "exponent / mantissa bits":
              [f"{r.exponent_bits} / {r.mantissa_bits}" for r in ranges],
              "largest value": [f"{r.largest:.4g}" for r in ranges],
              "smallest normal": [f"{r.smallest_normal:.4g}" for r in ranges],
              "step after 1.0": [f"{r.step_after_one:.3g}" for r in ranges]})
    st.markdown("BF16 is FP32 with the last 16 mantissa bits dropped: the same exponent, so the same range, but only "
                "about 3 significant digits. FP16 has 3 more mantissa bits (finer steps) but 3 fewer exponent bits: "
                "nothing above 65,504, and small values lose precision as subnormals. Training and serving prefer "
                "BF16 because a value out of range breaks a model, while a slightly coarser one rarely does; the "
                "residual stream measured above shows why range matters.")
