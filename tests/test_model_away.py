"""A page whose call to the model server failed says so at its next run, whatever another session saw meanwhile.

Found by pressing Generate on the journey page of `playground --web-processes 2` right after its model server was
killed (the hosted soak's "the page ended without a new run's link or a message", 42.4 s into a CI run): the run
that met the restart reran the page (app/main.py), which drops the press, and the rerun asked the process-wide
look at the server, which another session's look had just found answering, so the page drew as if nothing had
been pressed. The rerun now reads this session's own failed call first (app/hosting/model.py `away_now`)."""
from __future__ import annotations

from streamlit.testing.v1 import AppTest

from servers import free_port


def failing_then_rerun_page() -> None:
    import streamlit as st

    from app.hosting.model import _health, away_now, note_away

    if not st.session_state.get("failed_once"):
        st.session_state["failed_once"] = True
        note_away()                         # this run's call to the model server failed (main.py's except)
        _health.update(away=None)           # another session's look found it answering meanwhile (restart_notice)
        st.rerun()                          # as main.py does: the press goes with this rerun
    st.write(f"away: {away_now()}")


def test_the_rerun_after_a_failed_call_says_the_model_is_away(monkeypatch):
    monkeypatch.setenv("PLAYGROUND_ENGINE_URL", f"http://127.0.0.1:{free_port()}")   # nothing listens there
    app = AppTest.from_function(failing_then_rerun_page).run(timeout=30)
    assert not app.exception
    said = app.markdown[0].value
    assert "is not answering right now" in said or "restarting" in said, said
