"""Attention: who each token looks at, per layer and head, with grouped-query attention made visible, at any length."""
import streamlit as st

from app.attention import on_demand as od
from app.attention.context import context_section, target_section
from app.attention.numbers import captured_layers
from app.attention.sections import (gqa_section, grid_section, heatmap_section, heads_of, kept_line, layer_and_head,
                                    layer_options, scrubber_section, summary_section)
from app.runs.live import last_run, run_live
from app.runs.notebook import notebook_button
from app.hosting.model import offline_notice, page_model
from app.runs.recordings import run_notes
from app.room.session import presenter_push, pushed_choice
from app.runs.widgets import ProgressLine, quick_form

lm = page_model()
st.title("Attention")
st.write("Every head of every layer turns each token's query into weights over the tokens before it. The maps "
         "below come from the last generation (from any page), computed from the real model's own Q and K exactly, "
         "on the model server when you look, from the residual stream the run kept (memory that grows with the "
         "length, not its square).")

if lm is None:
    offline_notice()
else:
    with st.expander("Run a request from this page", expanded=last_run() is None):
        prepared, clicked, stop_slot = quick_form(lm, "attention")
        notice, progress = st.empty(), ProgressLine()
        if clicked:
            run_live(lm, prepared, "attention", stop_slot, progress.update, notice=notice)

run = last_run()
if run is not None and run.prefill is not None and (captured_layers(run) or od.on_server(run, lm)):
    run_notes(run)
    if run.capture_note:
        st.info(run.capture_note)
    if od.on_server(run, lm):
        kept_line(lm, run)
    stretch = st.toggle("Stretch colours (√p) so small weights show", value=True, key="attention.stretch")
    layers = layer_options(run, lm)
    pushed_choice(f"attention.layer.{run.id}", "layer", layers)
    pushed_choice(f"attention.head.{run.id}", "head", list(heads_of(run, layers[0])[0]))
    layer, head_index = layer_and_head(run, lm)
    presenter_push("attention", "attention", view={"layer": layer, "head": heads_of(run, layer)[0][head_index]})
    st.subheader("One head")
    heatmap_section(run, layer, head_index, stretch, lm)
    notebook_button(run, lm, "attention", layer, heads_of(run, layer)[0][head_index])
    st.subheader(f"All heads of layer {layer}")
    grid_section(run, layer, stretch, lm)
    st.subheader("Every head at a glance")
    summary_section(run, lm)
    st.subheader("Decoding, one step at a time")
    scrubber_section(run, layer, stretch, lm)
elif run is not None and run.prefill is not None:
    st.info("The last run captured no attention (capture was off, or the model that made it is not loaded here). "
            "Generate again with capture on.")
else:
    st.info("Nothing generated yet: run a request above or on the journey page, or open a recording.")

st.subheader("Attention across the whole context")
if lm is not None:
    context_section(lm)
else:
    st.caption("The context-length slider needs the model.")
st.markdown("**The same views for Llama 3.1 8B at 32K tokens.**")
target_section()

st.subheader("Grouped-query attention")
source = lm or run
if source is not None:
    gqa_section(source.spec, lm.label if lm is not None else run.model)
else:
    st.caption("Open a recording to compare its model's heads with Llama 3.1 8B.")
