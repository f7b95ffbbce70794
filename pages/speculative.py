"""Speculative decoding: a cheap draft proposes k tokens, the model checks them all in one pass."""
import streamlit as st

from app.runs.live import last_run, run_live
from app.runs.notebook import notebook_button
from app.hosting.model import page_model
from app.runs.request import prepare
from app.speculative.sections import (TimelineView, build_draft, draft_controls, last_speculative, prompt_controls,
                                      rounds_sections, run_controls)
from app.runs.widgets import generate_button

lm = page_model(needed=True)
st.title("Speculative decoding")
st.write("A cheap draft guesses the next k tokens; the model checks them all in one forward pass and keeps them up "
         "to the first it disagrees with, plus one of its own. Same answer, fewer passes: whether that is faster "
         "depends on how often the draft is right and what it costs, both measured below.")

choice = draft_controls(lm)
k, sampling = run_controls(lm)
prompt = prompt_controls()
prepared = prepare(lm, prompt, sampling, chat=lm.has_chat_template)
if prepared.error:
    st.error(prepared.error)
clicked, stop_slot = generate_button("speculative", prepared, disabled=choice is None)

timeline = TimelineView()                       # the answer streams right under Generate; its rounds below
st.subheader("1. The answer, round by round")
timeline.chart_slot()
if clicked:
    draft = build_draft(lm, choice)
    if draft is not None:
        run_live(lm, prepared, "speculative", stop_slot, timeline.update, draft=draft, k=k)
run = last_speculative(last_run())
if run is None or not run.speculation.rounds:          # no st.stop(): see main.py
    st.caption("Nothing generated yet." if run is None else "The answer ended with its first token: no rounds.")
else:
    timeline.update(run, final=True)
    rounds_sections(run)
    notebook_button(run, lm, "speculative")
