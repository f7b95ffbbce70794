""""Open in a notebook": the run a page shows, as a run file (engine/runs) and a generated notebook that reopens it,
in one .zip download. Built only when the button is pressed.

The file carries the views the model server derives from the residual it keeps for the run (attention as float32)
when it still has it, else the session's own copy (a recording's attention as float16); the notebook checks a fresh
run against it to the precision it holds (engine.runs.attention_tolerance).
"""
from __future__ import annotations

import streamlit as st

from app.runs.recordings import file_name, recording_from_run
from app.runs.run import Run
from engine.errors import EngineError
from engine.runs import SUFFIX, dumps, file_of, known_texts
from engine.runs.notebook import bundle
from engine.service.client import ModelClient

HELP = ("A .zip with a Jupyter notebook and this run's file (run.json and tensors.safetensors). Run the notebook "
        "from the top: it redraws this page's attention and logit lens from the file, runs the same prompt again "
        "on the same model and checks the attention, then reproduces a head with transformers (and nnsight).")


def notebook_button(run: Run | None, lm: ModelClient | None, page: str, layer: int | None = None,
                    head: int | None = None) -> None:
    """The download button, for a finished run; nothing otherwise."""
    if run is None or run.done is None or run.prefill is None:
        return
    stem = file_name(run).removesuffix(SUFFIX)
    st.download_button("Open in a notebook", data=lambda: notebook_zip(run, lm, page, layer, head),
                       file_name=f"{stem}-notebook.zip", mime="application/zip", key=f"{page}.notebook.{run.id}",
                       on_click="ignore", icon=":material/data_object:", help=HELP)


def notebook_zip(run: Run, lm: ModelClient | None, page: str, layer: int | None, head: int | None) -> bytes:
    view = {"page": page, "layer": layer, "head": head}
    stem = file_name(run).removesuffix(SUFFIX)
    return bundle(run_file_bytes(run, lm, view), stem, page, layer, head)


def run_file_bytes(run: Run, lm: ModelClient | None, view: dict | None = None) -> bytes:
    """The run file of a finished run: with the model that made it, full precision and the prefill's logit lens."""
    recording = recording_from_run(run)
    if lm is not None and lm.label == run.model:
        try:
            return file_of(recording, lm, view, run_id=run.id)    # the views derived on the server (float32)
        except EngineError:                          # the server went away meanwhile: the session's copy still goes
            pass
    return dumps(recording, texts=known_texts(recording), view=view)
