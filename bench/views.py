"""The time a page waits for a view derived from a run's residual stream, at 512 and 8,192 tokens.

    .venv/bin/python bench/views.py [--lengths 512,8192] [--rounds 3] [--new 8]

For each length, one run of N prompt tokens (the public-domain text of engine/lab/long_context.py) through the
in-process EngineService with the pages' capture policy and the server's capture budget (every layer's residual at
512; at 8,192 only the layers that fit, spread over the depth), then each view asked for as a page asks
(`ModelClient.quick`, the same call a remote page makes over HTTP):

- one layer's full map: one head pooled to 160 x 160 cells (the attention page's heatmap) and every head of the
  layer pooled to 48 x 48 (its grid), at a layer the run kept;
- one head's row as a token streams: `attention.row` for one head at the newest position, asked right after each
  decode record arrives while the run is still generating (its residual read from the batch's pool), and again
  after it finished;
- the lens for one token: `run.lens` (every kept layer's top 5 and its residual norm) at the last position.

Medians over the rounds (each round one fresh run); os.getloadavg() before and after (the machine is shared).
Writes a new bench/results/views/<UTC time>-<commit>.json (bench/provenance.py) and prints a table.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.core.generate import GenerationRequest  # noqa: E402
from engine.core.loader import load_model  # noqa: E402
from engine.core.records import DecodeRecord  # noqa: E402
from engine.lab.long_context import text_ids  # noqa: E402
from engine.service.service import EngineService  # noqa: E402
from engine.serving.capture import capture_policy  # noqa: E402
from engine.serving.limits import Limits  # noqa: E402
from engine.serving.scheduler import CheckedRequest  # noqa: E402
from bench import provenance  # noqa: E402



def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def one_run(svc: EngineService, ids: list[int], new: int) -> dict:
    """A run of `ids` with the pages' capture; a head's row timed after each decode record while it streams."""
    lm, limits = svc.lm, svc.limits
    policy, note = capture_policy(lm.spec, len(ids), new, True, limits.max_capture_bytes, limits.max_capture_layers,
                                  lm.dtype.itemsize)
    request = GenerationRequest("(the long text)", max_new_tokens=new, chat=False)
    handle = svc.submit(CheckedRequest(request, policy, tuple(ids), door=svc.scheduler), policy)
    state = None
    live = []
    for record in handle.records():
        if isinstance(record, DecodeRecord):
            state = state or svc.quick("attention.kept", {"run_id": handle.run_id})
            layer = [i for i in state.layers if i < lm.spec.n_layers][len(state.layers) // 2]
            position = len(ids) + record.step - 1
            live.append(timed(lambda: svc.quick("attention.row", {"run_id": handle.run_id, "layer": layer,
                                                                    "position": position, "heads": [3]})))
    state = svc.quick("attention.kept", {"run_id": handle.run_id})
    run, layers = handle.run_id, [i for i in state.layers if i < lm.spec.n_layers]
    layer = layers[len(layers) // 2]
    n = state.positions
    return {"kept_layers": list(state.layers), "positions": n, "kept_bytes": state.bytes, "note": note,
            "layer": layer, "row_live_s": statistics.median(live) if live else None,
            "map_one_head_s": timed(lambda: svc.quick("attention.map", {"run_id": run, "layer": layer, "heads": [3],
                                                                         "cells": 160})),
            "map_every_head_s": timed(lambda: svc.quick("attention.map", {"run_id": run, "layer": layer,
                                                                           "heads": list(range(lm.spec.n_heads)),
                                                                           "cells": 48})),
            "row_done_s": timed(lambda: svc.quick("attention.row", {"run_id": run, "layer": layer,
                                                                     "position": n - 1, "heads": [3]})),
            "lens_s": timed(lambda: svc.quick("run.lens", {"run_id": run, "position": n - 1}))}


def measure(lm, n: int, rounds: int, new: int) -> dict:
    limits = Limits.for_device(lm.device).with_env()
    os.environ["PLAYGROUND_MAX_PROMPT_TOKENS"] = str(max(limits.max_prompt_tokens, n))
    svc = EngineService(lm, Limits(**{**limits.to_dict(), "max_prompt_tokens": max(limits.max_prompt_tokens, n),
                                      "request_seconds": 900.0}))
    try:
        ids = text_ids(lm, n)
        runs = [one_run(svc, ids, new) for _ in range(rounds)]
    finally:
        svc.close()
    keys = ("row_live_s", "map_one_head_s", "map_every_head_s", "row_done_s", "lens_s")
    row = {k: statistics.median(r[k] for r in runs) for k in keys}
    row.update({k: runs[0][k] for k in ("kept_layers", "positions", "kept_bytes", "note", "layer")}, n=n,
               rounds=runs)
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lengths", default="512,8192")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--new", type=int, default=8, help="new tokens per run: the rows timed as they stream")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--out", help="default: a new file under bench/results/views/")
    args = p.parse_args()
    run = provenance.start("views")
    torch.set_num_threads(args.threads)
    lm = load_model("default", device="cpu", dtype="float32")
    load_before = os.getloadavg()
    rows = [measure(lm, int(n), args.rounds, args.new) for n in args.lengths.split(",")]
    report = {"what": "the time a page waits for a view derived from a run's residual (ModelClient.quick, in-process), "
                      "medians of the rounds", "model": lm.label, "dtype": lm.dtype_name, "threads": args.threads,
              "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
              "load_before": load_before, "load_after": os.getloadavg(), "rows": rows,
              "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    run.save(report, out=args.out)
    print(f"{'N':>6} {'kept':>5} {'map 1 head':>11} {'map all':>8} {'row live':>9} {'row done':>9} {'lens':>7}")
    for r in rows:
        print(f"{r['n']:>6} {len(r['kept_layers']):>5} {r['map_one_head_s']:>10.3f}s {r['map_every_head_s']:>7.3f}s "
              f"{r['row_live_s']:>8.3f}s {r['row_done_s']:>8.3f}s {r['lens_s']:>6.3f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
