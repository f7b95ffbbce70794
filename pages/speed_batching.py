"""Batching: a simulated serving engine on projected GPUs, and real batched generation on this machine."""
import streamlit as st

from app.hosting.model import page_model
from app.speed.batching import long_prompt_section, real_section, simulation_section, sweep_section, target_inputs
from app.ui.hardware import device_roof, hardware_controls

lm = page_model(needed=True)
st.title("Batching")
st.write("A decode step reads every weight once, whether it produces a token for one user or for two hundred. "
         "Serving many users in the same step is how a GPU goes from idle arithmetic units to full ones, and how "
         "the price of a token falls.")

st.subheader("1. A serving engine, simulated")
choice = hardware_controls("batching", lm, full=False)
targets = target_inputs()
simulation_section(choice, targets)

st.subheader("2. Long prompts: chunked prefill and disaggregation")
long_prompt_section(choice, targets)

st.subheader("3. The batch limit: throughput against latency")
sweep_section(choice)

st.subheader("4. Real batching on this machine")
real_section(lm, device_roof(lm))
