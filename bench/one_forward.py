"""The one forward (engine/core/lean.py) measured two ways, side by side in one run on this shared machine:

1. prefill through the forward against transformers' modules, in one process, alternating round by round, at
   128, 512 and 2,048 prompt tokens (one chunk each, a fresh cache, the last position's logits);
2. one person alone through the batch runner on this tree and on a checkout of the commit before, alternating:
   a 2,048-token prompt's time to its first token, then the median time between tokens of 64 more.

    git archive <commit> | tar -x -C /tmp/before
    .venv/bin/python bench/one_forward.py --before /tmp/before --rounds 3

SmolLM2 (the embedded model) in float32 on the CPU. Ratios only mean something within one run: other processes
share the cores. Writes a new bench/results/one_forward/<UTC time>-<commit>.json (bench/provenance.py: commit, date,
command, machine, every round).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def prefill_rounds(lengths: list[int], rounds: int) -> dict:
    """Seconds of one prefill chunk through the forward and through the modules, per length, every round."""
    import torch
    from transformers import DynamicCache

    from engine.core.lean import one_forward
    from engine.core.loader import load_model

    lm = load_model("default", device="cpu", dtype="float32")
    lean, out = one_forward(lm), {}
    for n in lengths:
        ids = torch.randint(4, lm.spec.vocab_size, (n,), generator=torch.Generator().manual_seed(n)).tolist()
        times = {"forward": [], "modules": []}
        for r in range(rounds + 1):                                  # round 0 warms both up, not counted
            for name in (("forward", "modules") if r % 2 else ("modules", "forward")):
                cache = DynamicCache(config=lm.model.config)
                t = time.perf_counter()
                with torch.inference_mode():
                    if name == "forward":
                        lean.on_cache(ids, cache)
                    else:
                        lm.model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True, logits_to_keep=1)
                if r:
                    times[name].append(time.perf_counter() - t)
        out[n] = {**times, "forward_vs_modules_speed": statistics.median(times["modules"])
                  / statistics.median(times["forward"])}
    return out


def alone(prompt_tokens: int, new_tokens: int) -> dict:
    """One request through the batch runner: time to first token of a long prompt, then the median between tokens."""
    import torch

    from engine.core.generate import GenerationRequest
    from engine.core.hooks import CAPTURE_OFF
    from engine.core.loader import load_model
    from engine.serving.batch import BatchRunner, Slot

    lm = load_model("default", device="cpu", dtype="float32")
    ids = torch.randint(4, lm.spec.vocab_size, (prompt_tokens,), generator=torch.Generator().manual_seed(1)).tolist()
    records: list = []
    runner = BatchRunner(lm, max_batch=8, prefill_chunk=prompt_tokens)
    request = GenerationRequest("(token ids)", max_new_tokens=new_tokens, chat=False)
    runner.add(Slot(request, ids, CAPTURE_OFF, records.append, lambda err: records.append(err)))
    while not runner.idle:
        runner.step()
    steps = [r.seconds for r in records if getattr(r, "kind", "") == "decode"]
    return {"ttft_s": records[0].seconds, "itl_median_s": statistics.median(steps), "decode_steps": len(steps)}


def alone_in(tree: Path, args: argparse.Namespace) -> dict:
    code = (f"import sys, json; sys.path.insert(0, {str(tree)!r}); sys.path.insert(1, {str(ROOT / 'bench')!r}); "
            f"import one_forward; print(json.dumps(one_forward.alone({args.prompt}, {args.new})))")
    done = subprocess.run([sys.executable, "-c", code], cwd=tree, text=True, capture_output=True)
    if done.returncode:
        raise SystemExit(f"{tree}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--before", help="a checkout of the commit before (for the lone request's before/after)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 2048])
    p.add_argument("--prompt", type=int, default=2048)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--out", help="default: a new file under bench/results/one_forward/")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    from bench import provenance  # after the project root is on sys.path (run as a script)

    run = provenance.start("one_forward")
    report = {"what": __doc__.split("\n\n")[0], "prefill": prefill_rounds(args.lengths, args.rounds)}
    for n, row in report["prefill"].items():
        print(f"prefill {n:5d} tokens: forward {statistics.median(row['forward']) * 1e3:7.1f} ms, modules "
              f"{statistics.median(row['modules']) * 1e3:7.1f} ms: {row['forward_vs_modules_speed']:.2f}x", flush=True)
    if args.before:
        trees, seen = {"before": Path(args.before).resolve(), "after": ROOT}, {"before": [], "after": []}
        for r in range(args.rounds):
            for name in (("before", "after") if r % 2 == 0 else ("after", "before")):
                seen[name].append(alone_in(trees[name], args))
                print(f"round {r + 1} {name}: {seen[name][-1]}", flush=True)
        med = {name: {k: statistics.median(x[k] for x in rows) for k in ("ttft_s", "itl_median_s")}
               for name, rows in seen.items()}
        report["alone"] = {"before": str(trees["before"]), "rounds": seen, "medians": med,
                           "ttft_after_vs_before_speed": med["before"]["ttft_s"] / med["after"]["ttft_s"],
                           "itl_after_vs_before_speed": med["before"]["itl_median_s"] / med["after"]["itl_median_s"]}
        alone_report = report["alone"]
        print(f"alone: {args.prompt}-token TTFT after/before speed {alone_report['ttft_after_vs_before_speed']:.2f}x, "
              f"inter-token {alone_report['itl_after_vs_before_speed']:.2f}x", flush=True)
    run.save(report, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
