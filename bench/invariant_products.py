"""The invariant mode's products against MKL's, side by side in one run (issue 51): SmolLM2's weight shapes, 1 to
2,048 rows, one thread and two.

    python bench/invariant_products.py                         # every shape, 1 8 20 32 128 512 2048 rows, 5 rounds
    python bench/invariant_products.py --rows 20 2048 --rounds 3 --shapes gate_up down

Per shape (q|k|v 576->960, o 576->576, gate|up 576->3072, down 1536->576, vocabulary 576->49152; random weights and
rows: the order of a sum does not depend on its values, nor its speed), row count and thread count, three ways
taking turns round by round: `mkl` (F.linear: MKL's sgemm, the usual kernels' product above 8 rows), `padded` (the
mode's product before the row kernel took it: engine.core.invariant.padded, the rows padded with zero rows to a
multiple of 8, one MKL call) and `tiled` (engine.core.kernels' RowKernel.tiled, rows.c's tiles_linear: what the mode
makes now). Each (shape, rows, threads) gives the median and fastest seconds of each way, `tiled` over `mkl` and
over `padded` (medians), and whether `tiled` gave every row the bits the few-rows kernel gives it alone (bitwise).
The weights are made once per shape; a product's weight may be in the CPU's caches from the round before (not so the
vocabulary's 113 MB). Writes a new bench/results/invariant_products/<UTC time>-<commit>.json (bench/provenance.py).
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
from torch.nn import functional as F  # noqa: E402

from bench import provenance  # noqa: E402
from engine.core import invariant, kernels  # noqa: E402

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "vocabulary": (49152, 576)}
ROWS = (1, 8, 20, 32, 128, 512, 2048)


def ways(kernel: kernels.RowKernel) -> dict:
    return {"mkl": F.linear, "padded": invariant.padded, "tiled": kernel.tiled}


def same_bits(kernel: kernels.RowKernel, x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Rows 0, the middle one and the last of `tiled` over all of x, bitwise against each alone (`linear`)."""
    out = kernel.tiled(x, weight)
    return all(torch.equal(out[i:i + 1], kernel.linear(x[i:i + 1], weight)) for i in {0, len(x) // 2, len(x) - 1})


def one_case(kernel: kernels.RowKernel, weight: torch.Tensor, rows: int, rounds: int) -> dict:
    """Each way's seconds over `rounds` rounds, the ways taking turns (the current thread count)."""
    x = torch.randn(rows, weight.shape[1], generator=torch.Generator().manual_seed(rows))
    made = ways(kernel)
    times = {name: [] for name in made}
    for fn in made.values():
        fn(x, weight)                                     # not timed: a first touch, padded's one-time probe
    for _ in range(rounds):
        for name, fn in made.items():
            start = time.perf_counter()
            fn(x, weight)
            times[name].append(time.perf_counter() - start)
    med = {name: statistics.median(t) for name, t in times.items()}
    return {**{f"{name}_s": med[name] for name in made}, **{f"{name}_fastest_s": min(t) for name, t in times.items()},
            "tiled_over_mkl": med["tiled"] / med["mkl"], "tiled_over_padded": med["tiled"] / med["padded"],
            "bitwise_alone": same_bits(kernel, x, weight), "rounds": times}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    run = provenance.start("invariant_products", argv)
    kernel = kernels.row_kernel()
    if kernel is None:
        sys.exit(f"the row kernel is not built: {kernels.why_off()}")
    results = []
    with torch.inference_mode():
        for shape in args.shapes:
            weight = torch.randn(*SHAPES[shape], generator=torch.Generator().manual_seed(0))
            for threads in args.threads:
                torch.set_num_threads(threads)
                for rows in args.rows:
                    case = one_case(kernel, weight, rows, args.rounds)
                    results.append({"shape": shape, "out": weight.shape[0], "in": weight.shape[1], "rows": rows,
                                    "threads": threads, **case})
                    print(f"{shape:10s} {threads} thr {rows:5d} rows: tiled/mkl {case['tiled_over_mkl']:.2f} "
                          f"tiled/padded {case['tiled_over_padded']:.2f} (mkl {case['mkl_s'] * 1e3:.2f} ms)"
                          f"{'' if case['bitwise_alone'] else '  BITS DIFFER'}", flush=True)
    print(run.save({"results": results, "ways": list(ways(kernel)), "rounds_each": args.rounds}, out=args.out))


if __name__ == "__main__":
    main()
