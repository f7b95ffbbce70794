"""Engine benchmark on the embedded model: model.generate vs the engine, capture off and on, side by side.

    .venv/bin/python bench/engine.py [--model default] [--tokens 64] [--repeats 3] [--static]

With --static the engine's static-cache fast path (engine/fastpath.py; CUDA graphs on CUDA, eager on
CPU) runs too, capture off and with every attention row.

Writes bench/results/engine.json and prints a table. Runs are interleaved (reference, off, capture)
and the median of each is reported, so machine noise hits all three alike; the ratios are the result.
"""
from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.fastpath import FastDecoder  # noqa: E402
from engine.generate import GenerationRequest, encode_prompt, generate  # noqa: E402
from engine.hooks import CAPTURE_OFF, CapturePolicy  # noqa: E402
from engine.loader import load_model  # noqa: E402

DECODE_PROMPT = "Write a long, detailed story about a lighthouse keeper who finds a message in a bottle."
PREFILL_WORDS = ("The history of computing is a story of ideas becoming machines. " * 40).strip()
FULL_ROWS = CapturePolicy(layers=None, prefill_matrix=False, stats=True)  # every layer's attention row


def time_reference(model, ids: list[int], max_new: int, eos: list[int]) -> tuple[float, int]:
    """Seconds and tokens for HF model.generate (greedy), stopping at EOS like the engine."""
    input_ids = torch.tensor([ids], device=model.device)
    start = time.perf_counter()
    out = model.generate(input_ids, do_sample=False, max_new_tokens=max_new, eos_token_id=eos,
                         pad_token_id=eos[0])
    return time.perf_counter() - start, out.shape[1] - len(ids)


def reference_rates(model, ids: list[int], max_new: int, eos: list[int]) -> dict[str, float]:
    """Prefill = generate(1 token); decode rate from the extra time of the longer run."""
    t_first, _ = time_reference(model, ids, 1, eos)
    t_all, n = time_reference(model, ids, max_new, eos)
    return {"ttft_s": t_first, "decode_tok_s": (n - 1) / max(t_all - t_first, 1e-9), "tokens": n}


def engine_rates(lm, request: GenerationRequest, policy: CapturePolicy, fast: FastDecoder | None = None
                 ) -> dict[str, float]:
    records = fast.generate(request, policy) if fast is not None else generate(lm, request, policy)
    done = list(records)[-1]
    return {"ttft_s": done.ttft, "decode_tok_s": done.tokens_per_second, "tokens": done.generated_tokens}


def median_runs(fn, repeats: int) -> dict[str, float]:
    runs = [fn() for _ in range(repeats)]
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def measure(lm, reference, max_new: int, repeats: int, fast: FastDecoder | None = None
            ) -> dict[str, dict[str, float]]:
    eos = sorted({lm.tokenizer.eos_token_id, *([lm.model.generation_config.eos_token_id] if isinstance(
        lm.model.generation_config.eos_token_id, int) else lm.model.generation_config.eos_token_id or [])} - {None})
    results: dict[str, dict[str, float]] = {}
    for phase, prompt, chat, n in (("decode", DECODE_PROMPT, True, max_new), ("prefill", PREFILL_WORDS, False, 1)):
        request = GenerationRequest(prompt, max_new_tokens=n, chat=chat)
        ids = encode_prompt(lm, request)
        runs = {
            "model.generate": lambda: reference_rates(reference, ids, n, eos),
            "engine, capture off": lambda: engine_rates(lm, request, CAPTURE_OFF),
            "engine, all attention rows": lambda: engine_rates(lm, request, FULL_ROWS),
        }
        if fast is not None:
            runs["static cache, capture off"] = lambda: engine_rates(lm, request, CAPTURE_OFF, fast)
            runs["static cache, all attention rows"] = lambda: engine_rates(lm, request, FULL_ROWS, fast)
        engine_rates(lm, request, CAPTURE_OFF)  # warm-up
        for name, fn in runs.items():
            results.setdefault(name, {})[phase] = median_runs(fn, repeats)
        results.setdefault("prompt_tokens", {})[phase] = len(ids)
    return results


def summarize(lm, results: dict, seconds: float) -> dict:
    weight_bytes = lm.weight_bytes
    rows = {}
    for name in [k for k in results if k != "prompt_tokens"]:
        dec, pre = results[name]["decode"], results[name]["prefill"]
        rows[name] = {
            "decode_tok_s": dec["decode_tok_s"],
            "decode_tokens": dec["tokens"],
            "ttft_s": dec["ttft_s"],
            "prefill_tok_s": results["prompt_tokens"]["prefill"] / pre["ttft_s"],
            "effective_bandwidth_gb_s": weight_bytes * dec["decode_tok_s"] / 1e9,
        }
    ref = rows["model.generate"]["decode_tok_s"]
    return {
        "model": lm.label, "device": str(lm.device), "dtype": lm.dtype_name,
        "machine": f"{platform.machine()}, {torch.get_num_threads()} threads",
        "weight_bytes": weight_bytes,
        "prompt_tokens": results["prompt_tokens"],
        "runs": rows,
        "ratios": {
            "capture_off_vs_generate": rows["engine, capture off"]["decode_tok_s"] / ref,
            "full_capture_vs_generate": rows["engine, all attention rows"]["decode_tok_s"] / ref,
            **({"static_off_vs_engine_off": rows["static cache, capture off"]["decode_tok_s"]
                / rows["engine, capture off"]["decode_tok_s"],
                "static_rows_vs_engine_rows": rows["static cache, all attention rows"]["decode_tok_s"]
                / rows["engine, all attention rows"]["decode_tok_s"]} if "static cache, capture off" in rows else {}),
        },
        "targets": {"capture_off_vs_generate": 0.95, "full_capture_vs_generate": 0.7},
        "peak_memory_bytes": peak_memory(lm.device),
        "load_seconds": lm.load_seconds,
        "bench_seconds": seconds,
    }


def peak_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def print_table(summary: dict) -> None:
    print(f"\n{summary['model']} on {summary['device']} ({summary['dtype']}), {summary['machine']}")
    print(f"{'':34} {'decode tok/s':>12} {'prefill tok/s':>14} {'TTFT ms':>8} {'eff. GB/s':>10}")
    for name, row in summary["runs"].items():
        print(f"{name:34} {row['decode_tok_s']:12.1f} {row['prefill_tok_s']:14.0f} "
              f"{row['ttft_s'] * 1e3:8.1f} {row['effective_bandwidth_gb_s']:10.1f}")
    for key, value in summary["ratios"].items():
        target = summary["targets"].get(key)
        verdict = f"(target >= {target}) {'ok' if value >= target else 'MISSED'}" if target else "(no target)"
        print(f"{key:34} {value:6.3f}x  {verdict}")
    print(f"peak memory {summary['peak_memory_bytes'] / 1e9:.2f} GB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "engine.json"))
    parser.add_argument("--static", action="store_true", help="also the static-cache fast path")
    args = parser.parse_args()
    start = time.perf_counter()
    lm = load_model(args.model)
    reference = AutoModelForCausalLM.from_pretrained(lm.source, dtype=lm.dtype, attn_implementation="sdpa")
    reference.to(lm.device).eval()
    fast = FastDecoder(lm) if args.static else None
    with torch.inference_mode():
        results = measure(lm, reference, args.tokens, args.repeats, fast)
    summary = summarize(lm, results, time.perf_counter() - start)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=2))
    print_table(summary)


if __name__ == "__main__":
    main()
