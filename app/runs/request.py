"""The request a page builds: sampling settings, stored settings put back in range, and the request checked
at the scheduler's door before the model runs (its error is a message next to the prompt box, never a
traceback). The checked request, with the token ids it was encoded to, is what Generate submits: it is
validated and tokenized once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import streamlit as st

from engine.errors import EngineError
from engine.core.generate import GenerationRequest
from engine.service.client import ModelClient
from engine.serving.scheduler import CheckedRequest

DEFAULT_PROMPT = "Explain in two sentences why the sky is blue."
MAX_NEW_LIMIT = 512
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


@dataclass(frozen=True)
class Prepared:
    """A request as the page built it, and either the scheduler's checked request or why it was refused."""

    request: GenerationRequest
    checked: CheckedRequest | None = None
    error: str | None = None

    @property
    def ids(self) -> tuple[int, ...]:
        """The model input (chat template included), as the scheduler encoded it; empty when refused."""
        return self.checked.ids if self.checked is not None else ()


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


def new_token_limit(lm: ModelClient) -> int:
    """The most new tokens a widget offers: the page's limit or the server's, whichever is lower."""
    return min(MAX_NEW_LIMIT, lm.limits.max_new_tokens)


def prepare(lm: ModelClient, prompt: str, sampling: Sampling, chat: bool = True) -> Prepared:
    """Build the request and check it at the scheduler's door; the error is a message, never a traceback."""
    request = GenerationRequest(prompt, sampling.max_new_tokens, sampling.temperature, sampling.top_k,
                                sampling.top_p, sampling.seed, chat=chat)
    try:
        return Prepared(request, lm.check(request))
    except EngineError as err:
        return Prepared(request, error=str(err))
