"""Engine benchmark on the embedded model: model.generate vs the engine, capture off and on, side by side.

    .venv/bin/python bench/engine.py [--model default] [--tokens 64] [--repeats 3] [--no-nnsight]

Beside the engine's capture runs its peer: nnsight (an optional benchmark dependency, `pip install -e
'.[bench]'`) tracing `model.generate` on an eager-attention copy of the model and saving every layer's
attention weights at every step. Without nnsight installed that column is skipped with a message.
(The single-request fast path that --static measured is gone, issue 50: a request alone runs the batch runner's
one-row step, bench/lone_route.py.)

Writes a new bench/results/engine/<UTC time>-<commit>.json (bench/provenance.py) and prints a table. Each round
runs every column once (reference, engine off, engine capture, nnsight, ...) and the median over the rounds is
reported, so machine noise hits all columns alike; the ratios are the result.
"""
from __future__ import annotations

import argparse
import platform
import resource
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from transformers import AutoModelForCausalLM
from transformers.generation.streamers import BaseStreamer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.core.generate import GenerationRequest, encode_prompt, generate, generate_captured  # noqa: E402
from engine.core.hooks import CAPTURE_OFF, CapturePolicy  # noqa: E402
from engine.core.kept import kept_for  # noqa: E402
from engine.core.loader import load_model  # noqa: E402
from bench import provenance  # noqa: E402

DECODE_PROMPT = "Write a long, detailed story about a lighthouse keeper who finds a message in a bottle."
PREFILL_WORDS = ("The history of computing is a story of ideas becoming machines. " * 40).strip()
FULL_ROWS = CapturePolicy(layers=None, prefill_matrix=False, stats=True)  # every layer's attention row
NNSIGHT = "nnsight 0.8, every layer's attention (eager)"
EAGER = "model.generate, eager attention"


class TokenClock(BaseStreamer):
    """A generate() streamer that notes when each new token arrives (the first put is the prompt)."""

    def __init__(self) -> None:
        self.start, self.times, self.prompt_seen = time.perf_counter(), [], False

    def put(self, value: torch.Tensor) -> None:
        if self.prompt_seen:
            self.times.append(time.perf_counter())
        self.prompt_seen = True

    def end(self) -> None:
        pass

    def rates(self) -> dict[str, float]:
        """As the engine's DoneRecord: TTFT from the call, decode rate over the tokens after the first."""
        n, decode = len(self.times), self.times[-1] - self.times[0]
        return {"ttft_s": self.times[0] - self.start, "decode_tok_s": (n - 1) / decode if n > 1 else 0.0, "tokens": n}


def reference_rates(model, ids: list[int], max_new: int, eos: list[int]) -> dict[str, float]:
    """HF model.generate (greedy, stopping at EOS like the engine), timed token by token in one run."""
    clock = TokenClock()
    model.generate(torch.tensor([ids], device=model.device), do_sample=False, max_new_tokens=max_new,
                   eos_token_id=eos, pad_token_id=eos[0], streamer=clock)
    return clock.rates()


def engine_rates(lm, request: GenerationRequest, policy: CapturePolicy) -> dict[str, float]:
    kept = kept_for(lm, policy, 512)
    done = list(generate(lm, request, policy, kept=kept))[-1]
    return {"ttft_s": done.ttft, "decode_tok_s": done.tokens_per_second, "tokens": done.generated_tokens}


def load_reference(lm, attention: str):
    """A second copy of the model, plain transformers, with the given attention implementation."""
    model = AutoModelForCausalLM.from_pretrained(lm.source, dtype=lm.dtype, attn_implementation=attention)
    return model.to(lm.device).eval()


def load_nnsight(lm):
    """An eager-attention copy of the model wrapped by nnsight, or None when nnsight is not installed."""
    try:
        from nnsight import TransformersModel
    except ImportError:
        print("nnsight is not installed: skipping its column (make bench-deps, or pip install -e '.[bench]')")
        return None
    return TransformersModel(load_reference(lm, "eager"), tokenizer=lm.tokenizer, task="text-generation")


def nnsight_generate(traced, ids: list[int], max_new: int, eos: list[int]) -> tuple[TokenClock, list[list]]:
    """A traced greedy generate that saves every layer's attention weights at every step, timed per token.

    Returns the clock and the saved weights per step (one forward = one token): [step][layer] (1, H, T_q, T_k).
    """
    layers, clock = traced.model.layers, TokenClock()
    with warnings.catch_warnings():  # an open tracer.all() loop ends with a "never reached" warning by design
        warnings.filterwarnings("ignore", message=".*was never reached")
        with traced.generate(torch.tensor([ids], device=traced.device), do_sample=False, max_new_tokens=max_new,
                             eos_token_id=eos, pad_token_id=eos[0], streamer=clock) as tracer:
            steps = list().save()
            for _ in tracer.all():
                steps.append([layers[i].self_attn.output[1] for i in range(len(layers))])
    return clock, steps


def nnsight_rates(traced, ids: list[int], max_new: int, eos: list[int]) -> dict[str, float]:
    return nnsight_generate(traced, ids, max_new, eos)[0].rates()


def capture_agreement(lm, traced, request: GenerationRequest, ids: list[int], eos: list[int], step: int = 8) -> float:
    """Max |engine row - nnsight's saved eager weights| over every layer and head at one decode step."""
    records = [r for r in generate_captured(lm, request, FULL_ROWS) if r.kind == "decode"]
    _, steps = nnsight_generate(traced, ids, request.max_new_tokens, eos)
    step = min(step, len(records), len(steps) - 1)
    ours = records[step - 1].captures                      # DecodeRecord.step s = the s-th forward after prefill
    return max(float(np.abs(ours[i].attention[:, -1] - steps[step][i][0, :, -1].float().cpu().numpy()).max())
               for i in ours)


def eos_list(lm) -> list[int]:
    ids = lm.model.generation_config.eos_token_id
    return sorted({lm.tokenizer.eos_token_id, *([ids] if isinstance(ids, int) else ids or [])} - {None})


def columns(lm, references: dict, traced, request: GenerationRequest, ids: list[int], eos: list[int]
            ) -> dict[str, Callable[[], dict]]:
    """What one round runs, in order: the references, the engine, nnsight."""
    n = request.max_new_tokens
    runs = {name: (lambda model=model: reference_rates(model, ids, n, eos)) for name, model in references.items()}
    runs["engine, capture off"] = lambda: engine_rates(lm, request, CAPTURE_OFF)
    runs["engine, all attention rows"] = lambda: engine_rates(lm, request, FULL_ROWS)
    if traced is not None:
        runs[NNSIGHT] = lambda: nnsight_rates(traced, ids, n, eos)
    return runs


def measure(lm, references: dict, max_new: int, repeats: int, traced=None) -> dict[str, dict]:
    """Every column once per round, `repeats` rounds, medians per column and phase."""
    eos = eos_list(lm)
    results: dict[str, dict] = {"rounds": {}}
    for phase, prompt, chat, n in (("decode", DECODE_PROMPT, True, max_new), ("prefill", PREFILL_WORDS, False, 1)):
        request = GenerationRequest(prompt, max_new_tokens=n, chat=chat)
        ids = encode_prompt(lm, request)
        runs = columns(lm, references, traced, request, ids, eos)
        for fn in runs.values():  # warm-up, one of each
            fn()
        rounds = [{name: fn() for name, fn in runs.items()} for _ in range(repeats)]
        for name in runs:
            results.setdefault(name, {})[phase] = {k: statistics.median(r[name][k] for r in rounds)
                                                  for k in rounds[0][name]}
        results["rounds"][phase] = rounds
        results.setdefault("prompt_tokens", {})[phase] = len(ids)
        if phase == "decode" and traced is not None:
            results["nnsight_max_abs_diff"] = capture_agreement(lm, traced, request, ids, eos)
    return results


def summarize(lm, results: dict, seconds: float) -> dict:
    weight_bytes = lm.weight_bytes
    rows = {}
    for name in [k for k in results if k not in ("prompt_tokens", "rounds", "nnsight_max_abs_diff")]:
        dec, pre = results[name]["decode"], results[name]["prefill"]
        rows[name] = {
            "decode_tok_s": dec["decode_tok_s"],
            "decode_tokens": dec["tokens"],
            "ttft_s": dec["ttft_s"],
            "prefill_tok_s": results["prompt_tokens"]["prefill"] / pre["ttft_s"],
            "effective_bandwidth_gb_s": weight_bytes * dec["decode_tok_s"] / 1e9,
        }
    return {
        "model": lm.label, "device": str(lm.device), "dtype": lm.dtype_name,
        "machine": f"{platform.machine()}, {torch.get_num_threads()} threads",
        "weight_bytes": weight_bytes,
        "prompt_tokens": results["prompt_tokens"],
        "runs": rows,
        "ratios": ratios(rows),
        "targets": {"capture_off_vs_generate": 0.95, "full_capture_vs_generate": 0.7,
                    "full_capture_vs_nnsight": 1.0},  # the engine's capture costs less than its peer's
        "decode_rounds": {name: [r[name]["decode_tok_s"] for r in results["rounds"]["decode"]] for name in rows},
        "nnsight_max_abs_diff": results.get("nnsight_max_abs_diff"),
        "peak_memory_bytes": peak_memory(lm.device),
        "load_seconds": lm.load_seconds,
        "bench_seconds": seconds,
    }


def ratios(rows: dict) -> dict[str, float]:
    """Decode rates over model.generate's."""
    ref = rows["model.generate"]["decode_tok_s"]
    out = {"capture_off_vs_generate": rows["engine, capture off"]["decode_tok_s"] / ref,
           "full_capture_vs_generate": rows["engine, all attention rows"]["decode_tok_s"] / ref}
    if NNSIGHT in rows:
        out["nnsight_vs_generate"] = rows[NNSIGHT]["decode_tok_s"] / ref
        out["full_capture_vs_nnsight"] = (rows["engine, all attention rows"]["decode_tok_s"]
                                          / rows[NNSIGHT]["decode_tok_s"])
    if EAGER in rows:
        out["eager_generate_vs_generate"] = rows[EAGER]["decode_tok_s"] / ref
    return out


def peak_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def print_table(summary: dict) -> None:
    print(f"\n{summary['model']} on {summary['device']} ({summary['dtype']}), {summary['machine']}")
    print(f"{'':44} {'decode tok/s':>12} {'prefill tok/s':>14} {'TTFT ms':>8} {'eff. GB/s':>10}")
    for name, row in summary["runs"].items():
        print(f"{name:44} {row['decode_tok_s']:12.1f} {row['prefill_tok_s']:14.0f} "
              f"{row['ttft_s'] * 1e3:8.1f} {row['effective_bandwidth_gb_s']:10.1f}")
    for name, rates in summary["decode_rounds"].items():
        print(f"{'rounds: ' + name:44} " + " ".join(f"{r:6.1f}" for r in rates))
    for key, value in summary["ratios"].items():
        target = summary["targets"].get(key)
        verdict = f"(target >= {target}) {'ok' if value >= target else 'MISSED'}" if target else ""
        print(f"{key:44} {value:6.3f}x  {verdict}")
    peer = summary["ratios"].get("nnsight_vs_generate")
    if peer is not None:
        ours = summary["ratios"]["full_capture_vs_generate"]
        print(f"{'capture cost: engine vs nnsight':44} {1 - ours:6.1%} vs {1 - peer:6.1%}  "
              f"{'engine leads' if ours > peer else 'nnsight leads'}")
        print(f"{'nnsight vs engine rows, max abs diff':44} {summary['nnsight_max_abs_diff']:.2e}")
    print(f"peak memory {summary['peak_memory_bytes'] / 1e9:.2f} GB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", help="default: a new file under bench/results/engine/")
    parser.add_argument("--no-nnsight", action="store_true", help="skip the nnsight column")
    args = parser.parse_args()
    run = provenance.start("engine")
    start = time.perf_counter()
    lm = load_model(args.model)
    references = {"model.generate": load_reference(lm, "sdpa")}
    traced = None if args.no_nnsight else load_nnsight(lm)
    if traced is not None:  # nnsight's own base, untraced: how much of its cost is eager attention
        references[EAGER] = load_reference(lm, "eager")
    with torch.inference_mode():
        results = measure(lm, references, args.tokens, args.repeats, traced)
    summary = summarize(lm, results, time.perf_counter() - start)
    run.save(summary, out=args.out, rounds=results["rounds"])
    print_table(summary)


if __name__ == "__main__":
    main()
