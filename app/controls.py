"""Shared widgets: the prompt box, sampling controls, the Generate / Stop pair that runs a request live,
and what every page needs from the server: this session's id, its place in the room, the presenter.

Every widget key is namespaced by the page (`journey.temperature`, `kv.prompt`, ...). Input that
the engine would reject is caught here, before the model runs, and its message is shown next to the
prompt box by the page; the scheduler checks it again when the request is submitted.
"""
from __future__ import annotations

import hashlib
import math
import uuid
from dataclasses import dataclass
from typing import Any, Callable

import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx

from app.model import MODEL_ENV, current_slot
from app.nav import HOME, PAGES, PageInfo
from app.presenter import (PENDING_KEY, SEEN_KEY, TOKEN_KEY, follow_page, is_presenter, may_generate, new_broadcast,
                           presenter_board, push_button, pushed_view)
from app.run import LAST_RUN, Run, capture_policy, new_run, stream_generation
from engine.drafts import Draft
from engine.errors import EngineError
from engine.generate import GenerationRequest, check_context, encode_prompt, validate
from engine.limits import check_prompt_chars, check_tokens
from engine.loader import LoadedModel
from engine.scheduler import QueueStatus, SessionLimitError, scheduler_for

XSRF_COOKIE = "_streamlit_xsrf"     # set by Streamlit's server on the first page load, kept by the browser

DEFAULT_PROMPT = "Explain in two sentences why the sky is blue."
MAX_NEW_LIMIT = 512
SESSION_KEY, REFUSED_KEY = "session.id", "session.refused"
# widget key after "<page>." -> (label, kind, lowest, highest): stored settings outside are put back in range
SETTING_RANGES = {"temperature": ("Temperature", float, 0.0, 2.0), "top_k": ("Top-k", int, 0, 1000),
                  "top_p": ("Top-p", float, 0.05, 1.0), "seed": ("Seed", int, 0, 2**31 - 1),
                  "max_new": ("Max new tokens", int, 1, MAX_NEW_LIMIT)}


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    max_new_tokens: int = 48


@dataclass
class Prepared:
    """A request checked against the engine's rules, with the ids the model will read."""

    request: GenerationRequest
    ids: list[int]                 # model input (chat template included)
    prompt_ids: list[int]          # the prompt text alone
    error: str | None = None


def prompt_box(ns: str, default: str = DEFAULT_PROMPT, height: int = 110) -> str:
    key = f"{ns}.prompt"
    if key not in st.session_state:                # a push or a recording may have set it already
        st.session_state[key] = default
    return st.text_area("Prompt", height=height, key=key,
                        help="For instruct models the prompt is wrapped in the chat template before tokenizing.")


def sampling_controls(ns: str, max_new_default: int = 48, max_new_limit: int = MAX_NEW_LIMIT) -> Sampling:
    for message in sanitize_settings(ns, max_new_limit):
        st.warning(message)
    cols = st.columns(5)
    temperature = cols[0].slider("Temperature", 0.0, 2.0, 0.0, 0.05, key=f"{ns}.temperature",
                                 help="0 picks the most likely token every time (greedy).")
    top_k = cols[1].number_input("Top-k", 0, 1000, 0, 1, key=f"{ns}.top_k", help="Keep only the k most likely tokens; 0 = off.")
    top_p = cols[2].slider("Top-p", 0.05, 1.0, 1.0, 0.05, key=f"{ns}.top_p",
                           help="Keep the smallest set of tokens whose probabilities add up to p; 1 = off.")
    seed = cols[3].number_input("Seed", 0, 2**31 - 1, 0, 1, key=f"{ns}.seed", help="Same seed, same sampled answer.")
    max_new = cols[4].number_input("Max new tokens", 1, max_new_limit, min(max_new_default, max_new_limit), 1,
                                   key=f"{ns}.max_new", help=f"This server allows at most {max_new_limit}.")
    return Sampling(float(temperature), int(top_k), float(top_p), int(seed), int(max_new))


def sanitize_settings(ns: str, max_new_limit: int = MAX_NEW_LIMIT) -> list[str]:
    """Put stored settings the widgets cannot show (a push, a stale value) back in range; says what changed."""
    messages = []
    for name, (label, kind, low, high) in SETTING_RANGES.items():
        key = f"{ns}.{name}"
        if key not in st.session_state:
            continue
        high = max_new_limit if name == "max_new" else high
        value, fixed = st.session_state[key], in_range(st.session_state[key], kind, low, high)
        if fixed is None:
            del st.session_state[key]
        elif type(fixed) is not type(value) or fixed != value:
            st.session_state[key] = fixed
        if fixed is None or fixed != value:
            now = "back at its default" if fixed is None else f"set to {number(fixed)}"
            messages.append(f"{label} was {str(value)[:40]}; this page takes {number(low)} to {number(high)}, "
                            f"so it is {now}.")
    return messages


def in_range(value: Any, kind: type, low: float, high: float) -> int | float | None:
    """`value` as `kind` clamped to [low, high]; None when it is not a number at all."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return kind(min(max(value, low), high))


def number(x: int | float) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:g}"


def new_token_limit(lm: LoadedModel) -> int:
    """The most new tokens a widget offers: the page's limit or the server's, whichever is lower."""
    return min(MAX_NEW_LIMIT, scheduler_for(lm).limits.max_new_tokens)


def prepare(lm: LoadedModel, prompt: str, sampling: Sampling, chat: bool = True) -> Prepared:
    """Build the request and check it the way the engine will; the error is a message, never a traceback."""
    request = GenerationRequest(prompt, sampling.max_new_tokens, sampling.temperature, sampling.top_k,
                                sampling.top_p, sampling.seed, chat=chat)
    ids: list[int] = []
    prompt_ids: list[int] = []
    try:
        validate(request)
        check_prompt_chars(scheduler_for(lm).limits, prompt)          # a len() before the tokenizer runs
        ids = encode_prompt(lm, request)
        prompt_ids = lm.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        check_context(lm, len(ids), request.max_new_tokens)
        check_tokens(scheduler_for(lm).limits, len(ids), request.max_new_tokens)
    except EngineError as err:
        return Prepared(request, ids, prompt_ids, str(err))
    return Prepared(request, ids, prompt_ids)


def generate_button(ns: str, prepared: Prepared, disabled: bool = False) -> tuple[bool, st.delta_generator.DeltaGenerator]:
    """The Generate button and an empty slot beside it where Stop appears while the answer streams."""
    allowed = may_generate(st.session_state, presenter_board())
    left, right, _ = st.columns([3, 2, 7])              # wide enough for "Generate" on a 1024-px projector
    clicked = left.button("Generate", type="primary", key=f"{ns}.generate",
                          disabled=disabled or prepared.error is not None or not allowed)
    if not allowed:
        st.caption("The presenter runs the model for the room: their run appears here as it streams, and every "
                   "page draws it. Generating your own is off until the presenter allows it.")
    return clicked, right.empty()


def run_live(lm: LoadedModel, prepared: Prepared, ns: str, stop_slot: st.delta_generator.DeltaGenerator,
             on_record: Callable[[Run], None], capture: bool = True,
             notice: st.delta_generator.DeltaGenerator | None = None, draft: Draft | None = None,
             k: int = 0) -> Run | None:
    """Stream one generation into the page through the scheduler; the run becomes LAST_RUN at its first record.

    With a `draft`, speculative decoding drafting `k` tokens a round, then plain decoding of the same request
    for the measured speedup (`run.speculation`); `on_record` follows both.

    `notice` (a slot under the Generate button) shows the queue position while waiting, and a refusal
    or failure as a message. Returns the run, or None when the server refused the request.
    """
    limits = scheduler_for(lm).limits
    policy, note = capture_policy(lm.spec, len(prepared.ids), prepared.request.max_new_tokens, capture,
                                  limits.max_capture_bytes, limits.max_capture_layers)
    run = new_run(lm, prepared.request, policy, note, draft, k)
    notice = notice if notice is not None else st.empty()
    stop_slot.button("Stop", key=f"{ns}.stop", help="Stops the answer where it is (or leaves the queue); what "
                                                    "streamed so far stays.")

    board = presenter_board()

    def record(r: Run) -> None:
        if st.session_state.get(LAST_RUN) is not r:
            st.session_state[LAST_RUN] = r
            notice.empty()
            if is_presenter(st.session_state, board):
                board.broadcast(st.session_state.get(TOKEN_KEY), r)     # every follower watches this run
        on_record(r)

    def wait(status: QueueStatus) -> None:
        if run.prefill is None:                  # after the first token the answer itself shows progress
            show_wait(notice, status)

    try:
        stream_generation(lm, run, record, wait, session_id(), draft)
    except EngineError as err:
        notice.error(str(err))
        return None
    finally:
        stop_slot.empty()
    if run.warning:
        notice.warning(run.warning)
    elif run.prefill is None:
        notice.empty()
    return run if run.prefill is not None else None


def show_wait(slot: st.delta_generator.DeltaGenerator, status: QueueStatus) -> None:
    """The queue position and estimated wait, and a way to a recording meanwhile."""
    if status.state != "queued":
        slot.info(wait_message(status), icon=":material/hourglass_top:")
        return
    with slot.container():
        st.info(wait_message(status), icon=":material/group:")
        st.page_link(str(page_info("recordings").path), label="Open a recording meanwhile",
                     icon=":material/play_circle:")


def wait_message(status: QueueStatus) -> str:
    if status.state != "queued":
        return "Your request joined the batch: the model is reading your prompt (prefill)…"
    place = "next in line" if status.ahead == 0 else f"number {status.position} in line ({status.ahead} before you)"
    eta = ("no estimate yet" if status.estimated_wait is None
           else f"at most about {status.estimated_wait:.0f} s to go, from the batch's measured step time")
    return (f"All {status.batch} places in the batch are taken. You are {place}: {eta}; waited "
            f"{status.waited:.0f} s. Stop leaves the line.")


def last_run() -> Run | None:
    run = st.session_state.get(LAST_RUN)
    return run if isinstance(run, Run) else None


def quick_form(lm: LoadedModel, ns: str, default: str = DEFAULT_PROMPT,
               max_new_default: int = 16) -> tuple[Prepared, bool, st.delta_generator.DeltaGenerator]:
    """A prompt, a token limit and Generate / Stop (greedy), for pages that run a request of their own.

    The returned slot is Stop's; `run_live` puts the queue position and messages under the button.
    """
    prompt = prompt_box(ns, default, height=90)
    limit = new_token_limit(lm)
    for message in sanitize_settings(ns, limit):
        st.warning(message)
    max_new = st.number_input("Max new tokens", 1, limit, min(max_new_default, limit), 1, key=f"{ns}.max_new")
    prepared = prepare(lm, prompt, Sampling(max_new_tokens=int(max_new)), chat=lm.has_chat_template)
    if prepared.error:
        st.error(prepared.error)
    clicked, stop_slot = generate_button(ns, prepared)
    return prepared, clicked, stop_slot


def page_info(url_path: str) -> PageInfo | None:
    return next((p for p in (HOME, *PAGES) if p.url_path == url_path), None)


# --- the session on a shared server ---------------------------------------------------------------------

_STREAMLIT_SESSIONS: dict[str, str] = {}     # our session id -> Streamlit's, to ask whether the tab is still there


def session_id() -> str:
    """This browser tab's id for the scheduler (one request in flight per tab)."""
    if SESSION_KEY not in st.session_state:
        st.session_state[SESSION_KEY] = uuid.uuid4().hex
        ctx = get_script_run_ctx()
        if ctx is not None:
            _STREAMLIT_SESSIONS[st.session_state[SESSION_KEY]] = ctx.session_id
    return st.session_state[SESSION_KEY]


def person_id() -> str:
    """Who is behind this tab: the browser's XSRF cookie (hashed), the same across reloads and tabs."""
    try:
        cookie = st.context.cookies.get(XSRF_COOKIE)
    except Exception:  # noqa: BLE001 - no cookies outside a browser (tests, scripts)
        cookie = None
    if not isinstance(cookie, str) or not cookie:
        return session_id()
    return "p" + hashlib.sha256(cookie.encode()).hexdigest()[:16]


def connected(session: str) -> bool:
    """Is this Streamlit session still connected to the server? (True where there is no server to ask.)"""
    from streamlit.runtime import Runtime

    streamlit_id = _STREAMLIT_SESSIONS.get(session)
    if streamlit_id is None or not Runtime.exists() or Runtime.instance().is_active_session(streamlit_id):
        return True
    _STREAMLIT_SESSIONS.pop(session, None)
    return False


def join_session(lm: LoadedModel | None) -> str | None:
    """Count this person against the server's limit; the refusal message when the room is full."""
    if lm is None:
        return None
    scheduler = scheduler_for(lm)
    scheduler.presence = connected
    try:
        scheduler.join(session_id(), person_id())
    except SessionLimitError as err:
        st.session_state[REFUSED_KEY] = True
        return f"The model is not available to this browser: {err}."
    st.session_state.pop(REFUSED_KEY, None)
    return None


def page_model() -> LoadedModel | None:
    """The model this page may run: None when it did not load or the room is full (the page offers recordings)."""
    if st.session_state.get(REFUSED_KEY):
        return None
    return current_slot().lm


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


# --- presenter mode ------------------------------------------------------------------------------------------

def follow_presenter(here: str, ns: str, switch: Callable[[str], None]) -> None:
    """Before a page draws: adopt a new push (moving to its page first), or nothing. `here`: the url path."""
    board = presenter_board()
    if not board.enabled:
        return

    def go(page: str) -> None:
        if page_info(page) is None:
            st.session_state.pop(PENDING_KEY, None)        # not a page of this app: stay, keep what is here
            return
        switch(page)

    follow_page(st.session_state, board, ns, here, go)
    run = new_broadcast(st.session_state, board)
    if run is not None:                                    # the presenter's run becomes this session's run too
        st.session_state[LAST_RUN] = run
        if run.live and here != "journey":                 # still streaming: watch it on the journey page
            go("journey")


def presenter_push(ns: str, here: str, view: dict[str, int] | None = None) -> None:
    """For the presenter only: push this page's prompt, settings and view to every follower."""
    push_button(presenter_board(), ns, here, view)


def pushed_choice(key: str, name: str, options: list[int]) -> None:
    """Preset widget `key` to the presenter's pushed `name` (layer, head...) once per push and run."""
    marker = f"presenter.adopted.{key}"
    version = st.session_state.get(SEEN_KEY, 0)
    value = pushed_view(st.session_state, name)
    if value is None or st.session_state.get(marker) == version:
        return
    st.session_state[marker] = version
    if value in options:
        st.session_state[key] = value
