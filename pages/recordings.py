"""Recordings: finished generations saved with their captures, opened again without the model."""
import streamlit as st

from app.runs.live import last_run
from app.hosting.model import page_model
from app.ui.nav import PAGES
from app.runs.recordings import (keep_button, kept_section, recent_section, room_limits, run_notes, save_button,
                            shipped_section, store_section, upload_section)

lm = page_model()
st.title("Recordings")
st.write("A recording is one finished generation saved with everything the pages draw: the tokens, their "
         "candidates and timings, the cache after every step, and the captured attention and logit lens. "
         "Opening one makes it the run every page shows, without running the model, so a class can go on "
         "when the model is busy, slow or not loaded.")
if lm is None:
    st.info("No model is available to this session right now: recordings are the way to explore the pages.",
            icon=":material/cloud_off:")
elif (stats := lm.stats()).queued:
    st.info(f"The model is busy: {stats.queued} request(s) are waiting for it. A recording opens at once.",
            icon=":material/group:")

st.subheader("Shipped with the playground")
shipped_section()
limits = room_limits(lm)
st.subheader("Open a file")
upload_section(limits)
st.subheader("Kept on this server")
kept_section(limits)
st.subheader("Your last runs")
recent_section(limits, lm)
store_section()

run = last_run()
st.subheader("The run every page shows now")
if run is None or run.prefill is None:
    st.caption("None yet: open a recording above or generate on the journey page.")
else:
    run_notes(run)
    st.text(f"Prompt: {run.request.prompt[:300]}\nAnswer: {run.text[:300]}")
    for page in PAGES[:3]:
        st.page_link(str(page.path), label=f"See it on: {page.title}", icon=page.icon)
    save_button(run, "recordings", lm)
    keep_button(run, limits, lm)
