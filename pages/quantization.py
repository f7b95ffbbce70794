"""Quantization, closely: outliers in the real activations, grids and what rounding costs, and the bits of a weight."""
import streamlit as st

from app.explainers.quantization import bits_section, grids_section, methods_section, methods_text, outliers_section
from app.hosting.model import page_model

lm = page_model(needed=True)
st.title("Quantization, closely")
st.write("Quantization stores numbers in fewer bits by rounding them to a small set of levels. How much that costs "
         "depends on where the levels sit and on the numbers being rounded. The Precision page measures speed and "
         "memory; this one looks at the numbers themselves.")

st.subheader("1. Outliers: why activations are the hard part")
outliers_section(lm)

st.subheader("2. Grids: round-to-nearest, NF4, and a grid that lines up too well")
grids_section(lm)
st.markdown(methods_text())
methods_section(lm)

st.subheader("3. One weight, bit by bit")
bits_section(lm)
