"""What a lone decode step costs under each of libgomp's waits: sleeping at once (PASSIVE), a bounded spin
(GOMP_SPINCOUNT) or spinning (ACTIVE), at one and two torch threads, side by side in one run, taking turns.

    python bench/lone_spin.py                                  # the settings below, 3 rounds of 48 tokens
    python bench/lone_spin.py --rounds 5 --burn 1              # beside one process that keeps a core busy
    python bench/lone_spin.py --setting passive=OMP_WAIT_POLICY=PASSIVE --setting my=GOMP_SPINCOUNT=20000

A lone step makes ~120 products (engine.core.matvec.linear: the row kernel), each an OpenMP parallel region on
torch's team (libgomp). Between two regions the worker thread waits: PASSIVE sleeps on a futex at once, so every
product starts by waking it; a spin count keeps it polling that many times (`pause` each) before it sleeps. libgomp
reads the variables once, when it loads, so each setting runs in a child process of its own, started afresh for each
of its turns (an idle child of a spinning setting would hold a core while the others ran): the child loads SmolLM2
in float32, runs one warm-up request, then one lone greedy request at each thread count through the batch runner
(engine.serving.batch, as the scheduler runs a request alone), the thread counts' order flipped every round, and
reports each step's wall and CPU time (medians, the first three steps left out) and the text. The parent measures the
memory floor (the weights' bytes over a sum's read rate, one and two threads, fastest of 6) before and after the
rounds. `--burn N` keeps N processes spinning for the whole run (a neighbour on the same cores: the failure that
made two spinning threads ten times slower, docs/engine.md). Writes bench/results/lone_spin/<UTC>-<commit>.json
(bench/provenance.py); docs/engine.md, "Two threads, and why they were ten times slower", reads it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if "--child" not in sys.argv:              # the parent's own torch (the floor's sums) as served; a child keeps its setting
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WAITS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "KMP_BLOCKTIME")
ROWS_FROM = "ROWS_C"                           # in a setting: the commit whose rows.c its products take
SETTINGS = {                                   # name -> libgomp's variables in its child (all others unset)
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "spin-1e3": {"GOMP_SPINCOUNT": "1000"},
    "spin-1e4": {"GOMP_SPINCOUNT": "10000"},
    "spin-1e5": {"GOMP_SPINCOUNT": "100000"},
    "spin-3e5": {"GOMP_SPINCOUNT": "300000"},
    "passive-1e5": {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "100000"},
    "active": {"OMP_WAIT_POLICY": "ACTIVE"},
}


def child(threads: list[int], tokens: int, model: str, rows_from: str | None) -> dict:
    """In the child: one warm-up request, then one lone request at each thread count; per count the steps'
    medians (wall and CPU ms) and the text. `rows_from`: a commit whose rows.c the products take instead."""
    # Imported here, not at the top: the parent must not load the model, and each child reads libgomp's
    # variables as torch loads it.
    import torch
    from bench.lone_step import run
    from engine.core import kernels
    from engine.core.loader import load_model
    from engine.serving.batch import BatchRunner

    if rows_from:
        kernel = kernels.RowKernel(kernels.build(rows_c(rows_from)))
        kernels.row_kernel = lambda: kernel                 # matvec.linear asks the module at every product
    lm = load_model(model, device="cpu", dtype="float32")
    runner = BatchRunner(lm, max_batch=4, prefix=None)
    if kernels.row_kernel() is None:
        raise SystemExit(f"the row kernel is off here: {kernels.why_off()}")
    out = {}
    for t in threads:
        torch.set_num_threads(t)
        run(runner, lm, 8)                                                    # warm-up, not counted
    for t in threads:
        torch.set_num_threads(t)
        out[str(t)] = run(runner, lm, tokens)
    out["idle_spin_ms"] = idle_spin_ms(kernels.row_kernel(), max(threads))
    out["environ"] = {k: os.environ[k] for k in WAITS if k in os.environ}     # what this child's libgomp read
    return out


def rows_c(commit: str) -> Path:
    """engine/core/kernels/rows.c as it was at `commit`, in a folder of its own (the library is named by its
    source's hash: built once, beside today's)."""
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:engine/core/kernels/rows.c"], check=True,
                          capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp(prefix="rows-")) / "rows.c"
    path.write_text(text)
    return path


def idle_spin_ms(kernel, threads: int) -> float:
    """The CPU ms the process burns in the 200 ms after one parallel region of the row kernel while its thread
    sleeps: the team's workers polling before they sleep (median of 5)."""
    import torch                                          # here, as in child(): torch loads in the child only
    torch.set_num_threads(threads)
    w, x, burnt = torch.randn(4096, 576), torch.randn(1, 576), []
    for _ in range(5):
        kernel.linear(x, w)
        t = time.process_time()
        time.sleep(0.2)
        burnt.append(1e3 * (time.process_time() - t))
    return statistics.median(burnt)


def turn(name: str, env: dict[str, str], threads: list[int], tokens: int, model: str) -> dict:
    """One child process under `env`: its figures, or {"error": ...}."""
    environ = {k: v for k, v in os.environ.items() if k not in WAITS}
    environ.update({k: v for k, v in env.items() if k != ROWS_FROM}, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--model", model, "--tokens", str(tokens),
           "--threads", *map(str, threads)] + (["--rows-from", env[ROWS_FROM]] if ROWS_FROM in env else [])
    done = subprocess.run(cmd, env=environ, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        return {"error": f"{name}: exit {done.returncode}: {done.stderr.strip()[-400:]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def floor(nbytes: int) -> dict:
    """The weights' bytes over a sum's read rate over as many bytes, one and two threads, fastest of 6."""
    # Imported here: the parent's torch starts only once the children's environments are settled (nothing else).
    import torch
    from bench.lone_step import _fastest
    buf, read = torch.ones(nbytes // 4), {}
    for n in (1, 2):
        torch.set_num_threads(n)
        read[str(n)] = nbytes / _fastest(lambda: buf.sum(), 6) / 1e9
    best = max(read.values())
    return {"read_gb_s": read, "floor_ms": 1e3 * nbytes / best / 1e9}


def weight_bytes(model: str) -> int:
    """The model's weight bytes as its safetensors files hold them (float32; a tied embedding once)."""
    # Imported here: only the parent reads the files' headers, once (and vs_llamacpp brings the OpenAI client).
    sys.path.insert(0, str(ROOT / "bench"))              # vs_llamacpp imports its siblings by their names
    from vs_llamacpp import weight_bytes as held
    from vs_vllm import model_folder
    return held(model_folder(model))


def summarize(turns: dict[str, list[dict]], threads: list[int], floor_ms: float) -> dict:
    """Per setting and thread count: the medians over rounds of the steps' median wall and CPU ms, x the floor."""
    table = {}
    for name, results in turns.items():
        good = [r for r in results if "error" not in r]
        for t in map(str, threads):
            if not good:
                continue
            wall = statistics.median(r[t]["wall_ms"] for r in good)
            cpu = statistics.median(r[t]["cpu_ms"] for r in good)
            table[f"{name}-{t}"] = {"wall_ms": wall, "cpu_ms": cpu, "x_floor": wall / floor_ms,
                                    "rounds_wall_ms": [r[t]["wall_ms"] for r in good]}
            walls = ", ".join(f"{r[t]['wall_ms']:.1f}" for r in good)
            print(f"{name:12s} {t} thread{'s' * (t != '1')}: {wall:.1f} ms a step ({wall / floor_ms:.2f}x the floor), "
                  f"CPU {cpu:.1f} ms; rounds {walls}", flush=True)
    return table


def parse_settings(given: list[str] | None) -> dict[str, dict[str, str]]:
    """`name=VAR=value[,VAR=value]` each (an empty list after the name: everything unset), else SETTINGS."""
    if not given:
        return dict(SETTINGS)
    out = {}
    for item in given:
        name, _, rest = item.partition("=")
        pairs = [p.partition("=") for p in rest.split(",") if p]
        if not name or any(not k or k not in (*WAITS, ROWS_FROM) or not v for k, _, v in pairs):
            raise SystemExit(f"--setting {item!r}: want name=VAR=value[,VAR=value], VAR one of {', '.join(WAITS)} or {ROWS_FROM}")
        out[name] = {k: v for k, _, v in pairs}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--burn", type=int, default=0, help="processes that keep a core busy during the run")
    parser.add_argument("--setting", action="append", help="name=VAR=value[,VAR=value] (repeatable)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rows-from", help=argparse.SUPPRESS)
    parser.add_argument("--out", help="default: a new file under bench/results/lone_spin/")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.threads, args.tokens, args.model, args.rows_from)))
        return 0
    settings = parse_settings(args.setting)
    from bench import provenance                         # here: the child needs none of it
    from bench.lone_step import burn
    record = provenance.start("lone_spin", argv)
    nbytes = weight_bytes(args.model)
    burners = burn(args.burn)
    try:
        turns, floors = rounds(args, settings, nbytes)
    finally:
        for p in burners:
            p.kill()
    floor_ms = min(f["floor_ms"] for f in floors)
    table = summarize(turns, args.threads, floor_ms)
    for name, results in turns.items():
        spins = [r["idle_spin_ms"] for r in results if "error" not in r]
        table[f"{name}-idle"] = {"idle_spin_ms": statistics.median(spins) if spins else None}
        print(f"{name:12s} after a region, idle: {table[f'{name}-idle']['idle_spin_ms']} CPU ms in 200 ms")
    texts = {r[str(t)]["text"] for v in turns.values() for r in v if "error" not in r for t in args.threads}
    errors = [r["error"] for v in turns.values() for r in v if "error" in r]
    print(f"floor: {floor_ms:.1f} ms; same text every way: {len(texts) == 1}; errors: {len(errors)}")
    record.save({"settings": settings, "threads": args.threads, "rounds": args.rounds, "tokens": args.tokens,
                 "burn": args.burn, "weight_bytes": nbytes, "floors": floors, "floor_ms": floor_ms,
                 "same_text": len(texts) == 1, "errors": errors, "table": table,
                 "turns": {k: [{t: ({m: r[t][m] for m in ("wall_ms", "cpu_ms", "steps")} if isinstance(r[t], dict) else r[t])
                                   for t in r if t != "environ"} | {"environ": r.get("environ")} if "error" not in r
                               else r for r in v] for k, v in turns.items()}}, out=args.out)
    return 0 if len(texts) == 1 and not errors else 1


def rounds(args: argparse.Namespace, settings: dict, nbytes: int) -> tuple[dict, list[dict]]:
    """The settings taking turns, the leader rotating and the thread counts' order flipped every round; the floor
    before and after."""
    names, turns, floors = list(settings), {k: [] for k in settings}, [floor(nbytes)]
    for r in range(args.rounds):
        threads = args.threads if r % 2 == 0 else args.threads[::-1]
        for name in names[r % len(names):] + names[:r % len(names)]:
            turns[name].append(turn(name, settings[name], threads, args.tokens, args.model))
            print(f"round {r + 1} {name}: " + (turns[name][-1].get("error") or ", ".join(
                f"{t}: {turns[name][-1][str(t)]['wall_ms']:.1f} ms" for t in threads)), flush=True)
    floors.append(floor(nbytes))
    return turns, floors


if __name__ == "__main__":
    sys.exit(main())
