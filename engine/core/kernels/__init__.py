"""The row kernel: a few float32 rows times a weight matrix, built once from C with this machine's compiler.

    kernel = row_kernel()                  # the loaded library, or None (why: `why_off()`), built on first use
    y = kernel.linear(x, weight, bias)     # x (R, in), R <= MAX_ROWS; weight (out, in) contiguous float32; -> (R, out)
    y = kernel.tiled(x, weight, bias)      # the same bits for any number of rows, blocked like a matrix product
    call = kernel.one_row(weight, bias)    # call(x address, y address): `linear` for one row, its C arguments made once
    panels = kernel.pack(weight)           # the weight copied once into panels (rows.c's panels_pack)
    y = kernel.on_panels(x, panels, bias)  # the same bits again, for any R, faster for a room's rows or a chunk

`rows.c` is a plain C file: compiled with `gcc -O3 -march=native -fopenmp -ffp-contract=fast` into a shared
library in the cache folder (~/.cache/inference-playground/kernels/, or PLAYGROUND_CACHE's), named by a hash of the
source, the flags, the compiler's version and the CPU's flags, so a new source, compiler or machine builds afresh;
`make provision` builds it (`python -m engine provision`), else the first product does (about a second). It is
loaded with ctypes, which lets go of the GIL during each call, and called with the tensors' addresses: nothing is
copied, the weight is the checkpoint's own (out, in) tensor. Its OpenMP parallel regions run on the OpenMP runtime
torch already loaded (torch's libgomp: the library names the same libgomp.so.1), so its threads are torch's team,
as many as torch.get_num_threads(), never a second team beside it.

Each output's sum runs in one fixed order (rows.c says which), so a row's result is bitwise the same alone, among
up to MAX_ROWS rows and with any number of threads. `tiled` (rows.c's `tiles_linear`) keeps that order for any
number of rows, in register tiles of 4 rows x 3 outputs over cache-sized blocks of the weights: the batch-invariant
products (engine/core/invariant.py) of a room's decode step or a prefill chunk. Why a kernel at all, and what it measured: docs/engine.md,
"Alone at the floor". Where there is no compiler, the build fails or the library cannot be loaded, `row_kernel()`
is None, one warning says why, and the products take torch's path (engine/core/matvec.py).

Not `torch.utils.cpp_extension.load_inline`: it compiles against torch's C++ headers (about a minute here) and
needs ninja, for a function that only reads and writes float arrays.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Callable, NamedTuple

import torch

from engine.models.folder import cache_dir

log = logging.getLogger("engine.kernels")

SOURCE = Path(__file__).with_name("rows.c")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-ffp-contract=fast", "-shared", "-fPIC")
MAX_ROWS = 8                       # rows `linear` takes (matvec: more take torch's product); `tiled` takes any
F32 = torch.float32
BUILD_SECONDS = 120                # a compiler that takes longer than this is given up on


class Panels(NamedTuple):
    """A weight (out, in) packed by `RowKernel.pack`: rows.c's panels of PN outputs, each half of every span side by
    side (`data`, panels_floats(in, out) floats), and the library that packed it and multiplies on it (a copy stays
    usable where the row kernel is later turned off in the process)."""
    data: torch.Tensor
    out: int
    width: int
    kernel: "RowKernel"


class BuildError(Exception):
    """Why the row kernel could not be built or loaded (one line)."""


class RowKernel:
    """The loaded library: `linear` as F.linear for a few float32 rows (the caller checks `fits`)."""

    def __init__(self, path: Path):
        self.path = path
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as err:
            raise BuildError(f"could not load {path.name}: {err}") from err
        self._call = lib.rows_linear
        long, ptr = ctypes.c_long, ctypes.c_void_p
        self._call.argtypes = [ptr, long, long, ptr, long, long, ptr, ptr, long, ctypes.c_int]
        self._call.restype = None
        self._tiles = lib.tiles_linear                 # the same arguments, any number of rows
        self._tiles.argtypes, self._tiles.restype = self._call.argtypes, None
        self._panels = lib.panels_linear               # the same arguments, the weight's panels; -> 0 or -1
        self._panels.argtypes, self._panels.restype = self._call.argtypes, ctypes.c_int
        self._pack = lib.panels_pack                   # (w, in, out, packed, threads)
        self._pack.argtypes, self._pack.restype = [ptr, long, long, ptr, ctypes.c_int], None
        self._floats = lib.panels_floats               # (in, out) -> the packed copy's floats
        self._floats.argtypes, self._floats.restype = [long, long], long
        self.max_threads = lib.rows_max_threads      # () -> the OpenMP team a region here would have
        self._bare = lib["rows_linear"]                # the same function without argtypes: `one_row` passes C values
        self.address = ctypes.cast(self._bare, ctypes.c_void_p).value   # rows_linear's, for C that calls it (glue.c)
        self._bare.restype = None

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               threads: int | None = None) -> torch.Tensor:
        """x (R, in) @ weight.T + bias -> (R, out), with `threads` threads (default: torch's count)."""
        return self._product(self._call, x, weight, bias, threads)

    def tiled(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
              threads: int | None = None) -> torch.Tensor:
        """`linear` for any number of rows R (the caller checks `fits(..., max_rows=None)`), bitwise the same."""
        return self._product(self._tiles, x, weight, bias, threads)

    def pack(self, weight: torch.Tensor) -> Panels:
        """`weight` (out, in), contiguous float32 on the CPU, copied into rows.c's panels for `on_panels`."""
        out, width = weight.shape
        data = torch.empty(self._floats(width, out), dtype=torch.float32)
        self._pack(weight.data_ptr(), width, out, data.data_ptr(), torch.get_num_threads())
        return Panels(data, out, width, self)

    def on_panels(self, x: torch.Tensor, panels: Panels, bias: torch.Tensor | None = None,
                  threads: int | None = None) -> torch.Tensor:
        """`linear` for any number of rows R on the weight's panels (x (R, in) float32 on the CPU), bitwise the
        same; MemoryError where the rows' packed copy could not be allocated."""
        rows = x.contiguous()                                                       # [R, in]
        r = rows.shape[0]
        y = torch.empty(r, panels.out, dtype=torch.float32)                        # [R, out]
        if self._panels(rows.data_ptr(), panels.width, r, panels.data.data_ptr(), panels.width, panels.out,
                        bias.data_ptr() if bias is not None else None, y.data_ptr(), panels.out,
                        torch.get_num_threads() if threads is None else threads):
            raise MemoryError(f"no memory for {r} packed rows of {panels.width}")
        return y

    def one_row(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Callable[[int, int], None]:
        """`linear` for one row against this weight, as call(x address, y address): y (out,) = x (in,) @ weight.T +
        bias, float32, on torch's thread count. Its C arguments are made once (a lone step's products: the ctypes
        call with 10 Python ints converted took 1.95 us here, with C values made once 1.32 us). The caller checks
        `fits` once, passes addresses of `in` and `out` floats and holds weight and bias while it calls."""
        out, width = weight.shape
        long, ptr, call, threads = ctypes.c_long, ctypes.c_void_p, self._bare, torch.get_num_threads
        head = (long(width), long(1), ptr(weight.data_ptr()), long(width), long(out),
                ptr(bias.data_ptr()) if bias is not None else None)
        tail = long(out)
        return lambda x, y: call(ptr(x), *head, ptr(y), tail, threads())

    @staticmethod
    def _product(call, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 threads: int | None) -> torch.Tensor:
        rows = x.contiguous()                                                       # [R, in]
        (r, width), out = rows.shape, weight.shape[0]
        y = torch.empty(r, out, dtype=torch.float32, device=x.device)               # [R, out]
        call(rows.data_ptr(), width, r, weight.data_ptr(), width, out,
             bias.data_ptr() if bias is not None else None, y.data_ptr(), out,
             torch.get_num_threads() if threads is None else threads)
        return y


def fits(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, max_rows: int | None = MAX_ROWS) -> bool:
    """Whether the kernel computes x @ weight.T + bias: CPU float32 throughout, weight contiguous (out, in), x (R,
    in) with 1 <= R <= max_rows (None: any R, as `tiled` takes), bias contiguous (out) or None; no autograd (the
    kernel has no backward)."""
    if not (x.dim() == 2 and 0 < x.shape[0] <= (max_rows or x.shape[0]) and x.dtype == F32 and weight.dtype == F32
            and x.device.type == "cpu" and weight.device.type == "cpu" and weight.dim() == 2
            and x.shape[1] == weight.shape[1] and weight.is_contiguous()):
        return False
    if bias is not None and not (bias.dtype == F32 and bias.device.type == "cpu" and bias.is_contiguous()
                                 and bias.shape == weight.shape[:1]):
        return False
    return not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                             or (bias is not None and bias.requires_grad)))


class Lazy:
    """A kernel built and loaded at its first use in this process, then handed out: `get()` is it, or None (and one
    warning) where it cannot be built or loaded, or where `use(False)` turned it off; `why_off()` says why.
    `make()` builds and loads it (raising BuildError); `off` names what takes its place in the warning."""

    every: list["Lazy"] = []                  # each made, for `forget_every`

    def __init__(self, name: str, make: Callable[[], object], off: str):
        self.name, self.make, self.off = name, make, off
        self._lock = threading.Lock()
        self._state: dict[str, object] = {}   # "built": the kernel or None once tried ("why" None); "kernel": handed out
        Lazy.every.append(self)

    def get(self):
        if "kernel" in self._state:
            return self._state["kernel"]
        with self._lock:
            if "built" not in self._state:
                try:
                    self._state["built"] = self.make()
                except BuildError as err:
                    self._state.update(built=None, why=str(err))
                    log.warning("%s off, %s: %s", self.name, self.off, err)
            self._state.setdefault("kernel", self._state["built"])
        return self._state["kernel"]

    def why_off(self) -> str | None:
        """Why `get()` is None (None while it is on or not yet tried)."""
        if "kernel" in self._state and self._state["kernel"] is None:
            return self._state.get("why") or f"turned off in this process ({self.name}: use(False))"  # type: ignore
        return None

    def use(self, on: bool) -> None:
        """Turn it off in this process (torch's path takes its place), or on again (as built before): the benches
        compare the two ways in one run, step by step."""
        with self._lock:
            if on:
                self._state.pop("kernel", None)
            else:
                self._state["kernel"] = None

    def forget(self) -> None:
        """Build (or find) and load it afresh at the next `get()` (tests change the compiler or the cache)."""
        with self._lock:
            self._state.clear()


def forget_every() -> None:
    """Every kernel of this package (rows.c, and glue.c and attend.c where their modules are imported) built or found
    afresh at its next use: a test that takes the compiler away must not leave any of them off for the tests after."""
    for lazy in Lazy.every:
        lazy.forget()


ROWS = Lazy("row kernel", lambda: RowKernel(build()), "the products take torch's path")


def row_kernel() -> RowKernel | None:
    """The row kernel, built and loaded at the first call in this process; None (and one warning) where it cannot
    be, or where `use(False)` turned it off."""
    return ROWS.get()                                                               # type: ignore[return-value]


why_off, use, forget = ROWS.why_off, ROWS.use, ROWS.forget


def compiler() -> str:
    """The C compiler: $CC, else gcc, else cc; BuildError where none is found."""
    for name in ([os.environ["CC"]] if os.environ.get("CC") else ["gcc", "cc"]):
        found = shutil.which(name)
        if found:
            return found
    raise BuildError(f"no C compiler found ({os.environ.get('CC') or 'gcc or cc'}; set CC to one)")


def library_path(cc: str, source: Path = SOURCE) -> Path:
    """Where the library built from `source` (a C file) with this compiler, these flags and this CPU lives: named
    by the file's stem and a hash of all four."""
    key = hashlib.sha256()
    for part in (source.read_bytes(), " ".join(FLAGS).encode(), _version(cc).encode(), _cpu_flags().encode()):
        key.update(part + b"\0")
    return cache_dir() / "kernels" / f"{source.stem}-{key.hexdigest()[:16]}.so"


def build(source: Path = SOURCE) -> Path:
    """The path of the library built from `source` (rows.c unless named), compiled now unless already there
    (written under a temporary name, then moved into place: two processes building at once each leave a whole
    file)."""
    cc = compiler()
    path = library_path(cc, source)
    if path.exists():
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            made = Path(tmp) / path.name
            done = subprocess.run([cc, *FLAGS, "-o", str(made), str(source)], capture_output=True, text=True,
                                  timeout=BUILD_SECONDS)
            if done.returncode != 0:
                raise BuildError(f"{Path(cc).name} failed to build {source.name}: {_first_error(done.stderr)}")
            os.replace(made, path)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise BuildError(f"could not build {source.name} with {cc}: {err}") from err
    return path


def _first_error(stderr: str) -> str:
    """The compiler's first error line (its first line where none says "error": gcc opens with "In function ...")."""
    lines = stderr.strip().splitlines() or ["no message"]
    return next((line for line in lines if "error" in line), lines[0])


def _version(cc: str) -> str:
    try:
        done = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise BuildError(f"{cc} does not run: {err}") from err
    if done.returncode != 0:
        raise BuildError(f"{cc} --version failed: {done.stderr.strip()[:200]}")
    return done.stdout.strip()


def _cpu_flags() -> str:
    """The CPU's model and instruction set flags (what -march=native compiles for), as /proc/cpuinfo says."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return os.uname().machine
    lines = [line for line in text.splitlines() if line.split(":")[0].strip() in ("flags", "model name", "Features")]
    return "\n".join(dict.fromkeys(lines))
