"""A lone step's weight products made with packed weights, against the split products the step makes now, in one run.

    python bench/lone_products.py                  # SmolLM2, two torch threads, 7 rounds
    python bench/lone_products.py --threads 1 --rounds 11

Every product of a lone SmolLM2 decode step, in the step's order (per layer q|k|v, o, gate|up, down, as
engine.core.lone makes them side by side; then the head), one row each, made three ways, the ways taking turns round
by round: `split` (engine.core.matvec.linear: the stored matrix as 4 blocks of output rows, one torch.bmm), `mkl`
(MKL's packed GEMM: `torch.ops.mkl._mkl_reorder_linear_weight` once, `torch.ops.mkl._mkl_linear` per product, what
inductor's CPU freezing uses), `onednn` (`torch.ops.mkldnn._reorder_linear_weight` once,
`torch.ops.mkldnn._linear_pointwise` per product), and `head-N`: the split products with the vocabulary projection
(113 MB of the 540) in N blocks of output rows instead of 4. The weights' 0.54 GB do not fit any cache, so each product reads
its weight from memory as a step does. Per way: the products' wall time (median over rounds, and the fastest), the
bytes its packed weights take, and its largest difference from the float64 product on the same row. The floor: the
weights' bytes over the read bandwidth of a sum over as many bytes, in the same run. Writes a new
bench/results/lone_products/<UTC time>-<commit>.json (bench/provenance.py); docs/engine.md reads it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")        # before torch loads OpenMP: as the server runs
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench import provenance  # noqa: E402
from bench.lone_step import floor  # noqa: E402
from engine.core import matvec  # noqa: E402
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


def made(weights: list[torch.Tensor]) -> dict:
    """Per way: what multiplies a row by the i-th weight, and the bytes its weights take."""
    mkl = [torch.ops.mkl._mkl_reorder_linear_weight(w, 1) for w in weights]
    dnn = [torch.ops.mkldnn._reorder_linear_weight(w, 1) for w in weights]
    split = [lambda x, w=w: matvec.linear(x, w) for w in weights]
    return {
        "split": (split, sum(w.numel() * 4 for w in weights)),
        **{f"head-{n}": (split[:-1] + [lambda x, w=weights[-1], n=n: blocks(x, w, n)], sum(w.numel() * 4 for w in weights))
           for n in HEAD_PARTS},
        "mkl": ([lambda x, p=p, w=w: torch.ops.mkl._mkl_linear(x, p, w, None, 1) for p, w in zip(mkl, weights)],
                sum(p.numel() * 4 for p in mkl)),
        "onednn": ([lambda x, p=p: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "") for p in dnn],
                   None),                                  # an opaque oneDNN tensor: its blocked layout's bytes unread
    }


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", help="default: a new file under bench/results/lone_products/")
    args = parser.parse_args(argv)
    record = provenance.start("lone_products", argv)
    torch.set_num_threads(args.threads)
    lm = load_model(args.model, device="cpu", dtype="float32")
    runner = BatchRunner(lm, max_batch=4, prefix=None)
    weights = step_weights(runner)
    rows = [torch.randn(1, w.shape[1], generator=torch.Generator().manual_seed(i)) for i, w in enumerate(weights)]
    with torch.inference_mode():
        ways = made(weights)
        times = {name: [] for name in ways}
        for r in range(args.rounds + 1):
            order = list(ways)[r % len(ways):] + list(ways)[:r % len(ways)]     # each way leads a round in turn
            for name in order:
                seconds = one_pass(ways[name][0], rows)
                if r:                                                            # round 0 warms every way
                    times[name].append(seconds)
        diffs = differences(ways, weights, rows)
    report = {"threads": args.threads, "rounds": args.rounds, "products": len(weights),
              "floor": floor(lm, [args.threads]), "largest_product": diffs["largest"]}
    for name, (_, nbytes) in ways.items():
        ms = 1e3 * statistics.median(times[name])
        report[name] = {"median_ms": ms, "fastest_ms": 1e3 * min(times[name]), "weight_bytes": nbytes,
                        "x_floor": ms / report["floor"]["floor_ms"], "over_split": ms / (1e3 * statistics.median(
                            times["split"])), "max_diff_vs_float64": diffs[name],
                        "rounds_ms": [1e3 * t for t in times[name]]}
        print(f"{name}: {ms:.1f} ms a step's products (fastest {report[name]['fastest_ms']:.1f}), "
              f"{report[name]['x_floor']:.2f}x the floor, {nbytes or 0:,} bytes, max diff {diffs[name]:.1e}",
              flush=True)
    print(f"floor {report['floor']['floor_ms']:.1f} ms ({report['floor']['best_gb_s']:.1f} GB/s)")
    record.save(report, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
