"""Attention: who each token looks at, per layer and head, with grouped-query attention made visible."""
import streamlit as st

from app.attention.numbers import captured_heads, captured_layers
from app.attention.sections import (gqa_section, grid_section, heatmap_section, layer_and_head, layer_options,
                                    scrubber_section, summary_section)
from app.live import last_run, run_live
from app.model import offline_notice, page_model
from app.recordings import run_notes
from app.session import presenter_push, pushed_choice
from app.widgets import ProgressLine, quick_form

lm = page_model()
st.title("Attention")
st.write("Every head of every layer turns each token's query into weights over the tokens before it. The maps "
         "below come from the last generation (from any page), captured inside the real model.")

if lm is None:
    offline_notice()
else:
    with st.expander("Run a request from this page", expanded=last_run() is None):
        prepared, clicked, stop_slot = quick_form(lm, "attention")
        notice, progress = st.empty(), ProgressLine()
        if clicked:
            run_live(lm, prepared, "attention", stop_slot, progress.update, notice=notice)

run = last_run()
if run is not None and run.prefill is not None and captured_layers(run):
    run_notes(run)
    if run.capture_note:
        st.info(run.capture_note)
    stretch = st.toggle("Stretch colours (√p) so small weights show", value=True, key="attention.stretch")
    pushed_choice(f"attention.layer.{run.id}", "layer", layer_options(run, lm))
    pushed_choice(f"attention.head.{run.id}", "head", list(captured_heads(run, captured_layers(run)[0])[0]))
    run, layer, head_index = layer_and_head(run, lm)
    presenter_push("attention", "attention",
                   view={"layer": layer, "head": captured_heads(run, layer)[0][head_index]})
    st.subheader("One head")
    heatmap_section(run, layer, head_index, stretch)
    st.subheader(f"All heads of layer {layer}")
    grid_section(run, layer, stretch)
    st.subheader("Every head at a glance")
    summary_section(run)
    st.subheader("Decoding, one step at a time")
    scrubber_section(run, layer, stretch)
elif run is not None and run.prefill is not None:
    st.info("The last run captured no attention (capture was off). Generate again with capture on.")
else:
    st.info("Nothing generated yet: run a request above or on the journey page, or open a recording.")

st.subheader("Grouped-query attention")
source = lm or run
if source is not None:
    gqa_section(source.spec, lm.label if lm is not None else run.model)
else:
    st.caption("Open a recording to compare its model's heads with Llama 3.1 8B.")
