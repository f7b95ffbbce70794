"""A lone step's weight products made every way there is, side by side in one run: the row kernel against the split
products the step made before it (and the packed layouts tried before that).

    python bench/lone_products.py                          # SmolLM2, kernel and split, one and two threads, 7 rounds
    python bench/lone_products.py --threads 2 --rounds 11 --rows 4
    python bench/lone_products.py --way split --way mkl --way onednn --way head-16

Every product of a lone SmolLM2 decode step, in the step's order (per layer q|k|v, o, gate|up, down, as
engine.core.lone makes them side by side; then the head), `--rows` rows each (a lone step has one), made each way
at each thread count, the (threads, way) pairs taking turns round by round: `kernel` (engine.core.kernels: the row
kernel, what engine.core.matvec.linear makes now), `split` (engine.core.matvec.split: the stored matrix as 4 blocks
of output rows, one torch.bmm: the step's products before the kernel), `mkl` (MKL's packed GEMM:
`torch.ops.mkl._mkl_reorder_linear_weight` once, `torch.ops.mkl._mkl_linear` per product, what inductor's CPU
freezing uses), `onednn` (`torch.ops.mkldnn._reorder_linear_weight` once, `torch.ops.mkldnn._linear_pointwise` per
product), and `head-N`: the split products with the vocabulary projection (113 MB of the 540) in N blocks of output
rows instead of 4; `kernel-huge` and `kernel-4k`: the kernel on a copy of the weights in memory advised for 2 MB
pages (transparent huge pages) and in ordinary 4 KB pages (the loader places the step's weights in 2 MB pages since
engine.core.layout.in_huge_pages; before it, in 4 KB pages). The process's AnonHugePages is recorded. The weights' 0.54 GB do not fit any cache, so each product reads its weight from memory as a
step does. Per way and thread count: the products' wall time (median over rounds, and the fastest), the rate its
weights streamed at (their bytes over the median), the bytes its packed weights take, and its largest difference
from the float64 product on the same rows. The floor: the weights' bytes over the read bandwidth of a sum over as
many bytes, at each thread count, in the same run. Also the threads: torch's count, the OpenMP team a parallel
region of the kernel's library gets, and the process's threads before and after (the kernel runs on torch's team,
adding none). Writes a new bench/results/lone_products/<UTC time>-<commit>.json (bench/provenance.py); docs/engine.md
reads it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.provenance import server_wait  # noqa: E402 (torch-free)

server_wait()                        # before torch loads OpenMP: its threads wait as the server's do

import torch  # noqa: E402

from bench import provenance  # noqa: E402
from bench.lone_step import anon_huge_kb, floor  # noqa: E402
from engine.core import kernels, matvec  # noqa: E402
from engine.core.layout import mapped_floats  # noqa: E402
from engine.core.loader import load_model  # noqa: E402
from engine.serving.batch import BatchRunner  # noqa: E402


def step_weights(runner: BatchRunner) -> list[torch.Tensor]:
    """The matrices a lone step multiplies, in its order: per layer q|k|v, o, gate|up, down; then the head."""
    lean, wholes = runner.lean.lean, runner.lean.lean.lm.side_by_side
    out = []
    for w, (qkv, gate_up) in zip(lean.layers, wholes):
        out += [qkv, w.o[0], gate_up, w.down[0]]
    return out + [lean.head[0]]


HEAD_PARTS = (16, 64)     # the head (49,152 x 576) in this many blocks of output rows instead of matvec.PARTS


def blocks(x: torch.Tensor, weight: torch.Tensor, parts: int) -> torch.Tensor:
    """matvec.linear's product with `parts` blocks: x (1, in) -> (1, out)."""
    out, width = weight.shape
    return torch.bmm(weight.view(parts, out // parts, width), x.t().expand(parts, -1, -1)).view(out, -1).t()


def made(weights: list[torch.Tensor], names: list[str]) -> dict:
    """Per way named: what multiplies rows by the i-th weight, and the bytes its weights take."""
    nbytes = sum(w.numel() * 4 for w in weights)
    split = [lambda x, w=w: matvec.split(x, w) for w in weights]
    ways = {}
    for name in names:
        if name == "kernel":
            kernel = kernels.row_kernel()
            if kernel is None:
                raise SystemExit(f"the row kernel is off here: {kernels.why_off()}")
            ways[name] = ([lambda x, w=w: kernel.linear(x, w) for w in weights], nbytes)
        elif name in ("kernel-huge", "kernel-4k"):
            kernel, copies = kernels.row_kernel(), copied(weights, advise=name == "kernel-huge")
            ways[name] = ([lambda x, w=w: kernel.linear(x, w) for w in copies], nbytes)
        elif name == "split":
            ways[name] = (split, nbytes)
        elif name.startswith("head-"):
            n = int(name.split("-")[1])
            ways[name] = (split[:-1] + [lambda x, w=weights[-1], n=n: blocks(x, w, n)], nbytes)
        elif name == "mkl":
            mkl = [torch.ops.mkl._mkl_reorder_linear_weight(w, 1) for w in weights]
            ways[name] = ([lambda x, p=p, w=w: torch.ops.mkl._mkl_linear(x, p, w, None, 1)
                           for p, w in zip(mkl, weights)], sum(p.numel() * 4 for p in mkl))
        elif name == "onednn":                             # an opaque oneDNN tensor: its blocked layout's bytes unread
            dnn = [torch.ops.mkldnn._reorder_linear_weight(w, 1) for w in weights]
            ways[name] = ([lambda x, p=p: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")
                           for p in dnn], None)
    return ways


WAYS = ("kernel", "split", "kernel-huge", "kernel-4k", "mkl", "onednn", *(f"head-{n}" for n in HEAD_PARTS))


def copied(weights: list[torch.Tensor], advise: bool) -> list[torch.Tensor]:
    """The weights copied one after another into one anonymous mapping, advised for 2 MB pages (MADV_HUGEPAGE, what
    transparent huge pages in "madvise" mode need) or not: the page size alone differs. Linux only; the tensors keep
    the mapping alive (torch.frombuffer)."""
    flat, out, at = mapped_floats(sum(w.numel() for w in weights), advise), [], 0
    for w in weights:
        out.append(flat[at:at + w.numel()].view_as(w).copy_(w))
        at += w.numel()
    return out


def one_pass(products, rows) -> float:
    t = time.perf_counter()
    for product, x in zip(products, rows):
        product(x)
    return time.perf_counter() - t


def differences(ways: dict, weights: list[torch.Tensor], rows: list[torch.Tensor]) -> dict:
    """Per way, its largest difference from the float64 product over every weight, and the largest |product|."""
    exact = [(x.double() @ w.double().t()) for x, w in zip(rows, weights)]
    out = {name: max(float((p(x).double() - e).abs().max()) for p, x, e in zip(products, rows, exact))
           for name, (products, _) in ways.items()}
    out["largest"] = max(float(e.abs().max()) for e in exact)
    return out


def process_threads() -> int:
    """The threads this process has now (Linux; -1 elsewhere)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return -1


def rounds(ways: dict, rows: list[torch.Tensor], threads: list[int], n: int) -> dict:
    """Per (threads, way), the wall seconds of each of n rounds; the pairs take turns, each leading a round in
    turn; round 0 warms every pair and is not kept."""
    pairs = [(t, name) for t in threads for name in ways]
    times = {pair: [] for pair in pairs}
    for r in range(n + 1):
        for t, name in pairs[r % len(pairs):] + pairs[:r % len(pairs)]:
            torch.set_num_threads(t)
            seconds = one_pass(ways[name][0], rows)
            if r:
                times[t, name].append(seconds)
    return times


def team(kernel_on: bool, threads: list[int]) -> dict:
    """Per thread count, torch's count and the OpenMP team a region of the kernel's library would get."""
    out = {}
    for t in threads:
        torch.set_num_threads(t)
        out[str(t)] = {"torch": torch.get_num_threads(),
                       "kernel": kernels.row_kernel().max_threads() if kernel_on else None}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--rows", type=int, default=1, help="rows a product multiplies (a lone step: 1)")
    parser.add_argument("--way", action="append", choices=WAYS, help="default: kernel and split")
    parser.add_argument("--out", help="default: a new file under bench/results/lone_products/")
    args = parser.parse_args(argv)
    names = list(dict.fromkeys(args.way or ["kernel", "split"]))
    record = provenance.start("lone_products", argv)
    lm = load_model(args.model, device="cpu", dtype="float32")
    runner = BatchRunner(lm, max_batch=4, prefix=None)
    weights = step_weights(runner)
    rows = [torch.randn(args.rows, w.shape[1], generator=torch.Generator().manual_seed(i))
            for i, w in enumerate(weights)]
    with torch.inference_mode():
        ways = made(weights, names)
        started = process_threads()
        times = rounds(ways, rows, args.threads, args.rounds)
        diffs = differences(ways, weights, rows)
    report = {"threads": args.threads, "rounds": args.rounds, "rows": args.rows, "products": len(weights),
              "product_bytes": sum(w.numel() * w.element_size() for w in weights),
              "ways": names, "floor": floor(lm, args.threads), "largest_product": diffs["largest"],
              "team": team("kernel" in ways, args.threads),
              "process_threads": {"before": started, "after": process_threads()}, "anon_huge_kb": anon_huge_kb()}
    for (t, name), seconds in times.items():
        report[f"{name}-{t}"] = entry(report, name, t, seconds, ways[name][1], diffs[name], times)
    print(f"floor {report['floor']['floor_ms']:.1f} ms ({report['floor']['best_gb_s']:.1f} GB/s; "
          f"{report['floor']['read_gb_s']}); threads {report['team']}, the process's {report['process_threads']}")
    record.save(report, out=args.out)
    return 0


def entry(report: dict, name: str, t: int, seconds: list[float], nbytes: int | None, diff: float,
          times: dict) -> dict:
    """One (way, threads) pair's figures, printed as a line."""
    ms = 1e3 * statistics.median(seconds)
    split = times.get((t, "split"))
    out = {"threads": t, "median_ms": ms, "fastest_ms": 1e3 * min(seconds), "weight_bytes": nbytes,
           "streamed_gb_s": report["product_bytes"] / ms / 1e6, "x_floor": ms / report["floor"]["floor_ms"],
           "over_split": ms / (1e3 * statistics.median(split)) if split else None, "max_diff_vs_float64": diff,
           "rounds_ms": [1e3 * s for s in seconds]}
    print(f"{name} {t} thread{'s' * (t > 1)}: {ms:.1f} ms a step's products (fastest {out['fastest_ms']:.1f}), "
          f"{out['streamed_gb_s']:.1f} GB/s, {out['x_floor']:.2f}x the floor, max diff {diff:.1e}", flush=True)
    return out


if __name__ == "__main__":
    sys.exit(main())
