"""A step's products for a few to a few hundred rows (a room's decode step, a prefill chunk, a mixed step) four ways
on the model's own weights, side by side: MKL (F.linear), oneDNN on the weights packed once in its blocked layout
(what engine.core.small_batch packed before the panels), the row kernel's tiles on the weights as stored (rows.c's
tiles_linear) and its panels on the weights packed once (rows.c's panels_linear: what small_batch packs now, and
the invariant mode's products); why a chunk of up to small_batch.ROWS tokens takes the packed products
(docs/serving.md, "Prefill chunks on the packed weights") and why the packed products are the panels
(docs/engine.md, "Room products on panels").

    python bench/chunk_products.py                          # SmolLM2 float32, two threads
    python bench/chunk_products.py --rows 8 41 128 --rounds 7

Every layer's q|k|v, o, gate|up and down of the model (the products of a step but the LM head, which a prefill
makes for one row), each way in turn for every row count, the fastest of `--rounds` (the least disturbed by the
rest of the machine). Writes a new bench/results/chunk_products/<UTC time>-<commit>.json (bench/provenance.py).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from bench import provenance  # noqa: E402
from engine.core import kernels  # noqa: E402
from engine.core.loader import load_model  # noqa: E402

ROWS = (2, 8, 20, 41, 64, 96, 128, 256, 512)


def layer_weights(lm) -> list[torch.Tensor]:
    """Each layer's q|k|v and gate|up as one matrix each (as the step makes them), its o and down."""
    out = []
    for layer in lm.model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        out += [torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).detach(),
                attn.o_proj.weight.detach(), torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).detach(),
                mlp.down_proj.weight.detach()]
    return [w.contiguous() for w in out]


def ways(weights: list[torch.Tensor]) -> dict:
    """name -> product(x, i): the i-th weight's product each way (packed copies made once here)."""
    onednn = [torch.ops.mkldnn._reorder_linear_weight(w, None) for w in weights]
    out = {"mkl": lambda x, i: F.linear(x, weights[i]),
           "onednn": lambda x, i: torch.ops.mkldnn._linear_pointwise(x, onednn[i], None, "none", [], "")}
    kernel = kernels.row_kernel()
    if kernel is not None:
        panels = [kernel.pack(w) for w in weights]
        out["tiles"] = lambda x, i: kernel.tiled(x, weights[i])
        out["panels"] = lambda x, i: kernel.on_panels(x, panels[i])
    return out


def timed(fn, xs: dict, count: int) -> float:
    t = time.perf_counter()
    for i in range(count):
        fn(xs[i], i)
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    record = provenance.start("chunk_products", argv)
    torch.set_num_threads(args.threads)
    lm = load_model(args.model, device="cpu", dtype="float32")
    weights = layer_weights(lm)
    made = ways(weights)
    report = {}
    with torch.inference_mode():
        for rows in args.rows:
            xs = {i: torch.randn(rows, w.shape[1]) for i, w in enumerate(weights)}
            best = {name: float("inf") for name in made}
            for _ in range(args.rounds + 1):            # the ways in turn, round after round; the first warms up
                for name, fn in made.items():
                    best[name] = min(best[name], timed(fn, xs, len(weights)))
            flops = sum(2 * w.numel() * rows for w in weights)
            report[rows] = {name: {"ms": 1e3 * s, "gflops": flops / s / 1e9, "x_mkl": s / best["mkl"]}
                            for name, s in best.items()}
            print(f"{rows} rows: " + ", ".join(f"{n} {v['ms']:.1f} ms ({v['x_mkl']:.2f}x MKL)"
                                             for n, v in report[rows].items()), flush=True)
    record.save({"threads": args.threads, "model": lm.label, "products": len(weights), "rows": report},
                out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
