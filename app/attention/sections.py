"""Sections of the attention page, each drawn from the stored run (never by running the model again)."""
from __future__ import annotations

import streamlit as st

from app.attention import figures as charts
from app.attention import numbers as att
from app.attention import on_demand as od
from app.ui.format import fmt_bytes, token_words
from app.runs.run import Run
from app.runs.widgets import plot
from engine.errors import EngineError
from engine.service.client import ModelClient
from engine.projection.specs import MODEL_PRESETS, ModelSpec

HEATMAP_CELLS = 160     # cells per axis of the main heatmap
GRID_CELLS = 48         # cells per axis of each small multiple
ROW_CELLS = 400         # key cells of a decode step's row
ON_DEMAND_HELP = ("This run's maps are computed on the model server when you look at them, from the residual stream "
                  "it kept at every position: exact, for any layer and head.")


def pooled_note(n: int, factor: int, what: str) -> str:
    if factor == 1:
        return ""
    return (f" {what} is downsampled: {n:,} positions drawn as {-(-n // factor):,} cells per axis, each the mean "
            f"of the visible attention weights in a {factor}×{factor} block (masked cells left out).")


def layer_options(run: Run, lm: ModelClient | None) -> list[int]:
    """Every layer when the server computes the maps; else the layers whose maps the run holds."""
    if od.on_server(run, lm):
        return list(range(run.spec.n_layers))
    return att.captured_layers(run)


def heads_of(run: Run, layer: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(query heads, the K/V head each reads) of a layer: as captured, or every head (computed on demand)."""
    if layer in att.captured_layers(run):
        return att.captured_heads(run, layer)
    group = run.spec.n_heads // run.spec.n_kv_heads
    return tuple(range(run.spec.n_heads)), tuple(h // group for h in range(run.spec.n_heads))


def layer_and_head(run: Run, lm: ModelClient | None) -> tuple[int, int]:
    """Pick a layer and one of its heads (keys carry the run id: a new run starts fresh)."""
    layers = layer_options(run, lm)
    left, right = st.columns(2)
    if len(layers) > 1:
        layer = left.select_slider("Layer", options=layers, value=layers[len(layers) // 2],
                                   key=f"attention.layer.{run.id}",
                                   help=ON_DEMAND_HELP if layers != att.captured_layers(run) else None)
    else:
        layer = layers[0]
        if run.spec.n_layers > 1:
            left.caption(f"Layer {layer} is the only one of {run.spec.n_layers} layers this recording kept, and the "
                         "model that made it is not the one loaded here.")
    heads, kv_heads = heads_of(run, layer)
    head = right.select_slider("Query head", options=list(heads), key=f"attention.head.{run.id}",
                               format_func=lambda h: f"{h} (reads KV {kv_heads[heads.index(h)]})")
    return layer, heads.index(head)


def kept_line(lm: ModelClient, run: Run) -> None:
    """What the server keeps for this run, per token and in all, beside the run."""
    try:
        state = od.kept_state(lm, run)
    except EngineError as err:
        st.error(f"The model server no longer has this run's attention: {err}. Generate again to look at it.")
        return
    entering = [i for i in state.layers if i < run.spec.n_layers]
    layers = ("every layer and the final norm" if len(state.layers) == run.spec.n_layers + 1 else
              f"{len(entering)} of {run.spec.n_layers} layers (any other is rebuilt from the one below it)")
    st.caption(f"Kept on the model server, the only thing this run captured: the residual stream entering {layers}, "
               f"{fmt_bytes(state.bytes_per_position)} per token ({state.dtype}), {fmt_bytes(state.bytes)} for its "
               f"{state.positions:,} positions. Every map here is derived from it when you look; full maps would "
               f"take {fmt_bytes(full_maps_bytes(run, state))}.")


def full_maps_bytes(run: Run, state) -> float:  # noqa: ANN001 - a KeptState
    return run.spec.n_layers * run.spec.n_heads * state.positions ** 2 * 4


def server_maps(lm: ModelClient, run: Run, layer: int, fetch):  # noqa: ANN001, ANN201 - a thunk and its value
    """`fetch()` once the layer's input is on the server (rebuilt first when needed); None with a message if not."""
    try:
        return fetch() if od.ready(lm, run, layer) else None
    except EngineError as err:
        st.error(f"These maps could not be computed: {err}")
        return None


def heatmap_section(run: Run, layer: int, head_index: int, stretch: bool, lm: ModelClient | None) -> None:
    if od.needs_server(run, lm, layer):
        head = heads_of(run, layer)[0][head_index]
        pooled = server_maps(lm, run, layer, lambda: od.head_map(lm, run, layer, head, HEATMAP_CELLS))
        if pooled is None:
            return
        missing = ""
    else:
        matrix, rows = att.head_matrix(run, layer, head_index)
        pooled = att.pool(matrix, att.valid_mask(matrix.shape[0], rows), HEATMAP_CELLS)
        missing = ("" if rows.all() else " Solid grey rows were not captured (only the last row of the prompt was "
                   "kept).")
    plot(charts.heatmap_figure(pooled, run.position_texts(), stretch), key=f"attention.heatmap.{run.id}")
    st.caption("Each row is one token looking back: how its attention splits over the tokens before it. Hatched "
               "cells above the diagonal are the causal mask: a token never sees later ones. Rows after the "
               "prompt are the generated tokens, one per decode step." + missing
               + pooled_note(pooled.n, pooled.factor, "This map"))


def grid_section(run: Run, layer: int, stretch: bool, lm: ModelClient | None) -> None:
    heads, kv_heads = heads_of(run, layer)
    if od.needs_server(run, lm, layer):
        pooled = server_maps(lm, run, layer, lambda: od.layer_maps(lm, run, layer, GRID_CELLS))
        if pooled is None:
            return
    else:
        pooled = []
        for i in range(len(heads)):
            matrix, rows = att.head_matrix(run, layer, i)
            pooled.append(att.pool(matrix, att.valid_mask(matrix.shape[0], rows), GRID_CELLS))
    plot(charts.heads_grid_figure(pooled, heads, kv_heads, stretch), key=f"attention.grid.{run.id}")
    st.caption(f"All {len(heads)} query heads of layer {layer}; heads reading the same K/V head share a group."
               + pooled_note(pooled[0].n, pooled[0].factor, "Each small map"))


def summary_section(run: Run, lm: ModelClient | None) -> None:
    whole = len(att.captured_layers(run)) == run.spec.n_layers or not od.on_server(run, lm)
    try:
        summary = att.head_summary(run) if whole else od.summary(lm, run, att.LOCAL_WINDOW)
    except EngineError as err:
        st.error(f"The summaries could not be computed: {err}")
        return
    if summary is None:
        return
    plot(charts.summary_figure(summary), key=f"attention.summary.{run.id}")
    how = ("from the maps this run holds" if whole else "on the model server a tile of keys at a time, with an "
           "online softmax as FlashAttention computes attention, so no N×N map is ever held")
    st.caption(f"Per head, averaged over every query row after the first ({summary.rows:,} rows), computed {how}: "
               "entropy (low = the head looks at few tokens), the share of attention on the first token (an "
               f"'attention sink'), how many positions back the head looks on average, and the share on the last "
               f"{summary.window} positions (a local head keeps most of its weight there).")


def scrubber_section(run: Run, layer: int, stretch: bool, lm: ModelClient | None) -> None:
    if not run.steps:
        st.caption("This run produced a single token, so there is no decode step to scrub through.")
        return
    texts = run.position_texts()
    step = 1 if len(run.steps) == 1 else st.slider("Decode step", 1, len(run.steps), len(run.steps),
                                                   key=f"attention.step.{run.id}")
    row = att.step_row(run, layer, step) if layer in att.captured_layers(run) else None
    if row is None and od.on_server(run, lm):
        row = server_maps(lm, run, layer, lambda: od.row(lm, run, layer, run.n_prompt + step - 1))
    if row is None:
        st.caption("This layer was not captured at that step.")
        return
    pooled, factor = att.pool_row(row, ROW_CELLS)
    ends = step == len(run.steps) and run.done is not None and run.done.finish_reason == "eos"
    st.text(f"Step {step}: the token {token_words(run.tokens[step - 1].text)} (position "
            f"{run.n_prompt + step - 1}) looks back at {row.shape[1]:,} positions to produce "
            f"{token_words(run.tokens[step].text, ends)}.")
    heads = heads_of(run, layer)[0]
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
