"""Sections of the attention-arithmetic page: capture one layer's Q, K, V for a prompt, then walk one head's
numbers through Q·Kᵀ, ÷√d, the causal mask, softmax and the weighted sum of V, beside the shapes.

The capture (one forward pass, under the model's lock) is kept in `st.session_state[CAPTURE]` as numpy
arrays; moving the head or query sliders recomputes one head's arithmetic from it without the model.
"""
from __future__ import annotations

import numpy as np
import streamlit as st

from app.attention import figures as charts
from app.ui.format import visible
from app.ui.format import MEASURED
from app.runs.live import run_alone
from app.runs.widgets import plot
from engine.lab.attention_math import MAX_TOKENS, AttentionSteps, LayerQKV, attention_steps
from engine.errors import EngineError
from engine.service.client import ModelClient

CAPTURE = "math.capture"
DEFAULT_PROMPT = "The capital of France is Paris, and the capital of Italy is"
DIMS_SHOWN = 6


def capture(lm: ModelClient, prompt: str, layer: int) -> None:
    ids = lm.tokenizer(prompt)["input_ids"]
    try:
        st.session_state[CAPTURE] = run_alone(lm, "attention.qkv", {"ids": ids, "layer": layer})
    except EngineError as err:
        st.error(str(err))
        return
    if len(ids) > MAX_TOKENS:
        st.warning(f"The prompt has {len(ids)} tokens; the first {MAX_TOKENS} are used so every number fits on screen.")


def capture_controls(lm: ModelClient) -> None:
    cols = st.columns([5, 3, 2], vertical_alignment="bottom")
    prompt = cols[0].text_input("Prompt", DEFAULT_PROMPT, max_chars=400, key="math.prompt")
    layer = cols[1].slider("Layer", 0, lm.spec.n_layers - 1, min(3, lm.spec.n_layers - 1), key="math.layer")
    if cols[2].button("Capture", type="primary", key="math.capture_button", disabled=not prompt.strip()):
        capture(lm, prompt, layer)


def pick_head_and_query(qkv: LayerQKV) -> tuple[AttentionSteps, int]:
    t, heads = len(qkv.tokens), qkv.q.shape[0]
    cols = st.columns(2)
    head = cols[0].slider("Query head", 0, heads - 1, min(heads - 1, 1), key="math.head") if heads > 1 else 0
    labels = [f"{i}: {visible(tok)}" for i, tok in enumerate(qkv.tokens)]
    query = cols[1].selectbox("Query (the row to follow)", range(t), index=t // 2, format_func=labels.__getitem__,
                              key="math.query")
    return attention_steps(qkv, head), int(query)


def shapes_text(s: AttentionSteps) -> str:
    t, d = s.q.shape
    return (f"Layer {s.layer}, query head {s.head} reads K/V head {s.kv_head}. **Q** ({t}, {d}) · **Kᵀ** ({d}, {t}) "
            f"→ scores ({t}, {t}); ÷√{d} = ×{s.scaling:.4g}; mask: keys after the query → −∞; softmax along each "
            f"row → ({t}, {t}), rows sum to 1; · **V** ({t}, {d}) → output ({t}, {d}).")


def row_table(s: AttentionSteps, row: int) -> None:
    """For one query: every key's score through each step."""
    fmt = lambda x: "−∞" if np.isneginf(x) else f"{x:.4f}"                             # noqa: E731
    st.dataframe({"key": [f"{j}: {visible(tok)}" for j, tok in enumerate(s.tokens)],
                  "q·k": [f"{x:.4f}" for x in s.scores[row]],
                  f"÷√{s.q.shape[1]}": [f"{x:.4f}" for x in s.scaled[row]],
                  "masked": [fmt(x) for x in s.masked[row]],
                  "softmax p": [f"{x:.4f}" for x in s.probs[row]]}, hide_index=True, width="stretch",
                 height=table_height(len(s.tokens)))


def table_height(rows: int) -> int:
    """Pixels to show every row (header included), at most a screenful."""
    return min(35 * (rows + 1) + 3, 600)


def output_table(s: AttentionSteps, row: int) -> None:
    """The weighted sum for one query: p_j x v_j over the visible keys, then the output, first few dims."""
    keys = range(row + 1)
    dims = [f"dim {i}" for i in range(min(DIMS_SHOWN, s.v.shape[1]))]
    body = {"": [f"p={s.probs[row, j]:.3f} × v[{j}]" for j in keys] + ["output = Σ p·v"]}
    for i, name in enumerate(dims):
        body[name] = [f"{s.probs[row, j] * s.v[j, i]:+.4f}" for j in keys] + [f"{s.out[row, i]:+.4f}"]
    st.dataframe(body, hide_index=True, width="stretch", height=table_height(row + 2))


def steps_section(lm: ModelClient) -> None:
    capture_controls(lm)
    qkv: LayerQKV | None = st.session_state.get(CAPTURE)
    if qkv is None:
        st.info("Press **Capture**: one forward pass of the prompt; every number below comes from it.")
        return
    s, row = pick_head_and_query(qkv)
    st.markdown(shapes_text(s))
    q_row = ", ".join(f"{x:+.3f}" for x in s.q[row, :DIMS_SHOWN])
    st.markdown(f"**1–4. Scores for query {row}**: q = [{q_row}, …] ({s.q.shape[1]} "
                f"numbers, |q| = {np.linalg.norm(s.q[row]):.2f}); each key's dot product with it, scaled, masked and "
                "turned into probabilities:")
    row_table(s, row)
    st.markdown(f"**5. The weighted sum of V** (first {DIMS_SHOWN} of {s.v.shape[1]} dimensions):")
    output_table(s, row)
    st.success(f"{MEASURED}: every head's output, concatenated and through the layer's o_proj, matches the model's "
               f"own attention output to {qkv.hf_difference:.1e} (largest difference). The last row is what a decode "
               "step computes for the newest token.")


def matrices_section() -> None:
    qkv: LayerQKV | None = st.session_state.get(CAPTURE)
    if qkv is None:
        return
    s = attention_steps(qkv, min(int(st.session_state.get("math.head", 0)), qkv.q.shape[0] - 1))
    tabs = st.tabs(["Q·Kᵀ", "÷√d", "masked", "softmax"])
    figures = [(s.scores, "scores", "RdBu", 0.0), (s.scaled, "scaled", "RdBu", 0.0),
               (s.masked, "masked (grey: −∞)", "RdBu", 0.0), (s.probs, "probabilities", "Viridis", None)]
    for tab, (z, title, scale, mid) in zip(tabs, figures):
        with tab:
            plot(charts.matrix_figure(z, s.tokens, f"head {s.head}: {title}", scale, mid), f"math.{title}")
