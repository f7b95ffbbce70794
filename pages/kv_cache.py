"""The KV cache: watch it grow in the real model, then see what it costs per user on real GPUs."""
import streamlit as st

from app import kv_view as view
from app.controls import last_run, quick_form, run_live
from app.model import require_model

lm = require_model()
st.title("The KV cache")
st.write("Each layer keeps the keys and values of every token it has seen, so that a new token only computes "
         "its own. That memory grows with every token and every user, and it decides how many people one GPU "
         "can serve.")

st.subheader("1. Watch it grow")
st.text(f"{lm.label} in {lm.dtype_name}: " + view.formula_text(lm.spec, lm.dtype_name))
prepared, clicked, stop_slot = quick_form(lm, "kv", max_new_default=64)
growth = view.GrowthView(lm.spec, lm.dtype_name)
if clicked:
    run_live(lm, prepared, "kv", stop_slot, growth.update)
run = last_run()
if run is not None:
    growth.update(run, final=True)
    st.caption("Each band is one layer's K and V tensors, read from the cache object after every step; the dashed "
               "line is the formula above. The first jump is the prompt (prefill), then one token per step.")
else:
    st.caption("Generate to see the cache of a real run.")

st.subheader("2. How many users fit on one GPU")
choice = view.calculator_inputs(lm.spec, lm.label)
view.calculator_section(choice)

st.subheader("3. Grouped-query against full multi-head attention")
view.gqa_vs_mha_section(choice)

st.subheader("4. Paged against contiguous allocation")
view.paging_section(view.paging_inputs())
