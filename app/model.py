"""The one model every session shares: loaded once per process, with a progress bar the first time.

Which model, device and dtype come from the environment, so `make run` needs no arguments:

    PLAYGROUND_MODEL   "default" (SmolLM2-135M-Instruct), an extra's key, a local folder or a hub id
    PLAYGROUND_DEVICE  "cpu", "cuda", "cuda:1" ... (default: CUDA when present)
    PLAYGROUND_DTYPE   "float32", "bf16", "fp16" ... (default: bf16 on CUDA, float32 on CPU)
    PLAYGROUND_DRAFT   the speculative page's draft: "ngram", "early-exit:N" or a model (default: none named)

`st.cache_resource` holds a `ModelSlot` per (name, device, dtype). The slot is created instantly;
the first session that needs the model loads it under the slot's lock while its page shows a
progress bar, and every later session gets the loaded model at once. No Streamlit call happens
inside the cached function, so nothing is recorded for replay.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Callable

import streamlit as st

from app.nav import page_info
from app.session import REFUSED_KEY
from engine.errors import EngineError
from engine.core.loader import LoadedModel, load_model

MODEL_ENV, DEVICE_ENV, DTYPE_ENV, DRAFT_ENV = "PLAYGROUND_MODEL", "PLAYGROUND_DEVICE", "PLAYGROUND_DTYPE", "PLAYGROUND_DRAFT"


@dataclass(frozen=True)
class ModelChoice:
    name: str
    device: str | None
    dtype: str | None


def model_choice() -> ModelChoice:
    """The model this process serves, read from the environment."""
    return ModelChoice(os.environ.get(MODEL_ENV) or "default",
                       os.environ.get(DEVICE_ENV) or None,
                       os.environ.get(DTYPE_ENV) or None)


def draft_choice() -> str | None:
    """The draft the launcher named for speculative decoding ('ngram', 'early-exit:N', a model), or None."""
    value = (os.environ.get(DRAFT_ENV) or "").strip()
    return value or None


@dataclass
class ModelSlot:
    """Holds one loaded model; `get` loads it the first time (thread-safe)."""

    choice: ModelChoice
    lm: LoadedModel | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def get(self, progress: Callable[[float, str], None] | None = None) -> LoadedModel:
        with self.lock:
            if self.lm is None:
                c = self.choice
                self.lm = load_model(c.name, device=c.device, dtype=c.dtype, progress=progress)
            return self.lm


@st.cache_resource(show_spinner=False)
def model_slot(name: str, device: str | None, dtype: str | None) -> ModelSlot:
    return ModelSlot(ModelChoice(name, device, dtype))


def current_slot() -> ModelSlot:
    c = model_choice()
    return model_slot(c.name, c.device, c.dtype)


def get_model() -> LoadedModel | None:
    """The shared model, loading it with a progress bar on first use; None (with a message) on failure.

    app/main.py calls it before every page; pages call `page_model`."""
    slot = current_slot()
    if slot.lm is not None:
        return slot.lm
    box = st.empty()
    bar = box.progress(0.0, text=f"Loading {slot.choice.name} (first start only)…")

    def report(fraction: float, message: str) -> None:
        bar.progress(min(max(fraction, 0.0), 1.0), text=message)

    try:
        lm = slot.get(report)
    except EngineError as err:
        box.error(f"The model could not be loaded: {err}")
        return None
    except Exception as err:  # noqa: BLE001 - a broken checkpoint must not leave a traceback on the page
        box.error(f"The model could not be loaded ({type(err).__name__}): {err}")
        return None
    box.empty()
    return lm


def page_model(needed: bool = False) -> LoadedModel | None:
    """The one way a page gets the model (app/main.py has loaded it before the page runs).

    None when it did not load or this browser was refused a seat because the room is full: the pages
    that work without it draw recordings or projections instead (`offline_notice`). A page that
    `needed` it stops here when it did not load, with the reason on screen.
    """
    if not needed:
        return None if st.session_state.get(REFUSED_KEY) else current_slot().lm
    lm = get_model()
    if lm is None:
        st.info(f"Set {MODEL_ENV} to a model that loads (or unset it for the embedded default) and restart.")
        st.stop()
    return lm


def offline_notice() -> None:
    """Why this page cannot run the model, and the way to a recording."""
    if st.session_state.get(REFUSED_KEY):
        reason = "this server already serves as many sessions as it was started for"
    else:
        reason = (f"the model is not loaded on this server (set {MODEL_ENV} to a model that loads, or unset it "
                  "for the embedded default, and restart)")
    st.info(f"No model for this page: {reason}. Recordings still work: open one and this page shows it, "
            "tokens, attention, cache and all.", icon=":material/cloud_off:")
    st.page_link(str(page_info("recordings").path), label="Open a recording", icon=":material/play_circle:")
