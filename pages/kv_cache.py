"""The KV cache: watch it grow in the real model, then see what it costs per user on real GPUs."""
import streamlit as st

from app.kv import sections as view
from app import recordings as replay
from app.speed import room
from app.controls import last_run, offline_notice, page_model, quick_form, run_live
from engine.scheduler import scheduler_for
from engine.specs import MODEL_PRESETS

lm = page_model()
st.title("The KV cache")
st.write("Each layer keeps the keys and values of every token it has seen, so that a new token only computes "
         "its own. That memory grows with every token and every user, and it decides how many people one GPU "
         "can serve.")

st.subheader("1. Watch it grow")
clicked = False
view.follow_charted_run(last_run())          # the box shows the prompt of the run the chart draws
if lm is None:
    offline_notice()
else:
    prepared, clicked, stop_slot = quick_form(lm, "kv", max_new_default=64)
    notice = st.empty()
run = last_run()
if lm is not None and run is not None and not clicked and prepared.request.prompt != run.request.prompt:
    st.caption("The chart below still shows the last run, whose prompt was different: press Generate to chart "
               "the prompt in the box.")
if lm is not None and (clicked or run is None or run.source is None):      # the loaded model's cache
    spec, label, dtype = lm.spec, lm.label, lm.dtype_name
elif run is not None:                                                      # a recording's
    spec, label, dtype = run.spec, run.model, run.dtype
else:
    spec, dtype = MODEL_PRESETS["smollm2-135m"], "float32"
    label = spec.name
st.text(f"{label} in {dtype}: " + view.formula_text(spec, dtype))
growth = view.GrowthView(spec, dtype)
if clicked:
    run_live(lm, prepared, "kv", stop_slot, growth.update, notice=notice)
    run = last_run()
if run is not None:
    replay.run_notes(run)
    growth.update(run, final=True)
    st.caption(view.growth_caption(run))
else:
    st.caption("Generate (or open a recording) to see the cache of a real run.")

st.subheader("2. How many users fit on your GPUs")
choice = view.calculator_inputs(spec, label)
view.calculator_section(choice)
if lm is not None:
    view.memory_section(lm, run)

st.subheader("3. What the attention design saves: grouped-query, latent attention, windows")
view.gqa_vs_mha_section(choice)

st.subheader("4. Paged against contiguous allocation")
view.paging_section(view.paging_inputs())

st.subheader("5. This server's batch cache, live")
if lm is None:
    st.caption("The batch cache appears here when this server runs the model.")
else:
    st.write("Everyone generating on this server shares one batch cache: one row per request, left-padded to the "
             "longest. The padding is memory that holds nothing, which is the waste paging removes.")
    room.batch_cache_section(scheduler_for(lm))

st.subheader("6. Prefix caching: prompts that start alike")
if lm is None:
    st.caption("Prefix caching is measured when this server runs the model.")
else:
    st.write("A token's keys and values depend only on the tokens before it, so two prompts that open alike (the "
             "chat template's system prompt, or the same prompt sent by a whole room) can share the cached "
             "start: only the rest is computed.")
    room.prefix_section(lm, scheduler_for(lm))
