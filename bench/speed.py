"""Speed lab benchmark on the embedded model: this device's peaks, prefill/decode against context, the decode
step on the roofline, quantized copies, and batched generation. Everything the speed pages measure, in one run.

    .venv/bin/python bench/speed.py [--model default] [--lengths 64,256,1024] [--quick]

Writes a new bench/results/speed/<UTC time>-<commit>.json (bench/provenance.py) and prints a summary.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.lab.batching import measure_batching  # noqa: E402
from engine.core.loader import load_model  # noqa: E402
from bench import provenance  # noqa: E402
from engine.lab.quantize import compare_models, quantize_copy, text_ids  # noqa: E402
from engine.lab.speed import (attention_onset, compare_decode, fit_ttft, measure_roof, place_decode,  # noqa: E402
                              prompt_of_length, sweep_context)


def context_part(lm, roof, lengths: list[int], rounds: int) -> dict:
    points = sweep_context(lm, lengths, steps=6, rounds=rounds)
    fit = fit_ttft(points)
    last = points[-1]
    place = place_decode(lm, roof, last.itl, last.tokens)
    return {"points": [p.to_dict() for p in points], "fit_onset": fit.onset if fit else None,
            "projected_onset_10pct": attention_onset(lm.spec, 0.1), "decode_placement": place.to_dict()}


def quant_part(lm, steps: int, rounds: int) -> dict:
    copies = [quantize_copy(lm, "int8"), quantize_copy(lm, "int4", 32)]
    ids = text_ids(lm)
    timings = compare_decode([lm] + [q.lm for q in copies], prompt_of_length(lm, 32), steps, rounds)
    out = {"float": {"bytes": lm.weight_bytes, "tok_s": timings[0].tokens_per_second}}
    for q, t in zip(copies, timings[1:]):
        r = compare_models(lm, q.lm, ids)
        out[q.scheme] = {"stored_bytes": q.stored_bytes, "linear_bytes_before": q.linear_bytes_before,
                         "linear_bytes_after": q.linear_bytes_after, "bits_per_weight": q.bits_per_weight,
                         "weight_error": q.weight_error, "mode": q.mode, "compute_dtype": q.compute_dtype,
                         "tok_s": t.tokens_per_second, "speed_vs_float": t.tokens_per_second / timings[0].tokens_per_second,
                         "top1_agreement": r.top1_agreement, "ppl_reference": r.ppl_reference,
                         "ppl_quantized": r.ppl_candidate, "ppl_change": r.ppl_change, "mean_kl": r.mean_kl,
                         "eval_tokens": r.tokens}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--lengths", default="64,256,512,1024")
    parser.add_argument("--quick", action="store_true", help="fewer steps and rounds")
    args = parser.parse_args()
    run = provenance.start("speed")
    lm = load_model(args.model, device="cpu")
    roof = measure_roof(lm.device, lm.dtype)
    steps, rounds = (6, 1) if args.quick else (12, 3)
    result = {
        "model": lm.label, "device": str(lm.device), "dtype": lm.dtype_name,
        "machine": f"{platform.machine()}, {torch.get_num_threads()} threads", "roof": roof.to_dict(),
        "context": context_part(lm, roof, [int(n) for n in args.lengths.split(",")], rounds),
        "quantization": quant_part(lm, steps, rounds),
        "batching": [p.to_dict() for p in measure_batching(lm, (1, 2, 4, 8), prompt_tokens=32, new_tokens=12,
                                                              rounds=rounds)],
    }
    result["rounds_per_point"] = rounds          # each point is engine/lab's median of that many rounds
    run.save(result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
