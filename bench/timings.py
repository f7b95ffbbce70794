"""What keeping every request's timeline costs the room: the same load through the API on servers keeping timelines
(the default) and servers not (PLAYGROUND_TIMELINES=0), alternating round by round in one run; and the memory one
timeline takes per request.

    python bench/timings.py                               # SmolLM2, 20 sessions, 16 and 64 new tokens, 3 rounds
    python bench/timings.py --sessions 20 --tokens 16 64 --rounds 5
    python bench/timings.py --setting invariant --sessions 20 1   # the batch-invariant kernels on against off
                                                                  # (issue 51): the room, then one person alone
    python bench/timings.py --setting spin --threads auto --sessions 1 20 --burn 1   # libgomp's bounded spin against
                                                                  # sleeping at once, each server's tuner choosing
                                                                  # its threads, a busy neighbour beside (issue 54)

Both sides run the same model with the same limits and threads; only one server is busy at a time (they alternate).
Each side has `--per-side` servers (default 2), started in the order kept, not kept, not kept, kept: with one server
a side, the keeping one started first, two servers of the same setting can differ by as much as the effect looked
for (a process's place in the starting order, or luck, is not the setting). Each round runs every server once (the
order reversed on odd rounds): N streaming chat completions at once (bench/api_clients.py), and the server process's
CPU seconds over it (Linux /proc). Each side's figures are the medians over its servers' rounds; each row also gives
every server's own median and, per side, its first server's tok/s over its second's (the same setting twice: the
spread the comparison must beat). Before the counted rounds each server serves `--warm-rounds` (default 1) not
counted: a server's first round of the full load is its slowest (its first touch of the batch's memory: tens of
thousands of page faults where a later round has a few hundred). Memory: the same N sessions in-process on a
scheduler that keeps timelines, each finished request's record measured with its steps counted as if it were their
only owner (an upper bound: the steps are shared by the batch), and its stored story (the plain values a run keeps
on its info and in its run file); and the bookkeeping's own time (recording each step, taking each request apart,
its story's way out) against the steps' time, in-process in the same run, a ratio the machine's load scales on both
sides (`--share-only`: that and the memory, no servers). Writes a new bench/results/timings/<UTC time>-<commit>.json
(bench/provenance.py); with `--setting invariant`, bench/results/invariance/.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import zlib
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import openai  # noqa: E402
import torch  # noqa: E402

from api import api_scenario, free_port, wait_healthy  # noqa: E402
from api_clients import ClientPool  # noqa: E402
from load import PROMPTS, machine, references  # noqa: E402
from bench import provenance  # noqa: E402
from bench.lone_step import burn  # noqa: E402
from engine.core.generate import GenerationRequest  # noqa: E402
from engine.core.hooks import CAPTURE_OFF  # noqa: E402
from engine.core.loader import load_model  # noqa: E402
from engine.core.openmp import in_passing_thread  # noqa: E402
from engine.serving.limits import Limits  # noqa: E402
from engine.serving.scheduler import Scheduler  # noqa: E402
from engine.server import protocol as p  # noqa: E402

SIDES = {"kept": "1", "not_kept": "0"}
# --setting: which setting the two sides differ by, its variable and each side's value (the first side's over the
# second's is each row's ratio): the timelines (this bench's own question) or the batch-invariant kernels (issue 51)
# (issue 51), or libgomp's bounded spin before a waiting thread sleeps (issue 54: None leaves the variable unset, so
# `python -m engine`'s OMP_WAIT_POLICY=PASSIVE makes it sleep at once)
SETTINGS = {"timelines": ("PLAYGROUND_TIMELINES", SIDES),
            "invariant": ("PLAYGROUND_INVARIANT", {"on": "on", "off": "off"}),
            "spin": ("GOMP_SPINCOUNT", {"spin": "10000", "sleep": None})}
RESULTS = {"timelines": "timings", "invariant": "invariance", "spin": "spin_served"}   # bench/results/<this>/
REQUEST_SECONDS = 3600.0


def start_servers(args: argparse.Namespace, limits: Limits) -> dict[str, tuple[str, subprocess.Popen, str]]:
    """`--per-side` servers a side, started in ABBA order (kept, not kept, not kept, kept, ...): whatever a server's
    place in the starting order does to it falls on both sides alike. Name -> (side, process, url)."""
    values = SETTINGS[args.setting][1]
    sides = list(values)
    order = [sides[(i + i // 2) % 2] for i in range(2 * args.per_side)]     # a b b a a b b a ...
    servers: dict[str, tuple[str, subprocess.Popen, str]] = {}
    for side in order:
        name = f"{side}#{sum(1 for s, _, _ in servers.values() if s == side) + 1}"
        try:
            servers[name] = (side, *start(args, limits, values[side]))
        except BaseException:
            stop_servers(servers)
            raise
    return servers


def stop_servers(servers: dict[str, tuple[str, subprocess.Popen, str]]) -> None:
    for _, proc, _ in servers.values():
        proc.terminate()
        proc.wait(timeout=30)


def cpu_seconds(pid: int) -> float | None:
    """A process's CPU seconds so far, all its threads (Linux /proc; None elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(args: argparse.Namespace, limits: Limits, value: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "engine", "serve", "--model", args.model, "--port", str(port), "--log-level",
           "warning", "--max-batch", str(limits.max_batch), "--max-queue", str(max(limits.max_queue, *args.sessions))]
    cmd += ["--threads", args.threads] if args.threads != "auto" else []
    cmd += [x for flag, v in (("--device", args.device), ("--dtype", args.dtype)) if v for x in (flag, v)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            env=server_env(args, value))
    url = f"http://127.0.0.1:{port}"
    wait_healthy(proc, url)
    return proc, url


def server_env(args: argparse.Namespace, value: str | None) -> dict[str, str]:
    """A server's environment: this one, its side's value of the setting (None: the variable unset), the threads
    fixed unless `--threads auto` (the server's tuner then measures, as a user's does)."""
    variable = SETTINGS[args.setting][0]
    env = {k: v for k, v in os.environ.items() if k not in (variable, "OMP_NUM_THREADS", "PLAYGROUND_THREADS")}
    env["PLAYGROUND_REQUEST_SECONDS"] = str(REQUEST_SECONDS)
    if args.threads != "auto":
        env["OMP_NUM_THREADS"] = env["PLAYGROUND_THREADS"] = args.threads
    if value is not None:
        env[variable] = value
    return env


def deep_size(value, seen: set[int] | None = None) -> int:
    """Bytes of a value and everything it holds (each object once)."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return 0
    seen.add(id(value))
    size = sys.getsizeof(value)
    if isinstance(value, dict):
        return size + sum(deep_size(k, seen) + deep_size(v, seen) for k, v in value.items())
    if isinstance(value, (list, tuple, set)):
        return size + sum(deep_size(v, seen) for v in value)
    slots = getattr(type(value), "__slots__", ())
    fields = [getattr(value, s) for s in slots] + list(getattr(value, "__dict__", {}).values())
    return size + sum(deep_size(v, seen) for v in fields)


def memory(lm, limits: Limits, sessions: int, tokens: int) -> dict:
    """Per request: its timeline record (steps counted as its own), and its stored story."""
    scheduler = Scheduler(lm, limits)
    try:
        handles = [scheduler.submit(GenerationRequest(PROMPTS[i % len(PROMPTS)], max_new_tokens=tokens), CAPTURE_OFF)
                   for i in range(sessions)]
        for h in handles:
            h.result(timeout=600)
        reasons = [h.timeline.finish_reason for h in handles]
        record = [deep_size(h.timeline) for h in handles]
        story = [len(json.dumps(h.story)) for h in handles]
        steps = [len(h.timeline.steps) for h in handles]
    finally:
        scheduler.close()
    return {"tokens": tokens, "finish_reasons": {r: reasons.count(r) for r in set(reasons)},
            "steps_per_request_max": max(steps),
            "record_bytes_max": max(record), "record_bytes_per_step": max(r / s for r, s in zip(record, steps)),
            "story_json_bytes_max": max(story), "story_json_bytes_per_step": max(b / s for b, s in zip(story, steps))}


def share(lm, limits: Limits, sessions: int, tokens: int) -> dict:
    """The bookkeeping's own time against the steps' time, in-process, in the same run (a ratio the machine's load
    scales on both sides): the worker's time in recording each step into the timelines and in taking each finished
    request apart, and each ended request's story on its way out (`way_out`)."""
    spent = {"per_step": 0.0, "per_request": 0.0}

    def timed(name, fn):
        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent[name] += time.perf_counter() - t0
        return wrapper

    scheduler = Scheduler(lm, limits)
    scheduler._lived = timed("per_step", scheduler._lived)
    scheduler._end_story = timed("per_request", scheduler._end_story)
    try:
        handles = [scheduler.submit(GenerationRequest(PROMPTS[i % len(PROMPTS)], max_new_tokens=tokens), CAPTURE_OFF)
                   for i in range(sessions)]
        for h in handles:
            h.result(timeout=600)
        spent.update(way_out(handles))
        steps = [s.seconds for s in scheduler.room().steps]
        reasons = [h.timeline.finish_reason for h in handles]
    finally:
        scheduler.close()
    total = sum(spent.values())
    return {"tokens": tokens, "finish_reasons": {r: reasons.count(r) for r in set(reasons)}, "steps": len(steps),
            "step_seconds_total": sum(steps), "bookkeeping_seconds": spent,
            "bookkeeping_share_of_step_time": total / sum(steps)}


def way_out(handles: list) -> dict[str, float]:
    """What each ended request's story costs on its way out, in seconds over all of them: built for the run's info
    (the service's listener, once per request), asked for again by the API's last chunk (`Handle.story` builds it
    once and keeps it; until 2026-11-28 it was built again here) and its timings validated into that chunk, and
    encoded into the run file (JSON, deflated as the file's zip does)."""
    spent = {}
    for name, each in (("story", lambda h: h.story), ("story_again", lambda h: h.story),
                       ("last_chunk", lambda h: p.Timings.model_validate(h.story["timings"])),
                       ("run_file", lambda h: zlib.compress(json.dumps(h.story, separators=(",", ":")).encode(), 6))):
        t0 = time.perf_counter()
        for h in handles:
            each(h)
        spent[name] = time.perf_counter() - t0
    return spent


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--device")
    parser.add_argument("--dtype")
    parser.add_argument("--sessions", type=int, nargs="+", default=[20],
                        help="sessions at once; several: a row for each (1: one person alone)")
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="timelines",
                        help="what the two sides differ by: keeping timelines (default), the batch-invariant "
                             "kernels (PLAYGROUND_INVARIANT on against off; no in-process part), or libgomp's "
                             "bounded spin (GOMP_SPINCOUNT=10000 against unset; no in-process part)")
    parser.add_argument("--tokens", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each runs every server once")
    parser.add_argument("--warm-rounds", type=int, default=1,
                        help="rounds each server serves first, not counted (its first touch of a full batch's memory)")
    parser.add_argument("--per-side", type=int, default=2,
                        help="servers per side, started kept, not kept, not kept, kept (default 2)")
    parser.add_argument("--threads", default=str(len(os.sched_getaffinity(0))),
                        help="the servers' torch threads (default: every core), or auto: each server's tuner measures")
    parser.add_argument("--burn", type=int, default=0,
                        help="processes that keep a core busy for the whole run (a neighbour on the same cores)")
    parser.add_argument("--client-procs", type=int, default=1)
    parser.add_argument("--share-only", action="store_true",
                        help="only the in-process bookkeeping's share of the step time and the memory (no servers)")
    parser.add_argument("--out", help="default: a new file under bench/results/timings/")
    return parser.parse_args(argv)


def one_round(pool: ClientPool, proc: subprocess.Popen, model: str, sessions: int, tokens: int,
              expected: dict) -> dict:
    """One server's round: the clients' figures and the server's CPU seconds over it (per token generated)."""
    before = cpu_seconds(proc.pid)
    out = api_scenario(pool, model, sessions, tokens, False, expected)
    after = cpu_seconds(proc.pid)
    out["server_cpu_s"] = None if before is None or after is None else after - before
    generated = out["generated_tokens"]
    out["server_cpu_ms_per_token"] = (1e3 * out["server_cpu_s"] / generated
                                      if out["server_cpu_s"] is not None and generated else None)
    return out


def compare(args: argparse.Namespace, servers: dict, pools: dict, model: str, tokens: int, expected: dict,
            sessions: int) -> dict:
    runs: dict[str, list[dict]] = {name: [] for name in servers}
    first, second = SETTINGS[args.setting][1]
    for name in list(servers) * args.warm_rounds:       # not counted: a server's first full round touches its
        one_round(pools[name], servers[name][1], model, sessions, tokens, expected)   # batch's memory first
    for i in range(args.rounds):
        order = list(servers) if i % 2 == 0 else list(reversed(servers))      # alternate which goes first
        for name in order:
            runs[name].append(one_round(pools[name], servers[name][1], model, sessions, tokens, expected))
    keys = ("throughput_tok_s", "completion_p95_s", "ttft_p95_s", "server_cpu_ms_per_token")
    med = lambda rs: {k: median_of(r[k] for r in rs) for k in keys}  # noqa: E731
    by_side = {side: [r for name, rs in runs.items() if servers[name][0] == side for r in rs]
               for side in (first, second)}
    sides = {side: med(rs) for side, rs in by_side.items()}
    each = {name: med(rs) for name, rs in runs.items()}
    row = {"tokens": tokens, "sessions": sessions, **sides,
           "throughput_ratio": sides[first]["throughput_tok_s"] / sides[second]["throughput_tok_s"],
           "p95_ratio": sides[first]["completion_p95_s"] / sides[second]["completion_p95_s"],
           "cpu_per_token_ratio": ratio(sides[first]["server_cpu_ms_per_token"],
                                        sides[second]["server_cpu_ms_per_token"]),
           "servers": {name: {"side": servers[name][0], **each[name]} for name in servers},
           "same_side_throughput_ratio": same_side(servers, each, (first, second)),
           "rounds": runs,
           "ok": all(not r["errors"] and not r["wrong_answers"] and r["served"] == sessions
                     for rs in runs.values() for r in rs)}
    print(f"{sessions} sessions, {tokens:3d} tokens: {first} {sides[first]['throughput_tok_s']:.1f} tok/s, {second} "
          f"{sides[second]['throughput_tok_s']:.1f} tok/s: {row['throughput_ratio']:.3f}x tok/s, "
          f"{row['p95_ratio']:.3f}x p95, {row['cpu_per_token_ratio'] or float('nan'):.3f}x server CPU per token; "
          f"same setting, first server over second: {row['same_side_throughput_ratio']} "
          f"{'ok' if row['ok'] else 'ERRORS'}", flush=True)
    return row


def median_of(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def same_side(servers: dict, each: dict, sides=tuple(SIDES)) -> dict[str, float | None]:
    """Per side, its first-started server's median tok/s over its second's: the same setting twice (an A/A)."""
    out = {}
    for side in sides:
        names = [n for n in servers if servers[n][0] == side]
        if len(names) >= 2:
            out[side] = ratio(each[names[0]]["throughput_tok_s"], each[names[1]]["throughput_tok_s"])
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = provenance.start(RESULTS[args.setting], argv)
    if args.threads != "auto":
        torch.set_num_threads(int(args.threads))
        os.environ.setdefault("PLAYGROUND_THREADS", args.threads)
    lm = in_passing_thread(lambda: load_model(args.model, device=args.device, dtype=args.dtype))
    # no request stopped by the server's wall-time limit on a loaded machine: a cut-short timeline measures nothing
    limits = replace(Limits.for_device(lm.device).with_env(), request_seconds=REQUEST_SECONDS)
    if args.share_only:
        return write(run, args, lm, [], in_house(args, lm, limits))
    expected = {tokens: in_passing_thread(lambda: references(lm, tokens)) for tokens in args.tokens}
    servers = start_servers(args, limits)
    burners = burn(args.burn)
    pools: dict[str, ClientPool] = {}
    rows: list[dict] = []
    try:
        pools = {name: ClientPool(args.client_procs, url + "/v1") for name, (_, _, url) in servers.items()}
        url = next(iter(servers.values()))[2]
        model = openai.OpenAI(base_url=url + "/v1", api_key="unused").models.list().data[0].id
        for sessions in args.sessions:
            for tokens in args.tokens:
                rows.append(compare(args, servers, pools, model, tokens, expected[tokens], sessions))
    finally:
        for pool in pools.values():
            pool.close()
        for proc in burners:
            proc.kill()
        stop_servers(servers)
    return write(run, args, lm, rows, in_house(args, lm, limits) if args.setting == "timelines" else {})


def in_house(args: argparse.Namespace, lm, limits: Limits) -> dict:
    """In this process: the memory of a timeline and the bookkeeping's share of the step time, per token count."""
    out: dict[str, list] = {"memory": [], "share": []}
    for tokens in args.tokens:
        out["memory"].append(in_passing_thread(lambda: memory(lm, limits, args.sessions[0], tokens)))
        out["share"].append(in_passing_thread(lambda: share(lm, limits, args.sessions[0], tokens)))
        m, s = out["memory"][-1], out["share"][-1]
        print(f"{tokens:3d} tokens: a timeline takes at most {m['record_bytes_max']:,} bytes in the scheduler, its "
              f"story {m['story_json_bytes_max']:,} bytes as JSON; the bookkeeping took "
              f"{s['bookkeeping_share_of_step_time']:.2%} of the steps' time", flush=True)
    return out


def what(args: argparse.Namespace) -> str:
    sessions = " and ".join(map(str, args.sessions))
    first, second = SETTINGS[args.setting][1]
    rounds = (f"{args.per_side} a side started {first}, {second}, {second}, {first}, each once a round after "
              f"{args.warm_rounds} not counted, medians of each side's rounds")
    beside = f", {args.burn} busy process(es) beside them" if args.burn else ""
    if args.setting == "spin":
        return (f"{sessions} streaming API sessions at once on servers whose OpenMP threads spin 10,000 times before "
                f"they sleep (GOMP_SPINCOUNT=10000) against servers whose threads sleep at once (PASSIVE, "
                f"python -m engine's default), threads {args.threads}, {rounds}{beside}")
    if args.setting == "invariant":
        return (f"{sessions} streaming API sessions at once on servers with the batch-invariant kernels "
                f"(PLAYGROUND_INVARIANT=on) against servers without, {rounds}")
    return (f"{sessions} streaming API sessions at once on servers keeping every request's timeline against servers "
            f"keeping none (PLAYGROUND_TIMELINES=0), {rounds}; the memory of one request's timeline; in-process, the "
            "bookkeeping's own time against the steps'")


def write(run: provenance.Run, args: argparse.Namespace, lm, rows: list[dict], house: dict) -> int:
    report = {"what": what(args), "setting": args.setting,
              "model_machine": machine(lm), "threads": args.threads, "burn": args.burn,
              "note": "the machine is shared with other work: the rounds' spread is the noise",
              "rows": rows, **house}
    run.save(report, out=args.out)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
