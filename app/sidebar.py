"""The sidebar every page shares: which model runs, where, in which precision, and the memory it takes;
the queue in front of it; and the presenter-mode box when the server was started with a token."""
from __future__ import annotations

import os

import psutil
import streamlit as st

from app.ui.format import CONVENTION, fmt_bytes
from app.room.join import join_panel
from app.hosting.model import model_choice
from app.room.presenter import PresenterError, is_presenter, presenter_board, presenter_box, unlock
from engine.projection.card import kv_bytes_per_token, param_counts
from engine.service.client import ModelClient


def memory_rows(lm: ModelClient) -> list[tuple[str, str]]:
    """Weights as loaded, the model's process, and the GPU allocator when there is one (measured where the model
    is); with a remote model, this web process too."""
    rows = [(row.name, fmt_bytes(row.bytes)) for row in lm.memory()]
    if lm.transport != "in-process":
        rows.append(("This web process", fmt_bytes(psutil.Process(os.getpid()).memory_info().rss)))
    return rows


def model_rows(lm: ModelClient) -> list[tuple[str, str]]:
    spec = lm.spec
    kv = kv_bytes_per_token(spec, lm.dtype_name)
    return [("Device", str(lm.device)), ("Dtype", lm.dtype_name),
            ("Parameters", f"{param_counts(spec).total / 1e6:,.1f} M"),
            ("Layers", str(spec.n_layers)),
            ("Heads (query / KV)", f"{spec.n_heads} / {spec.n_kv_heads}"),
            ("KV cache per token", fmt_bytes(kv)),
            ("Loaded in", f"{lm.load_seconds:.1f} s"),
            ("Served", "in this process" if lm.transport == "in-process" else f"by the model server at {lm.url}")]


def queue_line(lm: ModelClient) -> str:
    """How busy the shared model is right now: the batch, the line, the step time (measured)."""
    stats = lm.stats()
    if not stats.running and not stats.queued:
        return f"The model is free. {stats.sessions} session(s) here."
    step = f"; a step takes {stats.step_seconds * 1e3:.0f} ms" if stats.step_seconds else ""
    return (f"The batch: {stats.running} of {stats.max_batch} places in use, {stats.queued} waiting{step}. "
            f"{stats.sessions} session(s) here.")


def render_sidebar(lm: ModelClient | None) -> None:
    with st.sidebar:
        st.subheader("Model")
        if lm is None:
            st.text(f"{model_choice().name}: not loaded")
        else:
            st.text(lm.label)
            lines = [f"{name}: **{value}**" for name, value in model_rows(lm) + memory_rows(lm)]
            st.markdown("  \n".join(lines))  # our own names and numbers only, no user text
            st.caption(queue_line(lm))
        st.caption(CONVENTION)                             # the one statement of the units every page uses
        board = presenter_board()
        if board.enabled:
            token = st.session_state.get("presenter.token_input")
            if token and not is_presenter(st.session_state, board):
                try:
                    unlock(st.session_state, board, token)   # so the box below already shows the presenter's view
                except PresenterError:
                    pass                                     # the box below says how long to wait
            presenter_box(board)
            if is_presenter(st.session_state, board):
                join_panel()                                 # the room's join link and QR code
