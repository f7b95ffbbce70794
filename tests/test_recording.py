"""Record and replay: a generation saved with its captures loads back equal; bad files give a clear error. The
playground writes run files now (tests/test_runs.py); the `.json.gz` files here are made by the base commit's own
writer, frozen in tests/base_recording.py: what people saved before still opens."""
from __future__ import annotations

import gzip
import io
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import tiny_prompt
from engine.serving import recording
from engine.errors import EngineError
from engine.core.generate import GenerationRequest, generate, generate_captured
from engine.core.hooks import CAPTURE_ALL, CapturePolicy
from engine.core.records import DecodeRecord, DoneRecord, PrefillRecord
from base_recording import dumps_recording, save_recording
from engine.serving.recording import RecordingError, load_recording, loads_recording, new_recording

ASSETS = Path(__file__).resolve().parent.parent / "assets" / "recordings"
REQUEST = GenerationRequest(tiny_prompt(10, seed=5), max_new_tokens=6, chat=False, stop=("w9",), system=None)


@pytest.fixture(scope="module")
def tiny_recording(tiny_lm):
    records = generate_captured(tiny_lm, REQUEST, CAPTURE_ALL)
    return new_recording(tiny_lm, REQUEST, CAPTURE_ALL, records, title="tiny")


@pytest.fixture(scope="module")
def tiny_bytes(tiny_recording) -> bytes:
    return dumps_recording(tiny_recording)


def assert_same_records(got: list, want: list, attention_tol: float = 0.0) -> None:
    assert [type(r) for r in got] == [type(r) for r in want]
    for g, w in zip(got, want):
        if isinstance(w, DoneRecord):
            assert g == w
            continue
        assert (g.token.id, g.token.text, g.token.prob) == (w.token.id, w.token.text, w.token.prob)
        assert g.token.top == w.token.top
        assert np.array_equal(g.token.logits, w.token.logits) and np.array_equal(g.token.logit_ids, w.token.logit_ids)
        assert g.cache == w.cache and g.seconds == w.seconds
        assert g.captures.keys() == w.captures.keys()
        for i, cap in w.captures.items():
            other = g.captures[i]
            assert (other.heads, other.kv_heads, other.query_start, other.key_start, other.lens) == \
                   (cap.heads, cap.kv_heads, cap.query_start, cap.key_start, cap.lens)
            assert other.attention.shape == cap.attention.shape
            assert np.allclose(other.attention, cap.attention, atol=attention_tol, rtol=0)
            assert np.array_equal(other.q_norm, cap.q_norm) and other.resid_norm == cap.resid_norm
    assert got[0].prompt == want[0].prompt and got[0].shapes == want[0].shapes


def test_a_generation_round_trips_through_a_file(tiny_recording, tmp_path):
    path = save_recording(tiny_recording, tmp_path / "run.json.gz", attention_dtype=None)
    back = load_recording(path)
    assert (back.model, back.spec, back.request, back.policy, back.title, back.dtype, back.device) == \
           (tiny_recording.model, tiny_recording.spec, REQUEST, CAPTURE_ALL, "tiny", "float32", "cpu")
    assert_same_records(back.records, tiny_recording.records)
    assert isinstance(back.records[1], DecodeRecord) and back.records[1].captures[0].attention.dtype == np.float32


def test_a_recording_says_where_it_was_made_and_keeps_it_when_saved_again(tiny_recording, tmp_path):
    """The machine (cores, torch threads, load average) beside the device, read back; an older file without it
    loads with it empty; a recording opened in the app and saved again keeps its date and machine."""
    import os

    from app.runs.recorded import recording_from_run, run_from_recording

    made = tiny_recording.machine
    assert made.startswith(f"{os.cpu_count()} CPU cores (") and "load average" in made
    back = load_recording(save_recording(tiny_recording, tmp_path / "run.json.gz"))
    assert (back.machine, back.created) == (made, tiny_recording.created)
    doc = recording.document(tiny_recording)
    del doc["model"]["machine"]
    assert recording.build(doc).machine == ""
    again = recording_from_run(run_from_recording(back))
    assert (again.machine, again.created) == (made, tiny_recording.created)


def test_attention_is_stored_as_float16_by_default(tiny_recording, tiny_bytes):
    back = loads_recording(tiny_bytes)
    assert back.records[0].captures[0].attention.dtype == np.float16
    assert_same_records(back.records, tiny_recording.records, attention_tol=1e-3)
    assert len(tiny_bytes) < len(dumps_recording(tiny_recording, attention_dtype=None))


def test_a_speculative_run_round_trips(tiny_lm):
    from engine.speculative.decode import NgramDraft, SpecDoneRecord, SpecRoundRecord, speculative_generate

    records = list(speculative_generate(tiny_lm, REQUEST, NgramDraft(), k=3, policy=CapturePolicy(layers=(1,))))
    back = loads_recording(dumps_recording(new_recording(tiny_lm, REQUEST, CapturePolicy(layers=(1,)), records)))
    assert isinstance(back.records[-1], SpecDoneRecord) and back.records[-1] == records[-1]
    rounds = [r for r in back.records if isinstance(r, SpecRoundRecord)]
    assert [r.drafted for r in rounds] == [r.drafted for r in records if isinstance(r, SpecRoundRecord)]
    assert [[t.id for t in r.emitted] for r in rounds] == \
           [[t.id for t in r.emitted] for r in records if isinstance(r, SpecRoundRecord)]


def _doc(data: bytes) -> dict:
    return json.loads(gzip.decompress(data))


def _gz(doc) -> bytes:
    return gzip.compress(json.dumps(doc).encode())


def _edited(data: bytes, edit) -> bytes:
    doc = _doc(data)
    edit(doc)
    return _gz(doc)


def _npz() -> bytes:
    buf = io.BytesIO()
    np.savez(buf, a=np.arange(3))
    return buf.getvalue()


def _set_array_dtype(doc: dict) -> None:
    doc["records"][0]["captures"]["0"]["attention"]["dtype"] = "object"


def _cut_array(doc: dict) -> None:
    arr = doc["records"][0]["captures"]["0"]["attention"]
    arr["__ndarray__"] = arr["__ndarray__"][:-8]


BAD_FILES = {
    "empty": (lambda good: b"", "neither|not valid JSON"),
    "truncated gzip": (lambda good: good[: len(good) // 2], "truncated|damaged"),
    "flipped bytes": (lambda good: good[:40] + bytes(b ^ 0xFF for b in good[40:60]) + good[60:], "damaged|truncated"),
    "a pickle": (lambda good: pickle.dumps({"format": recording.FORMAT}), "pickle"),
    "a protocol-0 pickle": (lambda good: pickle.dumps([1, 2], protocol=0), "pickle"),
    "an npz": (lambda good: _npz(), "zip"),
    "random JSON": (lambda good: json.dumps({"hello": [1, 2, 3]}).encode(), "not a playground recording"),
    "a JSON list": (lambda good: _gz([1, 2]), "not a playground recording"),
    "binary noise": (lambda good: bytes(range(7, 255)), "neither"),
    "future version": (lambda good: _edited(good, lambda d: d.update(version=99)), "version 99"),
    "no records": (lambda good: _edited(good, lambda d: d.update(records=[])), "no records"),
    "cut-short records": (lambda good: _edited(good, lambda d: d["records"].pop()), "cut short"),
    "unknown record type": (lambda good: _edited(good, lambda d: d["records"][0].update(type="os.system")),
                            "unknown type"),
    "extra field": (lambda good: _edited(good, lambda d: d["request"].update(__class__="x")), "does not have"),
    "missing field": (lambda good: _edited(good, lambda d: d["request"].pop("prompt")), "lacks the field 'prompt'"),
    "wrong value type": (lambda good: _edited(good, lambda d: d["request"].update(max_new_tokens="6")),
                         "request.max_new_tokens should be int"),
    "object array": (lambda good: _edited(good, _set_array_dtype), "dtype 'object'"),
    "short array": (lambda good: _edited(good, _cut_array), "damaged array|bytes"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_files_give_a_clear_error(case, tiny_bytes, tmp_path):
    make, words = BAD_FILES[case]
    path = tmp_path / "bad.json.gz"
    path.write_bytes(make(tiny_bytes))
    with pytest.raises(RecordingError, match=words) as err:
        load_recording(path)
    assert isinstance(err.value, EngineError) and "bad.json.gz" in str(err.value)


def test_a_missing_file_and_a_gzip_bomb_are_refused(tiny_bytes, tmp_path, monkeypatch):
    with pytest.raises(RecordingError, match="cannot read"):
        load_recording(tmp_path / "nope.json.gz")
    monkeypatch.setattr(recording, "max_recording_bytes", lambda limits: len(gzip.decompress(tiny_bytes)) - 1)
    with pytest.raises(RecordingError, match="largest recording this server can make"):
        loads_recording(tiny_bytes)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_damage_to_a_file_either_loads_or_gives_a_recording_error(tiny_bytes, data):
    raw = bytearray(gzip.decompress(tiny_bytes))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(len(raw) // 2, len(raw)))
    blob = data.draw(st.sampled_from([bytes(raw[:cut]), gzip.compress(bytes(raw[:cut]))]))
    try:
        loaded = loads_recording(blob)
    except RecordingError as err:
        assert str(err)
    else:
        assert isinstance(loaded.records[-1], DoneRecord)


def test_shipped_recordings_are_run_files_that_load_and_are_small():
    """The one format: run files (made from the .json.gz they were by engine/runs/convert.py, with every token's
    text); no .json.gz is shipped."""
    from engine.runs import load, mentioned_ids

    files = sorted(ASSETS.glob("*.run.zip"))
    assert 2 <= len(files) <= 3 and not list(ASSETS.glob("*.json.gz"))
    assert sum(f.stat().st_size for f in files) < 4 * 2**20
    for f in files:
        run = load(f)
        rec = run.recording
        assert run.version == 1 and mentioned_ids(rec) <= set(run.texts)        # the lens's tokens have text too
        assert rec.model == "SmolLM2-135M-Instruct" and rec.spec.n_layers == 30
        prefill, done = rec.records[0], rec.done
        assert isinstance(prefill, PrefillRecord) and done is not None
        assert done.prompt_tokens == len(prefill.prompt) and done.generated_tokens == len(rec.records) - 1
        assert "".join(r.token.text for r in rec.records[:-1]).startswith(done.text[:20])
        assert set(prefill.captures) == set(rec.policy.layer_ids(30))
        assert all(c.attention.shape[1:] == (len(prefill.prompt),) * 2 for c in prefill.captures.values())


@pytest.mark.slow
def test_shipped_recordings_match_the_real_model_today(smol_lm):
    """Greedy decoding is deterministic: the default model still writes what the recordings hold."""
    from engine.runs import load

    for f in sorted(ASSETS.glob("*.run.zip")):
        rec = load(f).recording
        ids = [r.token.id for r in rec.records[:-1]]
        with smol_lm.lock:
            now = [r.token.id for r in generate(smol_lm, rec.request) if not isinstance(r, DoneRecord)]
        assert now == ids, f.name


def test_the_record_command_saves_a_greedy_run_that_says_where_it_was_made(tiny_model_dir, tiny_lm, tmp_path):
    """`python -m engine record` (engine.cli.record): an untimed warm-up pass, then the run; the file holds the same
    tokens as plain greedy decoding and names the machine."""
    from engine.cli import record
    from engine.runs import load

    with pytest.raises(EngineError, match="ending in .run.zip, not r.json.gz"):        # the old format is read only
        record(tiny_prompt(7), tmp_path / "r.json.gz", model=str(tiny_model_dir))
    rec = record(tiny_prompt(7), tmp_path / "r.run.zip", model=str(tiny_model_dir), max_new_tokens=4, layers=2)
    back = load(tmp_path / "r.run.zip").recording
    plain = [r.token.id for r in generate(tiny_lm, back.request) if not isinstance(r, DoneRecord)]
    assert [r.token.id for r in back.records[:-1]] == plain and back.machine == rec.machine != ""
    assert sorted(back.records[0].captures) == [0, 2]                 # two layers spread over the depth of 3


def test_an_old_recording_converts_to_a_run_file_holding_the_same_records(tiny_recording, tiny_model_dir, tmp_path,
                                                                          capsys):
    """engine/runs/convert.py on a file made by the base commit's writer: the same records and arrays, every token
    id with its text (the logit lens's from the tokenizer); a run file, a wrong name or a model that did not make it
    is refused in one line."""
    from engine.runs import load, mentioned_ids
    from engine.runs.convert import convert, main

    old = save_recording(tiny_recording, tmp_path / "old.json.gz")
    rec = convert(old, tmp_path / "new.run.zip", model=str(tiny_model_dir))
    run = load(tmp_path / "new.run.zip")
    assert run.version == 1 and run.name == str(tiny_model_dir) and rec.title == run.recording.title == "tiny"
    assert_same_records(run.recording.records, load_recording(old).records)
    lens = {int(t) for r in rec.records for c in getattr(r, "captures", {}).values() for t, _ in c.lens or ()}
    assert lens and lens <= set(run.texts)
    assert mentioned_ids(run.recording) <= set(run.texts)
    assert main([str(old), str(tmp_path / "plain.run.zip")]) == 0 and "wrote" in capsys.readouterr().out
    assert load(tmp_path / "plain.run.zip").recording.done == rec.done           # without --model: ids, no lens text
    assert main([str(tmp_path / "new.run.zip"), str(tmp_path / "again.run.zip")]) == 1
    assert main([str(old), str(tmp_path / "new.zip")]) == 1
    assert main([str(old), str(tmp_path / "other.run.zip"), "--model", "default"]) == 1
    said = capsys.readouterr().err.splitlines()
    assert "is a run file already" in said[0] and "ends in .run.zip" in said[1] and "not SmolLM2" in said[2]
    assert len(said) == 3 and not (tmp_path / "other.run.zip").exists()
