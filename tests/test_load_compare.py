"""bench/load.py's record of batched against alone (issue 48): per answer, equal or not and the first token where it
differs; and each prompt's answer alone against another device's (--alone-out there, --alone-against here), on the
tiny model in float32 on the CPU."""
from __future__ import annotations

import json

from test_scheduler import load_bench


def test_every_batched_answer_records_whether_it_equals_alone_and_where_it_first_differs(tiny_model_dir, tmp_path):
    bench = load_bench()
    alone, out = tmp_path / "alone.json", tmp_path / "load.json"
    code = bench.main(["--model", str(tiny_model_dir), "--sessions", "3", "--tokens", "6", "--capture", "off",
                       "--batched-only", "--overload", "0", "--alone-out", str(alone), "--out", str(out)])
    result = one_scenario(json.loads(out.read_text()))
    assert code == 0 and result["equal_alone"] == 3 and len(result["answers"]) == 3
    assert [a["prompt"] for a in result["answers"]] == [0, 1, 2]
    assert all(a["equal"] and a["first_diff"] is None and a["verdict"] == "same" for a in result["answers"])
    ids = json.loads(alone.read_text())["alone"]["6"]
    assert len(ids) == len(bench.PROMPTS) and all(len(i) == 6 for i in ids)


def test_answers_alone_against_another_devices_name_the_first_differing_token(tiny_model_dir, tiny_lm, tmp_path):
    bench = load_bench()
    theirs, out = tmp_path / "cpu.json", tmp_path / "against.json"
    args = ["--model", str(tiny_model_dir), "--tokens", "6", "--alone-only", "--out", str(out)]
    assert bench.main(args + ["--alone-out", str(theirs)]) == 0
    assert bench.main(args + ["--alone-against", str(theirs)]) == 0
    assert json.loads(out.read_text())["alone_against"][0]["equal"] == len(bench.PROMPTS)
    doc = json.loads(theirs.read_text())
    doc["alone"]["6"][1][2] += 1                                   # the other device chose another third token
    theirs.write_text(json.dumps(doc))
    assert bench.main(args + ["--alone-against", str(theirs)]) == 1
    against = json.loads(out.read_text())["alone_against"][0]
    assert against["equal"] == len(bench.PROMPTS) - 1 and against["of"] == len(bench.PROMPTS)
    assert against["answers"][1] == {"prompt": 1, "equal": False, "first_diff": 2}
    shorter = bench.alone_against(bench.references(tiny_lm, 2), theirs, 2)    # their 6 tokens' first 2
    assert shorter["equal"] == len(bench.PROMPTS) and shorter["tokens"] == 2


def test_first_diff():
    bench = load_bench()
    assert bench.first_diff([1, 2, 3], [1, 2, 3]) is None
    assert bench.first_diff([1, 9, 3], [1, 2, 3]) == 1 and bench.first_diff([1, 2], [1, 2, 3]) == 2


def one_scenario(report: dict) -> dict:
    (result,) = report["scenarios"]
    return result
