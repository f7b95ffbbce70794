"""A run's captures as tensors in one safetensors file (format `inference-playground/capture`, version 1; the layout
is documented in docs/capture_format.md). Written by `python -m engine generate --capture-out FILE`.

    write_capture(path, lm, ids, records, kept, policy)     # after a generation
    cap = read_capture(path)                                # CaptureFile: meta (dict) and tensors (torch, as stored)
    cap.tensors["layer.3.input"]                            # (N, d_model): recompute layer 3's attention from it

safetensors holds only named arrays and a header of strings: nothing in the file is ever executed or unpickled,
and it can be read lazily (a tensor at a time) by any safetensors reader, in Python or elsewhere.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from engine.core.hooks import CapturePolicy
from engine.core.kept import KeptInputs
from engine.core.records import DecodeRecord, DoneRecord, PrefillRecord
from engine.errors import EngineError

FORMAT = "inference-playground/capture"
VERSION = 1
NORMS = ("q_norm", "k_norm", "v_norm")


class CaptureFileError(EngineError):
    """A file that is not a capture this playground reads (another format, a newer version, damaged)."""


@dataclass(frozen=True)
class CaptureFile:
    meta: dict[str, Any]               # the run: model, dtype, request, policy, positions, which tensors mean what
    tensors: dict[str, torch.Tensor]   # as stored (layer inputs in the model's dtype, bf16 included)


def _stack_norms(caps: list[Any], name: str) -> np.ndarray | None:
    rows = [getattr(c, name) for c in caps]
    return None if any(r is None for r in rows) else np.stack(rows).astype(np.float32)


def _layer_tensors(i: int, prefill: PrefillRecord, steps: list[DecodeRecord]) -> dict[str, torch.Tensor]:
    """One captured layer: its prefill map, its decode rows (zero-padded, with where each starts) and its norms."""
    out: dict[str, torch.Tensor] = {}
    first = prefill.captures.get(i)
    caps = [first] + [s.captures.get(i) for s in steps]
    if first is not None and first.attention is not None:
        out[f"layer.{i}.attention.prefill"] = torch.from_numpy(np.ascontiguousarray(first.attention, np.float32))
    rows = [c.attention[:, -1] for c in caps[1:] if c is not None and c.attention is not None]
    if rows:
        width = max(r.shape[-1] for r in rows)
        padded = np.zeros((len(rows), rows[0].shape[0], width), np.float32)              # (steps, h, keys)
        for s, r in enumerate(rows):
            padded[s, :, : r.shape[-1]] = r
        out[f"layer.{i}.attention.decode"] = torch.from_numpy(padded)
        starts = [c.key_start for c in caps[1:] if c is not None and c.attention is not None]
        out[f"layer.{i}.attention.decode.key_start"] = torch.tensor(starts, dtype=torch.int64)
    for name in NORMS + ("resid_norm",):
        values = [getattr(c, name, None) for c in caps if c is not None]
        if values and all(v is not None for v in values):
            out[f"layer.{i}.{name}"] = torch.tensor(np.asarray(values, np.float32))
    return out


def write_capture(path: str | Path, lm: Any, ids: list[int], records: list[Any], kept: KeptInputs | None,
                  policy: CapturePolicy) -> int:
    """Write a finished (or stopped) run's captures; returns the bytes written."""
    prefill = next(r for r in records if isinstance(r, PrefillRecord))
    steps = [r for r in records if isinstance(r, DecodeRecord)]
    done = next((r for r in records if isinstance(r, DoneRecord)), None)
    tokens = [prefill.token.id] + [s.token.id for s in steps]
    positions = list(ids) + tokens[:-1]
    tensors: dict[str, torch.Tensor] = {"ids": torch.tensor(positions, dtype=torch.int64),
                                        "tokens": torch.tensor(tokens, dtype=torch.int64)}
    for i in sorted(prefill.captures):
        tensors.update(_layer_tensors(i, prefill, steps))
    for i in _inputs_written(kept, policy, lm.spec.n_layers):
        name = f"layer.{i}.input" if i < lm.spec.n_layers else "norm.input"
        tensors[name] = kept.input(i).detach().cpu().contiguous()
    meta = _meta(lm, prefill, steps, done, policy, len(ids), len(positions), kept)
    save_file(tensors, str(path), metadata={"format": FORMAT, "version": str(VERSION), "run": json.dumps(meta)})
    return Path(path).stat().st_size


def _inputs_written(kept: KeptInputs | None, policy: CapturePolicy, n_layers: int) -> list[int]:
    """The hidden states the file holds: those --keep-inputs named (the run kept more when views needed them)."""
    if kept is None:
        return []
    return [i for i in policy.input_ids(n_layers) if i in kept.layers]


def _meta(lm: Any, prefill: PrefillRecord, steps: list[DecodeRecord], done: DoneRecord | None,
          policy: CapturePolicy, n_prompt: int, n_positions: int, kept: KeptInputs | None) -> dict[str, Any]:
    heads = {str(i): {"heads": list(c.heads), "kv_heads": list(c.kv_heads), "query_start": c.query_start,
                      "key_start": c.key_start} for i, c in prefill.captures.items() if c.attention is not None}
    return {"model": lm.label, "source": str(lm.source), "dtype": lm.dtype_name, "n_layers": lm.spec.n_layers,
            "n_heads": lm.spec.n_heads, "n_kv_heads": lm.spec.n_kv_heads, "d_model": lm.spec.d_model,
            "n_prompt": n_prompt, "n_positions": n_positions, "steps": len(steps),
            "text": done.text if done is not None else None,
            "finish_reason": done.finish_reason if done is not None else "stopped",
            "policy": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(policy).items()},
            "attention": heads,
            "kept_layers": [i for i in _inputs_written(kept, policy, lm.spec.n_layers) if i < lm.spec.n_layers],
            "final_norm_input": lm.spec.n_layers in _inputs_written(kept, policy, lm.spec.n_layers),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def read_capture(path: str | Path) -> CaptureFile:
    """A capture file's run description and tensors; CaptureFileError for anything else."""
    try:
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
            _check_header(header, path)
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except CaptureFileError:
        raise
    except Exception as err:  # noqa: BLE001 - a damaged or foreign file is a message, not a traceback
        raise CaptureFileError(f"{path} is not a readable safetensors file ({type(err).__name__}: {err})") from None
    return CaptureFile(json.loads(header["run"]), tensors)


def _check_header(header: dict[str, str], path: str | Path) -> None:
    if header.get("format") != FORMAT:
        raise CaptureFileError(f"{path} is a safetensors file but not a playground capture (format "
                               f"{header.get('format')!r}, expected {FORMAT!r})")
    if not str(header.get("version", "")).isdigit() or int(header["version"]) > VERSION:
        raise CaptureFileError(f"{path} is capture format version {header.get('version')!r}; this playground reads "
                               f"versions up to {VERSION}")
