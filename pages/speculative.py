"""Speculative decoding: a cheap draft proposes k tokens, the model checks them all in one pass."""
import streamlit as st

from app.speculative import sections as view
from app.model import require_model
from app.speculative.numbers import measure

lm = require_model()
st.title("Speculative decoding")
st.write("Decoding runs the whole model once per token. Speculative decoding lets a cheap draft guess the next k "
         "tokens and has the model check all of them in one forward pass: it keeps the guesses up to the first "
         "one it disagrees with, plus one token of its own. The answer is exactly the model's own; only the "
         "number of passes changes. Whether that is faster depends on how often the draft is right and what it "
         "costs, both measured below.")

choice = view.draft_controls(lm)
k, sampling = view.run_controls(lm)
prompt = view.prompt_controls()
prepared = view.prepare_request(lm, prompt, sampling)
clicked, stop_slot = view.generate_button(disabled=choice is None or prepared.error is not None)

st.subheader("1. The answer, round by round")
timeline = view.TimelineView()
if clicked:
    draft = view.build_draft(lm, choice)
    if draft is not None:
        view.run_live(lm, prepared, draft, k, stop_slot, timeline)
run = view.last_spec_run()
if run is None or not run.rounds:
    st.caption("Nothing generated yet." if run is None else "The answer ended with its first token: no rounds.")
    st.stop()
timeline.update(run, final=True)
st.caption("Each row is one round: the drafted tokens, green where the model agreed and red from its first "
           "disagreement on, then the model's own token (blue: its correction; violet: the bonus when every draft "
           "passed; grey: nothing was drafted, so the round was a plain step). Hover a cell for the draft's and the "
           "model's probability of that token.")
m = measure(run)

st.subheader("2. How often the draft is right")
view.acceptance_section(run, m)

st.subheader("3. Is it faster? Measured on this machine")
view.speed_section(run, m)
view.k_section(run, m)

st.subheader("4. Projected: Llama 3.2 1B drafting for Llama 3.1 8B on an H100")
view.projection_section(m)
