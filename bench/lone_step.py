"""Where a lone request's decode step spends its time, and how near it is to the memory floor: before (F.linear,
each matrix in the layout F.linear reads fastest), split (engine.core.matvec.split's products on the matrices as
stored, each layer's q|k|v and gate|up as one product each: engine.core.lone; the step before the row kernel) and
kernel (the same products through the row kernel, engine.core.kernels: the step now, its weights in memory advised
for 2 MB pages as the loader places them: engine.core.layout.in_huge_pages) and kernel-4k (the same, the weights
moved into ordinary pages for its rounds), at each thread count asked for, side by side in one process, alternating.

    python bench/lone_step.py                      # SmolLM2, one and two torch threads, 3 rounds of 64 tokens
    python bench/lone_step.py --threads 2 --rounds 5 --burn 1    # beside one process that keeps a core busy

One request at a time through the batch runner (engine.serving.batch), as the scheduler runs a lone request
(`LeanDecode.decode` with one row). Each step is timed in wall time and in the CPU time of its thread (what other
processes on a shared machine cannot inflate), and split into its parts, each timed alone in the same layout: the
weights' matrix products (wall time, fastest of 10: with two threads the second thread's work counts), picking and
describing the token, and the rest (attention, norms, rotary, residuals, the cache's writes and reads, and the
Python around them). Also the memory floor: the weights' bytes over this machine's read bandwidth (a sum over a
buffer as large as the weights, with one and with two threads, the faster counts), measured in the same run.
`--burn N` starts N processes that spin for the whole run (a browser or a neighbour's job on the same cores).
OMP_WAIT_POLICY / KMP_BLOCKTIME, when set, are recorded. Writes a new bench/results/lone_step/<UTC time>-<commit>.json
(bench/provenance.py). docs/engine.md, "A lone request", reads it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from torch.nn import functional as F  # noqa: E402

from engine.core import kernels, matvec  # noqa: E402
from engine.core.generate import GenerationRequest, TextStream, encode_prompt, pick_tokens  # noqa: E402
from engine.core.hooks import CAPTURE_OFF  # noqa: E402
from engine.core.layout import cold, in_huge_pages  # noqa: E402
from engine.core.loader import load_model  # noqa: E402
from engine.serving.batch import BatchRunner, Slot  # noqa: E402
from bench import provenance  # noqa: E402

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."
ENVIRON = ("OMP_WAIT_POLICY", "KMP_BLOCKTIME", "OMP_NUM_THREADS", "GOMP_SPINCOUNT")


def layout(stored: dict) -> None:
    """Put every matrix in the layout `stored` holds (module -> a tensor of its values, in some strides)."""
    for module, weight in stored.items():
        module.weight.data = weight


def fastest_layout(linears: list) -> dict:
    """Each module's weight in the layout F.linear reads fastest for one row (each shape's matrices in turn, as a
    step reads them, fastest of 5): the lone step's layout before engine.core.matvec."""
    picked = {}
    for shape in dict.fromkeys(tuple(m.weight.shape) for m in linears):
        group = [m for m in linears if tuple(m.weight.shape) == shape]
        x = torch.randn(1, shape[1])
        ways = {"stored": [m.weight.data for m in group], "transposed": [m.weight.data.t().contiguous().t()
                                                                         for m in group]}
        seconds = {k: _fastest(lambda: [F.linear(x, w) for w in cold(v)], 5) for k, v in ways.items()}
        best = min(seconds, key=seconds.get)
        picked.update(zip(group, ways[best]))
    return picked


def run(runner: BatchRunner, lm, tokens: int) -> dict:
    """One lone request; per decode step: wall and thread CPU seconds (the first three steps left out)."""
    request = GenerationRequest(PROMPT, max_new_tokens=tokens)
    out = []
    runner.add(Slot(request, encode_prompt(lm, request), CAPTURE_OFF, out.append, print))
    wall, cpu = [], []
    while not runner.idle:
        w, c = time.perf_counter(), time.thread_time()
        runner.step()
        wall.append(time.perf_counter() - w)
        cpu.append(time.thread_time() - c)
    return {"wall_ms": 1e3 * statistics.median(wall[3:]), "cpu_ms": 1e3 * statistics.median(cpu[3:]),
            "text": out[-1].text, "steps": len(wall)}


def _fastest(fn, rounds: int = 5) -> float:
    """Wall seconds of fn, fastest of `rounds` after one that is not counted."""
    times = []
    for _ in range(rounds + 1):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times[1:])


def split(lm, linear, step_ms: float, grouped=None) -> dict:
    """The step's parts timed alone, in the same layout: every weight's product on a (1, in) row (wall time, fastest
    of 10: the least disturbed by the machine's other users), and picking and describing one token; the rest of the
    step (its median wall time) is attention, norms, rotary, residuals, the cache's writes and reads, and the Python
    around them."""
    linears = [m for m in lm.model.modules() if isinstance(m, torch.nn.Linear)]
    products = [(m.weight, m.bias) for m in linears]
    fused = grouped.fused() if grouped is not None else None
    if fused is not None:                       # q|k|v and gate|up as the step makes them: one product each
        apart = {id(w) for w in grouped.weights()}
        products = [p for p in products if id(p[0]) not in apart]
    rows = {m.in_features: torch.randn(1, m.in_features) for m in linears}
    x = rows[linears[0].in_features]
    logits = torch.randn(1, lm.spec.vocab_size)
    request = GenerationRequest(PROMPT)
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        weights = 1e3 * _fastest(lambda: [linear(rows[w.shape[1]], w, b) for w, b in products] +
                                 [p(x) for f in fused or [] for p in (f.qkv, f.gate_up)], 10)
        pick = 1e3 * _fastest(lambda: pick_tokens(lm, logits, [request], [generator], [TextStream(lm.tokenizer)]))
    return {"products_ms": weights, "pick_ms": pick, "rest_ms": step_ms - weights - pick}


def floor(lm, threads: list[int]) -> dict:
    """The weights' bytes over this machine's read bandwidth: a sum over as many bytes, fastest of 6 at each thread
    count; the floor is the fastest of them."""
    nbytes = sum(p.numel() * p.element_size() for p in {id(p): p for p in lm.model.parameters()}.values())
    buf = torch.ones(nbytes // 4)
    read = {}
    for n in threads:
        torch.set_num_threads(n)
        read[n] = nbytes / _fastest(lambda: buf.sum(), 6) / 1e9
    best = max(read.values())
    return {"weight_bytes": nbytes, "read_gb_s": {str(n): v for n, v in read.items()}, "best_gb_s": best,
            "floor_ms": 1e3 * nbytes / best / 1e9}


def anon_huge_kb() -> int:
    """The process's anonymous memory in transparent huge pages, kB (Linux; -1 elsewhere)."""
    try:
        lines = Path("/proc/self/smaps_rollup").read_text().splitlines()
        return next(int(line.split()[1]) for line in lines if line.startswith("AnonHugePages:"))
    except (OSError, ValueError, StopIteration):
        return -1


def burn(n: int) -> list[subprocess.Popen]:
    """n processes that keep a core busy each (killed at the end of the run)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def use(runner: BatchRunner, way: tuple, placed: dict) -> None:
    """The lone step as `way` makes it: (the weights' layout, None: as placed; its products; its side-by-side groups;
    the row kernel on or off; the weights in memory advised for 2 MB pages or not). `placed`: the advice the weights
    are placed with now ("huge") and each module's weight there ("weights"), updated when the way moves them."""
    stored, linear, grouped, kernel, huge = way
    if huge != placed["huge"]:
        layout(placed["weights"])                        # back where they were placed, then moved together
        in_huge_pages(runner.lean.lean.lm, advise=huge)
        placed.update(huge=huge, weights={m: m.weight.data for m in placed["weights"]})
        if grouped is not None:
            grouped._made = None                         # its addresses: made again at the next step
    layout(stored if stored is not None else placed["weights"])
    runner.lean.linear, runner.lean.side_by_side = linear, grouped
    kernels.use(kernel)


def measure(args, lm, runner: BatchRunner, ways: dict, placed: dict) -> dict:
    """Alternating rounds of every way at every thread count; then each way's parts and the floor."""
    rounds = {(t, k): [] for t in args.threads for k in ways}
    for _ in range(args.rounds):
        for (threads, name) in rounds:
            torch.set_num_threads(threads)
            use(runner, ways[name], placed)
            rounds[threads, name].append(run(runner, lm, args.tokens))
    report = {"floor": floor(lm, args.threads)}
    report["same_text"] = len({r["text"] for v in rounds.values() for r in v}) == 1
    for (threads, name), results in rounds.items():
        torch.set_num_threads(threads)
        use(runner, ways[name], placed)
        entry = {k: statistics.median(r[k] for r in results) for k in ("wall_ms", "cpu_ms")}
        entry.update(split(lm, ways[name][1], entry["wall_ms"], ways[name][2]))
        entry["x_floor"] = entry["wall_ms"] / report["floor"]["floor_ms"]
        entry["products_x_floor"] = entry["products_ms"] / report["floor"]["floor_ms"]
        entry["products_gb_s"] = report["floor"]["weight_bytes"] / entry["products_ms"] / 1e6   # the weights' bytes
        entry["rounds"] = [{k: r[k] for k in ("wall_ms", "cpu_ms")} for r in results]
        entry["anon_huge_kb"] = anon_huge_kb()            # the process's memory in 2 MB pages, as this way placed it
        report[f"{name}-{threads}"] = entry
        print(f"{name:6s} {threads} thread{'s' * (threads > 1)}: step {entry['wall_ms']:.1f} ms wall "
              f"({entry['x_floor']:.2f}x the floor), {entry['cpu_ms']:.1f} ms CPU; products "
              f"{entry['products_ms']:.1f} ms ({entry['products_gb_s']:.1f} GB/s), pick {entry['pick_ms']:.1f}, rest {entry['rest_ms']:.1f}", flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--burn", type=int, default=0, help="processes that keep a core busy during the run")
    parser.add_argument("--out", help="default: a new file under bench/results/lone_step/")
    args = parser.parse_args(argv)
    run_record = provenance.start("lone_step", argv)
    lm = load_model(args.model, device="cpu", dtype="float32")
    runner = BatchRunner(lm, max_batch=32, prefix=None)
    linears = [m for m in lm.model.modules() if isinstance(m, torch.nn.Linear)]
    grouped = runner.lean.side_by_side
    if kernels.row_kernel() is None:
        raise SystemExit(f"the row kernel is off here: {kernels.why_off()}")
    placed = {"huge": True, "weights": {m: m.weight.data for m in linears}}     # as the loader placed them
    ways = {"before": (fastest_layout(linears), F.linear, None, False, True),
            "split": (None, matvec.linear, grouped, False, True), "kernel": (None, matvec.linear, grouped, True, True),
            "kernel-4k": (None, matvec.linear, grouped, True, False)}
    burners = burn(args.burn)
    try:
        report = measure(args, lm, runner, ways, placed)
    finally:
        kernels.use(True)
        for p in burners:
            p.kill()
    report.update({"threads": args.threads, "tokens": args.tokens, "burn": args.burn,
                   "environ": {k: os.environ[k] for k in ENVIRON if k in os.environ},
                   "layout": {f"{o}x{i}": {"stored_us": a * 1e6, "transposed_us": b * 1e6, "transposed": c}
                              for (o, i), (a, b, c) in lm.layout.items()},
                   "before_transposed": sorted({f"{o}x{i}" for m, w in ways["before"][0].items()
                                                for o, i in [tuple(m.weight.shape)] if not w.is_contiguous()})})
    print(f"floor: {report['floor']['floor_ms']:.1f} ms ({report['floor']['best_gb_s']:.1f} GB/s); "
          f"same text every way: {report['same_text']}")
    run_record.save(report, out=args.out)
    return 0 if report["same_text"] else 1


if __name__ == "__main__":
    sys.exit(main())
