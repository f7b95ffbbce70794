"""Home: what the playground shows, and one line per page."""
import streamlit as st

from app.nav import PAGES

st.title("Inference Playground")
st.write(
    "A real language model runs inside this app, and every step it takes is on screen. A prompt is cut into "
    "tokens; each token becomes a vector that passes through every layer, where attention mixes in what came "
    "before; the last layer scores every word in the vocabulary, and one is picked. Then the model goes again, "
    "one token at a time, keeping the keys and values it already computed in its KV cache.")
st.write("All figures come from the loaded model or from the configs of the models named, never from a table.")
for page in PAGES:
    st.page_link(str(page.path), label=page.title, icon=page.icon)
    st.caption(page.blurb)
