"""The `.json.gz` recording writer as the base commit 1b348b2 had it (engine/serving/recording.py: `dumps_recording`,
`_dumps`, `document`, `_encode_records`, `_encode`, `_encode_array`), frozen here so that tests can make the files
people saved before the writer went (the Recordings page's "Save this run" and "Keep on this server", `python -m engine
record`) and check that they still open. Copied verbatim but for the parse places, which the reader alone holds now.
Do not change it to follow the engine: it is what wrote those files.
"""
from __future__ import annotations

import base64
import dataclasses
import gzip
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "inference-playground/recording"
VERSION = 1
ARRAY_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64")
ARRAY_KEY = "__ndarray__"
_ARRAY_NP_DTYPES = frozenset(np.dtype(name) for name in ARRAY_DTYPES)


def dumps_recording(recording: Any, attention_dtype: str | None = "float16") -> bytes:
    """The gzip-compressed JSON bytes of a recording (engine.serving.recording.Recording) as 1b348b2 wrote them."""
    text = json.dumps(document(recording, attention_dtype), separators=(",", ":"), allow_nan=True)
    return gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0)


def save_recording(recording: Any, path: str | Path, attention_dtype: str | None = "float16") -> Path:
    path = Path(path)
    path.write_bytes(dumps_recording(recording, attention_dtype))
    return path


def document(recording: Any, attention_dtype: str | None = "float16") -> dict[str, Any]:
    doc = {"format": FORMAT, "version": VERSION, "title": recording.title, "created": recording.created,
           "model": {"label": recording.model, "dtype": recording.dtype, "device": recording.device,
                     "machine": recording.machine, "spec": _encode(recording.spec)},
           "request": _encode(recording.request), "policy": _encode(recording.policy),
           "records": _encode_records(recording.records, attention_dtype)}
    if recording.speculation is not None:
        doc["speculation"] = {**_encode(replace(recording.speculation, baseline=[]), attention_dtype),
                              "baseline": _encode_records(recording.speculation.baseline, attention_dtype)}
    if recording.timeline is not None:
        doc["timeline"] = recording.timeline
    return doc


def _encode_records(records: list[Any], attention_dtype: str | None) -> list[dict[str, Any]]:
    return [{"type": type(r).__name__, **_encode(r, attention_dtype)} for r in records]


def _encode(value: Any, attention_dtype: str | None = None) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if f.name == "attention" and isinstance(v, np.ndarray) and attention_dtype:
                v = v.astype(attention_dtype)
            out[f.name] = _encode(v, attention_dtype)
        return out
    if isinstance(value, np.ndarray):
        return _encode_array(value)
    if isinstance(value, dict):
        return {str(k): _encode(v, attention_dtype) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(v, attention_dtype) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _encode_array(a: np.ndarray) -> dict[str, Any]:
    if a.dtype not in _ARRAY_NP_DTYPES:
        raise ValueError(f"cannot store an array of dtype {a.dtype.name}")
    data = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes()
    return {ARRAY_KEY: base64.b64encode(data).decode("ascii"), "dtype": a.dtype.name, "shape": list(a.shape)}


# --- where the base commit's shelf (engine/serving/shelf.py, "Keep on this server") put a kept recording -----------

def shelve(root: Path, session: str, data: bytes, title: str, ns: int) -> Path:
    """A kept recording as 1b348b2's Shelf._write left it: root/<hash of the person>/<nanoseconds>-<slug>.json.gz."""
    import hashlib                                 # here: only the shelf's layout needs it
    import re

    folder = root / hashlib.sha256(session.encode("utf-8", "replace")).hexdigest()[:24]
    folder.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:40].strip("-")
    path = folder / f"{ns}-{slug}.json.gz"
    path.write_bytes(data)
    return path
