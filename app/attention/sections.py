"""Sections of the attention page, each drawn from the stored run (never by running the model again)."""
from __future__ import annotations

import numpy as np
import streamlit as st

from app.attention import numbers as att
from app.attention import figures as charts
from app.run import Run
from app.live import run_alone
from app.widgets import plot
from engine.errors import EngineError
from engine.service.client import ModelClient
from engine.projection.specs import MODEL_PRESETS, ModelSpec

HEATMAP_CELLS = 160     # cells per axis of the main heatmap
GRID_CELLS = 48         # cells per axis of each small multiple
ROW_CELLS = 400         # key cells of a decode step's row
RECAPTURE_HELP = ("This run kept fewer layers than the model has (a long prompt's maps fill the capture budget). "
                  "Choosing another captures it: the model runs once up to that layer over the run's positions, and "
                  "this session keeps that one extra layer.")


def pooled_note(n: int, factor: int, what: str) -> str:
    if factor == 1:
        return ""
    return (f" {what} is downsampled: {n:,} positions drawn as {-(-n // factor):,} cells per axis, each the mean "
            f"of a {factor}×{factor} block of attention weights.")


def layer_options(run: Run, lm: ModelClient | None) -> list[int]:
    """The layers kept, or every layer when the missing ones can be captured again."""
    if att.recapturable(run, lm.label if lm is not None else None):
        return list(range(run.spec.n_layers))
    return att.captured_layers(run)


def layer_and_head(run: Run, lm: ModelClient | None) -> tuple[Run, int, int]:
    """Pick a layer and one of its heads (keys carry the run id: a new run starts fresh). Every layer is offered
    when a long prompt kept fewer and the model is here to capture the one chosen; the run comes back with it."""
    kept, layers = att.captured_layers(run), layer_options(run, lm)
    left, right = st.columns(2)
    if len(layers) > 1:
        layer = left.select_slider("Layer", options=layers, value=kept[len(kept) // 2], key=f"attention.layer.{run.id}",
                                   help=None if layers == kept else RECAPTURE_HELP)
    else:
        layer = layers[0]
        if run.spec.n_layers > 1:
            left.caption(only_layer_note(run, layer))
    if layer not in kept:
        run = captured_again(lm, run, layer)
        layer = layer if layer in att.captured_layers(run) else kept[0]
    heads, kv_heads = att.captured_heads(run, layer)
    head = right.select_slider("Query head", options=list(heads), key=f"attention.head.{run.id}",
                               format_func=lambda h: f"{h} (reads KV {kv_heads[heads.index(h)]})")
    return run, layer, heads.index(head)


def only_layer_note(run: Run, layer: int) -> str:
    """Why there is no layer slider: the one layer this run kept, and why no other can be captured here."""
    why = ("only the last query row of each step was kept, and a full map of another layer would not fit"
           if not run.policy.prefill_matrix else "the model that ran it is not loaded here")
    return (f"Layer {layer} is the only one of {run.spec.n_layers} layers this run kept: a long prompt's maps fill "
            f"the capture budget, and {why}.")


def captured_again(lm: ModelClient, run: Run, layer: int) -> Run:
    """The run with `layer` captured in one pass over its positions; one such layer is kept per session."""
    key = f"attention.again.{run.id}"
    held = st.session_state.get(key)
    if held is None or held.layer != layer:
        st.session_state.pop(key, None)                        # free the last one before making the next
        n, guess = att.n_positions(run), run.prefill.seconds * (layer + 1) / run.spec.n_layers
        try:
            with st.spinner(f"Capturing layer {layer}: layers 0 to {layer} run over {n:,} positions (about "
                            f"{guess:.0f} s: this prompt's prefill took {run.prefill.seconds:.1f} s for all "
                            f"{run.spec.n_layers} layers)…"):
                held = run_alone(lm, "attention.layer", {"ids": list(att.run_ids(run)), "layer": layer})
        except EngineError as err:
            st.error(f"Layer {layer} could not be captured: {err}")
            return run
        held.attention = held.attention.astype(np.float16)    # as the run keeps its own (app.run.compact)
        st.session_state[key] = held
    return att.with_layer(run, held)


def heatmap_section(run: Run, layer: int, head_index: int, stretch: bool) -> None:
    matrix, rows = att.head_matrix(run, layer, head_index)
    pooled = att.pool(matrix, att.valid_mask(matrix.shape[0], rows), HEATMAP_CELLS)
    plot(charts.heatmap_figure(pooled, run.position_texts(), stretch), key=f"attention.heatmap.{run.id}")
    missing = ("" if rows.all() else " Solid grey rows were not captured (only the last row of the prompt was "
               "kept).")
    st.caption("Each row is one token looking back: how its attention splits over the tokens before it. Hatched "
               "cells above the diagonal are the causal mask: a token never sees later ones. Rows after the "
               "prompt are the generated tokens, one per decode step." + missing
               + pooled_note(pooled.n, pooled.factor, "This map"))


def grid_section(run: Run, layer: int, stretch: bool) -> None:
    heads, kv_heads = att.captured_heads(run, layer)
    pooled = []
    for i in range(len(heads)):
        matrix, rows = att.head_matrix(run, layer, i)
        pooled.append(att.pool(matrix, att.valid_mask(matrix.shape[0], rows), GRID_CELLS))
    plot(charts.heads_grid_figure(pooled, heads, kv_heads, stretch), key=f"attention.grid.{run.id}")
    st.caption(f"All {len(heads)} query heads of layer {layer}; heads reading the same K/V head share a group."
               + pooled_note(pooled[0].n, pooled[0].factor, "Each small map"))


def summary_section(run: Run) -> None:
    summary = att.head_summary(run)
    if summary is None:
        return
    plot(charts.summary_figure(summary), key=f"attention.summary.{run.id}")
    st.caption("Per head, averaged over every captured query row after the first: entropy (low = the head "
               "looks at few tokens), the share of attention on the first token (an 'attention sink'), and "
               "how many positions back the head looks on average.")


def scrubber_section(run: Run, layer: int, stretch: bool) -> None:
    if not run.steps:
        st.caption("This run produced a single token, so there is no decode step to scrub through.")
        return
    texts = run.position_texts()
    step = 1 if len(run.steps) == 1 else st.slider("Decode step", 1, len(run.steps), len(run.steps),
                                                   key=f"attention.step.{run.id}")
    row = att.step_row(run, layer, step)
    if row is None:
        st.caption("This layer was not captured at that step.")
        return
    pooled, factor = att.pool_row(row, ROW_CELLS)
    fed = run.tokens[step - 1].text
    st.text(f"Step {step}: the token {fed!r} (position {run.n_prompt + step - 1}) looks back at "
            f"{row.shape[1]:,} positions to produce {run.tokens[step].text!r}.")
    heads = att.captured_heads(run, layer)[0]
    plot(charts.step_row_figure(pooled, factor, texts, heads, stretch), key=f"attention.row.{run.id}")
    if factor > 1:
        st.caption(f"Downsampled: each cell is the mean of {factor} neighbouring positions.")


def gqa_section(spec: ModelSpec, label: str) -> None:
    target = MODEL_PRESETS["llama-3.1-8b"]
    left, right = st.columns(2)
    with left:
        plot(charts.gqa_figure(spec.n_heads, spec.n_kv_heads,
                               f"{label}: {spec.n_heads} query heads over {spec.n_kv_heads} K/V heads"),
             key="attention.gqa.loaded")
    with right:
        plot(charts.gqa_figure(target.n_heads, target.n_kv_heads,
                               f"{target.name}: {target.n_heads} query heads over {target.n_kv_heads} K/V heads"),
             key="attention.gqa.target")
    st.caption(f"Grouped-query attention: every {spec.group_size} query heads of {label} read one shared K/V "
               f"head ({target.group_size} for {target.name}), so the KV cache stores {spec.n_kv_heads} heads "
               f"per layer instead of {spec.n_heads}: {spec.group_size}× less memory per token.")
