"""Quiz: questions for a class, each answer explained with numbers the engine computes."""
import streamlit as st

from app.explainers.quiz import questions, render_question, score

st.title("Quiz")
bank = questions()
st.write(f"{len(bank)} questions on what the other pages show. Pick an answer to see whether it is right and why; "
         "every number comes from the same formulas the playground uses.")

chosen = {q.key: render_question(i, q) for i, q in enumerate(bank, 1)}
answered = sum(c is not None for c in chosen.values())
st.divider()
st.metric("Score", f"{score(chosen, bank)} / {len(bank)}", help=f"{answered} of {len(bank)} answered")
if answered == len(bank) and st.button("Start again", key="quiz.reset"):
    for q in bank:
        st.session_state.pop(f"quiz.{q.key}", None)
    st.rerun()
