"""The service keeps every finished run on disk (engine/service/ondisk.py): written once by its writer thread, read
back by id after memory let go of it or after a restart, held in memory while the disk refuses it."""
from __future__ import annotations

import threading
import time

import pytest

from conftest import tiny_prompt
from engine import runs as run_files
from engine.core.generate import GenerationRequest
from engine.core.hooks import CAPTURE_OFF, CapturePolicy
from engine.service import ondisk
from engine.service.runs import NothingKeptError, RunNotFoundError
from engine.service.service import EngineService
from engine.store import StoreError, open_store


def finished(service: EngineService, seed: int, source: str = "api") -> str:
    request = GenerationRequest(tiny_prompt(6, seed=seed), max_new_tokens=3, chat=False)
    handle = service.submit(request, CAPTURE_OFF, source=source)
    list(handle.records())
    return handle.run_id


def test_a_finished_run_is_read_back_from_disk_after_memory_and_after_a_restart(tiny_lm, tmp_path):
    service = EngineService(tiny_lm, disk=open_store(tmp_path, 2**26))
    try:
        run_id = finished(service, 1)
        records = service.run_slice(run_id).records
        assert service.writer.flush(30) and service.writer.n_written == 1
        assert run_id not in service.runs                  # on disk: memory let go of it (nothing kept to recompute)
        with pytest.raises(NothingKeptError, match="is kept on disk, but the layers' inputs"):
            service.quick("attention.kept", {"run_id": run_id})
        assert [r.kind for r in service.run_slice(run_id).records] == [r.kind for r in records]
        data = service.run_file(run_id)
        assert data == service.disk.read(run_id) and run_files.loads(data).token_ids == \
            [r.token.id for r in records if r.kind in ("prefill", "decode")]
    finally:
        service.close()
    again = EngineService(tiny_lm, disk=open_store(tmp_path, 2**26))          # the model server restarted
    try:
        part = again.run_slice(run_id, since=1)
        assert part.info.state == "done" and part.info.source == "api" and part.start == 1
        assert [r.kind for r in part.records] == [r.kind for r in records[1:]]
        assert run_id in [info.id for info in again.run_list()]
        with pytest.raises(RunNotFoundError, match="no run run-0000"):
            again.run_slice("run-0000")
    finally:
        again.close()


def test_a_run_the_disk_refuses_stays_readable_in_memory_and_is_written_once_it_can_be(tiny_lm, tmp_path,
                                                                                        monkeypatch, caplog):
    monkeypatch.setattr(ondisk, "RETRY_SECONDS", 0.2)
    disk = open_store(tmp_path, 1024)                 # a budget smaller than any run file: every write is refused
    service = EngineService(tiny_lm, disk=disk)
    try:
        service.runs.max_bytes = 1                     # memory would drop every finished run at once...
        run_id = finished(service, 2)
        assert service.writer.flush(30) and list(service.writer.pending) == [run_id]
        assert service.run_slice(run_id).info.state == "done"        # ...but a run waiting for the disk is held
        assert "was not kept on disk" in (disk.usage().write_error or "")
        disk.budget = 2**26                            # space again (an operator freed some)
        deadline = time.monotonic() + 20
        while service.writer.pending and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not service.writer.pending and disk.row(run_id).size > 0 and run_id not in service.runs
        assert service.run_slice(run_id).info.state == "done"        # from its file now
    finally:
        service.close()


def test_a_captured_run_the_disk_refuses_is_not_evicted_as_it_closes(tiny_lm, tmp_path, monkeypatch):
    """Memory over its bounds (runs waiting for a full disk hold it): a run that kept its layer inputs settles them as
    it closes, which evicts; it must be held first, or it is gone before its file is written (the hosted hour lost
    138 captured pages' runs in its disk-full window that way)."""
    monkeypatch.setattr(ondisk, "RETRY_SECONDS", 0.2)
    disk = open_store(tmp_path, 1024)                                    # every write is refused
    service = EngineService(tiny_lm, disk=disk)
    try:
        service.runs.max_bytes = 1
        request = GenerationRequest(tiny_prompt(6, seed=3), max_new_tokens=3, chat=False)
        handle = service.submit(request, CapturePolicy(attention=False, inputs=None), source="page")
        list(handle.records())
        assert service.writer.flush(30) and list(service.writer.pending) == [handle.run_id]
        disk.budget = 2**26
        deadline = time.monotonic() + 20
        while service.writer.pending and time.monotonic() < deadline:
            time.sleep(0.1)
        assert disk.row(handle.run_id).size > 0 and service.run_slice(handle.run_id).info.state == "done"
    finally:
        service.close()


def test_runs_waiting_for_the_disk_are_held_by_their_files_size_not_their_count(tiny_lm, tmp_path, monkeypatch):
    monkeypatch.setattr(ondisk, "RETRY_SECONDS", 60.0)
    service = EngineService(tiny_lm, disk=open_store(tmp_path, 1024))          # every write is refused
    try:
        first = finished(service, 5)
        assert service.writer.flush(30)
        size = service.writer.pending[first]
        monkeypatch.setattr(ondisk, "PENDING_BYTES", int(2.5 * size))        # room for about two such files
        later = [finished(service, 6), finished(service, 7)]
        assert service.writer.flush(30) and list(service.writer.pending) == later
        assert service.writer.dropped == 1 and first not in service.writer.pending    # let go of: memory may drop it
        assert all(service.run_slice(run_id).info.state == "done" for run_id in later)
    finally:
        service.close()


def test_a_wait_that_sees_a_stopped_run_end_returns_once_its_file_is_on_disk(tiny_lm, tmp_path, monkeypatch):
    """A page that stopped a run asks run_wait from past its end before it shows the run's link (app/runs/run.py `settle`):
    it must come back with the file on disk, not as the run closes (the hosted hour lost a stopped run that way
    when the model server was killed between the two)."""
    disk = open_store(tmp_path, 2**26)
    put = disk.put
    monkeypatch.setattr(disk, "put", lambda row, data: (time.sleep(0.5), put(row, data)))   # a slow disk
    service = EngineService(tiny_lm, disk=disk)
    try:
        request = GenerationRequest(tiny_prompt(6, seed=7), max_new_tokens=200, chat=False)
        handle = service.submit(request, CAPTURE_OFF, source="page")
        next(iter(handle.records()))
        handle.cancel()                                     # Stop
        part = service.run_wait(handle.run_id, 2**31, timeout=10)
        assert not part.info.live and part.records == []
        assert run_files.loads(disk.read(handle.run_id)).token_ids      # on disk already, not on its way
    finally:
        service.close()


def test_a_run_finished_as_the_disk_takes_a_backlog_again_is_written_before_the_backlog(tiny_lm, tmp_path,
                                                                                        monkeypatch):
    """Once the disk takes files again, the runs it refused meanwhile are written in slices, each newly finished run
    first: a page that stopped a run waits for its file (`run_wait`), and the hosted hour's Stop 2.6 minutes after the
    disk was freed waited behind hundreds of held runs written in one go, past Streamlit's 10 s."""
    monkeypatch.setattr(ondisk, "RETRY_SECONDS", 0.2)
    disk = open_store(tmp_path, 1024)                                    # every write is refused
    service = EngineService(tiny_lm, disk=disk)
    try:
        backlog = [finished(service, seed) for seed in range(12)]
        assert service.writer.flush(30) and list(service.writer.pending) == backlog
        # A disk that writes a file only when the test lets it: the order of the writes is then the writer's, never
        # the machine's speed against a sleep. One run per slice, so each write is a point where a new run can go first.
        monkeypatch.setattr(ondisk, "DRAIN_SLICE_SECONDS", 0.0)
        put, permits, done, order = disk.put, threading.Semaphore(0), threading.Semaphore(0), []

        def one_at_a_time(row, data):
            assert permits.acquire(timeout=120)
            try:
                put(row, data)
                order.append(row.id)
            finally:
                done.release()

        monkeypatch.setattr(disk, "put", one_at_a_time)
        disk.budget = 2**26                                              # space again
        permits.release()
        assert done.acquire(timeout=120) and order == backlog[:1]        # the disk takes files again
        new = finished(service, 99)
        while new not in order:                                          # one write at a time, until the new run's
            permits.release()
            assert done.acquire(timeout=120) and len(order) <= 3
        assert order.index(new) <= 2                  # after at most the write already under way: not behind 11
        assert len(service.writer.pending) >= 6 and disk.row(new).size > 0
        permits.release(100)                                             # the rest as fast as the disk goes
        assert service.writer.flush(30)
        deadline = time.monotonic() + 60
        while service.writer.pending and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(disk.row(run_id).size > 0 for run_id in backlog)
    finally:
        service.close()


def test_a_wait_for_a_stopped_runs_file_keeps_within_the_wait_asked_for(tiny_lm, tmp_path, monkeypatch):
    """A page's settle must end inside Streamlit's 10 s hand-over: `run_wait` waits for the file within its `wait`."""
    disk = open_store(tmp_path, 2**26)
    put, written = disk.put, threading.Event()
    monkeypatch.setattr(disk, "put", lambda row, data: (written.wait(120), put(row, data)))   # a disk that waits for
    service = EngineService(tiny_lm, disk=disk)                                             # the test, not a clock
    try:
        request = GenerationRequest(tiny_prompt(6, seed=8), max_new_tokens=200, chat=False)
        handle = service.submit(request, CAPTURE_OFF, source="page")
        next(iter(handle.records()))
        handle.cancel()
        handle.result(timeout=120)                      # ended and closed (the listeners see the end before a reader):
        part = service.run_wait(handle.run_id, 2**31, timeout=0.5)    # the wait is the file's alone, not a slow step's
        assert not part.info.live
        with pytest.raises(StoreError):
            disk.row(handle.run_id)                     # back before the file: the wait asked for came first
        written.set()
        assert service.writer.flush(30) and disk.row(handle.run_id).size > 0
    finally:
        written.set()
        service.close()
