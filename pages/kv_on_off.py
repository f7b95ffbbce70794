"""The KV cache, with and without: the same answer generated both ways, each token timed."""
import streamlit as st

from app.kv.on_off import measured_section, projected_section
from app.hosting.model import page_model

lm = page_model(needed=True)
st.title("The KV cache, with and without")
st.write("To pick token n, attention needs the keys and values of every earlier token. They never change once "
         "computed, so a server keeps them (the KV cache) and each step pushes only the newest token through the "
         "model. Switch the cache off and every step must run the whole sequence again.")

st.subheader("1. The same answer, both ways, on this machine")
measured_section(lm)

st.subheader("2. On a GPU")
projected_section(lm)
