"""bench/provenance.py: every result file says where it came from, and no run overwrites another's."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import provenance  # noqa: E402


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "RESULTS", tmp_path / "results")
    return tmp_path / "results"


def test_a_run_records_commit_machine_command_and_rounds(results):
    run = provenance.start("demo", ["--rounds", "2"])
    path = run.save({"tok_s": 12.5}, rounds=[{"tok_s": 12.0}, {"tok_s": 13.0}])
    body = json.loads(path.read_text())
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    p = body["provenance"]
    assert path.parent == results / "demo" and path.name.endswith(f"-{head[:7]}.json")
    assert p["commit"] == head and isinstance(p["dirty"], bool) and p["command"][-2:] == ["--rounds", "2"]
    assert p["machine"]["cores"] >= 1 and p["machine"]["memory_bandwidth"]["read_GBps"] > 0
    assert p["machine"]["versions"]["numpy"] and p["started_utc"].endswith("+00:00")
    assert body["tok_s"] == 12.5 and len(body["rounds"]) == 2


def test_runs_never_share_a_file_and_a_run_saves_again_into_its_own(results):
    first, second = provenance.start("demo"), provenance.start("demo")
    second.started = first.started                            # the same second, the same commit
    a, b = first.save({"n": 1}), second.save({"n": 2})
    assert a != b and json.loads(a.read_text())["n"] == 1
    assert first.save({"n": 3}) == a and json.loads(a.read_text())["n"] == 3      # its own file, phase by phase
    assert provenance.runs("demo") == sorted([a, b]) and provenance.latest("demo") == max(a, b)


def test_an_explicit_out_never_overwrites_a_committed_result(results):
    old = results / "old.json"
    old.parent.mkdir(parents=True)
    old.write_text("{}")
    with pytest.raises(FileExistsError):
        provenance.start("demo", measure_bandwidth=False).save({"n": 1}, out=old)
    assert old.read_text() == "{}"


def test_without_git_the_commit_comes_from_the_environment(results, monkeypatch):
    monkeypatch.setattr(provenance, "git", lambda *args: None)
    monkeypatch.setenv("BENCH_COMMIT", "abc1234def")
    monkeypatch.setenv("BENCH_DIRTY", "false")
    path = provenance.start("demo", measure_bandwidth=False).save({})
    p = json.loads(path.read_text())["provenance"]
    assert p["commit"] == "abc1234def" and p["from"] == "BENCH_COMMIT" and path.name.endswith("-abc1234.json")



def test_a_given_commit_wins_over_a_stale_git_of_the_machine(results, monkeypatch):
    """A lent GPU machine kept a .git from an earlier call: its HEAD is not the tree that ran (seen 2026-11-28)."""
    monkeypatch.setenv("BENCH_COMMIT", "feed5678")
    monkeypatch.setenv("BENCH_DIRTY", "false")
    p = json.loads(provenance.start("demo", measure_bandwidth=False).save({}).read_text())["provenance"]
    assert p["commit"] == "feed5678" and p["from"] == "BENCH_COMMIT"
    assert provenance.git("rev-parse", "HEAD") not in (None, "feed5678")      # this tree has a git of its own

def writes_json_itself(path: Path) -> bool:
    """A benchmark that writes a results file without bench/provenance.py: json.dump(s) into write_text or a file."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("write_text",
                                                                                                      "dump"):
            if "json" in ast.unparse(node):
                return True
    return False


def test_every_benchmark_writes_through_provenance():
    scripts = [p for p in (ROOT / "bench").glob("*.py") if p.name != "provenance.py"]
    writers = [p.name for p in scripts if "provenance" in p.read_text()]
    assert not [p.name for p in scripts if writes_json_itself(p)]
    assert len(writers) >= 20, writers


def test_a_dirty_tree_names_its_changed_files_but_not_results(monkeypatch):
    status = " M bench/engine.py\nM  README.md\n M bench/results/engine.json"
    monkeypatch.setattr(provenance, "git", lambda *args: status if args[0] == "status" else "f" * 40)
    found = provenance.source()
    assert found["dirty"] is True and found["changed"] == ["bench/engine.py", "README.md"]


def test_the_page_bench_starts_with_the_projects_engine_on_its_path():
    """bench/page_speed.py imports the app after bench/room_browser.py, which puts bench/ first on the path, where
    bench/engine.py would shadow the project's `engine` (it did: the bench stopped at its imports)."""
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "page_speed.py"), "--help"], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0 and "--tokens" in done.stdout, done.stderr[-2000:]
