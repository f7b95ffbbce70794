"""Speed and cost on GPUs: the analytic projection for any model, GPUs, precision, batch and context."""
import streamlit as st

from app.hosting.model import page_model
from app.speed.cost import moe_section, projection_section, roofline_section, sweep_section
from app.speed.cost_tokens import token_cost_section
from app.ui.hardware import hardware_controls
from engine.projection.cost import DEFAULT_BANDWIDTH_EFFICIENCY, DEFAULT_FLOPS_EFFICIENCY

lm = page_model()
st.title("Speed and cost on GPUs")
st.write("Sections 1 to 3 run nothing: every figure is computed from the model's config and the GPU's spec "
         "sheet. Prefill is timed as FLOPs ÷ peak FLOP/s, decode as bytes moved ÷ bandwidth, each times the share of "
         f"the peak a real engine reaches (by default {DEFAULT_BANDWIDTH_EFFICIENCY:.0%} of the bandwidth and "
         f"{DEFAULT_FLOPS_EFFICIENCY:.0%} of the FLOP/s, as on every page; the sliders change them), and the slower "
         "of the two limits each step. A server fills 90% of each card and keeps room for its own workspace; a "
         "configuration that does not fit is not priced. Section 4 also times the loaded model on this machine, "
         "when you press its button.")
choice = hardware_controls("cost", lm)

st.subheader("1. Memory, speed and cost")
projection = projection_section(choice)

if choice.spec.is_moe:
    st.subheader("Mixture of experts: what is held and what is read")
    moe_section(choice, projection)

st.subheader("2. The roofline")
roofline_section(choice, projection)

st.subheader("3. Batch size: throughput against per-user speed, and the price of a token")
sweep_section(choice)

st.subheader("4. Why an output token costs several times an input token")
token_cost_section(choice, lm)
