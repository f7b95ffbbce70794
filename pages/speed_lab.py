"""Speed lab: prefill and decode timed on this machine, the decode step on this device's roofline, and
what a given number of tokens per second feels like."""
import streamlit as st

from app.ui.format import MEASURED, efficiency_note
from app.hosting.model import page_model
from app.ui.hardware import device_roof
from app.speed.lab_feel import feel_section
from app.speed.lab_measured import context_section, measured_points, roofline_section

lm = page_model(needed=True)
st.title("Speed lab")
st.write("Generating text has two phases. **Prefill** reads the whole prompt in one forward pass: many tokens "
         "share one read of the weights, so it is limited by arithmetic. **Decode** makes one token per pass: every "
         "weight is read again for a single token, so it is limited by memory bandwidth. Here both are timed on "
         "this machine with the loaded model.")
roof = device_roof(lm)

st.subheader(f"1. Longer prompts: time to first token and per-token latency ({MEASURED.lower()})")
context_section(lm, roof)

st.subheader("2. The decode step on this device's roofline")
roofline_section(lm, roof)

st.subheader("3. Feel the speed")
st.write("The same answer, streamed at exactly the rate you choose. Compare a person reading, this machine, and "
         f"projections for data-centre GPUs ({efficiency_note()}, 1K tokens of context, as on the cost page; the "
         "ceilings at 100%).")
latest = measured_points()[-1]["itl"] if measured_points() else None
feel_section(lm, 1 / latest if latest else None)
