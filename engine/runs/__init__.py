"""Runs to take home: the run file's format (`engine/runs/format.py`: `inference-playground/run`, version 1, a
`.run.zip`; docs/runs.md) and the notebook that opens one (`engine/runs/notebook.py`). Re-exports only.

    data = dumps(recording, source="/models/smollm2", name="default")   # the bytes of a .run.zip
    run = load("capital-of-france.run.zip")                               # RunFile; an old .json.gz opens too
"""
from engine.runs.format import (FORMAT, RUN_JSON, SUFFIX, TENSOR_KEY, TENSORS, VERSION, RunFile, RunFileError,
                                attention_differences, attention_tolerance, dumps, file_of, known_texts, load, loads,
                                mentioned_ids, recording_of, texts_with, unpacked_cap, with_prefill_lens, with_views)

__all__ = ["FORMAT", "RUN_JSON", "SUFFIX", "TENSOR_KEY", "TENSORS", "VERSION", "RunFile", "RunFileError",
           "attention_differences", "attention_tolerance", "dumps", "file_of", "known_texts", "load", "loads",
           "mentioned_ids", "recording_of", "texts_with", "unpacked_cap", "with_prefill_lens", "with_views"]
