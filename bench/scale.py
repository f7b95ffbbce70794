"""One model server against Ray Serve replicas, side by side in one run; and 200 sessions on 8 H100s, projected.

    python bench/scale.py                               # SmolLM2: one server, 1 replica, 2 replicas; 20 sessions
    python bench/scale.py --tokens 16 64 --rounds 3

Measured on this machine: `python -m engine serve` (one process, torch on every core but one), then
`python -m engine serve --replicas 1` and `--replicas 2` (Ray Serve, one CPU and one torch thread per replica),
each with 20 streaming `openai` clients at once (bench/api.py's sessions), greedy, capture off. The setups alternate
round by round; medians. Every answer must equal the same prompt run alone.

Projected (engine/projection/serving_sim.py, labelled so): Llama 3.1 8B in BF16, 200 people pressing Generate at
once, on 1 to 8 H100 SXM replicas (data parallel, chunked prefill): p95 time to first token, per-user speed, and
the cost per hour; the fewest replicas that meet the targets.

Writes a new bench/results/scale/<UTC time>-<commit>.json (bench/provenance.py).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import openai  # noqa: E402

from api import api_scenario, free_port, wait_healthy  # noqa: E402
from load import machine, references  # noqa: E402
from engine.core.loader import load_model  # noqa: E402
from bench import provenance  # noqa: E402

SETUPS = {"one server": [], "1 replica": ["--replicas", "1", "--replica-cpus", "1", "--threads", "1"],
          "2 replicas": ["--replicas", "2", "--replica-cpus", "1", "--threads", "1"]}


def start(args: argparse.Namespace, extra: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "engine", "serve", "--model", args.model, "--port", str(port), "--log-level",
           "warning", "--max-queue", str(max(64, args.sessions)), *extra]
    log = open(os.environ.get("BENCH_SERVER_LOG", os.devnull), "a")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    url = f"http://127.0.0.1:{port}"
    wait_healthy(proc, url)
    return proc, url


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


def measure(args: argparse.Namespace, expected: dict[int, dict]) -> dict:
    """Each setup started once; the rounds alternate between them (all stay up, idle while another runs)."""
    servers = {name: start(args, extra) for name, extra in SETUPS.items()}
    try:
        clients = {name: openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
                   for name, (_, url) in servers.items()}
        model = clients["one server"].models.list().data[0].id
        runs: dict = {(n, t): [] for n in SETUPS for t in args.tokens}
        for _ in range(args.rounds):
            for tokens in args.tokens:
                for name, client in clients.items():
                    runs[(name, tokens)].append(api_scenario(client, model, args.sessions, tokens, False,
                                                             expected[tokens]))
        fault = kill_one(servers["2 replicas"][1], clients["2 replicas"], model)
    finally:
        for proc, _ in servers.values():
            stop(proc)
    return {**summarize(runs, args), "fault": fault}


def kill_one(url: str, client: openai.OpenAI, model: str) -> dict:
    """A replica killed while it streams an answer: seconds until that request fails, until the room shows the
    replica missing, and until its replacement reports."""
    import signal

    import httpx

    def views() -> list[dict]:
        return httpx.get(url + "/v1/playground/replicas", timeout=30).json()

    deadline = time.monotonic() + 180
    while len([v for v in views() if v["seconds_ago"] < 3]) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)                                     # both replicas report before one is killed
    stream = iter(client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
        max_tokens=256, temperature=0, stream=True))                     # greedy, it runs all 256 tokens
    run_id = next(stream).playground["run_id"]
    next(stream)
    time.sleep(1.5)                                         # the replica lists the run in its next snapshot
    victim = next(v["snapshot"] for v in views() if run_id in v["snapshot"]["runs"])
    before = {v["snapshot"]["replica"] for v in views()}
    t0 = time.monotonic()
    os.kill(victim["pid"], signal.SIGKILL)
    try:
        for _ in stream:
            pass
        failed = None
    except openai.APIError:
        failed = time.monotonic() - t0
    missing = back = None
    while time.monotonic() - t0 < 180 and back is None:
        now = views()
        if missing is None and any(v["snapshot"]["replica"] == victim["replica"] and v["seconds_ago"] > 3 for v in now):
            missing = time.monotonic() - t0
        fresh = {v["snapshot"]["replica"] for v in now if v["seconds_ago"] < 3} - before
        if fresh:
            back = time.monotonic() - t0
        time.sleep(0.25)
    print(f"fault: the request failed after {failed} s, the replica shown missing after {missing} s, its "
          f"replacement reported after {back} s", flush=True)
    return {"request_failed_s": failed, "shown_missing_s": missing, "replacement_s": back}


def summarize(runs: dict, args: argparse.Namespace) -> dict:
    rows = []
    for (name, tokens), rounds in runs.items():
        med = lambda key: statistics.median(r[key] for r in rounds)  # noqa: E731
        rows.append({"setup": name, "tokens": tokens, "throughput_tok_s": med("throughput_tok_s"),
                     "completion_p95_s": med("completion_p95_s"), "ttft_p95_s": med("ttft_p95_s"),
                     "ok": all(not r["errors"] and not r["wrong_answers"] and r["served"] == args.sessions
                               for r in rounds), "rounds": rounds})
        print(f"{name:>11}, {tokens:3d} tokens: {rows[-1]['throughput_tok_s']:.1f} tok/s, p95 completion "
              f"{rows[-1]['completion_p95_s']:.2f} s, p95 TTFT {rows[-1]['ttft_p95_s']:.2f} s "
              f"{'ok' if rows[-1]['ok'] else 'ERRORS'}", flush=True)
    return {"rows": rows}


def projected(sessions: int = 200, max_gpus: int = 8, ttft_target: float = 1.0, itl_target: float = 0.05) -> dict:
    """200 people press Generate at once (prompts 256-1024 tokens, answers 128-512), Llama 3.1 8B BF16, chunked
    prefill, on 1 to 8 H100 SXM replicas: the projection's p95 TTFT, per-user speed and cost per hour."""
    from engine.projection.serving_sim import ServerConfig, Targets, Workload, simulate
    from engine.projection.specs import GPU_PRESETS, MODEL_PRESETS

    spec, gpu = MODEL_PRESETS["llama-3.1-8b"], GPU_PRESETS["h100-sxm"]
    workload = Workload(n_requests=sessions, arrival_rate=float("inf"), prompt_min=256, prompt_max=1024,
                        output_min=128, output_max=512)
    targets = Targets(ttft=ttft_target, itl=itl_target)
    rows = []
    for gpus in range(1, max_gpus + 1):
        server = ServerConfig(policy="chunked", max_batch=256, gpus=gpus, token_budget=2048, memory_fraction=0.9)
        r = simulate(spec, gpu, workload, server, targets=targets)
        rows.append({"replicas": gpus, "ttft_p95_s": r.ttft_p95, "itl_p95_s": r.itl_p95,
                     "per_user_tok_s": r.per_user_tok_s, "throughput_tok_s": r.throughput_tok_s,
                     "latency_p95_s": r.latency_p95, "goodput_share": r.goodput.share,
                     "dollars_per_hour": gpus * server.dollars_per_hour})
    fewest = next((row["replicas"] for row in rows if row["ttft_p95_s"] <= ttft_target
                   and row["itl_p95_s"] <= itl_target), None)
    return {"what": "PROJECTED (engine/projection/serving_sim.py): " + projected.__doc__.split("\n")[0],
            "targets": {"ttft_p95_s": ttft_target, "itl_p95_s": itl_target}, "rows": rows,
            "fewest_replicas_meeting_targets": fewest}


def fault_only(args: argparse.Namespace, run: provenance.Run) -> int:
    """Two replicas started, one killed mid-answer: a run of its own, naming the full run whose fault section it
    times again (the newest under bench/results/scale/), which stays as it was."""
    proc, url = start(args, SETUPS["2 replicas"])
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
        fault = kill_one(url, client, client.models.list().data[0].id)
    finally:
        stop(proc)
    last = provenance.latest("scale")
    report = {"fault_only": True, "fault_section_of": str(last.relative_to(ROOT)) if last else None,
              "measured": {"fault": {**fault, "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}}}
    run.save(report)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--tokens", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--projection-only", action="store_true")
    parser.add_argument("--fault-only", action="store_true", help="time a replica's death again, into the last results")
    args = parser.parse_args(argv)
    run = provenance.start("scale", argv)
    if args.fault_only:
        return fault_only(args, run)
    report = {"projected": projected(), "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    for row in report["projected"]["rows"]:
        print(f"projected: {row['replicas']} x H100, 200 at once: p95 TTFT {row['ttft_p95_s']:.2f} s, p95 ITL "
              f"{row['itl_p95_s'] * 1e3:.0f} ms, {row['per_user_tok_s']:.0f} tok/s each, ${row['dollars_per_hour']:.0f}/h")
    if not args.projection_only:
        lm = load_model(args.model)
        expected = {t: references(lm, t) for t in args.tokens}
        report.update(machine=machine(lm), load_average=os.getloadavg(), measured=measure(args, expected))
        report["load_average_after"] = os.getloadavg()
    run.save(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
