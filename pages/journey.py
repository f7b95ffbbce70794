"""The journey of a request: tokens in, shapes through the model, the answer streaming out."""
import streamlit as st

from app.journey.sections import ResultView, run_up_close, shapes_section, tokenization_section
from app.live import last_run, run_live
from app.model import offline_notice, page_model
from app.recordings import run_notes
from app.request import new_token_limit, prepare
from app.session import presenter_push
from app.widgets import generate_button, prompt_box, sampling_controls

lm = page_model()
st.title("The journey of a request")
st.write("Type a prompt and press Generate. The prompt becomes tokens, the tokens go through every layer "
         "once (prefill), and then the model produces one token per step (decode), reading its KV cache.")

clicked = False
if lm is None:
    offline_notice()
    sampling = sampling_controls("journey")
else:
    prompt = prompt_box("journey")
    sampling = sampling_controls("journey", max_new_limit=new_token_limit(lm))
    left, right = st.columns(2)
    chat = left.toggle("Use the chat template", value=lm.has_chat_template, key="journey.chat",
                       disabled=not lm.has_chat_template)
    capture = right.toggle("Capture internals (attention, logit lens)", value=True, key="journey.capture",
                           help="Off: the run keeps no residual stream, so nothing can be derived from it.")
    prepared = prepare(lm, prompt, sampling, chat)
    if prepared.error:
        st.error(prepared.error)
    clicked, stop_slot = generate_button("journey", prepared)
    notice = st.empty()
    presenter_push("journey", "journey")

    st.subheader("1. Tokens")
    tokenization_section(lm, prepared)
    st.subheader("2. Shapes through the model")
    shapes_section(lm, len(prepared.ids))

st.subheader("3. The answer, token by token")
if not clicked:
    run_notes(last_run())
result = ResultView(running=lambda: lm.stats().running)
if clicked:
    run_live(lm, prepared, "journey", stop_slot, result.update, capture, notice)
run = last_run()
# No st.stop() below: main.py draws the presenter's strip after the page.
if run is None or run.prefill is None:
    st.caption("Nothing generated yet.")
else:
    result.update(run, final=True)
    run_up_close(lm, run, sampling)
