"""The model server's memory under the API for a while: does it hold what the run store says it holds?

    python bench/api_memory.py --seconds 180 --clients 20            # every variant, one after the other

Starts `python -m engine serve` (the embedded model) once per variant on this machine: runs kept in memory only (the
run store off, PLAYGROUND_RUNS_MB=0: how the server kept them before the run store existed), runs on disk (the
default), runs on disk with glibc's malloc held to two arenas (MALLOC_ARENA_MAX=2), and with a fixed mmap threshold
(MALLOC_MMAP_THRESHOLD_=131072: every array over 128 KiB its own mapping, given back to the system when freed).
Each time `--clients` `openai` clients ask for `--seconds`: streamed and plain completions, half with the pages'
capture (extra_body playground capture), one stream in ten dropped after two chunks, and now and then a read of a
recent run by id. Reported per
variant: the server's resident memory every 10 s, what the run store counts as held in memory ("Runs held in
memory" of /v1/playground/memory), answers served, and reads by id that were 404 (a new
bench/results/api_memory/<UTC time>-<commit>.json, bench/provenance.py).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import provenance  # noqa: E402
VARIANTS = {"in memory only": {"PLAYGROUND_RUNS_MB": "0"}, "on disk": {},
            "on disk, MALLOC_ARENA_MAX=2": {"MALLOC_ARENA_MAX": "2"},
            "on disk, MALLOC_MMAP_THRESHOLD_=131072": {"MALLOC_MMAP_THRESHOLD_": "131072"}}
PROMPTS = ("Why is the sky blue?", "Name three prime numbers.", "What does a GPU do?", "Write a haiku about tea.")


async def client(url: str, model: str, rng: random.Random, until: float, seen: list[str], tally: dict) -> None:
    api = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        while time.monotonic() < until:
            extra = {"playground": {"capture": True}} if rng.random() < 0.5 else None
            try:
                if rng.random() < 0.5:
                    stream = await api.completions.create(model=model, prompt=rng.choice(PROMPTS), max_tokens=32,
                                                          stream=True, extra_body=extra)
                    n = 0
                    async for chunk in stream:
                        seen.append("run-" + chunk.id.split("-", 1)[-1])
                        n += 1
                        if n == 2 and rng.random() < 0.1:
                            await stream.close()          # a dropped stream
                            break
                else:
                    reply = await api.completions.create(model=model, prompt=rng.choice(PROMPTS), max_tokens=32,
                                                         extra_body=extra)
                    seen.append("run-" + reply.id.split("-", 1)[-1])
                tally["served"] += 1
            except openai.APIError as err:
                tally[type(err).__name__] = tally.get(type(err).__name__, 0) + 1
            if seen and rng.random() < 0.15:
                old = seen[max(0, len(seen) - rng.randint(1, 400))]
                status = (await http.get(f"/v1/playground/runs/{old}")).status_code
                tally["reads"] += 1
                tally["reads_404"] += status == 404
    await api.close()


def held(url: str) -> int | None:
    try:
        rows = httpx.get(url + "/v1/playground/memory", headers={"Accept": "application/json"}, timeout=10).json()
        return next((r["bytes"] for r in rows if r["name"] == "Runs held in memory"), None)
    except Exception:  # noqa: BLE001 - a sample missed is a sample missed
        return None


async def soak(url: str, pid: int, args: argparse.Namespace) -> dict:
    model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
    until, seen, tally = time.monotonic() + args.seconds, [], {"served": 0, "reads": 0, "reads_404": 0}
    tasks = [asyncio.ensure_future(client(url, model, random.Random(i), until, seen, tally))
             for i in range(args.clients)]
    samples = []
    start = time.monotonic()
    while not all(t.done() for t in tasks):
        rss = psutil.Process(pid).memory_info().rss
        samples.append({"t": round(time.monotonic() - start), "rss_mb": round(rss / 2**20),
                        "runs_held_mb": round((await asyncio.to_thread(held, url) or 0) / 2**20)})
        await asyncio.sleep(10)
    await asyncio.gather(*tasks, return_exceptions=True)
    return {**tally, "samples": samples}


def run_variant(name: str, extra: dict, args: argparse.Namespace) -> dict:
    port = args.port
    env = {**os.environ, **extra, "PLAYGROUND_RUNS_DIR": tempfile.mkdtemp(prefix="api-memory-")}
    log = open(Path(env["PLAYGROUND_RUNS_DIR"]) / "serve.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--port", str(port), "--threads", "1"], cwd=ROOT,
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while not ready(url):
            assert time.monotonic() < deadline and proc.poll() is None, "the server did not start"
            time.sleep(1)
        out = asyncio.run(soak(url, proc.pid, args))
    finally:
        proc.terminate()
        proc.wait(60)
    print(name, {k: v for k, v in out.items() if k != "samples"}, out["samples"][0], out["samples"][-1], flush=True)
    return out


def ready(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=180)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--port", type=int, default=8920)
    parser.add_argument("--out", type=Path, help="default: a new file under bench/results/api_memory/")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), help="which of them (default: all)")
    args = parser.parse_args()
    run = provenance.start("api_memory")
    result = {name: run_variant(name, VARIANTS[name], args) for name in args.variants}
    run.save({"seconds": args.seconds, "clients": args.clients, "units": {"rss_mb": "MiB (2**20 bytes)",
                                                                          "runs_held_mb": "MiB (2**20 bytes)"},
              "variants": result}, out=args.out)


if __name__ == "__main__":
    main()
