"""The parallel part's modules in the order that ends it soonest: the longest first (bench/suite.py).

pytest-xdist's `--dist loadfile` hands each worker one module at a time, in the order the collection gives; its own
reordering (`--loadscope-reorder`, by number of tests) put the one-test browser modules (over a minute each) last, so
one worker ran them alone at the end. Sorted by the seconds each module took in the newest recorded suite
(bench/results/suite/, the `modules` of its parallel part), longest first, a module no record knows first of all
(it may be long), the rest in their own order. That is the longest-processing-time rule (on two workers its end is
at most 7/6 of the best possible; xdist's first two modules per worker make it nearly that). Within a module the
tests keep their order."""
from __future__ import annotations

import json
from pathlib import Path

RECORDS = Path(__file__).resolve().parent.parent / "bench" / "results" / "suite"


def recorded_seconds(records: Path = RECORDS) -> dict[str, float]:
    """Seconds per module (its path from the repository root) in the newest record that has them; {} if none."""
    for path in sorted(records.glob("*.json"), reverse=True):
        try:
            parts = json.loads(path.read_text()).get("parts", [])
        except (OSError, ValueError):
            continue
        seconds = next((p["modules"] for p in parts if p.get("name") == "parallel" and p.get("modules")), None)
        if seconds:
            return seconds
    return {}


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def longest_first(nodeids: list[str], seconds: dict[str, float]) -> list[int]:
    """The indices of `nodeids` reordered: whole modules, those unknown to `seconds` first, then by seconds taken,
    longest first; ties (and the unknown) in collection order."""
    first_seen: dict[str, int] = {}
    for nodeid in nodeids:
        first_seen.setdefault(module_of(nodeid), len(first_seen))
    rank = {m: (m in seconds, -seconds.get(m, 0.0), i) for m, i in first_seen.items()}
    return sorted(range(len(nodeids)), key=lambda i: (rank[module_of(nodeids[i])], i))
