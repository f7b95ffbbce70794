"""The sidebar every page shares: which model runs, where, in which precision, and the memory it takes."""
from __future__ import annotations

import os

import psutil
import streamlit as st
import torch

from app.format import fmt_bytes
from app.model import model_choice
from engine.card import kv_bytes_per_token, param_counts
from engine.loader import LoadedModel


def memory_rows(lm: LoadedModel) -> list[tuple[str, str]]:
    """Weights as loaded, the whole process, and the GPU allocator when there is one."""
    rows = [("Weights", fmt_bytes(lm.weight_bytes)),
            ("Process memory", fmt_bytes(psutil.Process(os.getpid()).memory_info().rss))]
    if lm.device.type == "cuda":
        rows.append(("GPU allocated", fmt_bytes(torch.cuda.memory_allocated(lm.device))))
    return rows


def model_rows(lm: LoadedModel) -> list[tuple[str, str]]:
    spec = lm.spec
    kv = kv_bytes_per_token(spec, lm.dtype_name)
    return [("Device", str(lm.device)), ("Dtype", lm.dtype_name),
            ("Parameters", f"{param_counts(spec).total / 1e6:,.1f} M"),
            ("Layers", str(spec.n_layers)),
            ("Heads (query / KV)", f"{spec.n_heads} / {spec.n_kv_heads}"),
            ("KV cache per token", fmt_bytes(kv)),
            ("Loaded in", f"{lm.load_seconds:.1f} s")]


def render_sidebar(lm: LoadedModel | None) -> None:
    with st.sidebar:
        st.subheader("Model")
        if lm is None:
            st.text(f"{model_choice().name}: not loaded")
            return
        st.text(lm.label)
        lines = [f"{name}: **{value}**" for name, value in model_rows(lm) + memory_rows(lm)]
        st.markdown("  \n".join(lines))  # our own names and numbers only, no user text
