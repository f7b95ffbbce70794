"""The run store on disk (engine/store): atomic files and their SQLite index, the budget with the oldest evicted
first, bad files skipped with a line (never a crash at open), a newer store refused by name, a failed write one
clear error, and several processes writing at once without corrupting it."""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest

from conftest import tiny_prompt
from engine import runs as run_files
from engine.core.generate import GenerationRequest, generate
from engine.core.hooks import CAPTURE_OFF
from engine.serving.recording import new_recording
from engine.store import (RunGoneError, StoredFileError, StoredRun, StoreError, StoreVersionError,
                          StoreWriteError, open_store)
from engine.store.disk import INDEX, RUNS, SKIPPED

ROOT = Path(__file__).resolve().parent.parent
KB = 1024


@pytest.fixture(scope="module")
def run_file(tiny_lm) -> bytes:
    """A real run file of the tiny model (what the service writes)."""
    request = GenerationRequest(tiny_prompt(6, seed=3), max_new_tokens=3, chat=False)
    with tiny_lm.lock:
        records = list(generate(tiny_lm, request, CAPTURE_OFF))
    return run_files.dumps(new_recording(tiny_lm, request, CAPTURE_OFF, records))


def test_a_run_is_kept_whole_and_read_back_by_id(tmp_path, run_file):
    disk = open_store(tmp_path, 10 * 2**20)
    assert disk.put(StoredRun("run-a1", model="tiny", title="w1 w2", answer="w3"), run_file) == []
    assert disk.read("run-a1") == run_file
    row = disk.row("run-a1")
    assert (row.size, row.sha256, row.title) == (len(run_file), hashlib.sha256(run_file).hexdigest(), "w1 w2")
    assert not list((tmp_path / RUNS).glob(".*.tmp"))              # no temporary file left behind
    with pytest.raises(RunGoneError, match="no run run-b2"):
        disk.read("run-b2")
    with pytest.raises(RunGoneError, match="not a run id"):
        disk.read("../index")
    again = open_store(tmp_path, 10 * 2**20)                        # another process, or after a restart
    assert again.read("run-a1") == run_file and again.usage().problems == ()


def test_the_oldest_runs_go_first_and_the_page_can_say_so(tmp_path):
    disk = open_store(tmp_path, 10 * KB)
    for i in range(4):
        disk.put(StoredRun(f"run-{i}", created=100.0 + i), os.urandom(3 * KB))
    use = disk.usage()
    assert [r.id for r in disk.rows()] == ["run-3", "run-2", "run-1"]
    assert (use.runs, use.bytes, use.budget, use.evicted_runs, use.evicted_bytes) == (3, 9 * KB, 10 * KB, 1, 3 * KB)
    assert not (tmp_path / RUNS / "run-0.run.zip").exists()
    with pytest.raises(RunGoneError, match=r"evicted .* budget of 0.01 MiB \(the oldest"):
        disk.read("run-0")
    with pytest.raises(StoreWriteError, match="not kept on disk: it is 0.01 MiB, more than the run store's whole"):
        disk.put(StoredRun("run-big"), os.urandom(11 * KB))
    assert disk.usage().runs == 3


def test_a_persons_claims_list_their_runs_and_say_which_were_evicted(tmp_path):
    disk = open_store(tmp_path, 10 * KB)
    disk.put(StoredRun("run-old", created=1.0), os.urandom(6 * KB))
    disk.claim("p1", "run-old", "first prompt", "first answer", "tiny")
    disk.claim("p2", "run-old", "first prompt", "", "tiny")                # a follower opened it too
    disk.put(StoredRun("run-new", created=2.0), os.urandom(6 * KB))     # evicts run-old
    disk.claim("p1", "run-new", "second prompt", "second answer", "tiny", keep=1)
    assert [(c.id, c.kept) for c in disk.claims("p1")] == [("run-new", True)]     # keep=1: the newest only
    assert [(c.id, c.kept) for c in disk.claims("p2")] == [("run-old", False)]


def test_bad_files_are_skipped_with_a_line_and_never_stop_the_store_from_opening(tmp_path, run_file, caplog):
    disk = open_store(tmp_path, 10 * 2**20)
    for name in ("run-cut", "run-edited", "run-fine"):
        disk.put(StoredRun(name), run_file)
    disk.close()
    runs = tmp_path / RUNS
    (runs / "run-cut.run.zip").write_bytes(run_file[: len(run_file) // 2])            # truncated
    edited = bytearray(run_file)
    edited[len(edited) // 2] ^= 0xFF
    (runs / "run-edited.run.zip").write_bytes(bytes(edited))                           # same size, changed
    (runs / "run-junk.run.zip").write_bytes(b"PK\x03\x04 not a zip at all")            # no row, unreadable
    (runs / "run-copied.run.zip").write_bytes(run_file)                                # no row, a good run file
    for name in ("run-junk", "run-copied"):                      # older than a write that may be adding its row
        os.utime(runs / f"{name}.run.zip", (1e9, 1e9))
    disk = open_store(tmp_path, 10 * 2**20)
    problems = " | ".join(what for _, what in disk.usage().problems)
    assert "run-cut: its file is" in problems and "run-junk.run.zip: not a run file" in problems
    assert {r.id for r in disk.rows()} == {"run-edited", "run-fine", "run-copied"}
    assert disk.row("run-copied").title == tiny_prompt(6, seed=3)[:200]                # adopted from its run.json
    with pytest.raises(StoredFileError, match="cut short or changed after it was written"):
        disk.read("run-edited")
    assert "run-edited" not in {r.id for r in disk.rows()} and disk.read("run-fine") == run_file
    assert len(list((tmp_path / SKIPPED).iterdir())) == 3                                # set aside, not deleted
    assert "run store" in caplog.text


def test_an_index_that_is_not_sqlite_is_set_aside_and_rebuilt_from_the_files(tmp_path, run_file):
    disk = open_store(tmp_path, 10 * 2**20)
    disk.put(StoredRun("run-keep"), run_file)
    disk.close()
    for extra in ("-wal", "-shm"):
        Path(str(tmp_path / INDEX) + extra).unlink(missing_ok=True)
    (tmp_path / INDEX).write_bytes(b"this is no database" * 100)
    disk = open_store(tmp_path, 10 * 2**20)
    assert disk.read("run-keep") == run_file


def sqlite_error(code: int, message: str) -> sqlite3.OperationalError:
    """The error SQLite raises with `code` (as the sqlite3 module fills it in)."""
    err = sqlite3.OperationalError(message)
    err.sqlite_errorcode, err.sqlite_errorname = code, message
    return err


@pytest.mark.parametrize("code, message", [(sqlite3.SQLITE_BUSY, "database is locked"),
                                           (sqlite3.SQLITE_PROTOCOL, "locking protocol"),
                                           (sqlite3.SQLITE_IOERR, "disk I/O error")])
def test_an_index_another_process_is_opening_is_waited_for_never_set_aside(tmp_path, run_file, monkeypatch, code,
                                                                           message):
    """Four processes opening a new store at once: one got SQLITE_BUSY at once (no busy wait when SQLite sees a
    possible deadlock) and gave up with a StoreError; PROTOCOL and IOERR (the write-ahead log's shared memory under
    contention) set the index aside while the others wrote it. Each is tried again now, and the index is kept."""
    from engine.store.disk import RunDisk

    open_store(tmp_path, 10 * 2**20).put(StoredRun("run-keep"), run_file)
    real, calls = RunDisk._prepared, []

    def flaky(self, path):
        calls.append(path)
        if len(calls) <= 3:
            raise sqlite_error(code, message)
        return real(self, path)

    monkeypatch.setattr(RunDisk, "_prepared", flaky)
    disk = open_store(tmp_path, 10 * 2**20)
    assert len(calls) == 4 and disk.read("run-keep") == run_file
    assert not (tmp_path / SKIPPED).exists() and disk.usage().problems == ()


def test_an_index_that_stays_locked_is_refused_with_a_line_and_kept(tmp_path, run_file, monkeypatch):
    from engine.store import disk as store_disk

    open_store(tmp_path, 10 * 2**20).put(StoredRun("run-keep"), run_file)
    monkeypatch.setattr(store_disk, "BUSY_SECONDS", 0.0)
    def locked(self, path):
        raise sqlite_error(sqlite3.SQLITE_BUSY, "database is locked")

    monkeypatch.setattr(store_disk.RunDisk, "_prepared", locked)
    with pytest.raises(StoreError, match=r"index .* could not be opened for 0 s \(database is locked\)"):
        open_store(tmp_path, 10 * 2**20)
    monkeypatch.undo()
    assert open_store(tmp_path, 10 * 2**20).read("run-keep") == run_file and not (tmp_path / SKIPPED).exists()


def test_a_store_written_by_a_newer_playground_is_refused_by_name(tmp_path):
    open_store(tmp_path, 2**20).close()
    with sqlite3.connect(tmp_path / INDEX) as db:
        db.execute("PRAGMA user_version = 7")
    with pytest.raises(StoreVersionError, match=r"written by a newer playground \(run store version 7; this one reads "
                                                r"version 1\).*--runs-dir"):
        open_store(tmp_path, 2**20)
    with sqlite3.connect(tmp_path / INDEX) as db:                            # left untouched
        assert db.execute("PRAGMA user_version").fetchone()[0] == 7
    with pytest.raises(StoreError, match="PLAYGROUND_RUNS_MB=0"):
        open_store(tmp_path / "off", 0)


def test_a_failed_write_is_one_clear_error_and_the_store_goes_on(tmp_path):
    """A real failed write: a child process whose file size limit (RLIMIT_FSIZE) is below the run's size."""
    child = textwrap.dedent(f"""
        import os, resource, signal, sys
        sys.path.insert(0, {str(ROOT)!r})
        from engine.store import StoredRun, StoreWriteError, open_store
        disk = open_store(__import__("pathlib").Path({str(tmp_path)!r}), 2**20)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)              # the write fails with EFBIG instead of a signal
        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))
        try:
            disk.put(StoredRun("run-big"), os.urandom(100 * 1024))
        except StoreWriteError as err:
            print("REFUSED", err, "|", disk.usage().write_error)
        resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))                       # room again
        disk.put(StoredRun("run-small"), b"x" * 1000)
        print("THEN", disk.read("run-small") == b"x" * 1000, disk.usage().write_error)
    """)
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert "REFUSED run run-big was not kept on disk: the file is over this process's file size limit; serving goes " \
           "on" in out.stdout, out.stderr
    assert "THEN True None" in out.stdout and "Traceback" not in out.stderr
    assert [r.id for r in open_store(tmp_path, 2**20).rows()] == ["run-small"]


WRITER = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {root!r})
    import pathlib, time
    from engine.store import RunGoneError, StoredRun, open_store
    who, folder = sys.argv[1], pathlib.Path({folder!r})
    (folder / f"ready-{{who}}").touch()
    while not (folder / "go").exists():                                 # every writer opens the new store at once
        time.sleep(0.001)
    disk = open_store(folder, {budget})
    for i in range({n}):
        run = f"run-{{who}}-{{i}}"
        disk.put(StoredRun(run, title=f"{{who}} {{i}}"), os.urandom(2048 + i))
        disk.claim(who, run, f"{{who}} {{i}}")
        try:
            assert len(disk.read(disk.rows(1)[0].id)) >= 2048          # the newest run, whoever wrote it
        except RunGoneError:
            pass                                                        # evicted by another writer meanwhile
    print("OK", who)
""")


def test_processes_writing_at_once_never_corrupt_the_store(tmp_path):
    """Four processes (as web processes and a model server would) write, claim, read and evict at the same time."""
    n, budget = 40, 120 * KB
    script = WRITER.format(root=str(ROOT), folder=str(tmp_path), budget=budget, n=n)
    procs = [subprocess.Popen([sys.executable, "-c", script, f"w{k}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for k in range(4)]
    while len(list(tmp_path.glob("ready-*"))) < 4 and all(p.poll() is None for p in procs):
        time.sleep(0.01)
    (tmp_path / "go").touch()
    outs = [p.communicate(timeout=180) for p in procs]                 # a guard against a hang, not a speed
    assert [p.returncode for p in procs] == [0] * 4, [e[-2000:] for _, e in outs]
    disk = open_store(tmp_path, budget)
    with sqlite3.connect(tmp_path / INDEX) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    use = disk.usage()
    assert use.problems == (), use.problems
    assert use.bytes <= budget and use.runs + use.evicted_runs == 4 * n, use
    files = {p.name for p in (tmp_path / RUNS).iterdir()}
    rows = {f"{r.id}.run.zip" for r in disk.rows(1000)}
    assert (files - rows, rows - files) == (set(), set())                  # every row has its file, and no more
    for row in disk.rows(1000):
        assert len(disk.read(row.id)) == row.size
    assert all(len(disk.claims(f"w{k}", 1000)) == n for k in range(4))


def test_describe_reads_what_the_index_needs_from_a_run_file(run_file):
    from engine.store.disk import describe

    row = describe("run-x", run_file)
    with zipfile.ZipFile(__import__("io").BytesIO(run_file)) as z:
        doc = json.loads(z.read("run.json"))
    assert row.model == doc["recording"]["model"]["label"] and row.kind == "generation" and row.size == len(run_file)
    assert row.title == doc["recording"]["request"]["prompt"] and row.answer == doc["recording"]["records"][-1]["text"]


def test_two_writers_of_one_id_leave_the_file_and_the_row_of_the_same_one(tmp_path, monkeypatch):
    """A shipped recording opened in two web processes at once is written twice under one id: the rename happens
    under the index's write lock, so the second writer cannot put its file between the first one's rename and row
    (which left the row of one and the file of the other: set aside as changed at the next read)."""
    import threading

    from engine.store import disk as disk_module

    first, second = open_store(tmp_path, 2**20), open_store(tmp_path, 2**20)   # two connections, as two processes
    real, calls, placed = disk_module.place, [], threading.Event()

    def place(tmp, path):
        real(tmp, path)
        calls.append(path)
        if len(calls) == 1:
            placed.wait(2)            # the first writer between its rename and its row: the other goes now if it can
        else:
            placed.set()

    monkeypatch.setattr(disk_module, "place", place)
    writer = threading.Thread(target=first.put, args=(StoredRun("run-same"), b"a" * 1000))
    writer.start()
    while not calls and writer.is_alive():
        writer.join(0.01)
    second.put(StoredRun("run-same"), b"b" * 2000)
    writer.join()
    assert len(calls) == 2 and first.read("run-same") == second.read("run-same") == b"b" * 2000
    assert first.usage().problems == ()
