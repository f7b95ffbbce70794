"""Attention at long context on the embedded model, side by side in one run at 512, 2,048 and 8,192 tokens:

- prefill with capture off and with the pages' capture (what the server keeps to recompute attention, within its
  capture budget), and the capture's bytes;
- one head's map drawn on demand (pooled to 160 x 160 cells, as the page draws it), at a layer kept and, where the
  budget did not keep every layer, at one rebuilt from the layer below first; one query row (every head);
- every head of every layer summarised at full length (blockwise, online softmax);
- Hugging Face's `output_attentions=True` (eager) at the same length: time and bytes, or "does not fit".

    .venv/bin/python bench/long_context.py [--lengths 512,2048,8192] [--budget-mb 256] [--rounds 2] [--threads 1]

Writes a new bench/results/long_context/<UTC time>-<commit>.json (bench/provenance.py; with os.getloadavg()
before and after: the machine is shared) and prints a table. Targets on this CPU: capture on within 1.5x of capture
off at 8,192, capture bytes <= 1 GB at 8,192, one
head's map on demand in <= 1 s.
"""
from __future__ import annotations

import argparse
import gc
import os
import platform
import sys
import time
from pathlib import Path

import psutil
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.core.attention_maps import attention_map, attention_rows, summarise  # noqa: E402
from engine.core.generate import GenerationRequest, generate  # noqa: E402
from engine.core.hooks import CAPTURE_OFF  # noqa: E402
from engine.core.kept import KeptInputs, kept_for  # noqa: E402
from engine.core.loader import load_model  # noqa: E402
from engine.core.recompute import embeddings, layer_input, layer_qk  # noqa: E402
from engine.lab.long_context import text_ids  # noqa: E402
from engine.serving.capture import capture_policy  # noqa: E402
from bench import provenance  # noqa: E402

HEATMAP_CELLS = 160


def prefill_seconds(lm, ids: list[int], policy, kept: KeptInputs | None) -> float:
    request = GenerationRequest("bench", max_new_tokens=1, chat=False)
    records = list(generate(lm, request, policy, ids=ids, kept=kept))
    return records[0].seconds


def timed(fn):
    t0 = time.perf_counter()
    value = fn()
    return time.perf_counter() - t0, value


def on_demand(lm, kept: KeptInputs, ids: list[int]) -> dict:
    """One head's map and one row at a kept layer; a layer not kept rebuilt first, when there is one."""
    layer = kept.layers[len(kept.layers) // 2]
    head = lm.spec.n_heads // 2
    maps = [timed(lambda: attention_map(layer_qk(lm.model, layer, kept.input(layer)), head, HEATMAP_CELLS))
            for _ in range(3)]
    map_s, m = sorted(maps, key=lambda t: t[0])[1]                                 # the median of three
    row_s = sorted(timed(lambda: attention_rows(layer_qk(lm.model, layer, kept.input(layer)),
                                                list(range(lm.spec.n_heads)), len(ids) - 1, len(ids)))[0]
                   for _ in range(3))[1]
    out = {"map_layer": layer, "map_seconds": map_s, "map_cells": list(m.values.shape), "map_factor": m.factor,
           "row_seconds": row_s}
    missing = [i for i in range(lm.spec.n_layers) if i not in kept.layers]
    if missing:
        far = max(missing, key=lambda i: i - kept.below(i))                     # the most layers to run again
        t, _ = timed(lambda: attention_map(layer_qk(lm.model, far, layer_input(lm.model, kept, far, ids)[0]), head,
                                           HEATMAP_CELLS))
        out.update(rebuilt_layer=far, rebuilt_from=kept.below(far), rebuilt_map_seconds=t)
    return out


def hf_eager(lm, ids: list[int]) -> dict:
    """output_attentions=True on an eager copy: every layer's (heads, N, N) float32, or "does not fit"."""
    n, spec = len(ids), lm.spec
    need = spec.n_layers * spec.n_heads * n * n * 4
    free = psutil.virtual_memory().available
    if need > 0.6 * free:
        return {"fits": False, "bytes_needed": need, "available": free,
                "note": f"does not fit: {need / 1e9:.1f} GB of attention maps, {free / 1e9:.1f} GB available"}
    from transformers import AutoModelForCausalLM

    eager = AutoModelForCausalLM.from_pretrained(lm.source, attn_implementation="eager", dtype=torch.float32).eval()
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = eager(torch.tensor([ids]), output_attentions=True, logits_to_keep=1)
    seconds = time.perf_counter() - t0
    held = sum(a.numel() * a.element_size() for a in out.attentions)
    del out, eager
    gc.collect()
    return {"fits": True, "seconds": seconds, "bytes": held}


def measure(lm, n: int, budget: int, rounds: int) -> dict:
    ids = text_ids(lm, n)
    policy, note = capture_policy(lm.spec, n, 1, budget=budget, value_bytes=lm.dtype.itemsize)
    off, on, kept = [], [], None
    for r in range(rounds):                      # interleaved, the order swapped each round: noise hits both
        kept = kept_for(lm, policy, n + 1)
        for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):
            if mode == "off":
                off.append(prefill_seconds(lm, ids, CAPTURE_OFF, None))
            else:
                on.append(prefill_seconds(lm, ids, policy, kept))
        print(f"  N={n}: round {r + 1}: off {off[-1]:.2f} s, on {on[-1]:.2f} s, load {os.getloadavg()[0]:.1f}",
              flush=True)
    kept.truncate(kept.length)
    row = {"tokens": n, "prefill_off_seconds": min(off), "prefill_on_seconds": min(on), "rounds_off": off,
           "rounds_on": on, "on_vs_off": min(on) / min(off), "capture_bytes": kept.nbytes,
           "capture_bytes_per_token": kept.bytes_per_position, "kept_layers": list(kept.layers), "note": note}
    row.update(on_demand(lm, kept, ids))
    first = kept.input(0) if 0 in kept.layers else embeddings(lm.model, ids, lm.device)
    row["summaries_seconds"] = summarise(lm.model, first, lambda i: kept.input(i) if i in kept.layers else None,
                                         lm.spec.n_layers).seconds
    kept = None                                  # let the kept inputs go before HF eager needs the memory
    gc.collect()
    row["hf_output_attentions"] = hf_eager(lm, ids)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default")
    p.add_argument("--lengths", default="512,2048,8192")
    p.add_argument("--budget-mb", type=int, default=256, help="the capture budget (the CPU server's default)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: what `python -m engine serve` gives torch on this 2-core CPU)")
    p.add_argument("--out", help="default: a new file under bench/results/long_context/")
    args = p.parse_args()
    run = provenance.start("long_context")
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    lm = load_model(args.model, device="cpu")
    rows = []
    for n in [int(x) for x in args.lengths.split(",")]:
        rows.append(measure(lm, n, args.budget_mb * 2**20, args.rounds))
        save(run, args, rows, load_before)
    print_table(rows)


def save(run: provenance.Run, args, rows: list[dict], load_before) -> None:  # noqa: ANN001
    """After every length, into the run's own file: a run cut short keeps what it measured."""
    run.save({
        "model": args.model, "torch_threads": torch.get_num_threads(), "machine": platform.processor() or
        platform.machine(), "budget_mb": args.budget_mb, "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        "when": time.strftime("%Y-%m-%d %H:%M"), "rows": rows,
        "targets": {"on_vs_off_at_8192": 1.5, "capture_bytes_at_8192": 1e9, "map_seconds": 1.0}}, out=args.out)


def print_table(rows: list[dict]) -> None:
    print(f"{'N':>6} {'off s':>7} {'on s':>7} {'on/off':>6} {'capture':>10} {'map s':>6} {'rebuilt map s':>13} "
          f"{'row s':>6} {'summaries s':>11}  HF output_attentions")
    for r in rows:
        hf = r["hf_output_attentions"]
        hf_text = (f"{hf['seconds']:.1f} s, {hf['bytes'] / 1e9:.2f} GB" if hf["fits"] else hf["note"])
        rebuilt = f"{r['rebuilt_map_seconds']:.2f}" if "rebuilt_map_seconds" in r else "-"
        print(f"{r['tokens']:>6} {r['prefill_off_seconds']:>7.2f} {r['prefill_on_seconds']:>7.2f} "
              f"{r['on_vs_off']:>6.2f} {r['capture_bytes'] / 1e6:>8.1f} MB {r['map_seconds']:>6.2f} {rebuilt:>13} "
              f"{r['row_seconds']:>6.3f} {r['summaries_seconds']:>11.1f}  {hf_text}")


if __name__ == "__main__":
    main()
