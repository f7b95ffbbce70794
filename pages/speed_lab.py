"""Speed lab: prefill and decode timed on this machine, the decode step on this device's roofline, and
what a given number of tokens per second feels like."""
import streamlit as st

from app.speed import lab_feel as feel
from app.speed import lab_measured as measured
from app.model import require_model
from app.speed.common import MEASURED, device_roof, efficiency_note

lm = require_model()
st.title("Speed lab")
st.write("Generating text has two phases. **Prefill** reads the whole prompt in one forward pass: many tokens "
         "share one read of the weights, so it is limited by arithmetic. **Decode** makes one token per pass: every "
         "weight is read again for a single token, so it is limited by memory bandwidth. Here both are timed on "
         "this machine with the loaded model.")
roof = device_roof(lm)

st.subheader(f"1. Longer prompts: time to first token and per-token latency ({MEASURED.lower()})")
measured.context_section(lm, roof)

st.subheader("2. The decode step on this device's roofline")
measured.roofline_section(lm, roof)

st.subheader("3. Feel the speed")
st.write("The same answer, streamed at exactly the rate you choose. Compare a person reading, this machine, and "
         f"projections for data-centre GPUs ({efficiency_note()}, 1K tokens of context, as on the cost page; the "
         "ceilings at 100%).")
latest = measured.points()[-1]["itl"] if measured.points() else None
feel.feel_section(lm, 1 / latest if latest else None)
