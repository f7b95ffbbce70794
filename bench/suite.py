"""The suite's own time: `make test`'s two parts run and timed, written through bench/provenance.py.

    python bench/suite.py                       # both parts as `make test` runs them; exits with the suite's status
    python bench/suite.py --record              # and a new file in bench/results/suite/ (`.ci/run` does this)
    python bench/suite.py --workers 4 -- tests/test_store.py     # other workers; pytest arguments after --

The parts: every module but the serial ones on `--workers` pytest-xdist processes (a module stays on one, so its
servers start once), then the serial ones alone (faults with recovery deadlines, the Ray cluster). Both run; either
failing fails. The record holds each part's command, wall time, exit status and pytest's last line, the total, and
the machine (cores, load, memory bandwidth at the start), so a suite time in the README names the run it comes from.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import provenance  # noqa: E402


def parts(workers: int, extra: list[str]) -> list[tuple[str, list[str]]]:
    """(name, pytest arguments) of each part, in the order `make test` runs them."""
    pytest = [sys.executable, "-m", "pytest", "-q"]
    return [("parallel", [*pytest, "-n", str(workers), "--dist", "loadfile", "-m", "not serial", *extra]),
            ("serial", [*pytest, "-m", "serial", *extra])]


def run_part(name: str, command: list[str]) -> dict:
    """One part, its output passed through as it comes; its wall time, status and pytest's summary line."""
    start = time.perf_counter()
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    last = ""
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        last = line.strip() or last
    code = proc.wait()
    seconds = time.perf_counter() - start
    print(f"suite, {name} part: {seconds:.1f} s, exit status {code}", flush=True)
    return {"name": name, "command": command, "seconds": round(seconds, 1), "exit_status": code, "summary": last}


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist processes for the parallel part")
    parser.add_argument("--record", action="store_true", help="write bench/results/suite/<UTC time>-<commit>.json")
    parser.add_argument("--out", help="write the record here instead (with --record)")
    return parser.parse_args(own), extra


def main(argv: list[str] | None = None) -> int:
    args, extra = parse_args(sys.argv[1:] if argv is None else argv)
    run = provenance.start("suite", argv) if args.record else None
    done = [run_part(name, command) for name, command in parts(args.workers, extra)]
    total = sum(p["seconds"] for p in done)
    status = next((p["exit_status"] for p in done if p["exit_status"] != 0), 0)
    each = " + ".join(f"{p['seconds']:.1f} s" for p in done)
    print(f"suite: {total:.1f} s in all ({each}), exit status {status}", flush=True)
    if run is not None:
        run.save({"workers": args.workers, "pytest_args": extra, "total_seconds": round(total, 1),
                  "ok": status == 0, "parts": done}, out=args.out)
    return status


if __name__ == "__main__":
    sys.exit(main())
