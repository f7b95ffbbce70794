"""Speculative decoding benchmark: every draft kind and k against plain greedy decoding, side by side.

    .venv/bin/python bench/speculative.py [--quick] [--tokens 48] [--threads 1] [--no-qwen]

On the embedded model and three fixed prompts (a code continuation, a passage to copy, an open
question) it measures, for n-gram lookup and early exit at two depths with k in {2, 4, 6}: the
acceptance rate, tokens per target pass, the wall-clock speedup over plain greedy decoding
(`engine.core.generate`, capture off) and the draft and verify cost per round that explain it (the table
shows the median round; the JSON also has means and the first round, where a draft reads the prompt). The
Qwen2.5-Coder pair (0.5B drafting for 1.5B) is added when both extras are installed.

Plain greedy runs are interleaved with the speculative ones (before each draft kind and at the end)
and their median is the baseline, so a busy machine slows both sides alike. One torch thread by
default: the two cores here are shared, and one thread does not stall when a neighbour is busy.
Writes a new bench/results/speculative/<UTC time>-<commit>.json (bench/provenance.py) and prints a table.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.core.generate import GenerationRequest, encode_prompt, generate  # noqa: E402
from engine.speculative.demo_prompts import SPECULATIVE_PROMPTS  # noqa: E402
from engine.core.hooks import CAPTURE_OFF  # noqa: E402
from bench import provenance  # noqa: E402
from engine.core.loader import LoadedModel, cache_dir, load_model  # noqa: E402
from engine.speculative.decode import (Draft, SpecRoundRecord, draft_from_spec, expected_tokens_per_pass,  # noqa: E402
                                       speculative_generate)

PROMPTS = SPECULATIVE_PROMPTS  # the same three prompts the speculative page offers
DRAFTS = ("ngram", "early-exit:8", "early-exit:20")
KS = (2, 4, 6)
QWEN_TARGET, QWEN_DRAFT = "qwen-1.5b", "qwen-0.5b"


def plain_run(lm: LoadedModel, request: GenerationRequest) -> dict[str, Any]:
    start = time.perf_counter()
    done = list(generate(lm, request, CAPTURE_OFF))[-1]
    return {"seconds": time.perf_counter() - start, "tokens": done.generated_tokens, "text": done.text,
            "ttft_s": done.ttft, "step_ms": 1000 * done.inter_token_latency}


def spec_run(lm: LoadedModel, request: GenerationRequest, draft: Draft, k: int) -> dict[str, Any]:
    start = time.perf_counter()
    records = list(speculative_generate(lm, request, draft, k))
    seconds, done = time.perf_counter() - start, records[-1]
    rounds = [r for r in records if isinstance(r, SpecRoundRecord)]
    n = max(done.rounds, 1)
    return {"seconds": seconds, "tokens": done.generated_tokens, "text": done.text,
            "acceptance": done.acceptance_rate, "acceptance_by_position": done.acceptance_by_position,
            "tokens_per_pass": done.tokens_per_pass, "rounds": done.rounds, "drafted": done.drafted,
            "draft_ms_per_round": 1000 * done.draft_seconds / n, "verify_ms_per_round": 1000 * done.verify_seconds / n,
            "median_draft_ms": 1000 * _median(r.draft_seconds for r in rounds),       # steady state, no catch-up
            "median_verify_ms": 1000 * _median(r.verify_seconds for r in rounds),
            "first_round_draft_ms": 1000 * rounds[0].draft_seconds if rounds else 0.0,  # includes reading the prompt
            "ttft_s": done.ttft}


def _median(values) -> float:
    values = list(values)
    return statistics.median(values) if values else 0.0


def explain(run: dict[str, Any], baseline: dict[str, Any], k: int) -> dict[str, Any]:
    """Speedup and the costs behind it: a round costs draft + verify and yields tokens_per_pass tokens."""
    step = baseline["step_ms"]
    round_ms = run["draft_ms_per_round"] + run["verify_ms_per_round"]
    drafted_per_round = run["drafted"] / max(run["rounds"], 1)
    return {
        "speedup": baseline["seconds"] / run["seconds"],
        "greedy_seconds": baseline["seconds"],
        "greedy_step_ms": step,
        "same_text_as_greedy": run["text"] == baseline["text"],
        "expected_tokens_per_pass": expected_tokens_per_pass(run["acceptance"], k),
        "draft_cost_per_token_vs_step": (run["draft_ms_per_round"] / drafted_per_round / step
                                         if drafted_per_round else 0.0),
        "verify_cost_vs_step": run["verify_ms_per_round"] / step,
        "decode_speedup_from_costs": run["tokens_per_pass"] * step / round_ms if round_ms else 0.0,
    }


def bench_prompt(lm: LoadedModel, name: str, request: GenerationRequest, drafts: tuple[str, ...],
                 ks: tuple[int, ...]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Greedy before each draft kind and once at the end; each (draft, k) once in between."""
    plain, rows = [], []
    for spec in drafts:
        plain.append(plain_run(lm, request))
        draft = draft_from_spec(spec, lm)
        for k in ks:
            run = spec_run(lm, request, draft, k)
            rows.append({"target": "smollm2", "prompt": name, "draft": spec, "k": k, **run})
            print(f"  {name:8} {spec:14} k={k}  {run['seconds']:6.2f} s  accept {run['acceptance']:.0%}", flush=True)
    plain.append(plain_run(lm, request))
    baseline = {**plain[-1], "seconds": statistics.median(p["seconds"] for p in plain),
                "step_ms": statistics.median(p["step_ms"] for p in plain),
                "all_seconds": [p["seconds"] for p in plain]}
    for row in rows:
        row.update(explain(row, baseline, row["k"]))
    return baseline, rows


def qwen_available() -> bool:
    return all((cache_dir() / folder / "config.json").exists()
               for folder in ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"))


def bench_qwen(tokens: int, ks: tuple[int, ...]) -> dict[str, Any]:
    """Qwen2.5-Coder 0.5B drafting for 1.5B on the code prompt."""
    target = load_model(QWEN_TARGET, device="cpu")
    request = GenerationRequest(PROMPTS["code"], max_new_tokens=tokens)
    drafts = {"qwen-0.5b": draft_from_spec(QWEN_DRAFT, target)}
    baseline, rows = _bench_model_draft(target, request, drafts["qwen-0.5b"], ks)
    return {"target": target.label, "draft": drafts["qwen-0.5b"].label, "prompt": "code", "tokens": tokens,
            "target_weight_bytes": target.weight_bytes, "draft_weight_bytes": drafts["qwen-0.5b"].lm.weight_bytes,
            "baseline": _public(baseline), "runs": [_public(r) for r in rows]}


def _bench_model_draft(target: LoadedModel, request: GenerationRequest, draft: Draft,
                       ks: tuple[int, ...]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    plain_run(target, GenerationRequest(request.prompt, max_new_tokens=2))   # warm-up
    plain, rows = [plain_run(target, request)], []
    for k in ks:
        run = spec_run(target, request, draft, k)
        rows.append({"target": QWEN_TARGET, "prompt": "code", "draft": QWEN_DRAFT, "k": k, **run})
        print(f"  qwen     {QWEN_DRAFT:14} k={k}  {run['seconds']:6.2f} s  accept {run['acceptance']:.0%}", flush=True)
    plain.append(plain_run(target, request))
    baseline = {**plain[-1], "seconds": statistics.median(p["seconds"] for p in plain),
                "step_ms": statistics.median(p["step_ms"] for p in plain)}
    for row in rows:
        row.update(explain(row, baseline, row["k"]))
    return baseline, rows


def _public(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k != "text"}


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"\n{'target':10}{'prompt':9}{'draft':15}{'k':>2} {'accept':>7} {'tok/pass':>8} {'draft ms':>9} {'verify ms':>9} "
          f"{'step ms':>8} {'speedup':>8}  same")
    for r in rows:
        print(f"{r['target']:10}{r['prompt']:9}{r['draft']:15}{r['k']:>2} {r['acceptance']:>7.0%} {r['tokens_per_pass']:>8.2f} "
              f"{r['median_draft_ms']:>9.1f} {r['median_verify_ms']:>9.1f} {r['greedy_step_ms']:>8.1f} "
              f"{r['speedup']:>7.2f}x  {'yes' if r['same_text_as_greedy'] else 'NO'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer tokens and k in {2, 4} only")
    parser.add_argument("--tokens", type=int, default=None, help="new tokens per run (default 48, quick 24)")
    parser.add_argument("--qwen-tokens", type=int, default=None, help="new tokens for the Qwen pair (default 32)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-qwen", action="store_true")
    parser.add_argument("--out", help="default: a new file under bench/results/speculative/")
    args = parser.parse_args(argv)
    run = provenance.start("speculative", argv)
    torch.set_num_threads(args.threads)
    tokens = args.tokens or (24 if args.quick else 48)
    ks = (2, 4) if args.quick else KS
    started = time.perf_counter()
    lm = load_model("default", device="cpu")
    plain_run(lm, GenerationRequest(PROMPTS["question"], max_new_tokens=8))      # warm-up
    baselines, rows = {}, []
    for name, prompt in PROMPTS.items():
        request = GenerationRequest(prompt, max_new_tokens=tokens)
        baselines[name], prompt_rows = bench_prompt(lm, name, request, DRAFTS, ks)
        baselines[name]["prompt_tokens"] = len(encode_prompt(lm, request))
        rows.extend(prompt_rows)
    qwen = None
    if qwen_available() and not args.no_qwen:
        del lm
        qwen = bench_qwen(args.qwen_tokens or (16 if args.quick else 32), (4,) if args.quick else KS)
    result = {
        "model": "SmolLM2-135M-Instruct", "tokens": tokens, "threads": args.threads, "device": "cpu",
        "machine": {"cpus": _cpus(), "platform": platform.platform(), "torch": torch.__version__},
        "prompts": PROMPTS, "baselines": {n: _public(b) for n, b in baselines.items()},
        "runs": [_public(r) for r in rows], "qwen": qwen, "seconds": time.perf_counter() - started,
    }
    out = run.save(result, out=args.out)
    print_table(rows + (qwen["runs"] if qwen else []))
    print(f"\n{out} in {result['seconds']:.0f} s")
    return 0


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0


if __name__ == "__main__":
    raise SystemExit(main())
