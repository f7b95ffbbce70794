"""The KV cache: watch it grow in the real model, then see what it costs per user on real GPUs."""
import streamlit as st

from app.kv.sections import (GrowthView, calculator_inputs, calculator_section, follow_charted_run, formula_text,
                             gqa_vs_mha_section, growth_caption, memory_section, paging_inputs, paging_section,
                             residual_text)
from app.runs.live import last_run, run_live
from app.hosting.model import offline_notice, page_model
from app.runs.recordings import run_notes
from app.speed import room
from app.runs.widgets import quick_form
from engine.projection.specs import MODEL_PRESETS

lm = page_model()
st.title("The KV cache")
st.write("Each layer keeps the keys and values of every token it has seen, so that a new token only computes "
         "its own. That memory grows with every token and every user, and it decides how many people one GPU "
         "can serve.")

st.subheader("1. Watch it grow")
clicked = False
follow_charted_run(last_run())          # the box shows the prompt of the run the chart draws
if lm is None:
    offline_notice()
else:
    prepared, clicked, stop_slot = quick_form(lm, "kv", max_new_default=64)
    notice = st.empty()
run = last_run()
if lm is not None and (clicked or run is None or run.source is None):      # the loaded model's cache
    spec, label, dtype = lm.spec, lm.label, lm.dtype_name
elif run is not None:                                                      # a recording's
    spec, label, dtype = run.spec, run.model, run.dtype
else:
    spec, dtype = MODEL_PRESETS["smollm2-135m"], "float32"
    label = spec.name
growth = GrowthView(spec, dtype)                 # the answer and the growing cache right under Generate
if clicked:
    run_live(lm, prepared, "kv", stop_slot, growth.update, notice=notice)
    run = last_run()
if run is not None:
    growth.update(run, final=True)
    if lm is not None and not clicked and prepared.request.prompt != run.request.prompt:
        st.caption("The chart still shows the last run, whose prompt was different: press Generate to chart the "
                   "prompt in the box.")
    st.caption(growth_caption(run))
    run_notes(run)
else:
    st.caption("Generate (or open a recording) to see the cache of a real run.")
st.text(f"{label} in {dtype}: " + formula_text(spec, dtype))
st.caption(residual_text(spec, dtype))

st.subheader("2. How many users fit on your GPUs")
choice = calculator_inputs(spec, label)
calculator_section(choice)
if lm is not None:
    memory_section(lm, run)

st.subheader("3. What the attention design saves: grouped-query, latent attention, windows")
gqa_vs_mha_section(choice)

st.subheader("4. Paged against contiguous allocation")
paging_section(paging_inputs())

st.subheader("5. This server's paged cache, live (measured)")
room.batch_cache_section(lm)

st.subheader("6. Prefix caching: prompts that start alike")
room.prefix_section(lm)
