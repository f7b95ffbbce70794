"""Two checkouts side by side in one run: bench/api.py on the commit before a change and on this tree, alternating
round by round (the machine is shared and noisy), then the ratios that matter for a change to capturing.

    git worktree add /tmp/before <commit>
    flock /tmp/cpu-heavy.lock .venv/bin/python bench/before_after.py --before /tmp/before --rounds 3

Each round runs `bench/api.py --rounds 1` in each tree (its rows through a file in a temporary folder of this run's
own, so two runs at once never clobber each other) (this venv's Python; each tree's own `engine` package: the script
puts its own folder first on the path and starts `python -m engine serve` there), 20 sessions, 16 and 64 new tokens,
capture off and the pages' capture, in-process and through the API. Reported per version and token count: the medians
of the rounds, the pages' capture against capture off (in-process and API), and this tree's capture off against the
one before. Writes a new bench/results/before_after/<UTC time>-<commit>.json (bench/provenance.py) with both trees'
commits.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import provenance  # noqa: E402
MODES = ("in_process", "api")


def tree_commit(tree: Path) -> str:
    done = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def one_round(tree: Path, args: argparse.Namespace, out: Path) -> list[dict]:
    cmd = [sys.executable, str(tree / "bench" / "api.py"), "--rounds", "1", "--sessions", str(args.sessions),
           "--tokens", *map(str, args.tokens), "--out", str(out)]
    done = subprocess.run(cmd, cwd=tree, text=True, capture_output=True)
    if done.returncode not in (0, 1) or not out.exists():
        raise SystemExit(f"{tree}: bench/api.py failed\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    print(done.stdout.strip(), flush=True)
    return json.loads(out.read_text())["rows"]


def medians(rounds: list[list[dict]]) -> dict[tuple[int, str], dict]:
    """(tokens, capture) -> {mode: median tok/s, p95} over the rounds, and whether every round was clean."""
    out: dict[tuple[int, str], dict] = {}
    for rows in rounds:
        for r in rows:
            slot = out.setdefault((r["tokens"], r["capture"]), {"tok_s": {m: [] for m in MODES},
                                                                 "p95_s": {m: [] for m in MODES}, "ok": True})
            for m in MODES:
                slot["tok_s"][m].append(r[m]["throughput_tok_s"])
                slot["p95_s"][m].append(r[m]["completion_p95_s"])
            slot["ok"] = slot["ok"] and r["ok"]
    return {k: {"tok_s": {m: statistics.median(v["tok_s"][m]) for m in MODES},
                "p95_s": {m: statistics.median(v["p95_s"][m]) for m in MODES},
                "rounds_tok_s": v["tok_s"], "ok": v["ok"]} for k, v in out.items()}


def ratios(before: dict, after: dict, tokens: list[int]) -> list[dict]:
    rows = []
    for n in tokens:
        row = {"tokens": n}
        for name, table in (("before", before), ("after", after)):
            off, full = table[(n, "off")]["tok_s"], table[(n, "full")]["tok_s"]
            row[name] = {"off": off, "full": full, "capture_vs_off": {m: full[m] / off[m] for m in MODES}}
        row["off_after_vs_before"] = {m: after[(n, "off")]["tok_s"][m] / before[(n, "off")]["tok_s"][m] for m in MODES}
        row["full_after_vs_before"] = {m: after[(n, "full")]["tok_s"][m] / before[(n, "full")]["tok_s"][m]
                                       for m in MODES}
        rows.append(row)
    return rows


def spread(table: dict, tokens: int, mode: str) -> str:
    """A capture-off cell's rounds, lowest to highest: on a shared machine a round-to-round range of 20-40% is
    common, and a ratio of medians inside it is not a change."""
    rounds = sorted(table[(tokens, "off")]["rounds_tok_s"][mode])
    return "-".join(f"{v:.1f}" for v in (rounds[0], rounds[-1])) if len(rounds) > 1 else f"{rounds[0]:.1f}"


def alternate(trees: dict[str, Path], args: argparse.Namespace, work: Path) -> dict[str, list]:
    """Each round runs both trees, the order swapped every round; each run's rows go through its own file in
    `work`, a folder of this run's own."""
    seen: dict[str, list] = {"before": [], "after": []}
    for r in range(args.rounds):
        order = ("before", "after") if r % 2 == 0 else ("after", "before")
        for name in order:
            print(f"round {r + 1}/{args.rounds}: {name} ({trees[name]})", flush=True)
            seen[name].append(one_round(trees[name], args, work / f"{name}.{r}.json"))
    return seen


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--before", required=True, help="a checkout of the commit before (git worktree add)")
    p.add_argument("--after", default=str(ROOT), help="the checkout measured against it (default: this one)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sessions", type=int, default=20)
    p.add_argument("--tokens", type=int, nargs="+", default=[16, 64])
    p.add_argument("--out", help="default: a new file under bench/results/before_after/")
    args = p.parse_args(argv)
    run = provenance.start("before_after", argv)
    trees = {"before": Path(args.before).resolve(), "after": Path(args.after).resolve()}
    with tempfile.TemporaryDirectory(prefix="before_after.") as work:     # per run: two runs at once never share
        seen = alternate(trees, args, Path(work))
    before, after = medians(seen["before"]), medians(seen["after"])
    report = {"what": f"bench/api.py on two checkouts alternating, {args.rounds} rounds, medians: {args.sessions} "
                      "sessions, in-process and through the API, capture off and the pages' capture",
              "before": str(trees["before"]), "after": str(trees["after"]),
              "commits": {name: tree_commit(tree) for name, tree in trees.items()},
              "ratios": ratios(before, after, args.tokens),
              "medians": {name: {f"{k[0]}/{k[1]}": v for k, v in table.items()}
                          for name, table in (("before", before), ("after", after))},
              "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    run.save(report, out=args.out, rounds=seen)
    for row in report["ratios"]:
        for m in MODES:
            print(f"{row['tokens']:3d} tokens, {m:10s}: capture/off before {row['before']['capture_vs_off'][m]:.2f}x, "
                  f"after {row['after']['capture_vs_off'][m]:.2f}x; capture off after/before "
                  f"{row['off_after_vs_before'][m]:.2f}x (rounds: before {spread(before, row['tokens'], m)}, "
                  f"after {spread(after, row['tokens'], m)} tok/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
