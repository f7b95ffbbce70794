"""bench/vs_vllm.py's own parts without vLLM: our server started as the benchmark starts it, the load against it
through the real `openai` clients, and the report, on the tiny model (the vLLM side is a benchmark, not a test)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))


def test_the_benchmark_measures_our_server_alone_on_the_tiny_model(tiny_model_dir, tmp_path):
    import vs_vllm

    out = tmp_path / "vs.json"
    code = vs_vllm.main(["--only", "ours", "--model", str(tiny_model_dir), "--rounds", "1", "--sessions", "3",
                         "--tokens", "4", "--alone-tokens", "6", "--alone-repeats", "1", "--prefill-tokens", "0",
                         "--out", str(out)])
    report = json.loads(out.read_text())
    assert code == 0 and report["clean"] and report["sides"] == ["ours"]
    ours = report["rounds"][0]["ours"]
    assert ours["room_4"]["served"] == 3 and ours["room_4"]["throughput_tok_s"] > 0
    alone = ours["alone"]["runs"][0]
    assert alone["tokens"] >= 2 and 0 < alone["ttft_s"] < 60 and alone["itl_ms"] > 0
    assert ours["room_4"]["threads"]["cores"] >= 1                   # the room reports the threads it measured
    assert report["ours_wrong_answers"] == {"4": 0}
    assert report["answers"]["ours"]["4"] == {"answers": 3, "unanswered": 0, "wrong": 0}
    assert len(set(report["prompts"]["room"])) == 3 and ours["alone_repeated"]["runs"][0]["tokens"] >= 2
    assert report["settings"]["ours"]["processes"][0]["cores"]            # what the server may run on, measured
    assert report["provenance"]["commit"] and report["provenance"]["command"][-2:] == ["--out", str(out)]
    assert set(report["table"]["ours"]) >= {"alone_itl_ms", "alone_ttft_s", "room_4_throughput_tok_s",
                                            "alone_repeated_ttft_s"}


def test_every_session_asks_its_own_prompt_and_lone_requests_never_repeat():
    import vs_vllm

    room = vs_vllm.room_prompts(20)
    lone = vs_vllm.alone_prompts(9)
    assert len(set(room)) == 20 and len(set(lone)) == 9 and not set(room) & set(lone)


def test_one_wrong_answer_of_ours_fails_the_run_and_vllm_is_counted_against_ours():
    """compare_answers over two rounds of a 3-session room: ours must equal its answers alone every time."""
    import vs_vllm

    refs = {"ours": {4: ["a", "b", "c"]}, "vllm": {4: ["a", "b", "x"]}}
    room = lambda *answers: {"room_4": {"answers": list(answers)}}  # noqa: E731
    rounds = [{"ours": room("a", "b", "c"), "vllm": room("a", "b", "x")},
              {"ours": room("a", "B", "c"), "vllm": room("a", None, "c")}]
    counts = vs_vllm.compare_answers(rounds, ["ours", "vllm"], [4], refs)
    assert counts["ours"][4] == {"answers": 6, "unanswered": 0, "wrong": 1}
    assert counts["vllm"][4] == {"answers": 6, "unanswered": 1, "wrong": 1, "equal_ours": 4,
                                 "alone_equal_ours_alone": 2}


def test_without_vllm_installed_it_says_how_to_get_it(tmp_path, capsys):
    import vs_vllm

    assert vs_vllm.main(["--vllm-venv", str(tmp_path / "none"), "--out", str(tmp_path / "x.json")]) == 2
    assert "--install" in capsys.readouterr().err


def test_servers_that_fail_to_start_are_all_stopped_and_each_waits_on_its_own_path(tmp_path):
    """`running` (shared by bench/vs_vllm.py and bench/vs_llamacpp.py): a server that answers only on its `ready`
    path is waited for; one that exits fails the start with its log named, and every started one is stopped."""
    import vs_vllm

    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "models").write_text("{}")          # http.server answers /v1/models, nothing at /health
    port = vs_vllm.free_port()
    serving = lambda: vs_vllm.Server("files", [sys.executable, "-m", "http.server", str(port), "--bind",  # noqa: E731
                                               "127.0.0.1"], port, {}, tmp_path / "files.log", cwd=tmp_path,
                                     ready="/v1/models")
    failing = lambda: vs_vllm.Server("broken", [sys.executable, "-c", "raise SystemExit(3)"],  # noqa: E731
                                     vs_vllm.free_port(), {}, tmp_path / "broken.log")
    with vs_vllm.running({"files": serving}) as servers:
        files = servers["files"]
        assert files.proc.poll() is None
    assert files.proc.poll() is not None                                   # stopped on leaving
    started: dict = {}
    with pytest.raises(SystemExit, match="broken server exited with 3; its log: .*broken.log"):
        with vs_vllm.running({"files": lambda: started.setdefault("files", serving()), "broken": failing}):
            pass
    assert started["files"].proc.poll() is not None                       # the one that served is stopped too
