"""Where a decode step's time goes on a GPU: the torch profiler around the engine's three decode paths.

    python bench/gpu_profile.py --model /tmp/shaped/Llama-3.1-8B-shaped-bf16-seed0 --device cuda --dtype bf16
    python bench/gpu_profile.py --model TINY_FOLDER --device cpu --dtype float32     # the same code on a CPU

For each path, per decode step: the wall time, the time the GPU spent in kernels (CUDA events of the
profiler's trace), how many host-device synchronisations and copies the host asked for, and the host
operations that took the most time. Paths: `generate` (eager, dynamic cache, one request) and the scheduler's
step (engine/serving/batch.py, paged KV) with 1 and with `--rows` requests, eager and, on CUDA, as CUDA graphs
(engine/serving/graphed.py: a request alone replays the graph of row bucket 1), and one long prompt's prefill (engine.core.generate.forward, `--prefill` tokens).
A step whose wall time is far above its kernel time waits on the host: the table says on what. Where the kernel
time itself goes is split into matmuls, attention and the rest (norms, activations, copies), with the costliest
kernels by name: what a prefill slower than its matmuls spends on. `generate`'s steps include its prompt's
prefill, spread over the steps. Writes a new bench/results/gpu-profile/<UTC time>-<commit>.json
(bench/provenance.py).
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.core.generate import GenerationRequest, encode_prompt, forward, generate  # noqa: E402
from engine.core.hooks import CAPTURE_OFF  # noqa: E402
from engine.core.loader import load_model  # noqa: E402
from engine.serving.batch import BatchRunner, Slot  # noqa: E402
from engine.serving.graphed import graphed_decode  # noqa: E402
from engine.serving.limits import Limits  # noqa: E402
from bench import provenance  # noqa: E402

PROMPTS = ("What is the capital of France?", "Write a haiku about autumn.", "Why do we need sleep?")
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
COPIES = ("cudaMemcpyAsync", "cudaMemcpy")
KINDS = {"matmul": re.compile(r"gemm|nvjet|cutlass|xmma|cublas|sm\d\d_|splitk", re.I),   # cuBLAS/CUTLASS names
         "attention": re.compile(r"flash|fmha|attention|sdpa|softmax", re.I)}


def kernels(prof: Any, steps: int, top: int = 10) -> dict:
    """Kernel time per step by kind (matmul, attention, other) and the `top` costliest kernels by name."""
    by_name: Counter = Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            by_name[e.name] += (e.self_device_time_total or 0.0) / 1e3 / steps
    kinds = Counter()
    for name, ms in by_name.items():
        kinds[next((k for k, pattern in KINDS.items() if pattern.search(name)), "other")] += ms
    return {"kernel_ms_by_kind": dict(kinds), "top_kernels_ms": {k[:120]: v for k, v in by_name.most_common(top)}}


def summarize(prof: Any, steps: int, wall: float) -> dict:
    """Per step: wall, kernel time, runtime calls that wait or copy, launches, and the costliest host ops."""
    calls, device_us, host = Counter(), 0.0, Counter()
    for e in prof.events():
        calls[e.name] += 1
        device_us += getattr(e, "self_device_time_total", 0.0) or 0.0
        if e.name.startswith("aten::"):
            host[e.name] += e.self_cpu_time_total
    launches = sum(n for k, n in calls.items() if k in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC"))
    return {"wall_ms": 1e3 * wall / steps, "kernel_ms": device_us / 1e3 / steps,
            "syncs": sum(calls[k] for k in SYNCS) / steps, "copies": sum(calls[k] for k in COPIES) / steps,
            "graph_launches": calls["cudaGraphLaunch"] / steps, "kernel_launches": launches / steps,
            "aten_ops": sum(n for k, n in calls.items() if k.startswith("aten::")) / steps,
            "local_scalar_dense": calls["aten::_local_scalar_dense"] / steps,
            "top_host_ops_ms": {k: v / 1e3 / steps for k, v in host.most_common(10)}, **kernels(prof, steps)}


def profiled(run: Callable[[], int], device: torch.device) -> dict:
    """run() does some decode steps and returns how many; profile it once (after a warm-up run)."""
    run()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        steps = run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - start
    return summarize(prof, steps, wall)


def request(i: int, n: int) -> GenerationRequest:
    return GenerationRequest(PROMPTS[i % len(PROMPTS)], max_new_tokens=n)


def decode_only(records: list) -> int:
    return sum(1 for r in records if r.kind == "decode")


def scheduler_steps(lm: Any, rows: int, steps: int, graphs: Any = None) -> Callable[[], int]:
    """`steps` batched decode steps of `rows` requests, timed once every request is in the batch."""
    def run() -> int:
        runner = BatchRunner(lm, max_batch=max(rows, 2), graphs=graphs)
        for i in range(rows):
            r = request(i, steps + 64)
            runner.add(Slot(r, encode_prompt(lm, r), CAPTURE_OFF, lambda _: None, print, lambda: False))
        while runner.prefilling:
            runner.step()
        for _ in range(steps):
            runner.step()
        return steps
    return run


def prefill_pass(lm: Any, n: int) -> Callable[[], int]:
    """One forward over an n-token prompt, as the engine prefills (dynamic cache, the last position's logits)."""
    from transformers import DynamicCache

    ids = (encode_prompt(lm, request(0, 1)) * n)[:n]

    def run() -> int:
        with torch.inference_mode():
            forward(lm, ids, DynamicCache(config=lm.model.config))
        return 1
    return run


def times(run: Callable[[], int], rounds: int = 3) -> float:
    """Median wall ms per step without the profiler (it adds its own host time)."""
    seen = []
    for _ in range(rounds):
        t = time.perf_counter()
        n = run()
        seen.append((time.perf_counter() - t) / n)
    return 1e3 * statistics.median(seen)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--rows", type=int, default=30)
    p.add_argument("--prefill", type=int, default=2048, help="prompt tokens of the profiled prefill (0: none)")
    p.add_argument("--out", help="default: a new file under bench/results/gpu-profile/")
    args = p.parse_args()
    run_record = provenance.start("gpu-profile")
    lm = load_model(args.model, device=args.device, dtype=args.dtype)
    paths = {"generate": lambda: decode_only(list(generate(lm, request(0, args.steps + 1)))),
             "scheduler, 1 row": scheduler_steps(lm, 1, args.steps),
             f"scheduler, {args.rows} rows": scheduler_steps(lm, args.rows, args.steps)}
    if args.prefill:
        paths[f"prefill, {args.prefill} tokens"] = prefill_pass(lm, min(args.prefill, lm.spec.max_context))
    graphs = graphed_decode(lm, Limits.for_device(lm.device))          # CUDA only
    if graphs is not None:
        graphs.ensure_warm()                # compiled in this thread, the one that steps (graphed.py `bind`)
        paths["graphed, 1 row"] = scheduler_steps(lm, 1, args.steps, graphs)
        paths[f"graphed, {args.rows} rows"] = scheduler_steps(lm, args.rows, args.steps, graphs)
    report = {"model": lm.label, "device": str(lm.device), "dtype": lm.dtype_name, "torch": torch.__version__,
              "device_name": torch.cuda.get_device_name(lm.device) if lm.device.type == "cuda" else "cpu",
              "paths": {},
              "batch_graphs": None if graphs is None else {"mode": graphs.mode, "error": graphs.error,
                                                           "shapes": sorted(graphs.shapes)}}
    for name, run in paths.items():
        row = profiled(run, lm.device)
        row["wall_ms_unprofiled"] = times(run)
        report["paths"][name] = row
        print(f"{name:20} {row['wall_ms_unprofiled']:7.2f} ms/step ({row['wall_ms']:.2f} profiled), kernels "
              f"{row['kernel_ms']:6.2f} ms, syncs {row['syncs']:5.1f}, copies {row['copies']:5.1f}, "
              f"launches {row['kernel_launches']:6.1f} + graphs {row['graph_launches']:.1f}, "
              f"aten ops {row['aten_ops']:6.0f}, .item() {row['local_scalar_dense']:.1f}", flush=True)
        print("    " + ", ".join(f"{k[6:]} {v:.2f}" for k, v in list(row["top_host_ops_ms"].items())[:8]))
        if row["kernel_ms_by_kind"]:
            print("    kernels: " + ", ".join(f"{k} {v:.2f} ms" for k, v in row["kernel_ms_by_kind"].items()))
    run_record.save(report, out=args.out)


if __name__ == "__main__":
    main()
