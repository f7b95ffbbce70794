"""Where a lone streamed request's time goes in the server process, sampled by py-spy: the host's path per token.

    python bench/lone_spy.py                        # 3 streamed greedy answers of 256 tokens, sampled twice
    python bench/lone_spy.py --requests 2 --tokens 128

Starts `python -m engine serve` (its defaults, SmolLM2 float32) on a loopback port, then streams greedy answers
through the OpenAI client one at a time while py-spy (`py-spy record --threads --nonblocking`, raw stacks) samples the
process: once sampling every thread that is running, once only the thread holding the GIL (`--gil`). Each
thread's samples are sorted by what its stack is in: for the scheduler's thread the forward
(engine.core.lean.LeanStep.forward), picking and describing the token (`pick_tokens`), handing the record to the
HTTP side (`RecordStream.__call__`, engine/server/streams.py: the event loop's thread is woken and the GIL goes to
it), and the rest; the other threads (the event loop, the run writer) in all. Per token: samples over the rate
over the tokens streamed. A sample the scheduler spends at the hand-off without the GIL (all of them less the
GIL-holding ones) is a wait for the event loop's thread, which runs the stream's Python for the token meanwhile.
Writes a new bench/results/lone_spy/<UTC time>-<commit>.json (bench/provenance.py); docs/engine.md reads it.
"""
from __future__ import annotations

import argparse
import collections
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import openai  # noqa: E402

import provenance  # noqa: E402
from vs_vllm import Server, alone_prompts, free_port  # noqa: E402

PY_SPY = Path(sys.executable).parent / "py-spy"
PARTS = (("forward", "forward (engine/core/lean.py"), ("pick and describe", "pick_tokens ("),
         ("record hand-off", "RecordStream.__call__ ("))


def classify(stack: str) -> str:
    """The part of the scheduler's work a stack is in (py-spy's raw line without its count)."""
    for name, frame in PARTS:
        if frame in stack:
            return name
    return "the rest of the step" if "BatchRunner.step (" in stack else "outside the step"


def tally(path: Path) -> dict[str, collections.Counter]:
    """Samples per thread name and, for the scheduler's thread, per part."""
    out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        thread = stack.split(";", 1)[0].split(": ", 1)[-1]
        out["threads"][thread] += int(count)
        if thread == "playground-scheduler":
            out["scheduler"][classify(stack)] += int(count)
    return out


def stream(client: openai.OpenAI, model: str, prompt: str, tokens: int) -> int:
    """One streamed greedy answer; the pieces it came in."""
    pieces = 0
    for chunk in client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                                max_tokens=tokens, temperature=0, stream=True):
        pieces += bool(chunk.choices and chunk.choices[0].delta.content)
    return pieces


def sampled(server: Server, client, model: str, prompts: list[str], args, gil: bool) -> dict:
    """The answers streamed under one py-spy recording: per part, samples and ms per token."""
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "stacks.txt"
        cmd = [str(PY_SPY), "record", "-p", str(server.proc.pid), "-r", str(args.rate), "-f", "raw", "-o", str(raw),
               "--threads", "--nonblocking"] + (["--gil"] if gil else [])
        spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(2)
        t = time.perf_counter()
        pieces = sum(stream(client, model, p, args.tokens) for p in prompts)
        seconds = time.perf_counter() - t
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=60)
        counts = tally(raw)
    per_token = lambda n: 1e3 * n / args.rate / pieces  # noqa: E731
    return {"pieces": pieces, "seconds": seconds, "ms_per_piece": 1e3 * seconds / pieces,
            "threads_ms_per_token": {k: per_token(v) for k, v in counts["threads"].items()},
            "scheduler_ms_per_token": {k: per_token(v) for k, v in counts["scheduler"].items()},
            "samples": {k: dict(v) for k, v in counts.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples a second")
    parser.add_argument("--out", help="default: a new file under bench/results/lone_spy/")
    args = parser.parse_args(argv)
    record = provenance.start("lone_spy", argv)
    port, logs = free_port(), Path(tempfile.mkdtemp(prefix="lone-spy-"))
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    server = Server("ours", [sys.executable, "-m", "engine", "serve", "--port", str(port), "--host", "127.0.0.1",
                             "--dtype", "float32", "--log-level", "warning", "--no-api-key",
                             "--runs-dir", str(logs / "runs")], port, env, logs / "ours.log")
    try:
        server.wait()
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
        model = client.models.list().data[0].id
        prompts = alone_prompts(2 * args.requests + 1)
        stream(client, model, prompts[0], 16)                                     # warm: the first answer
        report = {"requests": args.requests, "tokens": args.tokens, "rate": args.rate,
                  "all": sampled(server, client, model, prompts[1:1 + args.requests], args, gil=False),
                  "gil": sampled(server, client, model, prompts[1 + args.requests:], args, gil=True)}
    finally:
        server.stop()
    for kind in ("all", "gil"):
        r = report[kind]
        print(f"{kind}: {r['ms_per_piece']:.1f} ms a piece; scheduler " + ", ".join(
            f"{k} {v:.3f}" for k, v in r["scheduler_ms_per_token"].items()) + " ms/token; threads " + ", ".join(
            f"{k} {v:.3f}" for k, v in r["threads_ms_per_token"].items()), flush=True)
    record.save(report, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
