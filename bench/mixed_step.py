"""A long prompt joining a room that decodes: the steps that carry its chunks, run apart (the chunk's prefill pass,
then the rows' decode pass: the code before the mixed step) and as ONE forward over the flattened step
(engine.serving.lean.mixed_step), side by side in one process, alternating round by round on this shared machine.

    .venv/bin/python bench/mixed_step.py                       # SmolLM2 float32: 8 and 20 rows, a 1,024-token prompt
    .venv/bin/python bench/mixed_step.py --rows 20 --prompt 2048 --rounds 3

Per way and round: the decoding rows' tokens per second over the steps that carry a chunk (their tokens in those
steps over those steps' seconds), the newcomer's prefill time (those steps' seconds together), and the same in this
process's CPU seconds (what other processes inflate less than wall time), and every step's. One torch thread by
default: on this shared 2-core machine a team of two waits for its second core and single steps scatter 5x. Both
ways give the same answers (checked: every row's tokens). Ratios only mean something within one run: other processes
share the cores. Writes a new bench/results/mixed_step/<UTC time>-<commit>.json (bench/provenance.py).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import provenance  # noqa: E402

WAYS = ("apart", "mixed")


def one_room(lm, way: str, rows: int, prompt: int, chunk: int) -> dict:
    """`rows` requests decoding, then a `prompt`-token newcomer: the steps that carry its chunks."""
    import torch

    from engine.core.generate import GenerationRequest
    from engine.core.hooks import CAPTURE_OFF
    from engine.serving.batch import BatchRunner, Slot

    runner = BatchRunner(lm, max_batch=rows + 1, prefill_chunk=chunk)
    if way == "apart":
        runner._mixes = lambda: False                            # the steps as they ran before the mixed step
    tokens: list[list[int]] = [[] for _ in range(rows + 1)]
    ids = torch.randint(4, lm.spec.vocab_size, (rows + 1, max(prompt, 16)),
                        generator=torch.Generator().manual_seed(0)).tolist()
    for i in range(rows):
        request = GenerationRequest("(token ids)", max_new_tokens=512, chat=False)
        runner.add(Slot(request, ids[i][:16], CAPTURE_OFF, lambda r, i=i: _keep(tokens[i], r), _raise))
    while runner.prefilling or not runner.batch.slots:
        runner.step()
    for _ in range(3):                                           # warm: decode-only steps
        runner.step()
    request = GenerationRequest("(token ids)", max_new_tokens=2, chat=False)
    runner.add(Slot(request, ids[rows][:prompt], CAPTURE_OFF, lambda r: _keep(tokens[rows], r), _raise))
    steps = []
    while runner.prefilling:
        cpu = time.process_time()
        info = runner.step()
        steps.append({"seconds": info.seconds, "cpu_s": time.process_time() - cpu, "decode_rows": info.decode_rows,
                      "prefill_tokens": info.prefill_tokens})
    wall, cpu = sum(s["seconds"] for s in steps), sum(s["cpu_s"] for s in steps)
    decoded = sum(s["decode_rows"] for s in steps)
    return {"steps": steps, "prefill_s": wall, "prefill_cpu_s": cpu, "rows_tok_s": decoded / wall,
            "rows_tok_cpu_s": decoded / cpu, "tokens": tokens[:rows]}


def _keep(into: list[int], record) -> None:
    token = getattr(record, "token", None)
    if token is not None:
        into.append(token.id)


def _raise(err: Exception) -> None:
    raise err


def measure(args: argparse.Namespace) -> dict:
    from engine.core.loader import load_model

    lm = load_model("default", device="cpu", dtype="float32")
    out = {}
    for rows in args.rows:
        seen = {way: [] for way in WAYS}
        for r in range(args.rounds):
            for way in (WAYS if r % 2 == 0 else WAYS[::-1]):
                seen[way].append(one_room(lm, way, rows, args.prompt, args.chunk))
                print(f"{rows} rows, round {r + 1}, {way}: decoding rows {seen[way][-1]['rows_tok_s']:.1f} tok/s, "
                      f"prefill {seen[way][-1]['prefill_s']:.2f} s", flush=True)
        same = all(x[:n] == y[:n] for a, b in zip(seen["apart"], seen["mixed"])
                   for x, y in zip(a["tokens"], b["tokens"]) for n in [min(len(x), len(y))])
        keys = ("rows_tok_s", "prefill_s", "rows_tok_cpu_s", "prefill_cpu_s")
        med = {way: {k: statistics.median(x[k] for x in seen[way]) for k in keys} for way in WAYS}
        out[str(rows)] = {"median": med, "same_tokens": same,
                          **{f"{k}_mixed_vs_apart": med["mixed"][k] / med["apart"][k] for k in keys},
                          "rounds": {way: [{k: v for k, v in x.items() if k != "tokens"} for x in seen[way]]
                                     for way in WAYS}}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 20])
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", help="default: a new file under bench/results/mixed_step/")
    args = parser.parse_args(argv)
    run = provenance.start("mixed_step", argv)
    import torch                            # here, after the machine's record: the thread count for the whole run

    torch.set_num_threads(args.threads)
    report = {"what": f"SmolLM2 float32 on the CPU: a {args.prompt}-token prompt in chunks of {args.chunk} joining "
                      "rows that decode; the steps carrying its chunks, apart and mixed, alternating",
              "prompt": args.prompt, "chunk": args.chunk, "threads": args.threads, "by_rows": measure(args)}
    for rows, r in report["by_rows"].items():
        print(f"{rows} rows: decoding rows' tok/s in chunk steps mixed/apart {r['rows_tok_s_mixed_vs_apart']:.2f}x "
              f"(CPU time {r['rows_tok_cpu_s_mixed_vs_apart']:.2f}x), newcomer's prefill time mixed/apart "
              f"{r['prefill_s_mixed_vs_apart']:.2f}x (CPU {r['prefill_cpu_s_mixed_vs_apart']:.2f}x), "
              f"same tokens {r['same_tokens']}")
    run.save(report, out=args.out)
    return 0 if all(r["same_tokens"] for r in report["by_rows"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
