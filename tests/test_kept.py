"""Runs a person keeps ("Keep on this server", engine/runs/kept.py): run files in the one run store, listed per
person within their cap, evicted with every other run within the store's budget; and the recordings the shelf kept
before run files (made here by the base commit's own writer and layout, tests/base_recording.py) taken into the store
once, under the same ids their links had."""
from __future__ import annotations

import logging
import threading

import pytest

from base_recording import dumps_recording, shelve
from conftest import tiny_prompt
from engine import runs as run_files
from engine.core.generate import GenerationRequest, generate_captured
from engine.core.hooks import CapturePolicy
from engine.runs.kept import import_shelf, keep, kept_owner
from engine.serving.recording import new_recording
from engine.store import RunGoneError, open_store
from engine.store.disk import RUN_ID

MB = 10**6


@pytest.fixture(scope="module")
def recording(tiny_lm):
    request = GenerationRequest(tiny_prompt(6, seed=5), max_new_tokens=3, chat=False)
    with tiny_lm.lock:
        records = generate_captured(tiny_lm, request, CapturePolicy(layers=(1,)))
    return new_recording(tiny_lm, request, CapturePolicy(layers=(1,)), records, title="Capital of France")


@pytest.fixture(scope="module")
def run_file(recording) -> bytes:
    return run_files.dumps(recording)


def kept(disk, person, n=10):
    return disk.claims(kept_owner(person), n)


def test_a_person_keeps_their_newest_and_is_told_which_went(tmp_path, run_file):
    disk = open_store(tmp_path, 10 * MB)
    first = keep(disk, run_file, "ana", "First run", "w1", "tiny", per_person=2)
    keep(disk, run_file, "ana", "Second run", "w2", "tiny", per_person=2)
    third = keep(disk, run_file, "ana", "Third run", "w3", "tiny", per_person=2)
    assert third.dropped == ("First run",) and third.evicted == 0 and third.size == len(run_file)
    assert [c.title for c in kept(disk, "ana")] == ["Third run", "Second run"]
    assert kept(disk, "ben") == [] and first.id not in {c.id for c in kept(disk, "ana")}
    assert run_files.loads(disk.read(third.id)).token_ids == run_files.loads(run_file).token_ids
    assert disk.row(third.id).kind == "recording"          # it opens as a recording the person kept


def test_kept_runs_are_evicted_with_every_other_run_and_the_list_says_so(tmp_path, run_file):
    disk = open_store(tmp_path, 2 * len(run_file) + 100)    # room for two run files
    old = keep(disk, run_file, "ana", "ana's", "", "tiny", per_person=5)
    keep(disk, run_file, "ben", "ben's", "", "tiny", per_person=5)
    made_room = keep(disk, run_file, "cem", "cem's", "", "tiny", per_person=5)
    assert made_room.evicted == 1 and made_room.dropped == ()
    (listed,) = kept(disk, "ana")
    assert listed.id == old.id and not listed.kept           # still listed, marked evicted: the page says so
    with pytest.raises(RunGoneError, match="evicted from the run store"):
        disk.read(old.id)


def test_ids_come_from_a_clock_and_a_slug_never_the_user(tmp_path, run_file):
    disk = open_store(tmp_path, 10 * MB)
    got = keep(disk, run_file, "../../etc", "../../passwd <script>", "", "tiny", per_person=3)
    assert RUN_ID.fullmatch(got.id) and got.id.endswith("-passwd-script")
    assert kept_owner("../../etc").startswith("kept:") and "/" not in kept_owner("../../etc")
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [f"{got.id}.run.zip"]


def test_concurrent_keeps_stay_within_each_persons_cap(tmp_path, run_file):
    disk = open_store(tmp_path, 100 * MB)
    errors = []

    def person(s: int) -> None:
        try:
            for i in range(6):
                keep(disk, run_file, f"s{s}", f"run {i}", "", "tiny", per_person=3)
        except Exception as err:  # noqa: BLE001 - the assertion below names it
            errors.append(err)

    threads = [threading.Thread(target=person, args=(s,)) for s in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert [len(kept(disk, f"s{s}")) for s in range(5)] == [3] * 5
    assert all(c.title in ("run 3", "run 4", "run 5") for s in range(5) for c in kept(disk, f"s{s}"))


def test_a_recording_the_shelf_kept_is_the_persons_kept_run_once(tmp_path, recording, caplog):
    """A `.json.gz` written by the base commit's writer where its shelf kept it: taken into the store under the id
    its link had (kept-<file name>), listed for the same person, removed from the shelf; a damaged one stays."""
    shelf = tmp_path / "saved"
    old = shelve(shelf, "ana-browser", dumps_recording(recording), "Capital of France", 1764240000123456789)
    bad = shelve(shelf, "ben-browser", dumps_recording(recording)[:-40], "Cut short", 1764240000999999999)
    disk = open_store(tmp_path / "store", 10 * MB)
    with caplog.at_level(logging.WARNING, logger="engine.runs.kept"):
        assert import_shelf(disk, shelf) == 1
    (listed,) = kept(disk, "ana-browser")
    assert listed.id == "kept-" + old.name.removesuffix(".json.gz") and listed.title == "Capital of france"
    assert listed.kept and abs(listed.at - 1764240000.123) < 0.01 and listed.answer == recording.done.text
    back = run_files.loads(disk.read(listed.id))
    assert back.token_ids == [r.token.id for r in recording.records[:-1]] and back.layers == [1]
    assert not old.exists() and not old.parent.exists()
    assert bad.exists() and kept(disk, "ben-browser") == []
    assert any("Cut short".lower().replace(" ", "-") in r.getMessage() and "stays where it is" in r.getMessage()
               for r in caplog.records)
    assert import_shelf(open_store(tmp_path / "store", 10 * MB), shelf) == 0     # the next start: nothing again
    assert import_shelf(disk, tmp_path / "nothing-here") == 0


def test_web_processes_starting_together_take_the_shelf_in_once(tmp_path, recording):
    """Two handles on one store (as two web processes at start) import one shelf at once: they take turns, so the
    recording is written once and reads back whole."""
    shelf = tmp_path / "saved"
    old = shelve(shelf, "ana-browser", dumps_recording(recording), "Both at once", 1764240000555555555)
    disks = [open_store(tmp_path / "store", 10 * MB) for _ in range(2)]
    counts: list[int] = []
    threads = [threading.Thread(target=lambda d=d: counts.append(import_shelf(d, shelf))) for d in disks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(counts) == [0, 1] and not old.exists()
    (listed,) = kept(disks[1], "ana-browser")
    assert run_files.loads(disks[0].read(listed.id)).token_ids == run_files.loads(disks[1].read(listed.id)).token_ids
    assert disks[0].usage().problems == ()
