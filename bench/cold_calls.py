"""What one small call costs right after a product has streamed its weights through the caches, against the same
call repeated (hot): why a lone step's work around its products is made in C, a layer in two calls (docs/engine.md,
"The work around the products, in C").

    python bench/cold_calls.py                    # two threads, 200 samples a call
    python bench/cold_calls.py --threads 1 --samples 400

A lone decode step streams every weight once: about 14 MB a SmolLM2 layer, more than this machine's share of its
caches, so each operator that follows a product finds its own code and data (Python's, torch's dispatcher's) evicted
and fetches them from memory again. Each call is timed alone, once after a product of the row kernel over a weight of
STREAM_MB (cold) and once right after the same call (hot); the median of each. Calls: torch.empty of one row, a
residual add, transformers' RMS norm in torch's operators (engine.core.lean.rms_norm), glue.c's norm through its
Python wrapper, and a bare ctypes call of glue.c's norm with its arguments made once. Writes a new
bench/results/cold_calls/<UTC time>-<commit>.json (bench/provenance.py).
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench import provenance  # noqa: E402
from engine.core import kernels  # noqa: E402
from engine.core.kernels.glue import glue_kernel  # noqa: E402
from engine.core.lean import rms_norm  # noqa: E402

STREAM_MB = 37           # a weight larger than this machine's 32 MB L3, as a SmolLM2 layer's are together
D = 576                  # SmolLM2's d_model


def calls(glue) -> dict:
    """name -> a call of one row's work, its tensors made once."""
    x, y, w = torch.randn(1, 1, D), torch.randn(1, 1, D), torch.randn(D)
    out = torch.empty(1, 1, D)
    bare = ctypes.CDLL(str(glue.path))["glue_norm"]
    bare.restype = None
    args = (ctypes.c_void_p(x.data_ptr()), ctypes.c_long(D), ctypes.c_void_p(w.data_ptr()),
            ctypes.c_void_p(out.data_ptr()), ctypes.c_long(D), ctypes.c_long(1), ctypes.c_long(D),
            ctypes.c_float(1e-5), ctypes.c_int(1))
    return {"torch.empty": lambda: torch.empty(1, 1, D), "add": lambda: x + y,
            "RMS norm, torch's operators": lambda: rms_norm(x, w, 1e-5),
            "RMS norm, glue.c through its wrapper": lambda: glue.norm(x, w, 1e-5),
            "RMS norm, glue.c, bare ctypes call": lambda: bare(*args) or out}     # `out` held: args are addresses


def sample(fn, before) -> float:
    before()
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    record = provenance.start("cold_calls", argv)
    torch.set_num_threads(args.threads)
    kernel, glue = kernels.row_kernel(), glue_kernel()
    if kernel is None or glue is None:
        print("the row kernel or glue.c is not built here", file=sys.stderr)
        return 1
    weight = torch.randn(STREAM_MB * 2 ** 20 // (4 * D), D)
    row, product = torch.randn(1, D), torch.empty(1, weight.shape[0])
    stream = kernel.one_row(weight)
    flush = lambda: stream(row.data_ptr(), product.data_ptr())                  # noqa: E731
    report = {}
    for name, fn in calls(glue).items():
        cold, hot = [], []
        for _ in range(args.samples):                  # cold and hot in turn: the machine's noise on both alike
            cold.append(sample(fn, flush))
            hot.append(sample(fn, fn))
        report[name] = {"cold_us": 1e6 * statistics.median(cold), "hot_us": 1e6 * statistics.median(hot)}
        print(f"{name}: {report[name]['hot_us']:.1f} us hot, {report[name]['cold_us']:.1f} us after the stream")
    record.save({"threads": args.threads, "stream_MB": STREAM_MB, "calls": report}, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
