"""A lone request's decode step in the server and in a plain process, side by side in one run (issue 54).

    python bench/lone_server.py                  # 4 rounds: in-process, through the server streamed, and plain
    python bench/lone_server.py --rounds 6 --tokens 128
    python bench/lone_server.py --server-tree /tmp/before    # that checkout's server (git worktree add)

Is a step slower behind the server (its threads: the event loop, the run writer; its OpenMP teams; the record and
the stream) than the same step in a process of its own? Starts `python -m engine serve` (its defaults, SmolLM2
float32, a run store of its own) on a loopback port and loads the same model here (in a passing thread, as the
server does, so that the step loop's thread is the only one with an OpenMP team; the steps run in this process's
own worker thread, as the scheduler's). Each round, in turn: one greedy request of `--tokens` through this process's
batch runner (engine.serving.batch, as the scheduler runs a lone request; max_batch 32), one through the server's
OpenAI API streamed, one not streamed; a fresh prompt each. Per request the median step after the first three: here
timed around `BatchRunner.step`, in the server read from the run's timeline (`steps[].seconds`, which the scheduler
times around the same call). The server sleeps while this process steps, and this one while the server does.
Medians over rounds, and each round's server / in-process ratio. Then the server is asked for one run file with its
views (a capturing request through /v1/playground/generate, then GET /v1/playground/runs/{id}/file, as a notebook
download or another web process does), and the rounds run again: torch work in the server's pooled threads left an
OpenMP team there, and libgomp throttled the step loop's team for the rest of the server's life (engine.core.openmp).
Writes a new bench/results/lone_server/<UTC
time>-<commit>.json (bench/provenance.py); the README's "One person alone, against llama.cpp" reads it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))              # the project's `engine` ahead of this folder's engine.py

from bench.provenance import server_wait  # noqa: E402 (torch-free)

server_wait()                        # before torch loads OpenMP: its threads wait as the server's do

import httpx  # noqa: E402
import openai  # noqa: E402

from bench import provenance  # noqa: E402
from bench.before_after import tree_commit  # noqa: E402
from bench.idle_costs import worker  # noqa: E402
from bench.vs_vllm import Server, alone_prompts, free_port  # noqa: E402

SKIP = 3                  # a request's first steps (its prefill's, the first decode steps) left out
WAYS = ("in-process", "server, streamed", "server, plain")


class LocalSteps:
    """This process's batch runner, stepped in one worker thread of its own (the scheduler's way)."""

    def __init__(self) -> None:
        from engine.core.loader import load_model
        from engine.core.openmp import in_passing_thread

        self.lm = in_passing_thread(lambda: load_model("default", device="cpu", dtype="float32"))
        self.runner = None
        self.call = worker()

    def _one(self, prompt: str, tokens: int) -> list[float]:
        from engine.core.generate import GenerationRequest, admit
        from engine.core.hooks import CAPTURE_OFF
        from engine.serving.batch import BatchRunner, Slot

        self.runner = self.runner or BatchRunner(self.lm, max_batch=32)
        request = GenerationRequest(prompt, max_new_tokens=tokens, temperature=0.0)
        errors: list[Exception] = []
        self.runner.add(Slot(request, admit(self.lm, request), CAPTURE_OFF, lambda record: None, errors.append))
        seconds = []
        while not self.runner.idle:
            t = time.perf_counter()
            self.runner.step()
            seconds.append(time.perf_counter() - t)
        if errors:
            raise errors[0]
        return seconds

    def steps(self, prompt: str, tokens: int) -> list[float]:
        return self.call(self._one, prompt, tokens)


def server_steps(server: Server, client: openai.OpenAI, model: str, prompt: str, tokens: int,
                 stream: bool) -> list[float]:
    """One greedy answer through the API; its steps' seconds from the run's timeline."""
    reply = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=tokens, temperature=0, stream=stream)
    if stream:
        for _ in reply.parse():
            pass
    run_id = reply.headers["x-playground-run"]
    for _ in range(50):                         # the timeline is complete once the run is done
        info = httpx.get(f"{server.url}/v1/playground/runs/{run_id}", timeout=10).json()["info"]
        if info["state"] == "done":
            return [s["seconds"] for s in info["timeline"]["steps"]]
        time.sleep(0.1)
    raise RuntimeError(f"run {run_id} did not finish")


def run_file_with_views(server: Server) -> int:
    """One capturing request (the pages' capture), then its run file with its views, as a download asks for it."""
    body = {"request": {"prompt": "Why is the sky blue?", "max_new_tokens": 24, "temperature": 0.0}, "policy": {}}
    reply = httpx.post(server.url + "/v1/playground/generate", json=body, timeout=300)
    run_id = reply.headers["x-playground-run"]
    return len(httpx.get(f"{server.url}/v1/playground/runs/{run_id}/file", timeout=300).content)


def rounds_of(args: argparse.Namespace, local: LocalSteps, server: Server, client: openai.OpenAI, model: str,
              prompts, label: str) -> list[dict[str, float]]:
    """`args.rounds` rounds, each way once a round (the order flips), a fresh prompt each: median steps (ms)."""
    rounds = []
    for r in range(args.rounds):
        got = {}
        for way in (WAYS if r % 2 == 0 else WAYS[::-1]):
            prompt = next(prompts)
            seconds = (local.steps(prompt, args.tokens) if way == "in-process" else
                       server_steps(server, client, model, prompt, args.tokens, way.endswith("streamed")))
            got[way] = median_step(seconds)
        rounds.append(got)
        print(f"{label}round {r + 1}: " + ", ".join(f"{w} {got[w]:.2f} ms" for w in WAYS), flush=True)
    return rounds


def summary(rounds: list[dict[str, float]], name: str) -> dict:
    table = {w: statistics.median(r[w] for r in rounds) for w in WAYS}
    ratios = {w: statistics.median(r[w] / r["in-process"] for r in rounds) for w in WAYS[1:]}
    print(f"{name}: median step " + ", ".join(f"{w} {v:.2f} ms" for w, v in table.items()) +
          "; server / in-process (median of the rounds' ratios) " + ", ".join(f"{w} {v:.3f}" for w, v in ratios.items()))
    return {"median_step_ms": table, "over_in_process": ratios, "per_round_ms": rounds}


def median_step(seconds: list[float]) -> float:
    return 1e3 * statistics.median(seconds[SKIP:]) if len(seconds) > SKIP else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--server-tree", type=Path, default=ROOT, help="the checkout whose server runs (default: this)")
    parser.add_argument("--out", help="default: a new file under bench/results/lone_server/")
    args = parser.parse_args(argv)
    record = provenance.start("lone_server", argv)
    port, logs = free_port(), Path(tempfile.mkdtemp(prefix="lone-server-"))
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    tree = args.server_tree.resolve()
    env["PYTHONPATH"] = str(tree)
    server = Server("ours", [sys.executable, "-m", "engine", "serve", "--port", str(port), "--host", "127.0.0.1",
                             "--dtype", "float32", "--log-level", "warning", "--no-api-key",
                             "--runs-dir", str(logs / "runs")], port, env, logs / "ours.log", cwd=tree)
    try:
        local = LocalSteps()
        server.wait()
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
        model = client.models.list().data[0].id
        prompts = iter(alone_prompts(6 * args.rounds + 2))
        local.steps(next(prompts), 16)                                          # warm: each side's first answer
        server_steps(server, client, model, next(prompts), 16, True)
        phases = {"first": rounds_of(args, local, server, client, model, prompts, "")}
        file_bytes = run_file_with_views(server)
        phases["after a run file"] = rounds_of(args, local, server, client, model, prompts, "after a run file, ")
    finally:
        server.stop()
    report = {"tokens": args.tokens, "rounds": args.rounds, "skip": SKIP, "server_tree": str(tree),
              "server_commit": tree_commit(tree), "run_file_bytes": file_bytes,
              "phases": {name: summary(rounds, name) for name, rounds in phases.items()},
              "env": {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}}
    record.save(report, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
