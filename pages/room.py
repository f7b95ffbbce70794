"""The room is the batch: who is generating on this server right now, and what batching does for them."""
import streamlit as st

from app.model import page_model
from app.session import session_id
from app.speed.room import kernel_note, live_section

lm = page_model(needed=True)
st.title("The room is the batch")
st.write("Everyone in this room shares one model. When several people press Generate, their requests do not "
         "queue one behind the other: they join the running batch at the next step, and one forward pass gives "
         "every one of them their next token. A newcomer's prompt is read in chunks between those steps, so "
         "nobody's answer freezes while it is read, and a finished answer leaves its place to the next person "
         "waiting. All of this is measured on this server, live.")
live_section(lm, session_id())
st.caption("Read the right-hand chart as the serving trade-off: each added request makes a step a little "
           "slower for everyone in it (latency), while the tokens produced per second by the whole room grow "
           "almost in step with the batch (throughput), because a step reads every weight once, whatever the "
           "number of users.")
note = kernel_note(lm)
if note:
    st.caption(note)
