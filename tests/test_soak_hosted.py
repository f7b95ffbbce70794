"""The hosted soak's 45-second version (bench/soak_hosted.py; the hour is a benchmark): `playground --web-processes 2
--host 0.0.0.0` with a join code, people speaking Streamlit's protocol through nginx and `openai` clients streaming
through its /v1/, while a web process and then the model server are SIGKILLed and the run store's disk is filled.
Every run that finished for its client opens by its id at the end, and every failure was an answer in flight when a
fault struck."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from servers import free_port

pytestmark = pytest.mark.serial

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_45_seconds_of_the_hosted_room_with_three_faults_lose_nothing(tiny_model_dir, tmp_path):
    out = tmp_path / "soak.json"
    cmd = [sys.executable, str(ROOT / "bench" / "soak_hosted.py"), "--seconds", "45", "--sessions", "6",
           "--api-clients", "3", "--pause", "4", "--api-pause", "1", "--quota-mb", "64", "--runs-mb", "48",
           "--model", str(tiny_model_dir), "--port", str(free_port()), "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    unexplained = [(f["kind"], f["who"], round(f["start"], 1), f["message"]) for f in result["failures_without_a_fault"]]
    assert result["checks"] == [] and result["lost"] == 0, (result["checks"], unexplained)
    kinds = result["kinds"]
    for kind in ("api", "generate", "reload", "open_recording"):
        assert kinds[kind].get("served", 0) >= 1, (kind, kinds[kind])
    assert result["finished_runs"] >= 10
    assert result["store"]["evicted_runs"] == 0 and result["store"]["problems"] == [], result["store"]
    assert result["restarts"]["web-1"] >= 1 and result["restarts"]["model-server"] >= 1
    assert result["back_after_s"]["model-server"] and result["back_after_s"]["web-1"]
    while_down = result["windows"].get("after: kill the model server", {}).get("api", {})
    assert all(m.startswith("503: the model is restarting") or m.startswith("503: the model is still loading")
               or m.startswith("429") for m in while_down.get("refused_messages", {})), while_down
    for process, mb in result["rss_mb"]["end"].items():
        assert process == "t" or mb is not None, result["rss_mb"]["end"]
    assert done.returncode == 0
