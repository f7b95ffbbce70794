"""The room is the batch: who is generating on this server right now, and what batching does for them."""
import streamlit as st

from app.hosting.hosted import hosted
from app.journey.why import pick_section
from app.hosting.model import api_key, page_model
from app.room.presenter import is_presenter, presenter_board, settings_panel
from app.room.session import session_id
from app.speed.room import api_note, kernel_note, live_section
from app.speed.same_numbers import section as same_numbers

lm = page_model(needed=True)
st.title("The room is the batch")
st.write("Everyone in this room shares one model. When several people press Generate, their requests do not "
         "queue one behind the other: they join the running batch at the next step, and one forward pass gives "
         "every one of them their next token. A newcomer's prompt is read in chunks between those steps, so "
         "nobody's answer freezes while it is read, and a finished answer leaves its place to the next person "
         "waiting. All of this is measured on this server, live.")
live_section(lm, session_id())
if hosted() is not None:                       # the pages and the API in this process (app/hosting/hosted.py)
    st.caption(api_note(st.context.url, api_key(), is_presenter(st.session_state, presenter_board())))
if is_presenter(st.session_state, presenter_board()):
    settings_panel()
note = kernel_note(lm)
if note:
    st.caption(note)
st.subheader("Why was an answer slow?")
pick_section(lm)
same_numbers(lm)
