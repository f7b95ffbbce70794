"""Attention arithmetic, step by step: one head of one layer, the real numbers beside the shapes."""
import streamlit as st

from app.attention.math import matrices_section, steps_section
from app.hosting.model import page_model

lm = page_model(needed=True)
st.title("Attention, step by step")
st.write("Each head turns every token into a query q, a key k and a value v (vectors of head_dim numbers; the "
         "keys and queries already rotated by their position, RoPE). For one query, attention is five steps: a dot "
         "product with every key, a division by √head_dim so the scores do not grow with the vector length, a mask "
         "that hides the keys after the query, a softmax that turns the scores into weights summing to 1, and the "
         "weighted sum of the values. Here are the real numbers of the loaded model.")

st.subheader("1. One query, number by number")
steps_section(lm)

st.subheader("2. The whole matrix at each step")
matrices_section()
