"""The served model as every page reaches it: one `ModelClient` per process (engine/service/client.py), loaded once,
with a progress bar the first time.

In-process (the default, `make run`): this process loads the model and serves it itself (`EngineService`).
Remote (`playground --engine-url http://host:8000`, or PLAYGROUND_ENGINE_URL): the model lives in a model server
(`python -m engine serve`) and this process holds none; pages make the same calls over HTTP.

Which model, which server, which key: this process's settings as its launcher passed them down (`settings()`,
engine/settings.py; every one in docs/settings.md).

`st.cache_resource` holds a `ModelSlot` per choice. The slot is created instantly; the first session that needs
the model loads it (or waits for the server) under the slot's lock while its page shows a progress bar, and every
later session gets the client at once. No Streamlit call happens inside the cached function.
"""
from __future__ import annotations

import functools
import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Callable

import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx

from app.hosting.hosted import hosted
from app.ui.nav import page_info
from engine.errors import EngineError
from engine.service.client import ModelClient, ServerUnavailableError, wait_until_ready
from engine.settings import Settings, SettingsError, current

MODEL_ENV, URL_ENV = "PLAYGROUND_MODEL", "PLAYGROUND_ENGINE_URL"     # named in the pages' hints
SERVER_WAIT_SECONDS = 600.0
REFUSED_KEY = "session.refused"      # set while this browser is refused a seat (the room is full): app/room/session.py
HEALTH_SECONDS = 1.0                 # a model server's health is asked at most this often per web process
RETRY_SECONDS = 2.0                  # a page that waits for the model server looks again this often
_health: dict[str, object] = {"at": -HEALTH_SECONDS, "away": None}


@dataclass(frozen=True)
class ModelChoice:
    name: str
    device: str | None
    dtype: str | None
    url: str | None = None            # a model server to use instead

    @property
    def shown(self) -> str:
        return f"the model server at {self.url}" if self.url else self.name


def settings() -> Settings:
    """This process's settings (engine/settings.py); on a page, a setting that cannot be read stops it with the
    reason (`playground` refuses such a setting before it starts anything)."""
    try:
        return current()
    except SettingsError as err:
        st.error(f"This server was started with a setting it cannot read: {err}")
        st.stop()
        raise


def model_choice() -> ModelChoice:
    """The model this process serves (or the server it uses), as its settings say."""
    s = settings()
    return ModelChoice(s.model, s.device, s.dtype, s.engine_url)


def draft_choice() -> str | None:
    """The draft the launcher named for speculative decoding ('ngram', 'early-exit:N', a model), or None."""
    return settings().draft


@dataclass
class ModelSlot:
    """Holds the one client; `get` makes it the first time (thread-safe)."""

    choice: ModelChoice
    client: ModelClient | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def get(self, progress: Callable[[float, str], None] | None = None) -> ModelClient:
        with self.lock:
            if self.client is None:
                self.client = connect(self.choice, progress)
            return self.client


def api_key() -> str | None:
    """The model server's API key: the one this process sends to a model server (`--engine-url`), or the one its
    own API door asks of clients (app/hosting/hosted.py)."""
    return settings().api_key


def connect(choice: ModelChoice, progress: Callable[[float, str], None] | None = None) -> ModelClient:
    """The remote client of the named server, the model this process hosts for its pages and its API
    (app/hosting/hosted.py, loading since the server started), or a service around a model loaded here now."""
    if choice.url:
        return wait_until_ready(choice.url, SERVER_WAIT_SECONDS, api_key(),
                                on_wait=lambda text: progress(0.5, f"Waiting for the model server: {text}")
                                if progress else None)

    model = hosted()
    return model.wait(progress) if model is not None else load_here(choice, progress)


def load_here(choice: ModelChoice, progress: Callable[[float, str], None] | None = None) -> ModelClient:
    """The model loaded in this process, served by an in-process `EngineService`."""
    from engine.core.loader import load_model  # torch and transformers: only when this process loads the model itself
    from engine.service.service import EngineService, freeze_heap

    lm = load_model(choice.name, device=choice.device, dtype=choice.dtype, progress=progress)
    service = EngineService(lm, presenter_token=settings().presenter_token, launched_draft=draft_choice())
    freeze_heap()                                 # loaded and warmed up (engine.service.service.freeze_heap)
    return service


@st.cache_resource(show_spinner=False)
def model_slot(name: str, device: str | None, dtype: str | None, url: str | None = None) -> ModelSlot:
    return ModelSlot(ModelChoice(name, device, dtype, url))


def current_slot() -> ModelSlot:
    c = model_choice()
    return model_slot(c.name, c.device, c.dtype, c.url)


def current_client() -> ModelClient | None:
    """The client once made (None before the first page made it, when it failed, or while its server is away)."""
    return None if _health["away"] else current_slot().client


def get_model() -> ModelClient | None:
    """The shared client, making it with a progress bar on first use; None (with a message) on failure.

    app/main.py calls it before every page; pages call `page_model`."""
    slot = current_slot()
    if _health["away"]:
        return None                      # its model server is restarting: pages that can, draw without it
    if slot.client is not None:
        return slot.client
    box = st.empty()
    bar = box.progress(0.0, text=f"Loading {slot.choice.shown} (first start only)…")

    def report(fraction: float, message: str) -> None:
        bar.progress(min(max(fraction, 0.0), 1.0), text=message)

    try:
        client = slot.get(report)
    except EngineError as err:
        box.error(f"The model could not be loaded: {err}")
        return None
    except Exception as err:  # noqa: BLE001 - a broken checkpoint must not leave a traceback on the page
        box.error(f"The model could not be loaded ({type(err).__name__}): {err}")
        return None
    box.empty()
    return client


def page_model(needed: bool = False) -> ModelClient | None:
    """The one way a page gets the model (app/main.py has made the client before the page runs).

    None when it did not load or this browser was refused a seat because the room is full: the pages
    that work without it draw recordings or projections instead (`offline_notice`). A page that
    `needed` it stops here when it did not load, with the reason on screen.
    """
    if not needed:
        return None if st.session_state.get(REFUSED_KEY) else current_client()
    client = get_model()
    if client is None:
        st.info(f"Set {MODEL_ENV} to a model that loads (or unset it for the embedded default), or "
                f"{URL_ENV} to a running model server, and restart.")
        st.stop()
    return client


SMALL_MODEL = "SmolLM2-135M-Instruct"     # the embedded default (engine.core.loader.EMBEDDED)


def small_model_note(label: str | None) -> str | None:
    """One line on the embedded model's weak answers (None for any other model): what it is for, and how to load a
    bigger one."""
    if label != SMALL_MODEL:
        return None
    return ("SmolLM2-135M is a tiny model, chosen so the playground runs on any laptop: expect short, often wrong "
            "answers, but every step shown is a real Llama-architecture step, which is what these pages are about. "
            "For better answers start it with a bigger model: `make models`, then `playground --model qwen-1.5b`; "
            "or `--model` a local model folder or a Hugging Face Hub id.")


def offline_notice() -> None:
    """Why this page cannot run the model, and the way to a recording."""
    if st.session_state.get(REFUSED_KEY):
        reason = "this server already serves as many sessions as it was started for"
    elif _health["away"]:
        reason = "the model is restarting (your runs are safe: the last one is shown below)"
    else:
        reason = (f"the model is not loaded on this server (set {MODEL_ENV} to a model that loads, or unset it "
                  "for the embedded default, and restart)")
    st.info(f"No model for this page: {reason}. Recordings still work: open one and this page shows it, "
            "tokens, attention, cache and all.", icon=":material/cloud_off:")
    st.page_link(str(page_info("recordings").path), label="Open a recording", icon=":material/play_circle:")


# --- while the model server restarts ------------------------------------------------------------------------------

def model_away() -> str | None:
    """With the model in a model server: None while it answers, else the line every page shows meanwhile. A look
    that found it answering serves every run of this web process for HEALTH_SECONDS; one that found it away serves
    none: each run asks again, since a look a moment old (another session's, just before the server came back) made a
    press meet the restart line with the server already answering (the hosted soak, bench/away_press.py --stale)."""
    url = model_choice().url
    now = time.monotonic()
    if not url:
        return None
    if _health["away"] is None and now - float(_health["at"]) < HEALTH_SECONDS:
        return None
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=3) as reply:
            away = None if reply.status == 200 else away_line(url)
    except (OSError, urllib.error.HTTPError):
        away = away_line(url)
    _health.update(at=now, away=away)
    return away


def away_safe(body: Callable[..., None]) -> Callable[..., None]:
    """For a fragment's body (`@st.fragment(run_every=...)` above it): its ticks run outside app/main.py's guard, so
    a model server gone between ticks is noted here (the page's next run says so), never shown as a traceback."""
    @functools.wraps(body)
    def guarded(*args, **kwargs) -> None:
        try:
            body(*args, **kwargs)
        except ServerUnavailableError:
            note_away()
    return guarded


AWAY_KEY = "model.away"             # this session's own call to the model server failed: its next run says so


def note_away() -> None:
    """A call to the model server just failed: every page of this process treats it as away until it answers, and
    this session's next run says so whatever another session's look finds meanwhile (`away_now`)."""
    url = model_choice().url
    if url:
        line = away_line(url)
        _health.update(at=time.monotonic(), away=line)
        st.session_state[AWAY_KEY] = line


def away_now() -> str | None:
    """The line this run of the page shows for a model server that is away (None while it answers): `model_away`,
    or the line this session's own failed call left (`note_away`). The process-wide look alone lost a press in the
    hosted soak: a Generate whose run met the server's restart reran the page (the press goes with that rerun), and
    another session's look had meanwhile found the server answering, so the page drew as if nothing was pressed."""
    return st.session_state.pop(AWAY_KEY, None) or model_away()


def away_line(url: str) -> str:
    """What a page says while the model cannot be reached: restarting (the room's supervisor says so) or away."""
    try:
        with open(settings().room_status or "") as f:
            state = json.load(f).get("model-server", {}).get("state")
    except (OSError, ValueError, AttributeError):
        state = None
    if state in ("restarting", "starting"):
        return ("The model is restarting; your runs are safe. This page tries again by itself in a few seconds.")
    return (f"The model server ({url}) is not answering right now; your runs are safe (kept on disk). This page tries "
            "again by itself every few seconds.")


def restart_notice(line: str) -> None:
    """The line, and a fragment that reruns the whole page as soon as the model server answers again: on its own
    ticks only, never inside the run that draws the line (`retry_tick`)."""
    st.info(line, icon=":material/autorenew:")

    @st.fragment(run_every=RETRY_SECONDS)
    def retry() -> None:
        if retry_tick() and model_away() is None:
            st.rerun(scope="app")

    retry()


def retry_tick() -> bool:
    """Is this run a fragment's own tick (not the whole page calling the fragment inline)? Rerunning the app from the
    run that drew the restart line lost a press: that run may carry one (a Generate whose run met the server away),
    `st.rerun` carries no widget states and Streamlit resets a button's trigger as every run ends, so the rerun drew
    the run from before the press; and the line, queued but not yet sent, was cleared as the rerun started. The
    hosted soak's "the page ended without a new run's link or a message" (bench/away_press.py: 6 of 6 presses lost)."""
    ctx = get_script_run_ctx()
    return bool(ctx is not None and ctx.fragment_ids_this_run)
