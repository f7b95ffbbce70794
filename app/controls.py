"""Shared widgets: the prompt box, sampling controls, and the Generate / Stop pair that runs a request live.

Every widget key is namespaced by the page (`journey.temperature`, `kv.prompt`, ...). Input that
the engine would reject is caught here, before the model runs, and its message is shown next to the
prompt box by the page.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import streamlit as st

from app.run import LAST_RUN, Run, capture_policy, new_run, stream_generation
from engine.errors import EngineError
from engine.generate import GenerationRequest, check_context, encode_prompt, validate
from engine.loader import LoadedModel

DEFAULT_PROMPT = "Explain in two sentences why the sky is blue."
MAX_NEW_LIMIT = 512


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
    return st.text_area("Prompt", value=default, height=height, key=f"{ns}.prompt",
                        help="For instruct models the prompt is wrapped in the chat template before tokenizing.")


def sampling_controls(ns: str, max_new_default: int = 48) -> Sampling:
    cols = st.columns(5)
    temperature = cols[0].slider("Temperature", 0.0, 2.0, 0.0, 0.05, key=f"{ns}.temperature",
                                 help="0 picks the most likely token every time (greedy).")
    top_k = cols[1].number_input("Top-k", 0, 1000, 0, 1, key=f"{ns}.top_k", help="Keep only the k most likely tokens; 0 = off.")
    top_p = cols[2].slider("Top-p", 0.05, 1.0, 1.0, 0.05, key=f"{ns}.top_p",
                           help="Keep the smallest set of tokens whose probabilities add up to p; 1 = off.")
    seed = cols[3].number_input("Seed", 0, 2**31 - 1, 0, 1, key=f"{ns}.seed", help="Same seed, same sampled answer.")
    max_new = cols[4].number_input("Max new tokens", 1, MAX_NEW_LIMIT, max_new_default, 1, key=f"{ns}.max_new")
    return Sampling(float(temperature), int(top_k), float(top_p), int(seed), int(max_new))


def prepare(lm: LoadedModel, prompt: str, sampling: Sampling, chat: bool = True) -> Prepared:
    """Build the request and check it the way the engine will; the error is a message, never a traceback."""
    request = GenerationRequest(prompt, sampling.max_new_tokens, sampling.temperature, sampling.top_k,
                                sampling.top_p, sampling.seed, chat=chat)
    ids: list[int] = []
    prompt_ids: list[int] = []
    try:
        validate(request)
        ids = encode_prompt(lm, request)
        prompt_ids = lm.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        check_context(lm, len(ids), request.max_new_tokens)
    except EngineError as err:
        return Prepared(request, ids, prompt_ids, str(err))
    return Prepared(request, ids, prompt_ids)


def generate_button(ns: str, prepared: Prepared) -> tuple[bool, st.delta_generator.DeltaGenerator]:
    """The Generate button and an empty slot beside it where Stop appears while the answer streams."""
    left, right, _ = st.columns([1, 1, 5])
    clicked = left.button("Generate", type="primary", key=f"{ns}.generate", disabled=prepared.error is not None)
    return clicked, right.empty()


def run_live(lm: LoadedModel, prepared: Prepared, ns: str, stop_slot: st.delta_generator.DeltaGenerator,
             on_record: Callable[[Run], None], capture: bool = True) -> Run | None:
    """Stream one generation into the page; the run is stored for every page under LAST_RUN."""
    policy, note = capture_policy(lm.spec, len(prepared.ids), prepared.request.max_new_tokens, capture)
    run = new_run(lm, prepared.request, policy, note)
    st.session_state[LAST_RUN] = run
    stop_slot.button("Stop", key=f"{ns}.stop", help="Stops the answer where it is; what streamed so far stays.")
    waiting = st.empty()

    def on_wait(seconds: float) -> None:
        waiting.info(f"Another session is using the model; waiting ({seconds:.0f} s)…")

    def record(r: Run) -> None:
        waiting.empty()
        on_record(r)

    try:
        stream_generation(lm, run, record, on_wait)
    except EngineError as err:
        st.error(str(err))
    stop_slot.empty()
    return run


def last_run() -> Run | None:
    run = st.session_state.get(LAST_RUN)
    return run if isinstance(run, Run) else None


def quick_form(lm: LoadedModel, ns: str, default: str = DEFAULT_PROMPT,
               max_new_default: int = 16) -> tuple[Prepared, bool, st.delta_generator.DeltaGenerator]:
    """A prompt, a token limit and Generate / Stop (greedy), for pages that run a request of their own."""
    prompt = prompt_box(ns, default, height=90)
    max_new = st.number_input("Max new tokens", 1, MAX_NEW_LIMIT, max_new_default, 1, key=f"{ns}.max_new")
    prepared = prepare(lm, prompt, Sampling(max_new_tokens=int(max_new)), chat=lm.has_chat_template)
    if prepared.error:
        st.error(prepared.error)
    clicked, stop_slot = generate_button(ns, prepared)
    return prepared, clicked, stop_slot
