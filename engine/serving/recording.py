"""A finished generation and everything needed to show it again (`Recording`), what a run file holds
(engine/runs/format.py writes and reads `.run.zip`; docs/runs.md), and the reader of the older `.json.gz` recordings.

    rec = new_recording(lm, request, policy, records, title="Capital of France")
    data = engine.runs.dumps(rec)                 # a run file: the one format the playground writes
    rec = load_recording("france.json.gz")        # a recording saved before run files: it still opens

The old file is gzip-compressed JSON; nothing writes it any more. Numpy arrays were stored as base64 of their
little-endian bytes with dtype and shape, from a short list of numeric dtypes. Loading rebuilds every record from the
dataclass field types, checking each value on the way, so a corrupt, truncated or foreign file (another JSON, a
pickle, a zip) gives a `RecordingError` that says what is wrong. Nothing is ever unpickled and no code in a file is
run. A run file's run.json is the same document with its arrays moved into tensors.safetensors (`document`, `build`).

A speculative run keeps its speculative part beside the records (`Recording.speculation`: the draft,
k, the rounds and the plain decoding of the same request), so it opens again as a speculative run.

    python -m engine record "What is the capital of France?" france.run.zip --layers 10
    python -m engine show france.run.zip          # or an old france.json.gz
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
import functools
import json
import os
import re
import threading
import time
import types
import typing
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Union

import numpy as np

from engine.errors import EngineError
from engine.core.generate import GenerationRequest
from engine.core.hooks import CapturePolicy
from engine.serving.limits import Limits, max_recording_bytes, max_recording_values, server_limits
from engine.core.records import DecodeRecord, DoneRecord, PrefillRecord, SpecDoneRecord, SpecRoundRecord
from engine.projection.specs import ModelSpec
from engine.projection.units import fmt_bytes
from engine.serving.timeline import story_problem

FORMAT = "inference-playground/recording"
VERSION = 1
MAX_FILE_BYTES = 64 * 2**20          # compressed size accepted (an upload or a file on disk)
GZIP_MAGIC = b"\x1f\x8b"
CHUNK = 2**20                        # decompressed bytes looked at per step
HEAD_BYTES = 512                     # the header must be within the first bytes of the text
PROBE_BYTES = 8 * 2**20              # read of a file whose gzip trailer says it is too large, to tell a cut one
HEADER = re.compile(rb'\s*\{\s*"format"\s*:\s*"' + re.escape(FORMAT.encode())
                    + rb'"\s*,\s*"version"\s*:\s*(-?\d{1,9})\b')
PARSE_PLACES = 2                     # recordings parsed or written at once; the rest wait
PARSE_WAIT_SECONDS = 120.0
ARRAY_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64")
ARRAY_KEY = "__ndarray__"


class RecordingError(EngineError):
    """A file that is not a recording this version can read, with the reason."""


def _record_types() -> dict[str, type]:
    return {c.__name__: c for c in (PrefillRecord, DecodeRecord, DoneRecord, SpecRoundRecord, SpecDoneRecord)}


@dataclass
class RecordedSpeculation:
    """The speculative part of a recorded run: what drafted, k, the rounds and plain decoding of the same request.

    The rounds carry no captures: the run's records hold them, one decode step per token (app.runs.run.round_steps).
    """

    draft: str                         # the draft's label
    draft_kind: str                    # "ngram", "early-exit" or "model"
    k: int
    rounds: list[SpecRoundRecord]
    baseline: list[Any] = field(default_factory=list)   # PrefillRecord, DecodeRecord..., DoneRecord; [] when not run


@dataclass
class Recording:
    """One finished generation and everything needed to show it again without the model."""

    model: str                         # the model's label
    spec: ModelSpec
    request: GenerationRequest
    policy: CapturePolicy
    records: list[Any]                 # PrefillRecord, DecodeRecord... or SpecRoundRecord..., then a DoneRecord
    dtype: str = ""
    device: str = ""
    title: str = ""
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    speculation: RecordedSpeculation | None = None
    machine: str = ""                  # where it ran and how busy that was (`machine_note`); "" when not known
    timeline: dict[str, Any] | None = None   # its story in the room and its timings (engine.serving.timeline.story)

    @property
    def done(self) -> DoneRecord | None:
        last = self.records[-1] if self.records else None
        return last if isinstance(last, DoneRecord) else None


def new_recording(lm: Any, request: GenerationRequest, policy: CapturePolicy, records: list[Any],
                  title: str = "") -> Recording:
    """A Recording of records produced by `lm` (an engine.core.loader.LoadedModel), made on this machine."""
    return Recording(lm.label, lm.spec, request, policy, list(records), lm.dtype_name, str(lm.device), title,
                     machine=machine_note(str(lm.device)))


def machine_note(device: str) -> str:
    """Where a recording was made, for whoever opens it elsewhere: the processor, and for a CPU how busy the machine
    was as the run finished (its timings are that machine's, then)."""
    import torch  # torch: only when a recording is written

    if device.startswith("cuda") and torch.cuda.is_available():
        return f"one {torch.cuda.get_device_name(torch.device(device))}"
    text = f"{os.cpu_count() or '?'} CPU cores ({torch.get_num_threads()} torch threads)"
    if hasattr(os, "getloadavg"):
        text += f", load average {os.getloadavg()[0]:.1f} as the run finished"
    return text


# --- the document a run file holds ----------------------------------------------------------------------

def document(recording: Recording) -> dict[str, Any]:
    """A recording as plain JSON values with each array left as the numpy array it is: the run file
    (engine/runs/format.py) moves the arrays into its tensors and writes the rest as run.json."""
    doc = {"format": FORMAT, "version": VERSION, "title": recording.title, "created": recording.created,
           "model": {"label": recording.model, "dtype": recording.dtype, "device": recording.device,
                     "machine": recording.machine, "spec": _encode(recording.spec)},
           "request": _encode(recording.request), "policy": _encode(recording.policy),
           "records": _encode_records(recording.records)}
    if recording.speculation is not None:
        doc["speculation"] = {**_encode(replace(recording.speculation, baseline=[])),
                              "baseline": _encode_records(recording.speculation.baseline)}
    if recording.timeline is not None:
        doc["timeline"] = recording.timeline
    return doc


def _encode_records(records: list[Any]) -> list[dict[str, Any]]:
    """Records of mixed types, each tagged with its type's name."""
    return [{"type": type(r).__name__, **_encode(r)} for r in records]


def _encode(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, np.ndarray):
        return _checked_array(value)
    if isinstance(value, dict):
        return {str(k): _encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _checked_array(a: np.ndarray) -> np.ndarray:
    if a.dtype not in _ARRAY_NP_DTYPES:                        # dtype objects hash: faster than their names
        raise RecordingError(f"cannot store an array of dtype {a.dtype.name}")
    return a


_ARRAY_NP_DTYPES = frozenset(np.dtype(name) for name in ARRAY_DTYPES)


# --- loading -----------------------------------------------------------------------------------------

def load_recording(path: str | Path) -> Recording:
    """Read a recording file; RecordingError for anything that is not a readable recording."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise RecordingError(f"{path.name} is {fmt_bytes(size)}; recordings are at most "
                                 f"{fmt_bytes(MAX_FILE_BYTES)}")
        data = path.read_bytes()
    except OSError as err:
        raise RecordingError(f"cannot read {path}: {err.strerror or err}") from None
    return loads_recording(data, name=path.name)


def loads_recording(data: bytes, name: str = "the file", limits: Limits | None = None,
                    on_wait: Callable[[int], None] | None = None) -> Recording:
    """Parse the bytes of a recording (an upload, say); RecordingError with the reason on failure.

    Cheap checks come first, while one of a few parse places is held (`PARSE_SLOTS`; `on_wait(waiting)`
    is called when all are taken): the header must say it is a recording, and the text, decompressed as a
    stream and thrown away, must stay within the largest recording the server can make under `limits`
    (engine.serving.limits.max_recording_bytes and max_recording_values). Only then is it decompressed and parsed.
    """
    if len(data) > MAX_FILE_BYTES:
        raise RecordingError(f"{name} is larger than {fmt_bytes(MAX_FILE_BYTES)}; it is not a recording")
    with PARSE_SLOTS.hold(on_wait):
        doc = _parse_json(_text(data, name, limits or server_limits()), name)
        _check_header(doc, name)
        try:
            return _build(doc)
        except RecordingError as err:
            raise RecordingError(f"{name} is not a valid recording: {err}") from None


def _text(data: bytes, name: str, limits: Limits) -> bytes:
    """The JSON text of a file, once its header, size and number of values have passed."""
    if data[:2] == GZIP_MAGIC:
        size = _scan(_inflate(data, name), name, limits, gzipped=True, claimed=int.from_bytes(data[-4:], "little"))
        return zlib.decompress(data, wbits=31, bufsize=max(size, 1))   # second pass, into a buffer of its size
    _refuse_foreign(data, name)
    _scan((data[i:i + CHUNK] for i in range(0, len(data), CHUNK)), name, limits, gzipped=False)
    return data


def _inflate(data: bytes, name: str) -> Iterator[bytes]:
    """Decompressed gzip data in chunks of at most CHUNK bytes; a recording is one gzip member."""
    inflater = zlib.decompressobj(wbits=31)                          # 31: gzip header and trailer
    pending = data
    try:
        while pending and not inflater.eof:
            yield inflater.decompress(pending, CHUNK)
            pending = inflater.unconsumed_tail
        if not inflater.eof:
            yield inflater.flush()
            raise RecordingError(f"{name} is a damaged or truncated gzip file (it ends early)")
    except zlib.error as err:
        raise RecordingError(f"{name} is a damaged or truncated gzip file ({err})") from None
    if inflater.unused_data.strip(b"\0"):
        raise RecordingError(f"{name} holds data after its gzip stream; a recording is one gzip member")


def _scan(chunks: Iterable[bytes], name: str, limits: Limits, gzipped: bool, claimed: int = 0) -> int:
    """Check the header at the start, then count bytes and JSON values up to the caps; refuse past them.

    `claimed`: the size a gzip trailer states (modulo 4 GiB, below every cap); a file that says it is too
    large is refused after a short read (a cut-short file ends first), one that says less than it holds
    is refused once it passes its word. Returns the number of bytes.
    """
    max_bytes, max_values = max_recording_bytes(limits), max_recording_values(limits)
    head, size, values, probe = b"", 0, 0, None
    for chunk in chunks:
        if len(head) < HEAD_BYTES:
            head += chunk[:HEAD_BYTES]
            if len(head) >= HEAD_BYTES:
                _check_head(head, name, gzipped)
                probe = PROBE_BYTES if claimed > max_bytes else None     # read a little: is it only cut short?
        if claimed and size + len(chunk) > claimed:
            raise RecordingError(f"{name} holds more than its gzip trailer says ({claimed:,} bytes); it is damaged "
                                 "or truncated")
        size += len(chunk)
        values += chunk.count(b",") + chunk.count(b"[") + chunk.count(b"{")
        if probe is not None and size > probe:
            raise RecordingError(f"{name} says it expands to {fmt_bytes(claimed)}, more than the "
                                 f"{fmt_bytes(max_bytes)} of the largest recording this server can make; refused")
        if size > max_bytes or values > max_values:
            raise _too_large(name, fmt_bytes(max_bytes) if size > max_bytes else
                             f"{max_values:,} JSON values", limits)
    if len(head) < HEAD_BYTES:
        _check_head(head, name, gzipped)
    return size


def _too_large(name: str, what: str, limits: Limits) -> RecordingError:
    return RecordingError(f"{name} holds more than {what}, more than the largest recording this server can make "
                          f"under its limits ({limits.max_new_tokens:,} new tokens, "
                          f"{fmt_bytes(limits.max_capture_bytes)} of "
                          "capture); refused")


def _check_head(head: bytes, name: str, gzipped: bool) -> None:
    """The first bytes must say `{"format": "inference-playground/recording", "version": N`."""
    match = HEADER.match(head)
    if match is not None:
        version = int(match.group(1))
        if version > VERSION:
            raise RecordingError(f"{name} is a version {version} recording; this playground reads version "
                                 f"{VERSION} and older. Update the playground to open it")
        return
    if head.lstrip()[:1] in (b"{", b"["):
        raise RecordingError(f"{name} is JSON but not a playground recording (it does not begin with "
                             f"\"format\": \"{FORMAT}\")")
    if gzipped:
        raise RecordingError(f"{name} is a gzip file but not a playground recording; it may be damaged")
    raise RecordingError(f"{name} is neither a gzip-compressed recording nor JSON text")


def _refuse_foreign(data: bytes, name: str) -> None:
    if data[:1] == b"\x80" or data[-16:].rstrip().endswith(b"."):   # pickle protocol 2+, or 0/1 ending in STOP
        raise RecordingError(f"{name} looks like a Python pickle; recordings are JSON, and pickles are never loaded")
    if data[:2] == b"PK":
        raise RecordingError(f"{name} is a zip archive (an .npz?), not a recording")


# --- a few parses at a time --------------------------------------------------------------------------

class ParseSlots:
    """At most `n` recordings parsed or written at once in this process; the rest wait their turn."""

    def __init__(self, n: int, wait_seconds: float = PARSE_WAIT_SECONDS):
        self._free = threading.BoundedSemaphore(n)
        self._lock = threading.Lock()
        self.waiting = 0
        self.wait_seconds = wait_seconds

    @contextmanager
    def hold(self, on_wait: Callable[[int], None] | None = None) -> Iterator[None]:
        """One place for the block; `on_wait(waiting)` first when every place is taken."""
        if not self._free.acquire(blocking=False):
            self._wait(on_wait)
        try:
            yield
        finally:
            self._free.release()

    def _wait(self, on_wait: Callable[[int], None] | None) -> None:
        with self._lock:
            self.waiting += 1
            waiting = self.waiting
        try:
            if on_wait is not None:
                on_wait(waiting)
            got = self._free.acquire(timeout=self.wait_seconds)
        finally:
            with self._lock:
                self.waiting -= 1
        if not got:
            raise RecordingError(f"the server was busy opening and saving other recordings for "
                                 f"{self.wait_seconds:.0f} s; try again in a minute")


PARSE_SLOTS = ParseSlots(PARSE_PLACES)


def _parse_json(text: bytes, name: str) -> Any:
    try:
        decoded = text.decode("utf-8")
    except UnicodeDecodeError:
        raise RecordingError(f"{name} is neither a gzip-compressed recording nor JSON text") from None
    del text                                          # its last reference: two copies at most, not three
    try:
        return json.loads(decoded)
    except json.JSONDecodeError as err:
        raise RecordingError(f"{name} is not valid JSON (line {err.lineno}: {err.msg}); "
                             "it may be truncated or damaged") from None
    except RecursionError:
        raise RecordingError(f"{name} nests too deeply to be a recording") from None


def _check_header(doc: Any, name: str) -> None:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise RecordingError(f"{name} is JSON but not a playground recording (no \"format\": \"{FORMAT}\")")
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise RecordingError(f"{name} has no valid format version")
    if version > VERSION:
        raise RecordingError(f"{name} is a version {version} recording; this playground reads version "
                             f"{VERSION} and older. Update the playground to open it")


def build(doc: dict) -> Recording:
    """A parsed recording document as typed records; RecordingError saying which value is wrong.
    Arrays may be stored ({ARRAY_KEY: ...}) or already numpy arrays (a run file's tensors)."""
    return _build(doc)


def _build(doc: dict) -> Recording:
    model = _mapping(doc.get("model"), "model")
    built = _decode_records(doc.get("records"), "records")
    if not built:
        raise RecordingError("it holds no records")
    if not isinstance(built[-1], DoneRecord):
        raise RecordingError("the last record is not the end of a generation; the file was cut short")
    return Recording(
        model=_decode(model.get("label"), str, "model.label"), spec=_decode(model.get("spec"), ModelSpec, "model.spec"),
        request=_decode(doc.get("request"), GenerationRequest, "request"),
        policy=_decode(doc.get("policy"), CapturePolicy, "policy"), records=built,
        dtype=_decode(model.get("dtype", ""), str, "model.dtype"),
        device=_decode(model.get("device", ""), str, "model.device"),
        machine=_decode(model.get("machine", ""), str, "model.machine"),
        title=_decode(doc.get("title", ""), str, "title"), created=_decode(doc.get("created", ""), str, "created"),
        speculation=_decode_speculation(doc.get("speculation"), "speculation"), timeline=_timeline(doc.get("timeline")))


def _timeline(value: Any) -> dict[str, Any] | None:
    """A run's timeline as stored (engine.serving.timeline.story), checked where a page reads it; None when absent."""
    if value is None:
        return None
    problem = story_problem(value)
    if problem:
        raise RecordingError(f"its timeline is not one this playground wrote: {problem}")
    return value


def _decode_records(records: Any, where: str) -> list[Any]:
    """Records of mixed types, each rebuilt as the type its tag names."""
    if not isinstance(records, list):
        raise RecordingError(f"{where} should be a list")
    known = _record_types()
    built = []
    for i, r in enumerate(records):
        kind = r.get("type") if isinstance(r, dict) else None
        if kind not in known:
            what = f"record {i}" if where == "records" else f"{where}[{i}]"
            raise RecordingError(f"{what} has an unknown type {kind!r}")
        built.append(_decode({k: v for k, v in r.items() if k != "type"}, known[kind], f"{where}[{i}]"))
    return built


def _decode_speculation(value: Any, where: str) -> RecordedSpeculation | None:
    if value is None:
        return None
    data = _mapping(value, where)
    baseline = _decode_records(data.get("baseline", []), f"{where}.baseline")
    if baseline and not isinstance(baseline[-1], DoneRecord):
        raise RecordingError(f"the last record of {where}.baseline is not the end of a generation")
    spec = _decode({k: v for k, v in data.items() if k != "baseline"}, RecordedSpeculation, where)
    return replace(spec, baseline=baseline)


def _mapping(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise RecordingError(f"{where} should be an object")
    return value


def _decode(value: Any, tp: Any, where: str) -> Any:
    """Rebuild `value` (plain JSON) as type `tp`, checking it on the way."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        return _decode_union(value, args, where)
    if dataclasses.is_dataclass(tp):
        return _decode_dataclass(value, tp, where)
    if tp is np.ndarray:
        return _decode_array(value, where)
    if origin in (list, tuple, dict):
        return _decode_container(value, origin, args, where)
    return _decode_scalar(value, tp, where)


def _decode_union(value: Any, args: tuple, where: str) -> Any:
    if value is None and type(None) in args:
        return None
    errors = []
    for arg in (a for a in args if a is not type(None)):
        try:
            return _decode(value, arg, where)
        except RecordingError as err:
            errors.append(str(err))
    raise RecordingError(errors[0] if errors else f"{where} should not be empty")


def _decode_dataclass(value: Any, cls: type, where: str) -> Any:
    data = _mapping(value, where)
    hints = _hints(cls)
    fields_ = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = set(data) - set(fields_)
    if unknown:
        raise RecordingError(f"{where} has fields a {cls.__name__} does not have: {', '.join(sorted(unknown))}")
    kwargs = {}
    for name, f in fields_.items():
        if name in data:
            kwargs[name] = _decode(data[name], hints[name], f"{where}.{name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise RecordingError(f"{where} lacks the field {name!r}")
    return cls(**kwargs)


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _decode_container(value: Any, origin: type, args: tuple, where: str) -> Any:
    if origin is dict:
        data = _mapping(value, where)
        key_type, value_type = args
        return {_decode_key(k, key_type, where): _decode(v, value_type, f"{where}[{k}]") for k, v in data.items()}
    if not isinstance(value, list):
        raise RecordingError(f"{where} should be a list")
    if origin is list:
        return [_decode(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)]
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(_decode(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
    if len(value) != len(args):
        raise RecordingError(f"{where} should have {len(args)} items")
    return tuple(_decode(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))


def _decode_key(key: str, tp: type, where: str) -> Any:
    if tp is int:
        if not key.lstrip("-").isdigit():
            raise RecordingError(f"{where} has a key {key!r} that should be a whole number")
        return int(key)
    return key


def _decode_scalar(value: Any, tp: Any, where: str) -> Any:
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp in (int, str, bool) and type(value) is tp:
        return value
    raise RecordingError(f"{where} should be {getattr(tp, '__name__', tp)}, not {type(value).__name__}")


def stored_array(value: Any, where: str = "an array") -> np.ndarray:
    """The numpy array a stored array ({ARRAY_KEY: base64, dtype, shape}) holds; RecordingError when damaged."""
    return _decode_array(value, where)


def _decode_array(value: Any, where: str) -> np.ndarray:
    if isinstance(value, np.ndarray):
        if value.dtype.name not in ARRAY_DTYPES:
            raise RecordingError(f"{where} has an array of dtype {value.dtype.name}; only {', '.join(ARRAY_DTYPES)} "
                                 "are read")
        return value
    data = _mapping(value, where)
    dtype, shape, payload = data.get("dtype"), data.get("shape"), data.get(ARRAY_KEY)
    if dtype not in ARRAY_DTYPES:
        raise RecordingError(f"{where} has an array of dtype {dtype!r}; only {', '.join(ARRAY_DTYPES)} are read")
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape) or not isinstance(payload, str):
        raise RecordingError(f"{where} is not a stored array (needs {ARRAY_KEY}, dtype and shape)")
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise RecordingError(f"{where} holds damaged array data") from None
    item = np.dtype(dtype).newbyteorder("<")
    if len(raw) != int(np.prod(shape, dtype=np.int64)) * item.itemsize:
        raise RecordingError(f"{where} holds {len(raw)} bytes, not the {shape} {dtype} array it claims")
    return np.frombuffer(raw, dtype=item).reshape(shape).astype(np.dtype(dtype))
