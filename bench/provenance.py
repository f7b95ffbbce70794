"""Where a result came from: every benchmark in bench/ writes its file through this module.

    run = provenance.start("engine")          # first thing in main(): the machine, its memory bandwidth, now
    ...                                       # the benchmark
    run.save(report, out=args.out)            # bench/results/engine/20261127T170312Z-43a9b43.json

A file holds the report's own keys plus "provenance": the commit and whether the tree was dirty (which tracked
files differ), the UTC start and save times, the command line, the machine (CPU model, cores, memory, load,
Python and the key libraries' versions, host memory read and copy bandwidth measured when the run started, the
GPU when there is one), and "rounds" when the caller passes them separately. A run never overwrites another's
file: each run writes bench/results/<name>/<UTC start>-<commit>.json, created exclusively; a run may save again
(bench/gpu.py saves after every phase), always into its own file. There is no index file to merge: the folder is
the index, its names sort by time, and `python bench/provenance.py [name]` lists the runs. Results written before
this module got a record reconstructed from git history (`python bench/provenance.py --reconstruct FILE...`),
labelled "reconstructed": true; an earlier version the docs still quote is brought back as a file of its own with
`--restore COMMIT FILE` (bench/results/<name>-<the commit it was measured on>.json).

BENCH_COMMIT, when set, gives the commit (a device machine gets the working tree without .git, or a stale one) and
BENCH_DIRTY, e.g. `BENCH_COMMIT=$(git rev-parse HEAD) bash bench/gpu_session.sh`; otherwise git, or "unknown" without it.
"""
from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
LIBRARIES = ("torch", "transformers", "numpy", "safetensors", "accelerate", "fastapi", "uvicorn", "openai",
             "streamlit", "nnsight", "vllm", "ray")
BANDWIDTH_BYTES = 200_000_000          # one buffer, well past any CPU cache


def server_wait() -> None:
    """OpenMP's wait at a barrier as `python -m engine` sets it (engine.launch.OPENMP_WAIT: poll, then sleep), where
    not set by hand; call before torch loads (libgomp reads it then), so a bench's threads wait as the server's do."""
    from engine.launch import OPENMP_WAIT       # torch-free; the caller has put the project's root on sys.path
    os.environ.update({k: v for k, v in OPENMP_WAIT.items() if k not in os.environ})


def git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.rstrip() if done.returncode == 0 else None     # rstrip: status lines open with a space


def source() -> dict:
    """The commit this tree is at and what differs from it (tracked files; results files left out)."""
    given = os.environ.get("BENCH_COMMIT")       # said first: a device machine may hold a stale .git of its own
    commit = given or git("rev-parse", "HEAD")
    if given or commit is None:
        commit = commit or "unknown"
        return {"commit": commit, "dirty": os.environ.get("BENCH_DIRTY", "unknown"),
                "from": "BENCH_COMMIT" if commit != "unknown" else "no git here and no BENCH_COMMIT"}
    changed = [line[3:] for line in (git("status", "--porcelain", "--untracked-files=no") or "").splitlines()
               if not line[3:].startswith("bench/results/")]
    return {"commit": commit, "dirty": bool(changed), "changed": changed[:40], "from": "git"}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def versions() -> dict:
    found = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def bandwidth(rounds: int = 5) -> dict:
    """Host memory read (a sum over 200 MB) and copy (200 MB to 200 MB) in GB/s, the best of `rounds`: a short
    numpy test at the start of the run, so a slow result can be told from a slow or busy machine."""
    import numpy as np
    a = np.ones(BANDWIDTH_BYTES // 8)
    b = np.empty_like(a)
    read, copy = [], []
    for _ in range(rounds):
        t = time.perf_counter(); a.sum(); read.append(time.perf_counter() - t)
        t = time.perf_counter(); np.copyto(b, a); copy.append(time.perf_counter() - t)
    return {"read_GBps": round(a.nbytes / min(read) / 1e9, 2), "copy_GBps": round(2 * a.nbytes / min(copy) / 1e9, 2),
            "method": f"numpy, {a.nbytes / 1e6:.0f} MB buffer, best of {rounds}; copy counts read + write bytes"}


def gpus() -> list[dict]:
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                               "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    rows = [line.split(", ") for line in done.stdout.strip().splitlines() if line.count(", ") == 2]
    return [{"name": n, "memory": m, "driver": d} for n, m, d in rows]


def machine(measure_bandwidth: bool = True) -> dict:
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"host": platform.node(), "system": f"{platform.system()} {platform.release()} {platform.machine()}",
            "cpu": cpu_model(), "cores": os.cpu_count(), "cores_usable": affinity,
            "memory_GB": round(memory_bytes() / 1e9, 2) if memory_bytes() else None,
            "load_avg": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
            "versions": versions(), "gpus": gpus(),
            "memory_bandwidth": bandwidth() if measure_bandwidth else None}


def stamp(now: dt.datetime) -> str:
    return now.strftime("%Y%m%dT%H%M%SZ")


class Run:
    """One benchmark run: what it ran on, gathered when it starts, and its own file, never another run's."""

    def __init__(self, name: str, argv: list[str] | None = None, measure_bandwidth: bool = True):
        self.name = name
        command = [Path(sys.executable).name, sys.argv[0], *(sys.argv[1:] if argv is None else argv)]
        self.started = dt.datetime.now(dt.timezone.utc)
        self.record = {"name": name, "started_utc": self.started.isoformat(timespec="seconds"),
                       "command": command, "cwd": os.getcwd(),
                       **source(), "machine": machine(measure_bandwidth)}
        self.path: Path | None = None

    def default_path(self) -> Path:
        short = self.record["commit"][:7] if self.record["commit"] != "unknown" else "nocommit"
        return RESULTS / self.name / f"{stamp(self.started)}-{short}.json"

    def claim(self, out: str | Path | None) -> Path:
        """The first save decides the file: the one asked for, or a new one under bench/results/<name>/ (created
        exclusively, a suffix when another run of the same second holds the name)."""
        if out is not None:
            path = Path(out).resolve()
            if path.exists() and path.is_relative_to(RESULTS):
                raise FileExistsError(f"{out} is another run's result: leave out --out for a file of this run's own")
            path.parent.mkdir(parents=True, exist_ok=True)
            return path
        base = self.default_path()
        base.parent.mkdir(parents=True, exist_ok=True)
        for n in range(100):
            path = base if n == 0 else base.with_name(f"{base.stem}-{n}.json")
            try:
                with open(path, "x"):
                    return path
            except FileExistsError:
                continue
        raise RuntimeError(f"no free name beside {base}")

    def save(self, report: dict, out: str | Path | None = None, rounds: list | dict | None = None) -> Path:
        """Write the report with its provenance (and the rounds, when given apart); returns the file."""
        if self.path is None:
            self.path = self.claim(out)
        record = {**self.record, "saved_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
        body = {"provenance": record, **{k: v for k, v in report.items() if k != "provenance"}}
        if rounds is not None:
            body["rounds"] = rounds
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(body, indent=2, default=str) + "\n")
        tmp.replace(self.path)
        print(f"wrote {self.path}", file=sys.stderr)
        return self.path


def start(name: str, argv: list[str] | None = None, measure_bandwidth: bool = True) -> Run:
    """Call first in a benchmark's main(), before loading anything: the bandwidth is measured on a quiet process.
    `argv`: the arguments main() was given, when not sys.argv's (a test calling main directly)."""
    return Run(name, argv, measure_bandwidth)


def runs(name: str) -> list[Path]:
    """Every run of a benchmark, oldest first."""
    return sorted((RESULTS / name).glob("*.json"))


def latest(name: str) -> Path | None:
    found = runs(name)
    return found[-1] if found else None


def reconstruct(path: Path) -> dict:
    """A provenance record for a result written before this module, from git history, labelled as reconstructed:
    the tree it was measured on is taken to be the parent of the commit that last changed the file."""
    rel = str(path.resolve().relative_to(ROOT))
    last = git("log", "--follow", "-1", "--format=%H%x09%aI%x09%s", "--", rel)
    if not last:
        raise SystemExit(f"{rel}: not in git history")
    commit, date, subject = last.split("\t", 2)
    parent = git("rev-parse", f"{commit}^") or "unknown"
    return {"reconstructed": True, "commit": parent, "dirty": "unknown", "file_commit": commit,
            "file_commit_date": date, "from": f"git history: the parent of {commit[:7]} ({subject[:100]}), the "
            "commit that last changed this file; the machine, command and start time were not recorded"}


def restore(commit: str, rel: str) -> Path:
    """An earlier version of a result that the docs still quote, brought back beside it as a file of its own:
    bench/results/<stem>-<measured commit>.json, from the version `commit` wrote, with a reconstructed record."""
    full = git("rev-parse", commit)
    text = git("show", f"{full}:{rel}")
    if full is None or text is None:
        raise SystemExit(f"{rel} is not in {commit}")
    subject, date = git("log", "-1", "--format=%s", full) or "", git("log", "-1", "--format=%aI", full)
    parent = git("rev-parse", f"{full}^") or "unknown"
    record = {"reconstructed": True, "commit": parent, "dirty": "unknown", "file_commit": full,
              "file_commit_date": date, "from": f"git history: {rel} as {full[:7]} ({subject[:100]}) wrote it; "
              "measured on its parent; the machine, command and start time were not recorded"}
    out = ROOT / Path(rel).with_name(f"{Path(rel).stem}-{parent[:7]}.json")
    out.write_text(json.dumps({"provenance": record, **json.loads(text)}, indent=2, default=str) + "\n")
    return out


def add_reconstructed(paths: list[str]) -> None:
    """Give each old result (one without "provenance") its reconstructed record, its other keys unchanged."""
    for name in paths:
        path = Path(name)
        body = json.loads(path.read_text())
        if not isinstance(body, dict) or "provenance" in body:
            print(f"{name}: kept as it is")
            continue
        record = reconstruct(path)
        if "commits" in body:
            record["note"] = "the file's own \"commits\" key was written by hand when it was measured"
        text = path.read_text()
        lines = text.splitlines()
        indent = (len(lines[1]) - len(lines[1].lstrip())) or None if len(lines) > 1 else None
        end = "\n" if text.endswith("\n") else ""           # the file's own layout: a diff of one key
        path.write_text(json.dumps({"provenance": record, **body}, indent=indent, default=str) + end)
        print(f"{name}: reconstructed")


def main(argv: list[str] | None = None) -> int:
    if argv and argv[0] == "--reconstruct":
        add_reconstructed(argv[1:])
        return 0
    if argv and argv[0] == "--restore":                     # --restore COMMIT bench/results/NAME.json
        print(restore(argv[1], argv[2]).relative_to(ROOT))
        return 0
    names = argv if argv else sorted(p.name for p in RESULTS.iterdir() if p.is_dir() and any(p.glob("*.json")))
    for name in names:
        for path in runs(name):
            p = json.loads(path.read_text()).get("provenance", {})
            dirty = " dirty" if p.get("dirty") is True else ""
            print(f"{path.relative_to(ROOT)}  {p.get('commit', '?')[:7]}{dirty}  {' '.join(p.get('command', []))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
