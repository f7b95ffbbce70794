"""Home: what the playground shows, a tour for a class in the sidebar's order, then every page by group."""
import streamlit as st

from app.hosting.model import current_client, small_model_note
from app.ui.nav import TOUR, menu, page_info

st.title("Inference Playground")
st.write(
    "A real language model runs inside this app, and every step it takes is on screen. A prompt is cut into "
    "tokens; each token becomes a vector that passes through every layer, where attention mixes in what came "
    "before; the last layer scores every word in the vocabulary, and one is picked. Then the model goes again, "
    "one token at a time, keeping the keys and values it already computed in its KV cache.")
client = current_client()
if note := small_model_note(client.label if client is not None else None):
    st.caption(note)

st.subheader("Start here: a tour for a class")
st.write(f"{len(TOUR)} pages in the sidebar's order, two or three minutes each; on a projector, *Presenter layout* "
         "at the foot of the sidebar gives larger type.")
for number, stop in enumerate(TOUR, start=1):
    info = page_info(stop.url_path)
    st.page_link(str(info.path), label=f"{number}. {info.title} ({stop.minutes})", icon=info.icon)
    st.caption(stop.what)

st.subheader("Every page")
st.write("All figures come from the loaded model or from the configs of the models named, never from a table.")
for section, pages in menu().items():
    st.markdown(f"**{section}**")
    for page in pages:
        st.page_link(str(page.path), label=page.title, icon=page.icon)
        st.caption(page.blurb)
