"""Attention: who each token looks at, per layer and head, with grouped-query attention made visible."""
import streamlit as st

from app import attention_view as view
from app.attention import captured_layers
from app.controls import last_run, quick_form, run_live
from app.model import require_model
from app.view import ProgressLine

lm = require_model()
st.title("Attention")
st.write("Every head of every layer turns each token's query into weights over the tokens before it. The maps "
         "below come from the last generation (from any page), captured inside the real model.")

with st.expander("Run a request from this page", expanded=last_run() is None):
    prepared, clicked, stop_slot = quick_form(lm, "attention")
    progress = ProgressLine()
    if clicked:
        run_live(lm, prepared, "attention", stop_slot, progress.update)

run = last_run()
if run is not None and run.prefill is not None and captured_layers(run):
    if run.capture_note:
        st.info(run.capture_note)
    stretch = st.toggle("Stretch colours (√p) so small weights show", value=True, key="attention.stretch")
    layer, head_index = view.layer_and_head(run)
    st.subheader("One head")
    view.heatmap_section(run, layer, head_index, stretch)
    st.subheader(f"All heads of layer {layer}")
    view.grid_section(run, layer, stretch)
    st.subheader("Every head at a glance")
    view.summary_section(run)
    st.subheader("Decoding, one step at a time")
    view.scrubber_section(run, layer, stretch)
elif run is not None and run.prefill is not None:
    st.info("The last run captured no attention (capture was off). Generate again with capture on.")
else:
    st.info("Nothing generated yet: run a request above or on the journey page.")

st.subheader("Grouped-query attention")
view.gqa_section(lm.spec, lm.label)
