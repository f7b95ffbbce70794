"""bench/suite.py, as `make test` runs it: both parts run, either failing fails the suite, and with --record the
two parts' times are written through bench/provenance.py. On a suite of its own that this test writes."""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

PASSING = "def test_parallel_one():\n    assert 1 + 1 == 2\n"
SERIAL = "import pytest\n\n\n@pytest.mark.serial\ndef test_serial_one():\n    assert {verdict}\n"


def suite(tmp_path: Path, serial_passes: bool) -> Path:
    folder = tmp_path / "suite"
    folder.mkdir()
    (folder / "pytest.ini").write_text("[pytest]\nmarkers =\n    serial: runs alone\n")
    (folder / "test_parallel.py").write_text(PASSING)
    (folder / "test_serial.py").write_text(SERIAL.format(verdict="True" if serial_passes else "1 == 2"))
    return folder


def test_a_failing_serial_part_fails_the_suite_after_both_parts_ran(tmp_path, capsys):
    import suite as bench_suite

    from longest_first import recorded_seconds

    folder, out = suite(tmp_path, serial_passes=False), tmp_path / "records" / "20990101T000000Z-abc.json"
    out.parent.mkdir()
    status = bench_suite.main(["--workers", "2", "--record", "--out", str(out), "--", str(folder),
                               "-p", "no:cacheprovider", "--rootdir", str(folder)])
    record = json.loads(out.read_text())
    parallel, serial = record["parts"]
    assert status == 1 and record["ok"] is False
    assert (parallel["name"], parallel["exit_status"]) == ("parallel", 0) and "1 passed" in parallel["summary"]
    assert (serial["name"], serial["exit_status"]) == ("serial", 1) and "1 failed" in serial["summary"]
    assert "-n" in parallel["command"] and "not serial" in parallel["command"]
    assert "--no-loadscope-reorder" in parallel["command"]                  # the order is tests/longest_first.py's
    assert list(parallel["modules"]) == ["test_parallel.py"] and list(serial["modules"]) == ["test_serial.py"]
    assert recorded_seconds(out.parent) == parallel["modules"]
    assert record["total_seconds"] == round(parallel["seconds"] + serial["seconds"], 1) > 0
    assert record["provenance"]["commit"] and record["provenance"]["machine"]["cores"] >= 1
    assert "suite, serial part:" in capsys.readouterr().out


def test_a_passing_suite_exits_0_and_writes_nothing_without_record(tmp_path):
    import suite as bench_suite

    folder = suite(tmp_path, serial_passes=True)
    before = sorted((ROOT / "bench" / "results").rglob("*.json"))
    assert bench_suite.main(["--workers", "2", "--", str(folder), "-p", "no:cacheprovider",
                             "--rootdir", str(folder)]) == 0
    assert sorted((ROOT / "bench" / "results").rglob("*.json")) == before


def test_the_workers_take_the_longest_modules_first_and_new_ones_before_all():
    from longest_first import longest_first

    ids = ["a.py::t1", "b.py::t1", "a.py::t2", "c.py::t1", "new.py::t1", "b.py::t2"]
    order = [ids[i] for i in longest_first(ids, {"a.py": 5.0, "b.py": 60.0, "c.py": 5.0})]
    assert order == ["new.py::t1", "b.py::t1", "b.py::t2", "a.py::t1", "a.py::t2", "c.py::t1"]
