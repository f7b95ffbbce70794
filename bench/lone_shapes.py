"""Where the row kernel loses to the memory: its read rate per weight shape of a lone SmolLM2 step, against a plain
streaming read of the very same bytes, side by side in one run.

    python bench/lone_shapes.py                        # 1 and 2 threads, 7 rounds, one row
    python bench/lone_shapes.py --threads 2 --rounds 11

The step's matrices (bench/lone_products.step_weights: per layer q|k|v 576->960, o 576->576, gate|up 576->3072,
down 1536->576; the vocabulary projection 576->49152) grouped by shape; per shape and thread count, each round
times one pass of the row kernel over every matrix of that shape (one row, as a lone step) and one pass of a plain
sum over the same tensors (torch's `sum`: a streaming read of the same bytes in the same pages), the (shape, way,
threads) triples taking turns. A shape's 30 matrices together (66-200 MB) and the vocabulary's 113 MB do not fit any
cache, so each pass reads from memory. Per triple: the median and fastest wall ms, and the GB/s (the group's bytes
over the median); per shape: the kernel's rate over the read's. Writes bench/results/lone_shapes/<UTC>-<commit>.json
(bench/provenance.py); docs/engine.md, "Alone at the floor", reads it.
"""
from __future__ import annotations

import argparse
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
from bench.lone_products import step_weights  # noqa: E402
from engine.core import kernels  # noqa: E402
from engine.core.loader import load_model  # noqa: E402
from engine.serving.batch import BatchRunner  # noqa: E402


def by_shape(weights: list[torch.Tensor]) -> dict[str, list[torch.Tensor]]:
    """The matrices grouped by shape, named 'in->out', in the step's order of first appearance."""
    groups: dict[str, list[torch.Tensor]] = {}
    for w in weights:
        groups.setdefault(f"{w.shape[1]}->{w.shape[0]}", []).append(w)
    return groups


def passes(kernel, group: list[torch.Tensor]) -> dict:
    """The two ways over one group: what one pass does."""
    rows = [torch.randn(1, w.shape[1], generator=torch.Generator().manual_seed(i)) for i, w in enumerate(group)]
    return {"kernel": lambda: [kernel.linear(x, w) for x, w in zip(rows, group)],
            "read": lambda: [w.sum() for w in group]}


def rounds(triples: dict, n: int) -> dict:
    """Per (shape, way, threads), the wall seconds of n rounds; the triples take turns, each leading a round in
    turn; round 0 warms every triple and is not kept."""
    keys = list(triples)
    times = {key: [] for key in keys}
    for r in range(n + 1):
        for key in keys[r % len(keys):] + keys[:r % len(keys)]:
            torch.set_num_threads(key[2])
            t = time.perf_counter()
            triples[key]()
            if r:
                times[key].append(time.perf_counter() - t)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", help="default: a new file under bench/results/lone_shapes/")
    args = parser.parse_args(argv)
    record = provenance.start("lone_shapes", argv)
    kernel = kernels.row_kernel()
    if kernel is None:
        raise SystemExit(f"the row kernel is off here: {kernels.why_off()}")
    lm = load_model(args.model, device="cpu", dtype="float32")
    groups = by_shape(step_weights(BatchRunner(lm, max_batch=4, prefix=None)))
    triples = {(shape, way, t): fn for shape, group in groups.items()
               for way, fn in passes(kernel, group).items() for t in args.threads}
    with torch.inference_mode():
        times = rounds(triples, args.rounds)
    report = {"threads": args.threads, "rounds": args.rounds, "shapes": {}}
    for shape, group in groups.items():
        report["shapes"][shape] = shape_entry(shape, group, times, args.threads)
    record.save(report, out=args.out)
    return 0


def shape_entry(shape: str, group: list[torch.Tensor], times: dict, threads: list[int]) -> dict:
    """One shape's figures at each thread count, printed as lines."""
    nbytes = sum(w.numel() * w.element_size() for w in group)
    out = {"matrices": len(group), "bytes": nbytes}
    for t in threads:
        row = {}
        for way in ("kernel", "read"):
            seconds = times[shape, way, t]
            ms = 1e3 * statistics.median(seconds)
            row[way] = {"median_ms": ms, "fastest_ms": 1e3 * min(seconds), "gb_s": nbytes / ms / 1e6,
                        "rounds_ms": [1e3 * s for s in seconds]}
        row["kernel_over_read"] = row["kernel"]["gb_s"] / row["read"]["gb_s"]
        out[str(t)] = row
        print(f"{shape} x{len(group)} ({nbytes / 1e6:.0f} MB), {t} thread{'s' * (t > 1)}: kernel "
              f"{row['kernel']['gb_s']:.1f} GB/s, read {row['read']['gb_s']:.1f} GB/s, "
              f"{row['kernel_over_read']:.2f} of the read", flush=True)
    return out


if __name__ == "__main__":
    sys.exit(main())
