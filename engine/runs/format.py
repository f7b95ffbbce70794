"""The run file: one `.zip` that standard tools open (format `inference-playground/run`, version 1; the layout is
documented in docs/runs.md), and `load` to get it back as typed records and numpy arrays, without Streamlit.

    data = dumps(recording, source="/models/smollm2", name="default", texts={...})   # the bytes of a .run.zip
    run = load("capital-of-france.run.zip")       # RunFile; an old .json.gz recording opens too
    run.prompt_ids, run.token_texts, run.layers   # plain values
    run.head_map(layer=3, head=1)                 # (T, T) float32: the prefill attention of one query head
    run.tensors["records.0.captures.3.attention"] # every array, by the name it has in tensors.safetensors
                                                  # (views derived from the run's residual when it was written)
    run.as_torch("records.0.captures.3.attention")  # the same as a torch tensor

Inside the zip: `run.json` (the request, the model, every record with its timings and tokens; each array replaced by
{"__tensor__": name}) and `tensors.safetensors` (those arrays, named by their place in run.json). Anything wrong
with a file (cut short, edited, from a newer playground, shapes that contradict run.json, too large) is a
`RunFileError` with one line that says what; nothing is executed or unpickled.
"""
from __future__ import annotations

import hashlib
import io
import json
import time
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from safetensors.numpy import load as load_tensors
from safetensors.numpy import save as save_tensors

from engine.core.hooks import LayerCapture
from engine.core.records import DecodeRecord, DoneRecord, PrefillRecord, SpecRoundRecord
from engine.errors import EngineError, InvalidRequestError
from engine.projection.units import fmt_bytes
from engine.serving.capture import LOGIT_LENS_TOP
from engine.serving.limits import Limits, max_recording_bytes, server_limits
from engine.serving.recording import (ARRAY_KEY, GZIP_MAGIC, MAX_FILE_BYTES, Recording, RecordingError, build,
                                      document, loads_recording, stored_array)

FORMAT = "inference-playground/run"
VERSION = 1
RUN_JSON, TENSORS = "run.json", "tensors.safetensors"
TENSOR_KEY = "__tensor__"
SUFFIX = ".run.zip"


class RunFileError(InvalidRequestError):
    """A file that is not a run this playground reads, with the reason in one line."""


@dataclass(frozen=True)
class RunFile:
    """A run read back: its typed records (engine.serving.recording.Recording) and every array by name."""

    recording: Recording
    tensors: dict[str, np.ndarray] = field(default_factory=dict)   # name in tensors.safetensors -> array
    source: str = ""              # where the weights were, on the machine that made the run
    name: str = ""                # what load_model was given there ("default", a folder, a hub id)
    texts: dict[int, str] = field(default_factory=dict)   # token id -> text, for every id the file mentions
    view: dict[str, Any] = field(default_factory=dict)    # what the page showed: page, layer, head
    version: int = VERSION        # 0: an old .json.gz recording

    # --- plain values ---------------------------------------------------------------------------------------
    request = property(lambda self: self.recording.request)
    policy = property(lambda self: self.recording.policy)
    model = property(lambda self: self.recording.model)
    dtype = property(lambda self: self.recording.dtype)
    prefill = property(lambda self: next(r for r in self.recording.records if isinstance(r, PrefillRecord)))
    prompt_ids = property(lambda self: [p.id for p in self.prefill.prompt])
    prompt_tokens = property(lambda self: [p.text for p in self.prefill.prompt])

    @property
    def steps(self) -> list[DecodeRecord]:
        return [r for r in self.recording.records if isinstance(r, DecodeRecord)]

    @property
    def rounds(self) -> list[SpecRoundRecord]:
        """A speculative run's rounds (drafts and verdicts); [] for plain decoding."""
        rounds = [r for r in self.recording.records if isinstance(r, SpecRoundRecord)]
        saved = self.recording.speculation
        return rounds or (list(saved.rounds) if saved is not None else [])

    @property
    def tokens(self) -> list[Any]:
        """The generated tokens (SampledToken: id, text, prob, top candidates), the first from prefill."""
        out = [self.prefill.token]
        for r in self.recording.records:
            if isinstance(r, DecodeRecord):
                out.append(r.token)
            elif isinstance(r, SpecRoundRecord):
                out += list(r.emitted)
        return out

    token_ids = property(lambda self: [t.id for t in self.tokens])
    token_texts = property(lambda self: [t.text for t in self.tokens])

    @property
    def timings(self) -> dict[str, float]:
        done = self.recording.done
        return {"ttft_s": done.ttft, "decode_s": done.decode_seconds, "total_s": done.total_seconds,
                "tokens_per_s": done.tokens_per_second} if done is not None else {}

    @property
    def story(self) -> dict[str, Any] | None:
        """Why it took its time: its timeline in the room and its timings (engine.serving.timeline.story); None for a
        run made before the playground kept one, or outside a server."""
        return self.recording.timeline

    @property
    def layers(self) -> list[int]:
        """Layers whose prefill attention the run captured."""
        return sorted(i for i, c in self.prefill.captures.items() if c.attention is not None)

    def capture(self, layer: int) -> LayerCapture:
        """The prefill pass's capture of one layer; RunFileError when the run did not capture it."""
        cap = self.prefill.captures.get(layer)
        if cap is None or cap.attention is None:
            raise RunFileError(f"the run captured no attention at layer {layer}; it has layers {self.layers}")
        return cap

    def head_map(self, layer: int, head: int) -> np.ndarray:
        """(T_q, T_k) float32: query head `head`'s prefill attention at `layer`, as captured."""
        cap = self.capture(layer)
        if head not in cap.heads:
            raise RunFileError(f"the run kept heads {list(cap.heads)} of layer {layer}, not head {head}")
        return cap.attention[cap.heads.index(head)].astype(np.float32)

    def as_torch(self, name: str) -> torch.Tensor:
        """One array of the file as a torch tensor (sharing the numpy array's memory)."""
        if name not in self.tensors:
            raise RunFileError(f"the run has no tensor {name!r}")
        return torch.from_numpy(self.tensors[name])

    def text(self, token_id: int) -> str:
        return self.texts.get(int(token_id), f"#{int(token_id)}")

    def logit_lens(self) -> list[dict[str, Any]]:
        """One row per captured layer: the top token (and its probability) read through the final norm and LM head
        at the prompt's last position, as the journey page's logit-lens table shows it."""
        rows = []
        for layer, cap in sorted(self.prefill.captures.items()):
            if cap.lens:
                token, prob = cap.lens[0]
                rows.append({"layer": layer, "token": self.text(token), "id": int(token), "prob": float(prob)})
        return rows


# --- writing ------------------------------------------------------------------------------------------------

def dumps(recording: Recording, source: str = "", name: str = "", texts: dict[int, str] | None = None,
          view: dict[str, Any] | None = None) -> bytes:
    """The bytes of a run file: run.json and tensors.safetensors in one zip (attention kept as it was captured)."""
    doc = document(recording)                  # arrays stay numpy: no base64 on the way
    tensors: dict[str, np.ndarray] = {}
    doc = _lift_arrays(doc, "", tensors)
    # One metadata key: safetensors writes the metadata map in a random order on each call (a Rust HashMap), so two
    # keys made the same run's file differ from one save to the next; the version is run.json's.
    blob = save_tensors(tensors, metadata={"format": f"{FORMAT}/tensors/{VERSION}"})
    header = {"format": FORMAT, "version": VERSION, "exported": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "source": str(source), "name": str(name), "view": dict(view or {}),
              "texts": {str(k): v for k, v in sorted((texts or known_texts(recording)).items())},
              "tensors": {"file": TENSORS, "sha256": hashlib.sha256(blob).hexdigest(),
                          "index": {k: {"dtype": v.dtype.name, "shape": list(v.shape)} for k, v in tensors.items()}}}
    doc = {**header, "recording": {k: v for k, v in doc.items() if k not in ("format", "version")}}
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as z:
        z.writestr(RUN_JSON, json.dumps(doc, separators=(",", ":"), allow_nan=True))
        z.writestr(TENSORS, blob)
    return out.getvalue()


def _lift_arrays(value: Any, path: str, tensors: dict[str, np.ndarray]) -> Any:
    """The document with every array moved to `tensors` under its path (records.0.captures.3.attention)."""
    if isinstance(value, np.ndarray):
        tensors[path] = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<"))
        return {TENSOR_KEY: path}
    if isinstance(value, dict) and ARRAY_KEY in value:
        tensors[path] = np.ascontiguousarray(stored_array(value, path))
        return {TENSOR_KEY: path}
    if isinstance(value, dict):
        return {k: _lift_arrays(v, f"{path}.{k}" if path else k, tensors) for k, v in value.items()}
    if isinstance(value, list):
        return [_lift_arrays(v, f"{path}.{i}", tensors) for i, v in enumerate(value)]
    return value


def known_texts(recording: Recording) -> dict[int, str]:
    """Every token id the records store with its text (prompt, answer, candidates); lens ids only with a tokenizer."""
    texts: dict[int, str] = {}
    for r in recording.records:
        for piece in getattr(r, "prompt", ()):
            texts[piece.id] = piece.text
        for token in ([r.token] if hasattr(r, "token") else []) + list(getattr(r, "emitted", ())):
            texts.update({c.id: c.text for c in token.top})
            texts.setdefault(token.id, token.text)
    return texts


def mentioned_ids(recording: Recording) -> set[int]:
    """Every token id a run's records mention, the logit lens's included."""
    ids = set(known_texts(recording))
    for r in recording.records:
        for cap in getattr(r, "captures", {}).values():
            ids.update(int(t) for t, _ in cap.lens or ())
    return ids


def texts_with(recording: Recording, decode: Callable[[list[int]], str] | None) -> dict[int, str]:
    """known_texts plus, with a tokenizer's decode, the text of every other id the run mentions."""
    texts = known_texts(recording)
    if decode is not None:
        texts.update({i: decode([i]) for i in mentioned_ids(recording) - set(texts)})
    return texts


# --- reading ------------------------------------------------------------------------------------------------

def unpacked_cap(limits: Limits) -> int:
    """The most a run file of the largest run a server under `limits` can make holds, unpacked."""
    return max_recording_bytes(limits) + 2 * limits.max_capture_bytes


def load(path: str | Path, limits: Limits | None = None) -> RunFile:
    """Read a run file (or an old .json.gz recording) from disk; RunFileError with one line for anything else.
    A file on disk may be as large as the largest run the server can make (a notebook opens any run it exported);
    bytes from elsewhere (`loads`: an upload) at most the upload cap."""
    path, cap = Path(path), unpacked_cap(limits or server_limits())
    try:
        size = path.stat().st_size
        if size > cap:
            raise RunFileError(f"{path.name} is {fmt_bytes(size)}; run files are at most {fmt_bytes(cap)}")
        data = path.read_bytes()
    except OSError as err:
        raise RunFileError(f"cannot read {path}: {err.strerror or err}") from None
    return loads(data, path.name, limits, max_bytes=cap)


def loads(data: bytes, name: str = "the file", limits: Limits | None = None,
          max_bytes: int = MAX_FILE_BYTES) -> RunFile:
    """The bytes of a run file (an upload, an HTTP reply) or of an old .json.gz recording, read back; at most
    `max_bytes` (the upload cap unless said)."""
    if len(data) > max_bytes:
        raise RunFileError(f"{name} is {fmt_bytes(len(data))}; run files are at most {fmt_bytes(max_bytes)}")
    if data[:2] == GZIP_MAGIC:                  # a recording saved before run files existed
        try:
            recording = loads_recording(data, name, limits)
        except RecordingError as err:
            raise RunFileError(str(err)) from None
        _check_prefill(recording, name)
        return RunFile(recording, texts=known_texts(recording), version=0)
    if data[:2] != b"PK":
        raise RunFileError(f"{name} is not a run file (a .zip holding {RUN_JSON} and {TENSORS}) nor a recording")
    doc, blob = _unzip(data, name, limits or server_limits())
    _check_header(doc, name)
    tensors = _check_tensors(doc, blob, name)
    try:
        recording = build(_place_arrays(doc.get("recording"), tensors, "recording"))
    except RecordingError as err:
        raise RunFileError(f"{name} is not a valid run: {err}") from None
    _check_prefill(recording, name)
    _check_shapes(recording, name)
    return RunFile(recording, tensors, _string(doc, "source"), _string(doc, "name"), _texts(doc.get("texts"), name),
                   doc.get("view") if isinstance(doc.get("view"), dict) else {}, doc["version"])


def _unzip(data: bytes, name: str, limits: Limits) -> tuple[Any, bytes]:
    """run.json (parsed) and the safetensors bytes, once the zip's own sizes pass the cap (no zip bomb unpacks)."""
    cap = unpacked_cap(limits)
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            members = {i.filename: i for i in z.infolist()}
            missing = [m for m in (RUN_JSON, TENSORS) if m not in members]
            if missing:
                raise RunFileError(f"{name} is a zip without {' and '.join(missing)}: not a playground run file")
            unpacked = sum(members[m].file_size for m in (RUN_JSON, TENSORS))
            if unpacked > cap:
                raise RunFileError(f"{name} unpacks to {fmt_bytes(unpacked)}, more than the {fmt_bytes(cap)} of the "
                                   "largest run this server can make; refused")
            text, blob = z.read(RUN_JSON), z.read(TENSORS)
    except RunFileError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError, NotImplementedError) as err:
        raise RunFileError(f"{name} is a damaged or truncated zip ({err})") from None
    try:
        return json.loads(text.decode("utf-8")), blob
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise RunFileError(f"{name} has a damaged {RUN_JSON} ({type(err).__name__})") from None


def _check_header(doc: Any, name: str) -> None:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise RunFileError(f"{name}'s {RUN_JSON} is not a playground run (no \"format\": \"{FORMAT}\")")
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise RunFileError(f"{name} has no valid format version")
    if version > VERSION:
        raise RunFileError(f"{name} is a version {version} run file; this playground reads version {VERSION} and "
                           "older. Update the playground to open it")


def _check_tensors(doc: dict, blob: bytes, name: str) -> dict[str, np.ndarray]:
    """The tensors, once their bytes match run.json's checksum and every one its declared dtype and shape."""
    entry = doc.get("tensors")
    if not isinstance(entry, dict) or not isinstance(entry.get("index"), dict):
        raise RunFileError(f"{name}'s {RUN_JSON} has no tensor index")
    if hashlib.sha256(blob).hexdigest() != entry.get("sha256"):
        raise RunFileError(f"{name}'s {TENSORS} does not match the checksum in {RUN_JSON}: the file was changed "
                           "or damaged")
    try:
        tensors = load_tensors(blob)
    except Exception as err:  # noqa: BLE001 - safetensors raises its own types; a bad file is a line, not a traceback
        raise RunFileError(f"{name}'s {TENSORS} cannot be read ({type(err).__name__})") from None
    index = entry["index"]
    for key, meta in index.items():
        got = tensors.get(key)
        if got is None:
            raise RunFileError(f"{name}: {RUN_JSON} lists the tensor {key!r}, which {TENSORS} lacks")
        if not isinstance(meta, dict) or meta.get("dtype") != got.dtype.name or meta.get("shape") != list(got.shape):
            raise RunFileError(f"{name}: tensor {key!r} is {got.dtype.name} {list(got.shape)} but {RUN_JSON} says "
                               f"{meta}")
    return {k: v for k, v in tensors.items() if k in index}


def _place_arrays(value: Any, tensors: dict[str, np.ndarray], where: str) -> Any:
    """run.json's recording with each {"__tensor__": name} replaced by that array."""
    if isinstance(value, dict) and TENSOR_KEY in value:
        key = value[TENSOR_KEY]
        if not isinstance(key, str) or key not in tensors:
            raise RunFileError(f"{where} names the tensor {str(key)[:80]!r}, which the file does not hold")
        return tensors[key]
    if isinstance(value, dict):
        return {k: _place_arrays(v, tensors, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_place_arrays(v, tensors, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def _check_prefill(recording: Recording, name: str) -> None:
    if not any(isinstance(r, PrefillRecord) for r in recording.records):
        raise RunFileError(f"{name} holds no prefill record (the prompt and the first token): there is no run to "
                           "open")


def _check_shapes(recording: Recording, name: str) -> None:
    """Every capture's arrays agree with the model and the positions the run read."""
    spec = recording.spec
    n_prompt = next((len(r.prompt) for r in recording.records if isinstance(r, PrefillRecord)), 0)
    for i, record in enumerate(recording.records):
        seen = n_prompt + (record.step if isinstance(record, DecodeRecord) else 0)
        for layer, cap in getattr(record, "captures", {}).items():
            problem = _capture_problem(cap, spec.n_heads, spec.n_kv_heads, spec.n_layers)
            if problem is None and isinstance(record, (PrefillRecord, DecodeRecord)) and cap.attention is not None:
                problem = _position_problem(cap, seen)
            if problem:
                raise RunFileError(f"{name}: record {i}, layer {layer}: {problem}, which contradicts run.json")


def _capture_problem(cap: LayerCapture, n_heads: int, n_kv_heads: int, n_layers: int) -> str | None:
    if not 0 <= cap.layer < n_layers:
        return f"layer {cap.layer} of a model with {n_layers}"
    if cap.attention is not None:
        a = cap.attention
        if a.ndim != 3 or a.shape[0] != len(cap.heads) or len(cap.kv_heads) != len(cap.heads):
            return f"attention of shape {list(a.shape)} for {len(cap.heads)} heads"
        if any(not 0 <= h < n_heads for h in cap.heads):
            return f"heads {list(cap.heads)} of a model with {n_heads}"
    for what, arr, n in (("q_norm", cap.q_norm, n_heads), ("k_norm", cap.k_norm, n_kv_heads),
                         ("v_norm", cap.v_norm, n_kv_heads)):
        if arr is not None and arr.shape != (n,):
            return f"{what} of shape {list(arr.shape)}, not ({n},)"
    return None


def _position_problem(cap: LayerCapture, seen: int) -> str | None:
    """A pass that read `seen` positions has at most that many query rows and key columns."""
    _, rows, keys = cap.attention.shape
    if cap.query_start + rows > seen or cap.key_start + keys > seen:
        return (f"attention of {rows} x {keys} from position {cap.query_start}, {cap.key_start} in a pass over "
                f"{seen} positions")
    return None


def _string(doc: dict, key: str) -> str:
    value = doc.get(key, "")
    return value if isinstance(value, str) else ""


def _texts(value: Any, name: str) -> dict[int, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(k.lstrip("-").isdigit() and isinstance(v, str) for k, v in value.items()):
        raise RunFileError(f"{name}'s token texts are damaged")
    return {int(k): v for k, v in value.items()}


# --- a run the service keeps ----------------------------------------------------------------------------------

def recording_of(part: Any, lm: Any) -> Recording:
    """A finished run as the service keeps it (engine.service.runs.RunSlice, all its records) as a Recording of the
    model `lm` (a ModelClient or LoadedModel: label, spec, dtype_name, device)."""
    info = part.info
    if info.kind == "job":
        raise RunFileError(f"run {info.id} is a measurement, not a generation: it has no run file")
    if info.live:
        raise RunFileError(f"run {info.id} is still running; its file is ready once it finishes")
    records = list(part.records)
    if not any(isinstance(r, PrefillRecord) for r in records) or not isinstance(records[-1], DoneRecord):
        raise RunFileError(f"run {info.id} ended before its first token ({info.state}): there is nothing to export")
    return Recording(info.model, lm.spec, info.request, info.policy, records, lm.dtype_name, str(lm.device),
                     title=info.request.prompt[:60], timeline=getattr(info, "timeline", None))


def file_of(recording: Recording, lm: Any, view: dict[str, Any] | None = None, run_id: str | None = None) -> bytes:
    """The run file of a run made by `lm` (a ModelClient): with `run_id`, the views its policy names derived on the
    server from the residual the run kept (`run.views`); records of older runs that kept a residual per layer get
    their prefill's logit lens (two weight reads); token texts from the model's tokenizer."""
    if run_id is not None and recording.policy.views:
        try:
            recording = with_views(recording, lambda: lm.quick("run.views", {"run_id": run_id}))
        except EngineError:                  # it kept nothing, or went meanwhile: the file holds what the records do
            pass
    recording = with_prefill_lens(recording, lambda resid: lm.quick("lens", {"resid": resid, "top": LOGIT_LENS_TOP}))
    return dumps(recording, str(lm.source), lm.name, texts_with(recording, lm.tokenizer.decode), view)


def with_views(recording: Recording, views: Callable[[], list[Any]]) -> Recording:
    """The recording with the server's records and their derived views (`views()`): all of them when they are the
    same records (plain decoding), else the prefill pass's (a speculative run's page records are its rounds made into
    steps)."""
    served = views()
    if len(served) == len(recording.records) and not recording.speculation:
        return replace(recording, records=list(served))
    i = next(i for i, r in enumerate(recording.records) if isinstance(r, PrefillRecord))
    records = list(recording.records)
    records[i] = next(r for r in served if isinstance(r, PrefillRecord))
    return replace(recording, records=records)


def with_prefill_lens(recording: Recording, lens: Callable[[dict[int, np.ndarray]], dict[int, Any]]) -> Recording:
    """The recording with its prefill pass's lens computed from the kept residuals (a copy: records may be shared)."""
    i, prefill = next((i, r) for i, r in enumerate(recording.records) if isinstance(r, PrefillRecord))
    resid = {n: c.resid for n, c in prefill.captures.items() if c.resid is not None and c.lens is None}
    if not resid:
        return recording
    found = lens(resid)
    captures = {n: replace(c, lens=[(int(t), float(p)) for t, p in found[n]]) if n in found else c
                for n, c in prefill.captures.items()}
    records = list(recording.records)
    records[i] = replace(prefill, captures=captures)
    return replace(recording, records=records)


# --- checking a run against a fresh one ------------------------------------------------------------------------

def attention_tolerance(run: RunFile) -> float:
    """How close a fresh run's attention must come to the file's: float32 rounding for a float32 model whose maps
    were kept as float32; the coarser of the model's and the stored maps' precision otherwise."""
    stored = {c.attention.dtype.name for r in run.recording.records
              for c in getattr(r, "captures", {}).values() if c.attention is not None}
    if run.dtype in ("bfloat16", "float16"):
        return 2e-2
    return 2e-3 if "float16" in stored else 1e-5


def attention_differences(run: RunFile, fresh: list[Any]) -> dict[tuple[str, int], float]:
    """Max |fresh - file| per captured map: the prefill pass's, then each decode step's while both runs chose the
    same tokens (a speculative run: the prefill pass only, its later passes verified rounds). `fresh`: the records of
    the same request run again with plain decoding (engine.core.generate.generate)."""
    mine = [run.prefill] + ([] if run.rounds else run.steps)
    again = [r for r in fresh if isinstance(r, (PrefillRecord, DecodeRecord))]
    out: dict[tuple[str, int], float] = {}
    for old, new in zip(mine, again):
        if old.token.id != new.token.id and isinstance(old, DecodeRecord):
            break
        where = "prefill" if isinstance(old, PrefillRecord) else f"step {old.step}"
        for layer, cap in sorted(old.captures.items()):
            other = new.captures.get(layer)
            if cap.attention is None or other is None or other.attention is None:
                continue
            if other.attention.shape != cap.attention.shape:
                raise RunFileError(f"{where}, layer {layer}: the fresh map is {list(other.attention.shape)}, the "
                                   f"file's {list(cap.attention.shape)}")
            diff = other.attention.astype(np.float32) - cap.attention.astype(np.float32)
            out[(where, layer)] = float(np.abs(diff).max())
        if old.token.id != new.token.id:
            break
    return out
