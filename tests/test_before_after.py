"""bench/before_after.py: each run keeps its rounds' files in a folder of its own, so two runs at once never read
each other's rows. The two trees are small checkouts whose bench/api.py writes rows in the shape the real one does."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import before_after  # noqa: E402

API = '''import json, sys
from pathlib import Path
args = sys.argv[1:]
out = Path(args[args.index("--out") + 1])
Path(__file__).resolve().parent.parent.joinpath("outs.log").open("a").write(str(out) + "\\n")
off, full = {off}, {full}
rows = [{{"tokens": int(t), "capture": c, "ok": True,
          "in_process": {{"throughput_tok_s": v, "completion_p95_s": 1.0}},
          "api": {{"throughput_tok_s": v / 2, "completion_p95_s": 2.0}}}}
        for t in args[args.index("--tokens") + 1:args.index("--out")] for c, v in (("off", off), ("full", full))]
out.write_text(json.dumps({{"rows": rows}}))
'''


def tree(root: Path, off: float, full: float) -> Path:
    (root / "bench").mkdir(parents=True)
    (root / "bench" / "api.py").write_text(API.format(off=off, full=full))
    return root


def outs(tree: Path) -> list[Path]:
    return [Path(line) for line in (tree / "outs.log").read_text().splitlines()]


def test_each_run_writes_its_rounds_in_its_own_folder_and_reads_them_back(tmp_path):
    before, after = tree(tmp_path / "before", 10.0, 8.0), tree(tmp_path / "after", 12.0, 9.0)
    for n in (1, 2):
        args = ["--before", str(before), "--after", str(after), "--rounds", "2", "--tokens", "16",
                "--out", str(tmp_path / f"report{n}.json")]
        assert before_after.main(args) == 0
    written = outs(before) + outs(after)
    assert len(written) == 8 and len(set(written)) == 8           # 2 runs x 2 rounds x 2 trees, no name twice
    folders = {p.parent for p in written}
    assert len(folders) == 2                                       # one folder per run ...
    assert not any(f.exists() for f in folders)                    # ... removed when the run ends
    assert not any(p.name.startswith("before_after.") and p.parent == Path("/tmp") for p in written)
    row = json.loads((tmp_path / "report2.json").read_text())["ratios"][0]
    assert row["tokens"] == 16
    assert abs(row["off_after_vs_before"]["in_process"] - 1.2) < 1e-9
    assert abs(row["before"]["capture_vs_off"]["api"] - 0.8) < 1e-9
