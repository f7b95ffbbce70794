"""The journey of a request: the answer streaming under Generate, then the tokens, the shapes through the model,
the steps, and one token up close."""
import streamlit as st

from app.journey.sections import ResultView, run_up_close, shapes_section, tokenization_section
from app.runs.live import last_run, run_live
from app.hosting.model import offline_notice, page_model, small_model_note
from app.runs.recordings import run_notes
from app.runs.request import new_token_limit, prepare
from app.room.session import presenter_push
from app.runs.widgets import generate_button, prompt_box, sampling_controls, state_defaults

lm = page_model()
st.title("The journey of a request")
st.write("Type a prompt and press Generate: the answer streams right below. Further down, what happened on the "
         "way: the prompt as tokens, their shapes through every layer (prefill), then one step per new token "
         "(decode), each reading the KV cache.")

clicked = False
if lm is None:
    offline_notice()
    sampling = sampling_controls("journey")
else:
    prompt = prompt_box("journey", height=90)
    sampling = sampling_controls("journey", max_new_limit=new_token_limit(lm))
    left, right = st.columns(2)
    state_defaults({"journey.chat": lm.has_chat_template, "journey.capture": True})
    if not lm.has_chat_template:                   # a recording made with a template: this model has none
        st.session_state["journey.chat"] = False
    chat = left.toggle("Use the chat template", key="journey.chat", disabled=not lm.has_chat_template)
    capture = right.toggle("Capture internals (attention, logit lens)", key="journey.capture",
                           help="Off: the run keeps no residual stream, so nothing can be derived from it.")
    prepared = prepare(lm, prompt, sampling, chat)
    if prepared.error:
        st.error(prepared.error)
    clicked, stop_slot = generate_button("journey", prepared)
    notice = st.empty()
    presenter_push("journey", "journey")

result = ResultView(running=lambda: lm.stats().running)      # the answer, where the person is looking
run = last_run()
if not clicked:
    run_notes(run, origin=False)                 # where a recording was made: under its times
    if run is None or run.prefill is None:
        st.caption("Nothing generated yet.")
    else:
        result.update(run, final=True)
if note := small_model_note(lm.label if lm is not None else run.model if run is not None else None):
    st.caption(note)

if lm is not None:
    st.subheader("1. Tokens")
    tokenization_section(lm, prepared)
    st.subheader("2. Shapes through the model")
    shapes_section(lm, len(prepared.ids))
st.subheader("3. Prefill, then one step per token")
result.timeline_slot()
if clicked:
    run_live(lm, prepared, "journey", stop_slot, result.update, capture, notice)
    run = last_run()
# No st.stop() below: main.py draws the presenter's strip after the page.
if run is not None and run.prefill is not None:
    result.update(run, final=True)
    result.why(run)
    run_up_close(lm, run, sampling)
else:
    st.caption("The timeline of the steps appears here after a run.")
