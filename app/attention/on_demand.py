"""Maps of a run derived on the model server, from what the run kept there (the residual stream): any layer and
head, pooled overviews, one row (the newest token's as a run streams), and every head summarised at full length
(engine/service/jobs.py).

A recording whose maps ride in its records is drawn from them (app/attention/numbers.py); a run the server keeps
asks the server by run id. Answers are kept for a while in the session, so moving a
slider back costs nothing; a run the server has dropped gets a message, never a traceback.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable

import numpy as np
import streamlit as st

from app.attention import numbers as att
from app.runs.live import measure_in_box
from app.runs.run import Run
from engine.service.client import ModelClient
from engine.service.jobs import QUICK_SUMMARY

CACHE = "attention.on_demand"
MAX_CACHED = 32


def on_server(run: Run, lm: ModelClient | None) -> bool:
    """Does the server keep this run's residual (its maps are derived there)? Only the model that ran it can."""
    return lm is not None and run.policy.enabled and run.model == lm.label and run.prefill is not None


def needs_server(run: Run, lm: ModelClient | None, layer: int) -> bool:
    return layer not in att.captured_layers(run) and on_server(run, lm)


def cached(key: tuple, compute: Callable[[], Any]) -> Any:
    """A server answer kept in the session (the newest MAX_CACHED)."""
    store: OrderedDict = st.session_state.setdefault(CACHE, OrderedDict())
    if key not in store:
        store[key] = compute()
        while len(store) > MAX_CACHED:
            store.popitem(last=False)
    store.move_to_end(key)
    return store[key]


def kept_state(lm: ModelClient, run: Run) -> Any:
    """What the server keeps for this run now (asked every time: a rebuilt layer changes it)."""
    return lm.quick("attention.kept", {"run_id": run.id})


def ready(lm: ModelClient, run: Run, layer: int) -> bool:
    """The layer's input is on the server, rebuilt first (a queued job, with progress and Stop) when it was not kept."""
    state = kept_state(lm, run)
    if layer in state.layers or layer in state.rebuilt:
        return True
    below = max((i for i in state.layers if i <= layer), default=0)
    label = (f"Layer {layer}'s input was not kept: rebuilding it from layer {below} over {state.positions:,} positions "
             "(the layers in between run once)…")
    return measure_in_box(lm, label, "attention.rebuild", {"run_id": run.id, "layer": layer}) is not None


def pooled(m: Any) -> att.Pooled:
    return att.Pooled(m.values.astype(np.float32), m.factor, m.n)


def head_map(lm: ModelClient, run: Run, layer: int, head: int, cells: int) -> att.Pooled:
    key = (run.id, "map", layer, head, cells)
    return cached(key, lambda: pooled(lm.quick("attention.map", {"run_id": run.id, "layer": layer, "heads": [head],
                                                                 "cells": cells})[0]))


def layer_maps(lm: ModelClient, run: Run, layer: int, cells: int) -> list[att.Pooled]:
    heads = list(range(run.spec.n_heads))
    key = (run.id, "grid", layer, cells)
    return cached(key, lambda: [pooled(m) for m in lm.quick("attention.map", {"run_id": run.id, "layer": layer,
                                                                               "heads": heads, "cells": cells})])


def row(lm: ModelClient, run: Run, layer: int, position: int) -> np.ndarray:
    """(heads, position + 1): every query head's attention from one position."""
    key = (run.id, "row", layer, position)
    return cached(key, lambda: lm.quick("attention.row", {"run_id": run.id, "layer": layer,
                                                          "position": position}).probs)


def newest_row(lm: ModelClient, run: Run, layer: int, heads: list[int]) -> np.ndarray:
    """(len(heads), n): the attention row of the pass that made the run's newest token, for the heads on screen,
    derived on the server from the residual as the token streams (a live run's included; one per token, so not kept
    in the session)."""
    position = run.n_prompt + len(run.steps) - 1
    return lm.quick("attention.row", {"run_id": run.id, "layer": layer, "position": position,
                                      "heads": list(heads)}).probs


def summary(lm: ModelClient, run: Run, window: int) -> att.HeadSummary | None:
    """Every head of every layer summarised over the whole run, kept per run: at once for a short run that kept every
    layer, else a job (queued, progress, Stop)."""
    key = (run.id, "summary", window)
    store = st.session_state.setdefault(CACHE, OrderedDict())
    if key not in store:
        state = kept_state(lm, run)
        if state.positions <= QUICK_SUMMARY and set(range(run.spec.n_layers)) <= set(state.layers):
            value = lm.quick("attention.summary_now", {"run_id": run.id, "window": window})
        else:
            value = measure_in_box(lm, "Summarising every head over the whole run…", "attention.summary",
                                   {"run_id": run.id, "window": window})
        if value is None:
            return None
        store[key] = att.from_summaries(value)
    return store[key]
