"""FlashAttention and kernel fusion: eager attention against one fused kernel, measured here and projected."""
import streamlit as st

from app.explainers.flash_attention import measured_section, projected_section
from app.hosting.model import page_model

lm = page_model(needed=True)
st.title("FlashAttention and kernel fusion")
st.write("Attention scores every query against every key: for a prompt of N tokens that is an N × N matrix per "
         "head. Written plainly (\"eager\"), each step is its own kernel: Q·Kᵀ writes the matrix to memory, scaling "
         "reads it and writes it again, so do the mask, the softmax and the cast back, and the product with V reads "
         "it once more. A fused kernel (FlashAttention, and PyTorch's `scaled_dot_product_attention`) does all of "
         "it in one pass over tiles of K and V, keeping a running softmax on chip: the matrix is never written out.")

st.subheader("1. Eager against fused, on this machine")
measured_section(lm)

st.subheader("2. On a GPU, from the memory traffic")
projected_section(lm)
