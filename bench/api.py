"""The model through its HTTP API against the same model in-process: N sessions at once, side by side in one run.

    python bench/api.py                                   # SmolLM2, 20 sessions, 16 and 64 tokens, capture off and on
    python bench/api.py --sessions 20 --tokens 16 --rounds 3 --model /models/llama --device cuda

In-process: N threads submit through the scheduler in this process and read the records (bench/load.py's
sessions, batched). Through the API: `python -m engine serve` runs the same model with the same limits and thread
count in another process, and N threads each stream one chat completion with the official `openai` package
(capture on: `"playground": {"capture": true}`, the pages' policy), spread over `--client-procs` processes
(bench/api_clients.py: one process of clients is a ceiling of its own at GPU speeds). The two alternate round
by round (the machine is shared and noisy); medians of the rounds. Every answer must equal the same prompt run alone (greedy).
Writes a new bench/results/api/<UTC time>-<commit>.json (bench/provenance.py). The issue's targets: API total tok/s
>= 0.9x in-process, p95 completion <= 1.15x.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import openai  # noqa: E402
import torch  # noqa: E402

from api_clients import ClientPool  # noqa: E402
from load import CAPTURES, PROMPTS, machine, pct, references, scenario  # noqa: E402
from engine.core.loader import load_model  # noqa: E402
from engine.core.openmp import in_passing_thread  # noqa: E402
from engine.serving.capture import capture_policy  # noqa: E402
from engine.serving.limits import Limits  # noqa: E402
from bench import provenance  # noqa: E402



def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: argparse.Namespace, limits: Limits, threads: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "engine", "serve", "--model", args.model, "--port", str(port), "--log-level",
           "warning", "--max-batch", str(limits.max_batch), "--max-queue", str(limits.max_queue),
           "--threads", str(threads)]
    cmd += [x for flag, v in (("--device", args.device), ("--dtype", args.dtype)) if v for x in (flag, v)]
    log = open(os.environ.get("BENCH_SERVER_LOG", os.devnull), "w")       # the server's output, when asked for
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    url = f"http://127.0.0.1:{port}"
    wait_healthy(proc, url)
    return proc, url


def wait_healthy(proc: subprocess.Popen, url: str, seconds: float = 600) -> None:
    """Until the server answers /health; a server that exits or never answers ends the benchmark with a line."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return
        except OSError:
            if proc.poll() is not None:
                raise SystemExit("the server exited (BENCH_SERVER_LOG=path keeps its output)")
            time.sleep(0.5)
    raise SystemExit("the server did not start")


def api_scenario(pool: ClientPool, model: str, n: int, tokens: int, capture: bool, expected: dict) -> dict:
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(n)]
    t0, outcomes = pool.run(model, prompts, tokens, capture)
    served = [o for o in outcomes if o["finished"] is not None and o["error"] is None and not o["refused"]]
    makespan = max(o["finished"] for o in served) - t0 if served else float("nan")
    done = [o["finished"] - o["submitted"] for o in served]
    return {"served": len(served), "errors": [o["error"] for o in outcomes if o["error"]],
            "refused": sum(bool(o["refused"]) for o in outcomes),
            "wrong_answers": sum(o["text"] != expected[o["prompt"]].text for o in served),
            "generated_tokens": sum(o["tokens"] for o in served),
            "throughput_tok_s": sum(o["tokens"] for o in served) / makespan,
            "completion_p95_s": pct(done, 0.95),
            "ttft_p95_s": pct([o["first"] - o["submitted"] for o in served if o["first"]], 0.95)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--device")
    parser.add_argument("--dtype")
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--tokens", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--captures", nargs="+", default=["off", "full"], choices=sorted(CAPTURES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="torch threads, the same for this process and the server (default: every core; "
                             "`python -m engine serve` leaves one to its neighbours unless told)")
    parser.add_argument("--client-procs", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2 - 1)),
                        help="processes the API's client threads are spread over (bench/api_clients.py: one "
                             "process of openai clients tops out near 1,000 tok/s); default: 1 on 2 to 5 cores")
    parser.add_argument("--out", help="default: a new file under bench/results/api/")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = provenance.start("api", argv)
    torch.set_num_threads(args.threads)
    # the in-process scheduler's threads fixed as the server's are (--threads): its tuner (engine/serving/threads.py)
    # would otherwise spend the first steps of each short scenario on a trial (a fresh scheduler per scenario): at 16
    # tokens that cost the in-process room ~14% (52 against 61 tok/s, alternating, 2026-11-26), a difference between
    # the two sides that is not the API's
    os.environ.setdefault("PLAYGROUND_THREADS", str(args.threads))
    # the model's work off this thread, as in the app and the server (engine.core.small_batch.in_passing_thread)
    lm = in_passing_thread(lambda: load_model(args.model, device=args.device, dtype=args.dtype))
    base = Limits.for_device(lm.device).with_env()
    limits = replace(base, max_queue=max(base.max_queue, args.sessions))
    proc, url = start_server(args, limits, args.threads)
    model = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0).models.list().data[0].id
    pool = ClientPool(args.client_procs, url + "/v1")
    rows = []
    try:
        for tokens in args.tokens:
            expected = in_passing_thread(lambda: references(lm, tokens))
            for capture in args.captures:
                rows.append(compare(args, lm, limits, pool, model, tokens, capture, expected))
    finally:
        pool.close()
        proc.terminate()
        proc.wait(timeout=30)
    report = {"what": f"{args.sessions} sessions at once: in-process (scheduler, this process) against the HTTP API "
                      "(python -m engine serve, streaming openai clients), alternating, medians of the rounds",
              "machine": machine(lm), "threads": args.threads, "client_processes": args.client_procs, "limits": limits.to_dict(), "rows": rows,
              "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    run.save(report, out=args.out)
    return 0 if all(r["ok"] for r in rows) else 1


def same_capture(lm, limits: Limits, tokens: int, capture: str) -> None:
    """The in-process sessions capture what the server captures for an API request that asks for captures."""
    if capture != "full":
        return
    for prompt in PROMPTS:
        n = len(lm.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                 tokenize=True, return_dict=True)["input_ids"])
        served, _ = capture_policy(lm.spec, n, tokens, True, limits.max_capture_bytes, limits.max_capture_layers,
                                   lm.dtype.itemsize)
        if served != CAPTURES["full"]:
            raise SystemExit(f"the server captures {served} for {prompt!r}, the in-process sessions "
                             f"{CAPTURES['full']}: the comparison would not be fair")


def compare(args: argparse.Namespace, lm, limits: Limits, pool: ClientPool, model: str, tokens: int,
            capture: str, expected: dict) -> dict:
    """Alternate in-process and API rounds; medians; the ratios."""
    same_capture(lm, limits, tokens, capture)
    local, remote = [], []
    for _ in range(args.rounds):
        local.append(scenario(lm, args.sessions, tokens, CAPTURES[capture], limits, expected))
        remote.append(api_scenario(pool, model, args.sessions, tokens, capture == "full", expected))
    med = lambda runs, key: statistics.median(r[key] for r in runs)  # noqa: E731
    row = {"tokens": tokens, "capture": capture, "sessions": args.sessions,
           "in_process": {k: med(local, k) for k in ("throughput_tok_s", "completion_p95_s", "ttft_p95_s")},
           "api": {k: med(remote, k) for k in ("throughput_tok_s", "completion_p95_s", "ttft_p95_s")},
           "rounds": {"in_process": local, "api": remote}}
    row["throughput_ratio"] = row["api"]["throughput_tok_s"] / row["in_process"]["throughput_tok_s"]
    row["p95_ratio"] = row["api"]["completion_p95_s"] / row["in_process"]["completion_p95_s"]
    clean = all(not r["errors"] and not r["wrong_answers"] and r["served"] == args.sessions for r in local + remote)
    row["ok"] = clean
    print(f"{tokens:3d} tokens, capture {capture:4s}: in-process {row['in_process']['throughput_tok_s']:.1f} tok/s "
          f"p95 {row['in_process']['completion_p95_s']:.2f} s | API {row['api']['throughput_tok_s']:.1f} tok/s "
          f"p95 {row['api']['completion_p95_s']:.2f} s | ratio {row['throughput_ratio']:.2f}x tok/s, "
          f"{row['p95_ratio']:.2f}x p95 {'ok' if clean else 'ERRORS'}", flush=True)
    return row


if __name__ == "__main__":
    sys.exit(main())
