"""The suite's own time: `make test`'s two parts run and timed, written through bench/provenance.py.

    python bench/suite.py                       # both parts as `make test` runs them; exits with the suite's status
    python bench/suite.py --record              # and a new file in bench/results/suite/ (`.ci/run` does this)
    python bench/suite.py --workers 4 -- tests/test_store.py     # other workers; pytest arguments after --

The parts: every module but the serial ones on `--workers` pytest-xdist processes (a module stays on one, so its
servers start once), then the serial ones alone (faults with recovery deadlines, the Ray cluster). Both run; either
failing fails. The record holds each part's command, wall time, exit status, pytest's last line and the seconds each
module took (the next run's order: tests/longest_first.py), the total, and the machine (cores, load, memory
bandwidth at the start), so a suite time in the README names the run it comes from.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from xml.etree import ElementTree

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import provenance  # noqa: E402


def parts(workers: int, extra: list[str]) -> list[tuple[str, list[str]]]:
    """(name, pytest arguments) of each part, in the order `make test` runs them. The parallel part's modules go to
    the workers in the collection's order, which tests/conftest.py sorts longest first (tests/longest_first.py)."""
    pytest = [sys.executable, "-m", "pytest", "-q"]
    return [("parallel", [*pytest, "-n", str(workers), "--dist", "loadfile", "--no-loadscope-reorder",
                          "-m", "not serial", *extra]),
            ("serial", [*pytest, "-m", "serial", *extra])]


def module_seconds(junit: Path) -> dict[str, float]:
    """Seconds per test module (its tests' setup, call and teardown) from pytest's JUnit XML: {"tests/test_x.py": s}."""
    seconds: dict[str, float] = {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        names = (case.get("classname") or "").split(".")
        while len(names) > 1 and names[-1][:1].isupper():                  # a test class, not a module
            names.pop()
        module = "/".join(names) + ".py"
        seconds[module] = seconds.get(module, 0.0) + float(case.get("time") or 0.0)
    return {m: round(s, 2) for m, s in sorted(seconds.items(), key=lambda kv: -kv[1])}


def run_part(name: str, command: list[str]) -> dict:
    """One part, its output passed through as it comes; its wall time, status, pytest's summary line and the seconds
    each of its modules took."""
    with tempfile.TemporaryDirectory() as folder:
        junit = Path(folder) / "junit.xml"
        done = run_command(name, [*command, f"--junitxml={junit}"])
        done["modules"] = module_seconds(junit) if junit.exists() else {}
    return done


def run_command(name: str, command: list[str]) -> dict:
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
