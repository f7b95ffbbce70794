"""Where a lone request's decode step spends its time: before (the model's modules, weights as stored) and after
(the lean step on the weights in their measured layout), side by side in one process, alternating.

    python bench/lone_step.py                      # SmolLM2, one torch thread, 3 rounds of 64 tokens each way
    python bench/lone_step.py --threads 2 --rounds 5

One request at a time through the batch runner (engine.serving.batch), as the scheduler runs a lone request. Each
step is timed in wall time and in the CPU time of its thread (what other processes on a shared machine cannot
inflate), and split into its parts, each timed alone in the same layout: the weights' matrix products, picking and
describing the token (softmax, top-k, log-sum-exp, its text), and the rest (attention, norms, rotary, residuals,
the cache's writes and reads, and the Python around them). Also the memory floor: the
weights' bytes over this machine's read bandwidth (a sum over a buffer as large as the weights, one thread).
Writes a new bench/results/lone_step/<UTC time>-<commit>.json (bench/provenance.py). docs/engine.md, "Where a lone
request's milliseconds go", reads it.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from torch.nn import functional as F  # noqa: E402

from engine.core.generate import GenerationRequest, TextStream, encode_prompt, pick_tokens  # noqa: E402
from engine.core.hooks import CAPTURE_OFF  # noqa: E402
from engine.core.loader import load_model  # noqa: E402
from engine.serving.batch import BatchRunner, Slot  # noqa: E402
from bench import provenance  # noqa: E402

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."


def layout(lm, stored: dict) -> None:
    """Put every matrix back as loaded (`stored`: the parameters' original strides) or in the measured layout."""
    for module, weight in stored.items():
        module.weight.data = weight


def run(lm, runner: BatchRunner, tokens: int) -> dict:
    """One lone request; per decode step: wall and thread CPU seconds (the first two steps left out)."""
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


def split(lm, step_cpu_ms: float) -> dict:
    """The step's parts timed alone, in the same layout (thread CPU time, fastest of 5): every weight's matrix
    product on a (1, in) row, and picking and describing one token; the rest of the step is attention, norms,
    rotary, residuals, the cache's writes and reads, and the Python around them."""
    linears = [m for m in lm.model.modules() if isinstance(m, torch.nn.Linear)]
    rows = {m.in_features: torch.randn(1, m.in_features) for m in linears}
    logits = torch.randn(1, lm.spec.vocab_size)
    request = GenerationRequest(PROMPT)
    generator = torch.Generator().manual_seed(0)

    def fastest(fn) -> float:
        times = []
        for _ in range(6):
            c = time.thread_time()
            fn()
            times.append(time.thread_time() - c)
        return 1e3 * min(times[1:])
    with torch.inference_mode():
        weights = fastest(lambda: [F.linear(rows[m.in_features], m.weight, m.bias) for m in linears])
        pick = fastest(lambda: pick_tokens(lm, logits, [request], [generator], [TextStream(lm.tokenizer)]))
    return {"weights_ms": weights, "pick_ms": pick, "rest_ms": step_cpu_ms - weights - pick}


def floor_ms(lm) -> dict:
    """The weights' bytes over the read bandwidth of this machine (one thread, a sum over as many bytes)."""
    nbytes = sum(p.numel() * p.element_size() for p in {id(p): p for p in lm.model.parameters()}.values())
    buf = torch.ones(nbytes // 4)
    times = []
    for _ in range(7):
        t = time.perf_counter()
        buf.sum()
        times.append(time.perf_counter() - t)
    best = min(times[1:])
    return {"weight_bytes": nbytes, "read_gb_s": nbytes / best / 1e9, "floor_ms": 1e3 * best}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out", help="default: a new file under bench/results/lone_step/")
    args = parser.parse_args(argv)
    run_record = provenance.start("lone_step", argv)
    torch.set_num_threads(args.threads)
    lm = load_model(args.model, device="cpu", dtype="float32")
    measured = {m: m.weight.data for m in lm.model.modules() if isinstance(m, torch.nn.Linear)}
    stored = {m: w.contiguous() for m, w in measured.items()}
    runner = BatchRunner(lm, max_batch=32, prefix=None)
    lone = runner.lean
    ways = {"before": (stored, None), "after": (measured, lone)}
    rounds = {k: [] for k in ways}
    for _ in range(args.rounds):
        for name, (weights, step) in ways.items():
            layout(lm, weights)
            runner.lean = step
            rounds[name].append(run(lm, runner, args.tokens))
    splits = {}
    for name, (weights, step) in ways.items():
        layout(lm, weights)
        splits[name] = split(lm, statistics.median(r["cpu_ms"] for r in rounds[name]))
    report = {"threads": args.threads, "tokens": args.tokens, "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
              "layout": {f"{o}x{i}": {"stored_us": a * 1e6, "transposed_us": b * 1e6, "transposed": c}
                         for (o, i), (a, b, c) in lm.layout.items()},
              "floor": floor_ms(lm), "same_text": len({r["text"] for v in rounds.values() for r in v}) == 1}
    for name in ways:
        report[name] = {k: statistics.median(r[k] for r in rounds[name]) for k in ("wall_ms", "cpu_ms")}
        report[name].update(splits[name])
        report[name]["rounds"] = [{k: r[k] for k in ("wall_ms", "cpu_ms")} for r in rounds[name]]
        print(f"{name:6s}: step {report[name]['wall_ms']:.1f} ms wall, {report[name]['cpu_ms']:.1f} ms CPU: "
              + ", ".join(f"{k} {v:.1f}" for k, v in splits[name].items()), flush=True)
    print(f"floor: {report['floor']['floor_ms']:.1f} ms ({report['floor']['read_gb_s']:.1f} GB/s); "
          f"same text every way: {report['same_text']}")
    run_record.save(report, out=args.out)
    return 0 if report["same_text"] else 1


if __name__ == "__main__":
    sys.exit(main())
