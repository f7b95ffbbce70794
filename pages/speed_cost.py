"""Speed and cost on GPUs: the analytic projection for any model, GPU, precision, batch and context."""
import streamlit as st

from app import speed_projected as view
from app.model import get_model
from app.speed_view import hardware_controls

lm = get_model()
st.title("Speed and cost on GPUs")
st.write("Nothing runs here: every figure is computed from the model's config and the GPU's spec sheet. Prefill "
         "is timed as FLOPs ÷ peak FLOP/s, decode as bytes moved ÷ bandwidth (each times the share of the peak a "
         "real engine reaches, which you can change), and the slower of the two limits each step.")
choice = hardware_controls("cost", lm)

st.subheader("1. Memory, speed and cost")
projection = view.projection_section(choice)

st.subheader("2. The roofline")
view.roofline_section(choice, projection)

st.subheader("3. Batch size: throughput against per-user speed, and the price of a token")
view.sweep_section(choice)
