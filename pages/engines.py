"""Where the real engines do it: each mechanism shown here, where its idea comes from, and where to read the code."""
import streamlit as st

from app.explainers.engines import ENGINES, MECHANISMS, REPOS, table

st.title("Where the real engines do it")
st.write("Every page of the playground runs one mechanism in plain PyTorch so you can watch it. Production engines "
         "do the same things with custom kernels and schedulers. Here is where to read each one next.")
st.markdown(" · ".join(f"[{name}]({REPOS[name]})" for name in ENGINES))
for m in MECHANISMS:
    st.subheader(m.name)
    st.caption(f"In the playground: {m.page}.")
    st.write(m.origin)
    st.table(table(m))
