"""The service's parts on their own: the wire format, the run store, presence, the named jobs, and the in-process
service against the engine alone (the same records, every run kept by id, metrics that count)."""
from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from conftest import tiny_prompt
from engine.core.generate import GenerationRequest, generate
from engine.core.hooks import CapturePolicy, LayerCapture
from engine.core.records import CacheState, Candidate, DecodeRecord, DoneRecord, SampledToken
from engine.errors import InvalidRequestError
from engine.service import wire
from engine.service.jobs import JOBS
from engine.service.runs import RunInfo, RunNotFoundError, LiveRuns, new_run_id
from engine.service.service import EngineService, Presence


def a_record(step: int = 1, rows: int = 3) -> DecodeRecord:
    token = SampledToken(7, " w7", 0.5, [Candidate(7, " w7", 0.5)], np.arange(4), np.linspace(0, 1, 4, dtype=np.float32),
                         -1.5, 92, logit=2.0)
    capture = LayerCapture(1, heads=(0, 1), kv_heads=(0, 0), attention=np.random.rand(2, 1, rows).astype(np.float32),
                           lens=[(3, 0.25)], resid=np.ones(64, dtype=np.float32))
    return DecodeRecord(step, 0.01, CacheState(rows, 1024, [512, 512]), token, {1: capture})


# --- the wire ---------------------------------------------------------------------------------------------------------

def test_a_record_crosses_the_wire_unchanged():
    record = a_record()
    back = wire.decode(wire.encode(record))
    assert type(back) is DecodeRecord and back.step == 1 and back.cache == record.cache
    cap = back.captures[1]                                            # an int key stays an int
    assert cap.heads == (0, 1) and cap.lens == [(3, 0.25)]            # tuples stay tuples
    np.testing.assert_array_equal(cap.attention, record.captures[1].attention)
    assert cap.attention.dtype == np.float32 and back.token.logit_ids.dtype == record.token.logit_ids.dtype
    assert back.token.logprob() == pytest.approx(record.token.logprob())


def test_a_server_reads_only_the_types_it_expects():
    allowed = wire.class_names(GenerationRequest, CapturePolicy)
    request = GenerationRequest("hi", stop=("\n",))
    assert wire.decode(wire.encode({"request": request}), allowed)["request"] == request
    with pytest.raises(wire.WireError, match="not a type this server accepts"):
        wire.decode(wire.encode(a_record()), allowed)
    forged = wire.encode({"__dc__": "os.system", "x": 1})
    with pytest.raises(wire.WireError):
        wire.decode(forged)                                           # a client too: only engine dataclasses
    with pytest.raises(wire.WireError):
        wire.decode(b"\xc1\xff\x00", allowed)
    assert isinstance(wire.WireError("x"), InvalidRequestError)


def test_a_stream_of_messages_splits_anywhere():
    data = b"".join(wire.encode(a_record(step)) for step in range(1, 6))
    chunks = [data[i:i + 7] for i in range(0, len(data), 7)]
    assert [r.step for r in wire.stream(chunks)] == [1, 2, 3, 4, 5]


def test_the_json_form_names_each_record_and_lists_its_arrays():
    plain = json.loads(json.dumps(wire.to_plain(a_record(rows=4))))
    assert plain["type"] == "DecodeRecord" and plain["token"]["type"] == "SampledToken"
    assert np.asarray(plain["captures"]["1"]["attention"]).shape == (2, 1, 4)


# --- the run store ----------------------------------------------------------------------------------------------------

def test_the_store_keeps_records_by_id_and_wakes_a_follower():
    store = LiveRuns()
    info = store.open(RunInfo(new_run_id(), "generation", "api"))
    got = []
    follower = threading.Thread(target=lambda: got.append(store.wait(info.id, 0, 10)))
    follower.start()
    time.sleep(0.05)
    store.append(info.id, a_record())
    follower.join(5)
    assert got and len(got[0].records) == 1 and got[0].info.state == "running"
    store.close(info.id, "done")
    assert store.slice(info.id, 1).records == [] and not store.info(info.id).live


def test_the_store_drops_the_oldest_finished_runs_first_and_says_so():
    store = LiveRuns(max_runs=3, max_bytes=10**9)
    ids = [store.open(RunInfo(new_run_id(), "generation", "page")).id for _ in range(4)]
    store.close(ids[1], "done")
    store.open(RunInfo(new_run_id(), "generation", "page"))
    assert {i.id for i in store.list()} >= {ids[0], ids[2], ids[3]}          # running ones stay
    with pytest.raises(RunNotFoundError, match="dropped to make room"):
        store.slice(ids[1])


def test_the_store_is_bounded_in_bytes():
    store = LiveRuns(max_runs=100, max_bytes=64 * 1024)
    ids = []
    for _ in range(20):
        info = store.open(RunInfo(new_run_id(), "generation", "page"))
        store.append(info.id, a_record(rows=2000))                  # 16 KB of attention each
        store.close(info.id, "done")
        ids.append(info.id)
    assert store.bytes <= 64 * 1024 and len(store.list(100)) < 20
    store.slice(ids[-1])                                            # the newest is there


def test_presence_frees_a_session_its_process_no_longer_lists_or_a_silent_process(monkeypatch):
    presence = Presence()
    assert presence("never-reported")                                # unknown: counted as present
    presence.report("web-1", ["a", "b"])
    assert presence("a") and presence("b")
    presence.report("web-1", ["b"])
    assert not presence("a") and presence("b")
    from engine.service import service as module

    monkeypatch.setattr(module, "PRESENCE_STALE_SECONDS", 0.0)
    assert not presence("b")


# --- the in-process service ----------------------------------------------------------------------------------------------

@pytest.fixture
def service(tiny_lm):
    svc = EngineService(tiny_lm)
    yield svc
    svc.close()


def test_the_service_gives_the_engines_own_records_and_keeps_the_run(service, tiny_lm):
    request = GenerationRequest(tiny_prompt(8), max_new_tokens=6, chat=False)
    handle = service.submit(request, CapturePolicy(layers=(0, 2)), session="s1", source="page")
    records = handle.result(timeout=60)
    alone = list(generate(tiny_lm, request, CapturePolicy(layers=(0, 2))))
    assert [getattr(r, "token", None) and r.token.id for r in records] == \
        [getattr(r, "token", None) and r.token.id for r in alone]
    part = service.run_slice(handle.run_id)
    assert part.info.state == "done" and part.info.session == "s1" and part.records == records
    assert isinstance(part.records[-1], DoneRecord) and part.info.bytes > 0
    text = service.metrics.exposition().decode()
    assert "playground:generation_tokens_total 6.0" in text


def test_a_refused_request_is_a_failed_run_with_its_reason(service):
    with pytest.raises(InvalidRequestError):
        service.submit(GenerationRequest("  ", chat=False))
    assert service.run_list()[0].state == "failed" and "empty" in service.run_list()[0].error


def test_every_job_checks_its_parameters_before_anything_runs(service):
    with pytest.raises(InvalidRequestError, match="no measurement called"):
        service.submit_job("rm -rf", {})
    with pytest.raises(InvalidRequestError, match="takes no parameter"):
        service.submit_job("speed.context", {"lengths": [8], "repeats": 1, "extra": 1})
    with pytest.raises(InvalidRequestError, match="whole number"):
        service.submit_job("attention.layer", {"ids": [1, 2], "layer": 99})
    with pytest.raises(InvalidRequestError, match="runs at once"):
        service.submit_job("lens", {"resid": {}, "top": 5})
    assert all(job.what for job in JOBS.values())


def test_a_job_runs_alone_in_its_turn_and_returns_plain_data(service):
    points = service.submit_job("speed.context", {"lengths": [8, 16], "repeats": 1}).value(timeout=120)
    assert [p.tokens for p in points] == [8, 16] and all(p.ttft > 0 for p in points)
    assert wire.decode(wire.encode(points))[1].tokens == 16                # it crosses the wire as it is


def test_the_quick_lens_of_residuals_a_client_sends_equals_the_engines_own(service, tiny_lm):
    """An old recording kept each layer's residual at the newest position and asks the server for the lens."""
    from engine.core.generate import generate_captured, generate_kept

    request = GenerationRequest(tiny_prompt(6), max_new_tokens=2, chat=False)
    policy = CapturePolicy(logit_lens=3)
    lensed = generate_captured(tiny_lm, request, policy)[0].captures
    records, kept = generate_kept(tiny_lm, request, policy)
    last = len(records[0].prompt) - 1
    resid = {i: kept.input(i + 1)[last].numpy() for i in range(tiny_lm.spec.n_layers)}
    top = service.quick("lens", {"resid": resid, "top": 3})
    assert sorted(lensed) == sorted(top) == [0, 1, 2]
    for i, capture in lensed.items():
        assert [t for t, _ in top[i]] == [t for t, _ in capture.lens]
        assert [p for _, p in top[i]] == pytest.approx([p for _, p in capture.lens], abs=1e-5)




def test_freeze_heap_collects_first_and_later_garbage_is_still_collected():
    """A server's start-up heap is frozen (engine.service.service.freeze_heap): the garbage there was is collected
    before, not frozen for good; objects alive are out of the collector's reach; a cycle made after still goes."""
    import gc
    import weakref

    from engine.service.service import freeze_heap

    class Node:
        pass

    def cycle() -> weakref.ref:
        a, b = Node(), Node()
        a.other, b.other = b, a
        return weakref.ref(a)

    before, alive = cycle(), Node()
    try:
        assert freeze_heap() == gc.get_freeze_count() > 0
        assert before() is None                                   # collected, not frozen
        assert not any(o is alive for o in gc.get_objects())      # frozen: the collector no longer walks it
        after = cycle()
        gc.collect()
        assert after() is None
    finally:
        gc.unfreeze()                                             # the test process as it was
