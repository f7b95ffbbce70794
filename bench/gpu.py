"""GPU benchmark on weights-free shaped checkpoints: HF generate, the engine and its one-row step, side by side.

    python bench/gpu.py --shape 8b       # on an H100: Llama 3.1 8B shape in bf16 (writes 16 GB once, ~7 min)
    python bench/gpu.py --shape tiny     # anywhere, CPU included: the same code at test scale

The checkpoints are written once into a cache folder (engine/models/shaped.py): the public config of Llama 3.1
8B (or Llama 3.2 1B) with random weights. Speed does not depend on the weights' values, only on the
shapes, the dtype and the device, so these timings hold for the real model; the generated text is noise.

Decode runs are interleaved round by round (every run once per round) and each keeps its median, so a
noisy neighbour hits all alike. Beside each measured number: the projected ceiling (engine/projection/cost.py
at 100% of the spec sheet's bandwidth, on CUDA) and the ceiling at this device's measured copy bandwidth.
A request alone ("one-off", "one-rows") runs as the server runs it: the batch runner's one-row step of the one
forward (engine/serving/batch.py), on CUDA the graphed step at row bucket 1 (engine/serving/graphed.py), on a CPU
the same step eagerly; "engine-*" is engine.core.generate (a dynamic cache). Where that step's time goes
("one_row_step_times", after the runs): per step the host's time before the replay, the replay's call, the device's
time (CUDA events around it) and the wall time per step (`measure_step_times`; on a CPU the same probe on the step
traced by dynamo's eager backend, as a rehearsal).
Writes a new bench/results/gpu/<UTC time>-<commit>.json (CPU runs: gpu-cpu-<shape>/; bench/provenance.py), or
--out, after every phase, so a run cut short still leaves what it measured. Imports nothing from app/ (no streamlit needed).
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
from transformers.generation.streamers import BaseStreamer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.lab.batching import batch_prompts, generate_batch  # noqa: E402
from engine.projection.card import weight_bytes  # noqa: E402
from engine.core.generate import GenerationRequest, admit, encode_prompt, forward, generate, sync  # noqa: E402
from engine.core.hooks import CAPTURE_OFF, CapturePolicy  # noqa: E402
from engine.core.kept import kept_for  # noqa: E402
from engine.core.loader import cache_dir, load_model  # noqa: E402
from engine.lab.fusion import best_time  # noqa: E402
from engine.lab.memory import allocated_by, memory_ledger, peak_during  # noqa: E402
from engine.projection.cost import cost_model, project  # noqa: E402
from engine.serving.batch import BatchRunner, Slot  # noqa: E402
from engine.serving.graphed import WARM_WIDTHS, GraphedDecode, StepProbe, cudagraph_counts  # noqa: E402
from engine.serving.paged import BLOCK  # noqa: E402
from engine.models.shaped import DRAFT_OF, shaped_bytes, write_shaped  # noqa: E402
from bench import provenance  # noqa: E402
from engine.lab.speed import (DeviceRoof, copy_bandwidth, cpu_name, device_cost_model, known_gpu, matmul_flops,  # noqa: E402
                              prompt_of_length)

ROWS = CapturePolicy(prefill_matrix=False, stats=False)      # every layer's attention row, every head
PROMPT = "Write a long, detailed story about a lighthouse keeper who finds a message in a bottle."
RUNS = ("hf", "hf-static", "engine-off", "engine-rows", "one-off", "one-rows")
LABELS = {"hf": "HF generate, dynamic cache", "hf-static": "HF generate, static cache (compiled on CUDA)",
          "engine-off": "engine, capture off", "engine-rows": "engine, attention rows",
          "one-off": "one forward, one row, capture off", "one-rows": "one forward, one row, attention rows"}
DEFAULTS = {"8b": dict(tokens=128, prefill=2048, batch=30), "1b": dict(tokens=128, prefill=2048, batch=30),
            "tiny": dict(tokens=64, prefill=256, batch=8)}
BATCH_PROMPT = 128                                            # tokens per row of the batched run
TARGETS = {"one_off_tok_s": 150.0, "one_off_of_ceiling": 0.70, "rows_vs_off": 0.8, "prefill_vs_projected": 1.5}


class Stamps(BaseStreamer):
    """Times each token HF generate emits (the first put is the prompt)."""

    def __init__(self, device: torch.device):
        self.device, self.times = device, []

    def put(self, value: Any) -> None:
        sync(self.device)
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def rates(ttft: float, tokens: int, decode_seconds: float) -> dict[str, float]:
    return {"ttft_s": ttft, "tokens": tokens, "decode_tok_s": (tokens - 1) / decode_seconds if tokens > 1 else 0.0}


def hf_run(model: Any, ids: list[int], n: int, static: bool) -> dict[str, float]:
    """model.generate, greedy, exactly n new tokens; decode rate from the token timestamps."""
    stamps = Stamps(model.device)
    extra = {"cache_implementation": "static"} if static else {}
    start = time.perf_counter()
    model.generate(torch.tensor([ids], device=model.device), do_sample=False, max_new_tokens=n, min_new_tokens=n,
                   streamer=stamps, pad_token_id=0, **extra)
    new = stamps.times[1:]
    return rates(new[0] - start, len(new), new[-1] - new[0])


def engine_run(records: Any) -> dict[str, float]:
    done = list(records)[-1]
    return rates(done.ttft, done.generated_tokens, done.decode_seconds)


def one_graphs(lm: Any, compile: str, positions: int) -> GraphedDecode | None:
    """On CUDA, the graphed step at row bucket 1 on a kept pool for `positions` (what a request alone replays in the
    server); None on a CPU, where the one-row step runs eagerly."""
    if lm.device.type != "cuda":
        return None
    return GraphedDecode(lm, -(-positions // BLOCK) + 2, compile, max_rows=1)


def alone(lm: Any, graphs: GraphedDecode | None, request: GenerationRequest, kept: Any = None,
          ids: list[int] | None = None, chunk: int = 512) -> list:
    """One request's records through the batch runner alone: the one forward's one-row step."""
    records, errors = [], []
    runner = BatchRunner(lm, max_batch=1, prefill_chunk=chunk, graphs=graphs)
    ids = admit(lm, request) if ids is None else ids
    runner.add(Slot(request, ids, ROWS if kept is not None else CAPTURE_OFF, records.append, errors.append,
                    kept=kept))
    while not runner.idle:
        runner.step()
    if errors:
        raise errors[0]
    return records


def make_runs(lm: Any, graphs: GraphedDecode | None, ids: list[int], n: int, skip: set[str]
              ) -> dict[str, Callable[[], dict]]:
    request = GenerationRequest(PROMPT, max_new_tokens=n, chat=False)
    runs = {
        "hf": lambda: hf_run(lm.model, ids, n, static=False),
        "hf-static": lambda: hf_run(lm.model, ids, n, static=True),
        "engine-off": lambda: engine_run(generate(lm, request, CAPTURE_OFF)),
        "engine-rows": lambda: engine_run(generate(lm, request, ROWS)),
        "one-off": lambda: engine_run(alone(lm, graphs, request)),
        "one-rows": lambda: engine_run(alone(lm, graphs, request, kept_for(lm, ROWS, len(ids) + n))),
    }
    return {k: fn for k, fn in runs.items() if k not in skip}


def interleaved(runs: dict[str, Callable[[], dict]], rounds: int, log: Callable[[str], None]) -> dict[str, dict]:
    """Every run once per round; per run the median of each figure over the rounds, and the rounds themselves."""
    seen: dict[str, list[dict]] = {k: [] for k in runs}
    for r in range(rounds):
        for name, fn in runs.items():
            seen[name].append(fn())
            log(f"round {r + 1}/{rounds} {name}: {seen[name][-1]['decode_tok_s']:.1f} tok/s")
    return {k: {**{f: statistics.median(x[f] for x in v) for f in v[0]}, "rounds": v} for k, v in seen.items()}


def warm_up(runs: dict[str, Callable[[], dict]], graphs: GraphedDecode | None, log: Callable[[str], None]
            ) -> dict[str, float]:
    """Run each twice untimed: compiles, records CUDA graphs, fills caches. Seconds per run.

    The one-row graphs compile first (GraphedDecode.warm_up); a compiler failure leaves them eager
    (graphs.error says why) instead of failing the run.
    """
    spent = {}
    if graphs is not None and any(k.startswith("one-") for k in runs):
        t = time.perf_counter()
        try:
            graphs.warm_up(WARM_WIDTHS)
        except Exception as err:  # noqa: BLE001 - any compiler failure: the one-row step runs eagerly
            graphs.give_up(err)
        spent["one-row graph compile"] = time.perf_counter() - t
        log(f"warm-up one-row graphs ({graphs.mode}): {spent['one-row graph compile']:.1f} s {graphs.error or ''}")
    for name, fn in runs.items():
        t = time.perf_counter()
        fn()
        fn()
        spent[name] = time.perf_counter() - t
        log(f"warm-up {name}: {spent[name]:.1f} s")
    return spent


def measure_step_times(lm: Any, graphs: GraphedDecode | None, n: int, skip: int = 3) -> dict[str, Any]:
    """Where a lone request's graphed step goes (GraphedDecode's StepProbe), step by step over one request of n new
    tokens: the host's time from the forward's call to the replay (the plan into the index buffer, its copy, the
    hand-over to the graphs' thread), the replay's call on the host, the device's time between CUDA events around
    it, and the wall time from one step's call to the next (sampling and the records included). Medians over the
    steps after the first `skip`, and the first 8 steps as they came; and how many graphs dynamo compiled meanwhile
    (0 after the warm-up: tests/test_graphed.py proves it on the CPU). On a CPU, whose runs have no graphs, the probe
    runs the same step traced by dynamo with its eager backend, warmed up: the rehearsal of the code the GPU runs."""
    request = GenerationRequest(PROMPT, max_new_tokens=n, chat=False)
    if graphs is None:              # a CPU: traced by dynamo (its eager backend) and warmed as the GPU's are
        graphs = GraphedDecode(lm, -(-(len(encode_prompt(lm, request)) + n + 1) // BLOCK) + 2, "eager", max_rows=1)
        graphs.warm_up(WARM_WIDTHS)
    from torch._dynamo.utils import counters   # torch's private counters: read only where this report asks
    graphs.probe, compiled = StepProbe(lm.device), counters["stats"]["unique_graphs"]
    try:
        done = alone(lm, graphs, request)[-1]
    finally:
        probe, graphs.probe = graphs.probe, None
    rows = probe.report()
    later = rows[skip:]
    medians = {k: statistics.median(r[k] for r in later if r[k] is not None)
               for k in (later[0] if later else {}) if any(r[k] is not None for r in later)}
    return {"compile_mode": graphs.mode, "cuda_graphs": graphs.graphs, "graphed_steps": len(rows),
            "graphs_compiled_meanwhile": counters["stats"]["unique_graphs"] - compiled, "compile_error": graphs.error, "decode_ms_per_token": done.decode_seconds / max(done.generated_tokens - 1, 1)
            * 1e3, "median_ms": medians, "first_steps": rows[:8]}


# --- prefill, batching, memory -----------------------------------------------------------------------------

def time_prefill(fn: Callable[[], Any], device: torch.device, repeats: int = 3) -> float:
    """Best of `repeats` (after one untimed call) of a forward over the whole prompt."""
    fn()
    return best_time(fn, device, repeats)


def measure_prefill(lm: Any, graphs: GraphedDecode | None, n: int) -> dict[str, float]:
    """Seconds for one n-token prompt: the engine's forward (dynamic cache) and a request alone's time to its first
    token through the batch runner (one chunk into the paged pool)."""
    from transformers import DynamicCache

    ids = prompt_of_length(lm, n)
    with torch.inference_mode():
        engine = time_prefill(lambda: forward(lm, ids, DynamicCache(config=lm.model.config)), lm.device)
    request = GenerationRequest(PROMPT, max_new_tokens=1, chat=False)
    one = [alone(lm, graphs, request, ids=ids, chunk=n)[-1].ttft for _ in range(4)][1:]     # the first warms
    return {"tokens": n, "engine_s": engine, "one_s": min(one)}


def measure_batch(lm: Any, batch: int, prompt: int, n: int) -> dict[str, float]:
    """engine/lab/batching.py (static batching, dynamic cache, eager): median step for `batch` rows."""
    rows = batch_prompts(lm, batch, prompt)
    generate_batch(lm, rows, 3)                                        # warm-up
    run = generate_batch(lm, rows, n)
    step = statistics.median(run.step_seconds)
    return {"batch": batch, "prompt_tokens": prompt, "step_s": step, "total_tok_s": batch / step,
            "per_user_tok_s": 1 / step}


def measure_memory(lm: Any, graphs: GraphedDecode | None, weights_allocated: int | None, pool_allocated: int | None,
                   n: int) -> dict:
    """The ledger after a request alone, plus what the allocator took for the weights and for the one-row graphs'
    kept pool (CUDA)."""
    request = GenerationRequest(PROMPT, max_new_tokens=n, chat=False)
    records, peak, reserved = peak_during(lambda: alone(lm, graphs, request), lm.device)
    ledger = memory_ledger(lm, records[-2].cache).to_dict()
    return {**ledger, "weights_allocated_at_load": weights_allocated, "pool_allocated": pool_allocated,
            "run_peak_above_start": peak, "run_peak_reserved": reserved}


# --- ceilings ----------------------------------------------------------------------------------------------

def measured_roof(lm: Any) -> DeviceRoof:
    """This device's copy bandwidth and matmul peak, measured here (CUDA too, unlike speedlab.measure_roof)."""
    name = torch.cuda.get_device_name(lm.device) if lm.device.type == "cuda" else cpu_name()
    return DeviceRoof(name, copy_bandwidth(device=lm.device), matmul_flops(4096 if lm.device.type == "cuda" else 1024,
                                                                           device=lm.device, dtype=lm.dtype),
                      "measured")


def spec_sheet(lm: Any) -> Any:
    return known_gpu(torch.cuda.get_device_name(lm.device)) if lm.device.type == "cuda" else None


def ceilings(lm: Any, roof: DeviceRoof, context: int, prefill: int, batch: int, batch_context: int) -> dict:
    """Ceilings at 100% of peak: the spec sheet (engine.projection, CUDA only) and this device's measured roof."""
    gpu, dtype = spec_sheet(lm), lm.dtype_name
    device = device_cost_model(lm, roof)
    out = {"measured_roof": roof.to_dict(),
           "measured_decode_tok_s": 1 / device.decode_seconds(1, context),
           "measured_prefill_s": device.prefill_seconds([prefill]),
           "measured_batch_tok_s": batch / device.decode_seconds(batch, batch * batch_context)}
    if gpu is not None:
        ideal = dict(weight_dtype=dtype, kv_dtype=dtype, flops_efficiency=1.0, bandwidth_efficiency=1.0)
        one = project(lm.spec, gpu, batch=1, context=context, prompt_tokens=prefill, **ideal)
        many = project(lm.spec, gpu, batch=batch, context=batch_context, **ideal)
        out.update(gpu=gpu.name, projected_decode_tok_s=one.ceiling_tok_s_per_user,
                   projected_prefill_s=cost_model(lm.spec, gpu, dtype, dtype, 1.0, 1.0).prefill_seconds([prefill]),
                   projected_batch_tok_s=many.total_tok_s)
    return out


def with_ratios(runs: dict[str, dict], ceil: dict, weight_bytes_read: int) -> dict[str, dict]:
    for row in runs.values():
        row["effective_bandwidth_gb_s"] = weight_bytes_read * row["decode_tok_s"] / 1e9
        row["of_measured_ceiling"] = row["decode_tok_s"] / ceil["measured_decode_tok_s"]
        if "projected_decode_tok_s" in ceil:
            row["of_projected_ceiling"] = row["decode_tok_s"] / ceil["projected_decode_tok_s"]
    return runs


def check_targets(summary: dict) -> dict[str, Any]:
    """Issue 12's targets, judged only for the 8B shape on a GPU the projection knows."""
    runs, ceil, pre = summary["runs"], summary["ceilings"], summary.get("prefill", {})
    if summary["shape"] != "8b" or "projected_decode_tok_s" not in ceil or "one-off" not in runs:
        return {"judged": False, "why": "the targets are for the 8B shape on a known GPU (an H100)"}
    off = runs["one-off"]["decode_tok_s"]
    got = {"one_off_tok_s": off, "one_off_of_ceiling": off / ceil["projected_decode_tok_s"]}
    if "one-rows" in runs:
        got["rows_vs_off"] = runs["one-rows"]["decode_tok_s"] / off
    if pre:
        got["prefill_vs_projected"] = pre["one_s"] / ceil["projected_prefill_s"]
    met = {k: (v <= TARGETS[k] if k == "prefill_vs_projected" else v >= TARGETS[k]) for k, v in got.items()}
    return {"judged": True, "targets": TARGETS, "measured": got, "met": met}


# --- output ------------------------------------------------------------------------------------------------

def fmt(value: float | None, spec: str) -> str:
    """format(value, spec), or a dash as wide as the spec asks for."""
    width = int("".join(c for c in spec.split(".")[0] if c.isdigit()) or 0)
    return "–".rjust(width) if value is None else format(value, spec)


def size(n: float | None) -> str:
    if n is None:
        return "–"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3f} {unit}"
    return f"{n:.0f} B"


def print_table(s: dict) -> None:
    ceil = s["ceilings"]
    print(f"\n{s['model']} on {s['device_name']} ({s['dtype']}), torch {s['torch']}, transformers {s['transformers']}")
    print("Random weights of the real shapes: speed does not depend on the weights' values.")
    print(f"prompt {s['prompt_tokens']} tokens, {s['new_tokens']} new tokens, median of {s['rounds']} interleaved rounds; "
          f"ceilings at 100% of peak bandwidth ({ceil.get('gpu', 'no spec sheet')} / measured "
          f"{ceil['measured_roof']['bandwidth'] / 1e9:.0f} GB/s)")
    print(f"{'':46} {'decode tok/s':>12} {'projected':>10} {'of it':>6} {'measured-bw':>11} {'of it':>6} {'TTFT ms':>8}")
    for name, row in s["runs"].items():
        print(f"{LABELS[name]:46} {row['decode_tok_s']:12.1f} {fmt(ceil.get('projected_decode_tok_s'), '10.1f')} "
              f"{fmt(row.get('of_projected_ceiling'), '6.0%')} {ceil['measured_decode_tok_s']:11.1f} "
              f"{row['of_measured_ceiling']:6.0%} {row['ttft_s'] * 1e3:8.1f}")
    if "prefill" in s:
        p = s["prefill"]
        print(f"prefill {p['tokens']} tokens: engine {p['engine_s'] * 1e3:.1f} ms, one row {p['one_s'] * 1e3:.1f} ms; "
              f"projected {fmt(ceil['projected_prefill_s'] * 1e3 if 'projected_prefill_s' in ceil else None, '.1f')} ms "
              f"(compute-bound), measured roof {ceil['measured_prefill_s'] * 1e3:.1f} ms")
    if "batch" in s:
        b = s["batch"]
        print(f"batch of {b['batch']} (engine/lab/batching.py, eager): {b['total_tok_s']:.0f} tok/s in all, "
              f"{b['per_user_tok_s']:.1f} per user; projected {fmt(ceil.get('projected_batch_tok_s'), '.0f')}, "
              f"measured roof {ceil['measured_batch_tok_s']:.0f}")
    if "memory" in s:
        print_memory(s["memory"])
    t = s.get("targets", {})
    for key, ok in t.get("met", {}).items():
        print(f"target {key}: {t['measured'][key]:.3f} (target {TARGETS[key]}) {'ok' if ok else 'MISSED'}")
    if not t.get("judged", False):
        print(f"targets not judged: {t.get('why', '')}")


def print_memory(m: dict) -> None:
    print(f"memory ({m['measured_by']}): weights {size(m['weights'])} (card {size(m['weights_formula'])}), "
          f"KV of the run {size(m['kv'])} for {m['kv_tokens']} positions (card {size(m['kv_formula'])}), "
          f"kept pool {size(m['kv_pool'])}, workspace {size(m['workspace'])}")
    if m.get("weights_allocated_at_load") is not None:
        print(f"  torch.cuda: the weights took {size(m['weights_allocated_at_load'])} at load, the one-row graphs' "
              f"pool {size(m['pool_allocated'])}; a run peaked {size(m['run_peak_above_start'])} above its start; "
              f"max reserved {size(m['run_peak_reserved'])} of {size(m['device_total'])}")


# --- main --------------------------------------------------------------------------------------------------

def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=("tiny", "1b", "8b"), default="8b" if torch.cuda.is_available() else "tiny")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    p.add_argument("--dtype", default=None, help="default: bf16 on CUDA, float32 on CPU")
    p.add_argument("--compile", default="auto", help="the one-row graphs on CUDA: auto (CUDA graphs), off, eager, "
                                                     "default, reduce-overhead")
    p.add_argument("--tokens", type=int, default=None, help="new tokens per decode run")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prefill-tokens", type=int, default=None)
    p.add_argument("--batch", type=int, default=None, help="rows of the batched run (0: skip)")
    p.add_argument("--skip", default="", help=f"comma-separated runs to leave out: {', '.join(RUNS)}")
    p.add_argument("--no-draft", action="store_true", help="do not write the draft-model shape")
    p.add_argument("--write-only", action="store_true", help="write the checkpoints and stop")
    p.add_argument("--cache", default=None, help="where shaped checkpoints live (default: $PLAYGROUND_CACHE/shaped)")
    p.add_argument("--out", default=None, help="default: a new file under bench/results/gpu/ (CPU: gpu-cpu-<shape>/)")
    return p.parse_args()


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def write_checkpoints(args: argparse.Namespace, device: torch.device) -> tuple[Path, float]:
    root = Path(args.cache) if args.cache else cache_dir() / "shaped"
    keys = [args.shape] + ([DRAFT_OF[args.shape]] if args.shape in DRAFT_OF and not args.no_draft else [])
    root.mkdir(parents=True, exist_ok=True)
    need = sum(shaped_bytes(k) for k in keys)
    if shutil.disk_usage(root).free < need * 1.05:
        sys.exit(f"error: {root} has {shutil.disk_usage(root).free / 1e9:.1f} GB free; the checkpoints need "
                 f"{need / 1e9:.1f} GB (use --cache DIR)")
    start = time.perf_counter()
    folders = [write_shaped(k, root, device=device if device.type == "cuda" else "cpu") for k in keys]
    return folders[0], time.perf_counter() - start


def header(args: argparse.Namespace, lm: Any, graphs: GraphedDecode | None, ids: list[int], n: int) -> dict[str, Any]:
    import transformers

    return {"shape": args.shape, "model": lm.label, "note": "random weights: speed does not depend on their values",
            "device": str(lm.device), "dtype": lm.dtype_name, "torch": torch.__version__,
            "transformers": transformers.__version__, "machine": f"{platform.machine()}, {torch.get_num_threads()} threads",
            "device_name": torch.cuda.get_device_name(lm.device) if lm.device.type == "cuda" else cpu_name(),
            "weight_bytes": lm.weight_bytes, "card_weight_bytes": weight_bytes(lm.spec, lm.dtype_name),
            "load_seconds": lm.load_seconds, "compile_mode": graphs.mode if graphs is not None else "off",
            "prompt_tokens": len(ids), "new_tokens": n, "rounds": args.rounds,
            "load_average_at_start": os.getloadavg()}


def measure_all(args: argparse.Namespace, lm: Any, weights_allocated: int | None,
                save: Callable[[dict], Path]) -> dict:
    """Every phase in turn, saving after each: decode runs, memory, batch, prefill, then the targets."""
    sizes = DEFAULTS[args.shape]
    n, prefill_n = args.tokens or sizes["tokens"], args.prefill_tokens or sizes["prefill"]
    batch, batch_new = (sizes["batch"] if args.batch is None else args.batch), min(n, 32)
    ids = encode_prompt(lm, GenerationRequest(PROMPT, chat=False))
    graphs, pool_allocated = allocated_by(lambda: one_graphs(lm, args.compile, max(prefill_n, len(ids) + n) + 1),
                                          lm.device)
    lm.batch_graphs = graphs            # the ledger counts its kept pool (engine.lab.memory)
    summary = header(args, lm, graphs, ids, n)
    summary["ceilings"] = ceilings(lm, measured_roof(lm), len(ids) + n // 2, prefill_n, max(batch, 1),  # 0: none
                                   BATCH_PROMPT + batch_new // 2)
    runs = make_runs(lm, graphs, ids, n, set(filter(None, args.skip.split(","))))
    summary["warm_up_s"] = warm_up(runs, graphs, log)
    summary.update(compile_error=graphs.error if graphs is not None else None,
                   one_row_graphed_shapes=sorted(graphs.shapes) if graphs is not None else [],
                   cudagraph_counts=cudagraph_counts())
    summary["runs"] = with_ratios(interleaved(runs, args.rounds, log), summary["ceilings"], lm.weight_bytes)
    save(summary)
    if "one-off" in runs:
        summary["one_row_step_times"] = times = measure_step_times(lm, graphs, n)
        log(f"one-row step ({times['compile_mode']}, {times['graphed_steps']} graphed steps), medians in ms: "
            + ", ".join(f"{k} {v:.3f}" for k, v in times["median_ms"].items()))
        save(summary)
    summary["memory"] = measure_memory(lm, graphs, weights_allocated, pool_allocated, n)
    save(summary)
    if batch:
        summary["batch"] = measure_batch(lm, batch, BATCH_PROMPT, batch_new)
        save(summary)
    summary["prefill"] = measure_prefill(lm, graphs, prefill_n)
    summary["targets"] = check_targets(summary)
    save(summary)
    return summary


def main() -> None:
    args = parse_args()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.shape == "8b" and device.type != "cuda":
        sys.exit("error: the 8B shape is for a GPU (16 GB of bf16 weights); on a CPU use --shape tiny or 1b")
    run = provenance.start("gpu" if device.type == "cuda" else f"gpu-cpu-{args.shape}")
    save = lambda summary: run.save(summary, out=args.out)  # noqa: E731  (the same file after every phase)
    folder, write_s = write_checkpoints(args, device)
    log(f"checkpoint ready in {write_s:.1f} s: {folder}")
    if args.write_only:
        return
    lm, weights_allocated = allocated_by(lambda: load_model(str(folder), device=str(device), dtype=args.dtype), device)
    log(f"loaded {lm.label} in {lm.load_seconds:.1f} s ({lm.weight_bytes / 1e9:.2f} GB)")
    summary = measure_all(args, lm, weights_allocated, save)
    summary["write_seconds"] = write_s
    save(summary)
    print_table(summary)


if __name__ == "__main__":
    main()
