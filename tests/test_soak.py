"""The soak test's 15-second version: 30 sessions on the embedded model, nothing failed, lost or leaked."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.serial

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_thirty_sessions_for_fifteen_seconds_leave_nothing_failed_lost_or_leaked(tmp_path):
    out = tmp_path / "soak.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "soak.py"), "--sessions", "30", "--seconds", "15",
                           "--out", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=420)
    assert out.exists(), done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["checks"] == [], (result["checks"], result["failures"])
    assert result["failed"] == 0 and result["lost"] == 0
    assert result["threads_left"] == 0 and result["hooks_left"] == 0 and result["sessions_left"] == 0
    assert result["memory_mb"]["held_over_warm_up"] <= 1.10
    kinds = result["kinds"]
    assert kinds["bomb"]["refused"] == 2 and kinds["generate"].get("served", 0) >= 1
    assert kinds["upload_bad"].get("served", 0) == 0 and kinds["upload_bad"].get("refused", 0) >= 1
    sched = result["scheduler"]
    assert sched["accepted"] == sched["served"] + sched["cancelled"] + sched["failed"] + sched["timed_out"]
    assert done.returncode == 0
