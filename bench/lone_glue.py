"""A lone request's decode step with two source trees side by side: the work around the products before and after a
change (issue 54), the same machine, the same run, the trees' processes alternating round by round.

    python bench/lone_glue.py --before /tmp/before-glue          # that tree (a `git worktree add` of the old commit)
    python bench/lone_glue.py --before /tmp/before-glue --rounds 5 --tokens 64 --threads 1

Each round starts one child process per tree (PYTHONPATH: the tree; the model, the batch runner and the row kernel
are the tree's own), which runs one lone request for warm-up, then one of `--tokens` new tokens through the batch
runner (engine.serving.batch, as the scheduler runs a lone request), timing every step (wall and the thread's CPU
time; the first three left out, the median kept), then profiles a few more steps with torch.profiler: the operators
a step dispatches (every one, nested calls included), the tensors it allocates (aten::empty and empty_strided) and
the operators' own CPU time by kind; and the fixed cost of one product's call (`call_cost`). Every step's logits are hashed (sha256 over the steps' bytes): the trees must
give the same hash, or the change moved a bit. Per tree: the median over rounds and the spread (min, max). Writes a
new bench/results/lone_glue/<UTC time>-<commit>.json (bench/provenance.py). docs/engine.md, "Where a lone step's
time goes", reads it.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."
PROFILED = 8                                  # steps profiled after the timed ones
ALLOCS = ("aten::empty", "aten::empty_strided")


def child(tokens: int, threads: int, model: str) -> dict:
    """In a child whose sys.path starts at its tree: the lone request's steps timed, then profiled."""
    # bench/ first on the path would make bench/engine.py the `engine` package: the tree's own comes first instead
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
    # Imported here, not at the top: each child imports the engine of its own tree (PYTHONPATH), never the parent.
    import torch
    from engine.core.generate import GenerationRequest, encode_prompt
    from engine.core.hooks import CAPTURE_OFF
    from engine.core.loader import load_model
    from engine.serving.batch import BatchRunner, Slot

    torch.set_num_threads(threads)
    lm = load_model(model, device="cpu", dtype="float32")
    runner = BatchRunner(lm, max_batch=4, prefix=None)
    digest = hashlib.sha256()
    decode = runner.lean.decode

    def hashed(batch, slots):
        logits = decode(batch, slots)
        digest.update(logits.float().numpy().tobytes())
        return logits
    runner.lean.decode = hashed

    def request(n: int, prof=None) -> list[tuple[float, float]]:
        r = GenerationRequest(PROMPT, max_new_tokens=n)
        runner.add(Slot(r, encode_prompt(lm, r), CAPTURE_OFF, lambda _: None, print))
        while runner.prefilling:
            runner.step()                                        # the prefill (in chunks), not counted
        times = []
        while not runner.idle:
            if prof is not None and len(times) == 1:
                prof.start()                                  # the decode steps only, the first and last left out
            w, c = time.perf_counter(), time.thread_time()
            runner.step()
            times.append((time.perf_counter() - w, time.thread_time() - c))
            if prof is not None and len(times) == n - 2:
                prof.stop()
        return times
    request(8)                                                                    # warm-up
    digest = hashlib.sha256()
    times = request(tokens)[3:]
    out = {"wall_ms": 1e3 * statistics.median(t[0] for t in times),
           "cpu_ms": 1e3 * statistics.median(t[1] for t in times), "steps": len(times), "sha256": digest.hexdigest()}
    return {**out, **profiled(torch, request), **call_cost(torch)}


def call_cost(torch) -> dict:
    """The fixed cost of one product call (us, fastest of 5 x 2,000): engine.core.matvec.linear (the checks, the
    output's allocation, the ctypes call), the bare ctypes call of the row kernel and, in a tree that has it,
    matvec.Bound (a lone step's route since the products are bound once), on an 8 x 576 weight, whose product
    itself takes next to nothing."""
    import timeit
    from engine.core import kernels, matvec
    kernel = kernels.row_kernel()
    x, w, y = torch.randn(1, 1, 576), torch.randn(8, 576), torch.empty(1, 8)
    ways = {"matvec.linear": lambda: matvec.linear(x, w),
            "ctypes call": lambda: kernel._call(x.data_ptr(), 576, 1, w.data_ptr(), 576, 8, None, y.data_ptr(), 8, 1)}
    if hasattr(matvec, "Bound"):                 # a tree with the lone step's products bound once (matvec.Bound)
        bound = matvec.Bound(kernel, w)
        ways["matvec.Bound"] = lambda: bound(x)
    with torch.inference_mode():
        return {"call_us": {name: 1e6 * min(timeit.repeat(f, number=2000, repeat=5)) / 2000
                            for name, f in ways.items()}}


def profiled(torch, request) -> dict:
    """Operators per step (every event, nested included), allocations per step, own CPU ms per step by operator."""
    from torch.profiler import ProfilerActivity, profile
    prof = profile(activities=[ProfilerActivity.CPU])
    request(PROFILED, prof)
    steps = PROFILED - 3                                    # steps 1 .. n - 3 of the n - 1 after the prefill
    events = prof.key_averages()
    counts = Counter({e.key: e.count for e in events})
    own = sorted(((e.key, e.self_cpu_time_total / 1e3 / steps, e.count / steps) for e in events),
                 key=lambda e: -e[1])
    return {"profiled_steps": steps, "ops_per_step": sum(counts.values()) / steps,
            "allocations_per_step": sum(counts[k] for k in ALLOCS) / steps,
            "own_ms_per_step": {k: {"ms": round(ms, 4), "calls": round(n, 2)} for k, ms, n in own[:25]},
            "own_ms_total_per_step": sum(ms for _, ms, _ in own)}


def turn(tree: Path, args: argparse.Namespace) -> dict:
    """One child on `tree`: its JSON line."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--tokens", str(args.tokens),
           "--threads", str(args.threads), "--model", args.model]
    done = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the child on {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary(rounds: list[dict]) -> dict:
    walls, cpus = [r["wall_ms"] for r in rounds], [r["cpu_ms"] for r in rounds]
    return {"wall_ms": statistics.median(walls), "wall_ms_range": [min(walls), max(walls)],
            "cpu_ms": statistics.median(cpus), "cpu_ms_range": [min(cpus), max(cpus)],
            "ops_per_step": rounds[-1]["ops_per_step"], "allocations_per_step": rounds[-1]["allocations_per_step"],
            "own_ms_per_step": rounds[-1]["own_ms_per_step"],
            "call_us": {k: statistics.median(r["call_us"][k] for r in rounds) for k in rounds[0]["call_us"]},
            "own_ms_total_per_step": statistics.median(r["own_ms_total_per_step"] for r in rounds),
            "sha256": sorted({r["sha256"] for r in rounds})}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, help="the source tree to compare with (a worktree of the old commit)")
    parser.add_argument("--model", default="default")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help="default: a new file under bench/results/lone_glue/")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.tokens, args.threads, args.model)))
        return 0
    sys.path.insert(0, str(ROOT))
    from bench import provenance  # the parent only: the children import their own trees
    run = provenance.start("lone_glue", argv)
    trees = {"before": args.before.resolve(), "after": ROOT} if args.before else {"after": ROOT}
    rounds: dict[str, list[dict]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            rounds[name].append(turn(tree, args))
    report = {"model": args.model, "threads": args.threads, "tokens": args.tokens, "rounds": args.rounds,
              "trees": {name: str(tree) for name, tree in trees.items()},
              "ways": {name: summary(r) for name, r in rounds.items()}, "per_round": rounds}
    if args.before:
        before, after = report["ways"]["before"], report["ways"]["after"]
        report["saved_ms"] = before["wall_ms"] - after["wall_ms"]
        report["saved_cpu_ms"] = before["cpu_ms"] - after["cpu_ms"]
        report["same_logits"] = before["sha256"] == after["sha256"] and len(after["sha256"]) == 1
    print(json.dumps({k: v for k, v in report.items() if k != "per_round"}, indent=1)[:4000])
    run.save(report, out=args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
