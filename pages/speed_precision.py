"""Precision: quantize a copy of the loaded model to INT8 and INT4 here, and project what precision does on a GPU."""
import streamlit as st

from app.hosting.model import page_model
from app.ui.hardware import hardware_controls
from app.speed.precision import measured_section, projected_section

lm = page_model(needed=True)
st.title("Precision")
st.write("Weights stored in fewer bits take less memory, and since a decode step reads every weight, fewer bytes "
         "can mean faster steps. The price is rounding: each weight moves to the nearest of 255 (INT8) or 16 (INT4) "
         "levels. Here you quantize a copy of the loaded model and measure what changes.")

st.subheader("1. Quantize the loaded model")
measured_section(lm)

st.subheader("2. On a GPU")
projected_section(hardware_controls("precision", lm, full=False))
