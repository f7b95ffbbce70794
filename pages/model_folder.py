"""A model is a folder: the files the engine loaded, what they hold, and how long moving them takes."""
import streamlit as st

from app.explainers.model_folder import files_section, timing_section
from app.hosting.model import page_model

lm = page_model(needed=True)
st.title("A model is a folder")
st.write("Before any token is generated, a model is files: a config that says how to build the network, a "
         "tokenizer, and the weights. Here is the folder the loaded model came from.")

st.subheader("1. The files")
report = files_section(lm)

if report is not None:
    st.subheader("2. Reading and moving the weights")
    timing_section(lm, report)
