"""A model is a folder: the files the engine loaded, what the weight files hold, and how long moving them takes.

    report = describe_folder(lm.source)          # files, kinds, sizes; tensors, dtypes, parameters per shard
    read = time_read(report)                     # measured: every weight byte read from disk (or page cache)
    pcie_seconds(16.06e9, PCIE["gen5-x16"])      # projected: the copy onto a GPU over its host link

The safetensors headers are read with `safetensors.safe_open` (names, dtypes and shapes only; no tensor
is loaded). A PCIe link's rate is computed from the standard: transfers/s per lane x lanes x the line
code's payload share (128 of every 130 bits from Gen3 on) / 8 bits per byte, per direction.
"""
from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from safetensors import safe_open

from engine import settings
from engine.errors import NoWeightsError

CACHE_ENV = "PLAYGROUND_CACHE"
READ_CHUNK = 64 * 2**20


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where converted models live; set PLAYGROUND_CACHE to move it (the `cache` setting)."""
    root = settings.of(environ).cache or Path.home() / ".cache" / "inference-playground"
    return Path(root).expanduser()


@dataclass(frozen=True)
class PcieLink:
    name: str
    gigatransfers: float         # GT/s per lane
    lanes: int

    @property
    def bytes_per_second(self) -> float:
        return self.gigatransfers * 1e9 * self.lanes * 128 / 130 / 8


PCIE: dict[str, PcieLink] = {
    "gen4-x16": PcieLink("PCIe 4.0 x16", 16.0, 16),
    "gen5-x16": PcieLink("PCIe 5.0 x16 (H100's host link)", 32.0, 16),
}


@dataclass(frozen=True)
class FileEntry:
    name: str                    # path relative to the folder
    size: int                    # bytes on disk
    kind: str                    # "weights", "config", "tokenizer", "generation", "chat template", "other"


@dataclass(frozen=True)
class ShardInfo:
    """What one safetensors file holds, read from its header."""

    name: str
    tensors: int
    parameters: int
    dtypes: dict[str, int]       # dtype -> parameters stored in it


@dataclass(frozen=True)
class FolderReport:
    path: Path
    files: list[FileEntry]
    shards: list[ShardInfo] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def weight_bytes(self) -> int:
        return sum(f.size for f in self.files if f.kind == "weights")

    @property
    def parameters(self) -> int:
        return sum(s.parameters for s in self.shards)


def file_kind(name: str) -> str:
    """What a checkpoint file is for, from its name."""
    lower = name.lower()
    if lower.endswith(".safetensors") or lower.endswith(".safetensors.index.json"):
        return "weights"
    if lower == "config.json":
        return "config"
    if lower == "generation_config.json":
        return "generation"
    if "chat_template" in lower:
        return "chat template"
    if lower.startswith(("tokenizer", "special_tokens", "vocab", "merges")) or lower.endswith(".model"):
        return "tokenizer"
    return "other"


def shard_info(path: Path) -> ShardInfo:
    """Tensor count, parameters and dtypes of one safetensors file, from its header alone."""
    dtypes: Counter[str] = Counter()
    count = 0
    with safe_open(str(path), framework="pt") as f:
        for key in f.keys():
            piece = f.get_slice(key)
            dtypes[piece.get_dtype()] += math.prod(piece.get_shape())
            count += 1
    return ShardInfo(path.name, count, sum(dtypes.values()), dict(dtypes))


def describe_folder(folder: Path | str) -> FolderReport:
    """Every file in the checkpoint folder (sizes and kinds) and every weight shard's header."""
    root = Path(folder)
    if not root.is_dir():
        raise NoWeightsError(f"{root} is not a folder")
    paths = sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))
    files = [FileEntry(str(p.relative_to(root)), p.stat().st_size, file_kind(p.name)) for p in paths]
    shards = [shard_info(p) for p in paths if p.suffix == ".safetensors"]
    return FolderReport(root, files, shards)


@dataclass(frozen=True)
class ReadTiming:
    nbytes: int
    seconds: float

    @property
    def bytes_per_second(self) -> float:
        return self.nbytes / self.seconds if self.seconds > 0 else math.inf


def time_read(report: FolderReport) -> ReadTiming:
    """Read every weight file once, in 64 MiB chunks, and time it (a repeat may come from the page cache)."""
    total, start = 0, time.perf_counter()
    for entry in report.files:
        if entry.kind != "weights":
            continue
        with open(report.path / entry.name, "rb") as f:
            while chunk := f.read(READ_CHUNK):
                total += len(chunk)
    return ReadTiming(total, time.perf_counter() - start)


def pcie_seconds(nbytes: float, link: PcieLink) -> float:
    """Projected: the copy over the link at its full rate (real copies reach most of it from pinned memory)."""
    return nbytes / link.bytes_per_second
