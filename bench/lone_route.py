"""A request alone, two routes side by side in one process on this CPU (issue 50): the batch runner's one-row step
of the one forward (the route a lone API request takes: engine.serving.batch.BatchRunner, max_batch 32 as the server
makes it) against the single-request fast path (engine/core/fastpath.py's FastDecoder: a static cache and its own
pipelined greedy loop, eager on a CPU), where the tree still has it.

    .venv/bin/python bench/lone_route.py [--rounds 5] [--prompt 64] [--new 64]

SmolLM2 (the embedded model) in float32, greedy, the same prompt; the two runs alternate round by round and must give
the same tokens (the file says whether they did). Per run: milliseconds per token after the first (DoneRecord's
decode_seconds over the tokens after the first) and the time to the first token. Ratios only mean something within
one run: other processes share the 2 cores, so the file also keeps each round's ratio (its two runs back to back)
and their median. Writes a new bench/results/lone_route/<UTC time>-<commit>.json
(bench/provenance.py).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def runner_route(lm, request):
    """Records of one request alone through the batch runner (the one forward's one-row step)."""
    from engine.core.generate import admit
    from engine.core.hooks import CAPTURE_OFF
    from engine.serving.batch import BatchRunner, Slot

    records, errors = [], []
    runner = BatchRunner(lm, max_batch=32)
    runner.add(Slot(request, admit(lm, request), CAPTURE_OFF, records.append, errors.append))
    while not runner.idle:
        runner.step()
    if errors:
        raise errors[0]
    return records


def fast_route(fast, request):
    return list(fast.generate(request))


def summary(records) -> dict:
    done = records[-1]
    return {"ms_per_token": done.decode_seconds / max(done.generated_tokens - 1, 1) * 1e3,
            "ttft_ms": done.ttft * 1e3, "tokens": [r.token.id for r in records[:-1]]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--prompt", type=int, default=64, help="prompt tokens (about)")
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--out", help="default: a new file under bench/results/lone_route/")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    from bench import provenance  # after the project root is on sys.path (run as a script)

    run = provenance.start("lone_route")
    import torch  # noqa: F401 - after provenance: its bandwidth is measured before the model loads
    from engine.core.generate import GenerationRequest
    from engine.core.loader import load_model

    lm = load_model("default", device="cpu", dtype="float32")
    request = GenerationRequest(" ".join(["the sky is blue because"] * (args.prompt // 5)), max_new_tokens=args.new,
                                temperature=0.0, chat=False)
    routes = {"one forward, one row (batch runner)": lambda: runner_route(lm, request)}
    try:
        from engine.core.fastpath import FastDecoder  # present before issue 50's change only
        fast = FastDecoder(lm, compile="off")
        routes["fast path (static cache, eager)"] = lambda: fast_route(fast, request)
    except ImportError:
        pass
    for fn in routes.values():                          # warm: packing, first allocations
        fn()
    seen = {name: [] for name in routes}
    for r in range(args.rounds):
        for name in (list(routes) if r % 2 == 0 else list(routes)[::-1]):
            seen[name].append(summary(routes[name]()))
            print(f"round {r + 1} {name}: {seen[name][-1]['ms_per_token']:.1f} ms/token", flush=True)
    med = {name: {k: statistics.median(x[k] for x in rows) for k in ("ms_per_token", "ttft_ms")}
           for name, rows in seen.items()}
    token_sets = {tuple(x["tokens"]) for rows in seen.values() for x in rows}
    report = {"what": __doc__.split("\n\n")[0], "prompt_tokens": lm.tokenizer(request.prompt)["input_ids"].__len__(),
              "new_tokens": args.new, "rounds": {n: [{k: v for k, v in x.items() if k != "tokens"} for x in rows]
                                                 for n, rows in seen.items()},
              "medians": med, "same_tokens": len(token_sets) == 1}
    names = list(med)
    if len(names) == 2:
        report["one_row_vs_fast_path_speed"] = med[names[1]]["ms_per_token"] / med[names[0]]["ms_per_token"]
        pairs = [f["ms_per_token"] / o["ms_per_token"] for o, f in zip(seen[names[0]], seen[names[1]])]
        report["one_row_vs_fast_path_speed_per_round"] = pairs       # each round's two runs, back to back
        report["one_row_vs_fast_path_speed_median_of_rounds"] = statistics.median(pairs)
        print(f"one row / fast path speed: {report['one_row_vs_fast_path_speed']:.2f}x (medians), "
              f"{report['one_row_vs_fast_path_speed_median_of_rounds']:.2f}x (median of the rounds' ratios); "
              f"same tokens: {report['same_tokens']}", flush=True)
    run.save(report, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
