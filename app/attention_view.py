"""Sections of the attention page, each drawn from the stored run (never by running the model again)."""
from __future__ import annotations

import streamlit as st

from app import attention as att
from app import attention_charts as charts
from app.run import Run
from app.view import plot
from engine.specs import MODEL_PRESETS, ModelSpec

HEATMAP_CELLS = 160     # cells per axis of the main heatmap
GRID_CELLS = 48         # cells per axis of each small multiple
ROW_CELLS = 400         # key cells of a decode step's row


def pooled_note(n: int, factor: int, what: str) -> str:
    if factor == 1:
        return ""
    return (f" {what} is downsampled: {n:,} positions drawn as {-(-n // factor):,} cells per axis, each the mean "
            f"of a {factor}×{factor} block of attention weights.")


def layer_and_head(run: Run) -> tuple[int, int]:
    """Pick a captured layer and one of its heads (keys carry the run id: a new run starts fresh)."""
    layers = att.captured_layers(run)
    left, right = st.columns(2)
    layer = left.select_slider("Layer", options=layers, value=layers[len(layers) // 2],
                               key=f"attention.layer.{run.id}")
    heads, kv_heads = att.captured_heads(run, layer)
    head = right.select_slider("Query head", options=list(heads), key=f"attention.head.{run.id}",
                               format_func=lambda h: f"{h} (reads KV {kv_heads[heads.index(h)]})")
    return layer, heads.index(head)


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
