"""The scheduler: many sessions share one tiny model; each gets exactly its own tokens and captures."""
from __future__ import annotations

import importlib.util
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from streamlit.testing.v1 import AppTest

from conftest import Pause, ticking_clock, tiny_prompt, worker_held
from engine.errors import EngineError, InvalidRequestError, QueueFullError, RequestTimeoutError
from engine.core.generate import GenerationRequest, generate, generate_kept
from engine.core.kept import kept_for
from engine.core.hooks import CAPTURE_ALL, CAPTURE_OFF, CapturePolicy, count_hooks
from engine.serving.limits import Limits
from engine.core.records import DecodeRecord, DoneRecord, PrefillRecord
from engine.serving.scheduler import Scheduler, SessionLimitError, scheduler_for

POLICY = CapturePolicy(layers=(0, 2), logit_lens=3)
ROOT = Path(__file__).resolve().parent.parent


def request(seed: int, new: int = 12, **kw) -> GenerationRequest:
    return GenerationRequest(tiny_prompt(8 + seed % 5, seed=seed), max_new_tokens=new, chat=False, **kw)


_LONG_SEED: list[int] = []


def long_request(lm, new: int = 200) -> GenerationRequest:
    """A request that runs to its full length (no EOS on the way), found once by trying prompts."""
    if not _LONG_SEED:
        _LONG_SEED.append(next(seed for seed in range(50)
                               if alone(lm, request(seed, new=240), CAPTURE_OFF)[-1].finish_reason == "length"))
    assert new <= 240
    return request(_LONG_SEED[0], new=new)


@pytest.fixture
def make_scheduler(tiny_lm):
    made = []

    def make(**limits) -> Scheduler:
        made.append(Scheduler(tiny_lm, Limits(**limits)))
        return made[-1]

    yield make
    for s in made:
        s.close()
    assert count_hooks(tiny_lm.model) == 0


def wait_until(check, seconds: float = 60.0) -> None:
    """Polls `check`; the limit only guards against a hang (the condition never depends on the model's speed)."""
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def token_ids(records) -> list[int]:
    return [r.token.id for r in records if isinstance(r, (PrefillRecord, DecodeRecord))]


def alone(lm, req, policy=POLICY):
    with lm.lock:
        return list(generate(lm, req, policy))


def same_residual(a, b) -> bool:
    """Equal within float32 tolerance: a batched forward rounds differently from a forward of one."""
    return a.layers == b.layers and a.length == b.length and all(
        torch.allclose(a.input(i), b.input(i), atol=1e-5, rtol=1e-4) for i in b.layers)


def test_concurrent_sessions_each_get_exactly_their_own_tokens_and_captures(tiny_lm, make_scheduler):
    scheduler = make_scheduler()
    seeds = list(range(6))
    results: dict[int, list] = {}

    kept = {s: kept_for(tiny_lm, POLICY, 64) for s in seeds}

    def session(seed: int) -> None:
        handle = scheduler.submit(request(seed), POLICY, session=f"s{seed}", kept=kept[seed])
        results[seed] = handle.result(timeout=120)

    threads = [threading.Thread(target=session, args=(s,)) for s in seeds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == seeds
    texts = set()
    for seed in seeds:
        with tiny_lm.lock:
            ref, ref_kept = generate_kept(tiny_lm, request(seed), POLICY)
        got = results[seed]
        assert token_ids(got) == token_ids(ref)
        assert got[-1].text == ref[-1].text
        texts.add(got[-1].text)
        for g, r in zip(got[:-1], ref[:-1]):
            assert g.cache.length == r.cache.length
        assert same_residual(kept[seed], ref_kept)                  # its own residual, no one else's
    assert len(texts) > 1   # different prompts gave different answers: the check above can tell them apart


def test_waiting_sessions_see_their_position_and_an_estimated_wait(make_scheduler):
    scheduler = make_scheduler(max_batch=1)                      # one at a time: a queue of four
    first = scheduler.submit(request(0, new=30), CAPTURE_OFF)
    first.result(timeout=60)                       # one finished request gives the estimate something to use
    with Pause() as pause:
        handles = [scheduler.submit(request(1, new=30), CAPTURE_OFF, listeners=(pause,))]
        handles += [scheduler.submit(request(s, new=30), CAPTURE_OFF) for s in range(2, 5)]
        pause.wait()                               # the first runs, held at its first token: three wait behind it
        statuses = [h.status() for h in handles]
        assert [s.state for s in statuses] == ["running", "queued", "queued", "queued"]
        queued = statuses[1:]
        assert [s.position for s in queued] == [1, 2, 3]
        assert all(s.estimated_wait is not None and s.estimated_wait >= 0 for s in queued)
        assert [s.estimated_wait for s in queued] == sorted(s.estimated_wait for s in queued)
        seen = []

        def on_wait(status) -> None:
            seen.append(status)
            pause.release()                        # the last one has seen itself waiting: let the line move

        last = list(handles[-1].records(on_wait=on_wait, poll=0.01))
    assert isinstance(last[-1], DoneRecord)
    waiting = [s.position for s in seen if s.state == "queued"]
    assert waiting and waiting == sorted(waiting, reverse=True) and waiting[-1] >= 1   # it moved up the queue
    for h in handles:
        h.result(timeout=60)
    assert all(h.state == "done" for h in handles)
    assert scheduler.stats().served == 5
    spans = scheduler.timeline()
    assert [s.id for s in spans] == [first.id] + [h.id for h in handles]          # first come, first served
    assert all(a.finished <= b.started for a, b in zip(spans, spans[1:]))        # one at a time
    assert all(s.submitted <= s.started <= s.finished and s.state == "done" and 1 <= s.tokens <= 30 for s in spans)


def test_cancel_a_queued_and_a_running_request(tiny_lm, make_scheduler):
    scheduler = make_scheduler()
    long = long_request(tiny_lm, 200)
    with Pause() as pause:
        running = scheduler.submit(long, CAPTURE_OFF, listeners=(pause,))
        pause.wait()                                # running, held at its first token
        queued = scheduler.submit(request(1), CAPTURE_OFF)
        assert queued.status().state == "queued"    # the batch takes newcomers only between steps
        queued.cancel()
        assert queued.state == "cancelled" and queued.result(timeout=5) == []
        first = running.get(timeout=30)             # the prefill record: it is running
        assert isinstance(first, PrefillRecord)
        running.cancel()                            # before its second token, on any machine
    rest = running.result(timeout=30)
    assert isinstance(rest[-1], DoneRecord) and rest[-1].finish_reason == "cancelled"
    assert rest[-1].generated_tokens < 200 and running.state == "cancelled"
    after = scheduler.submit(request(2), CAPTURE_OFF).result(timeout=30)
    assert token_ids(after) == token_ids(alone(tiny_lm, request(2), CAPTURE_OFF))


def test_a_reader_sees_the_end_only_after_every_listener_has(make_scheduler):
    """`result()` returning means the listeners (the run store's close) have run: a fast machine's reader won that race."""
    scheduler = make_scheduler()
    ended = []

    def slow_close(handle, record) -> None:            # a run store closing slowly, in the worker
        if record is handle.END:
            time.sleep(0.3)
            ended.append(handle.state)

    handle = scheduler.submit(request(0, new=3), CAPTURE_OFF, listeners=(slow_close,))
    assert isinstance(handle.result(timeout=60)[-1], DoneRecord)
    assert ended == ["done"]


def test_a_stop_after_the_final_record_leaves_the_request_done(make_scheduler):
    """A reader that has the final record and then stops (a script that breaks out at the DoneRecord, a Stop pressed a
    moment late) finds the request done and served, not cancelled: the worker settles it after the reader has the
    record, so on a fast reader the Stop came first. Held at its DoneRecord by a listener: that order on any machine."""
    scheduler = make_scheduler()
    at_end, go = threading.Event(), threading.Event()

    def hold_at_done(handle, record) -> None:             # in the worker, after the reader has the record
        if isinstance(record, DoneRecord):
            at_end.set()
            go.wait(120)                                  # only a guard against a test that never releases it

    handle = scheduler.submit(request(0, new=3), CAPTURE_OFF, listeners=(hold_at_done,))
    try:
        for record in handle.records():
            if isinstance(record, DoneRecord):
                break                                     # closing the iterator stops a request not yet done...
        assert at_end.wait(120)
        handle.cancel()                                   # ...and so does a Stop: both after its end, so no-ops
    finally:
        go.set()
    assert handle.result(timeout=60) == [] and handle.state == "done" and handle.error is None
    stats = scheduler.stats()
    assert (stats.served, stats.cancelled) == (1, 0)
    assert handle.timeline.stop_pressed is None and not handle.timings.stopped


def test_closing_the_record_iterator_cancels_the_request(tiny_lm, make_scheduler):
    scheduler = make_scheduler()
    long = long_request(tiny_lm, 200)
    with Pause() as pause:                            # held at its first token until the page has stopped reading
        handle = scheduler.submit(long, CAPTURE_OFF, listeners=(pause,))
        for _ in handle.records():
            break                                     # a page that stopped reading (Stop button, left the page)
    wait_until(lambda: handle.done)
    assert handle.state == "cancelled" and handle.tokens < 200


def test_a_full_queue_refuses_with_a_message(make_scheduler):
    scheduler = make_scheduler(max_queue=1, max_batch=1)
    with Pause() as pause:
        running = scheduler.submit(request(0, new=100), CAPTURE_OFF, listeners=(pause,))
        pause.wait()                                  # now running (and held), so the queue is empty
        waiting = scheduler.submit(request(1), CAPTURE_OFF)
        with pytest.raises(QueueFullError, match="^1 request is already waiting for a place in the batch, the most"):
            scheduler.submit(request(2), CAPTURE_OFF)
    assert scheduler.stats().refused == 1
    for h in (running, waiting):
        assert isinstance(h.result(timeout=60)[-1], DoneRecord)


def test_a_request_over_the_wall_time_limit_is_stopped_with_a_message(tiny_lm, make_scheduler):
    scheduler = make_scheduler(request_seconds=20)
    scheduler.clock = ticking_clock()                 # a second per reading: at least one reading per step
    handle = scheduler.submit(long_request(tiny_lm, 240), CAPTURE_ALL)
    records = handle.result(timeout=60)
    done = records[-1]
    assert isinstance(done, DoneRecord) and done.finish_reason == "timeout"
    assert isinstance(handle.error, RequestTimeoutError) and "stopped after 20 s, the time limit" in str(handle.error)
    assert 1 <= done.generated_tokens <= 21    # of 240: the prefill's token, then at most one per reading
    assert scheduler.stats().timed_out == 1
    assert count_hooks(tiny_lm.model) == 0
    nxt = scheduler.submit(request(3), CAPTURE_OFF).result(timeout=30)
    assert nxt[-1].finish_reason in ("length", "eos")


def test_sessions_over_the_limit_are_refused_and_a_resubmit_replaces_the_old_request(make_scheduler):
    scheduler = make_scheduler(max_sessions=2, max_batch=1)
    with Pause() as pause:
        a = scheduler.submit(request(0, new=100), CAPTURE_OFF, session="a", listeners=(pause,))
        pause.wait()                                                    # a runs, held: b waits behind it
        b = scheduler.submit(request(1), CAPTURE_OFF, session="b")
        with pytest.raises(SessionLimitError, match="sessions"):
            scheduler.submit(request(2), CAPTURE_OFF, session="c")
        b2 = scheduler.submit(request(3), CAPTURE_OFF, session="b")   # same session again: replaces b
        assert b.state == "cancelled"
    assert isinstance(b2.result(timeout=60)[-1], DoneRecord)
    a.result(timeout=60)
    scheduler.leave("a")
    scheduler.join("c")                                                 # a left, so c fits now


def test_the_room_counts_people_not_page_loads(make_scheduler):
    """Reloads and tabs of one browser are one person; a tab that is gone frees its place at once."""
    scheduler = make_scheduler(max_sessions=2)
    connected = {"tab1", "tab2", "tab3", "other"}
    scheduler.presence = lambda session: session in connected
    for tab in ("tab1", "tab2", "tab3"):                        # one person reloading: three sessions
        scheduler.join(tab, person="alice")
    scheduler.join("other", person="bob")
    assert scheduler.stats().sessions == 2
    with pytest.raises(SessionLimitError, match="at the latest in 15 minute"):
        scheduler.join("new", person="carol")
    connected -= {"tab1", "tab2", "tab3"}                      # alice closed her tabs
    scheduler.join("new", person="carol")
    assert scheduler.stats().sessions == 2


def test_a_resubmit_into_a_full_queue_replaces_the_old_request(tiny_lm, make_scheduler):
    scheduler = make_scheduler(max_queue=1, max_batch=1)
    long = long_request(tiny_lm, 200)
    with Pause() as pause:
        running = scheduler.submit(long, CAPTURE_OFF, session="a", listeners=(pause,))
        pause.wait()                                                     # running, held
        mine = scheduler.submit(request(1), CAPTURE_OFF, session="b")
        with pytest.raises(QueueFullError):
            scheduler.submit(request(2), CAPTURE_OFF, session="c")
        again = scheduler.submit(request(3), CAPTURE_OFF, session="b")  # takes the place of its own request
        assert mine.state == "cancelled" and again.status().position == 1
        running.cancel()
    assert isinstance(again.result(timeout=60)[-1], DoneRecord)


def test_invalid_requests_are_refused_at_submit_and_nothing_is_queued(make_scheduler):
    scheduler = make_scheduler()
    for bad in (GenerationRequest("   "), GenerationRequest("w1", temperature=-1.0),
                GenerationRequest("w1", max_new_tokens=0)):
        with pytest.raises(InvalidRequestError):
            scheduler.submit(bad)
    assert scheduler.stats().refused == 3 and scheduler.stats().submitted == 0


def test_a_failure_while_running_reaches_its_session_and_the_next_request_runs(tiny_lm, make_scheduler):
    from engine.speculative.decode import NgramDraft

    scheduler = make_scheduler()
    broken = scheduler.submit(request(0), CAPTURE_OFF, draft=NgramDraft(max_ngram=99))  # checked when it runs
    with pytest.raises(EngineError, match="n-gram"):
        list(broken.records())
    assert broken.state == "failed"
    ok = scheduler.submit(request(1), CAPTURE_OFF).result(timeout=30)
    assert token_ids(ok) == token_ids(alone(tiny_lm, request(1), CAPTURE_OFF))
    assert scheduler.stats().failed == 1


def test_speculative_requests_through_the_scheduler_match_plain_greedy_text(tiny_lm, make_scheduler):
    from engine.speculative.decode import NgramDraft

    scheduler = make_scheduler()
    req = request(4, new=20)
    records = scheduler.submit(req, CAPTURE_OFF, draft=NgramDraft(), k=3).result(timeout=60)
    assert records[-1].text == alone(tiny_lm, req, CAPTURE_OFF)[-1].text
    assert records[-1].k == 3


def test_requests_share_the_batch_and_the_room_sees_it(tiny_lm, make_scheduler):
    scheduler = make_scheduler(max_batch=3)
    long = long_request(tiny_lm, 40)
    with worker_held(scheduler):                      # they all arrive before a step: three start in one step
        handles = [scheduler.submit(long, POLICY, session=f"r{i}") for i in range(5)]
        statuses = [h.status() for h in handles]
    for h in handles:
        h.result(timeout=120)
    assert all(h.state == "done" for h in handles)
    spans = {s.id: s for s in scheduler.timeline()}
    first, fourth = spans[handles[0].id], spans[handles[3].id]
    assert spans[handles[1].id].started < first.finished and spans[handles[2].id].started < first.finished
    assert fourth.started >= min(spans[h.id].finished for h in handles[:3])     # waited for a place
    steps = scheduler.room().steps
    assert max(s.decode_rows for s in steps) == 3 and all(s.decode_rows <= 3 for s in steps)
    assert {t for s in steps for t in s.tags} == {h.id for h in handles}
    assert [(s.state, s.position, s.ahead, s.batch) for s in statuses] == [("queued", i, i - 1, 3) for i in range(1, 6)]


def test_a_queued_request_estimates_from_the_measured_steps(tiny_lm, make_scheduler):
    scheduler = make_scheduler(max_batch=2)
    long = long_request(tiny_lm, 200)
    with Pause(at=3) as pause:
        with worker_held(scheduler):                     # both join the batch in its first step
            running = [scheduler.submit(long, CAPTURE_OFF, listeners=(pause,)), scheduler.submit(long, CAPTURE_OFF)]
        pause.wait()                                     # held in the third step: two measured, tokens stand still
        waiting = scheduler.submit(request(1), CAPTURE_OFF)
        status = waiting.status()
        step = scheduler.stats().step_seconds
        left = min(200 - h.tokens for h in running)
        assert step is not None and status.state == "queued" and status.position == 1 and status.ahead == 0
        assert status.estimated_wait == pytest.approx(left * step, rel=1e-9)
        for h in running:
            h.cancel()
    assert isinstance(waiting.result(timeout=60)[-1], DoneRecord)


def test_jobs_run_alone_in_their_turn_and_report_progress(tiny_lm, make_scheduler):
    scheduler = make_scheduler(max_batch=4)
    seen_locked = []

    def job(progress):
        progress(0.5, "half way")
        seen_locked.append(tiny_lm.lock.locked())
        return 42

    plain = scheduler.submit(request(0, new=20), CAPTURE_OFF)
    handle = scheduler.submit_job(job, "speed lab: context sweep", session="lab")
    records = handle.result(timeout=60)
    assert [r.kind for r in records] == ["progress", "result"] and records[-1].value == 42
    assert seen_locked == [True] and handle.state == "done"
    assert isinstance(plain.result(timeout=60)[-1], DoneRecord)
    spans = {s.id: s for s in scheduler.timeline()}
    assert spans[plain.id].finished <= spans[handle.id].started                # the batch drained first


def test_no_code_outside_the_scheduler_takes_the_models_lock():
    """One door to the model: pages, the speed lab and recordings all go through the scheduler."""
    import re

    takers = [f"{path.relative_to(ROOT)}:{n}" for folder in ("engine", "app", "pages")
              for path in sorted((ROOT / folder).rglob("*.py")) if path.name != "scheduler.py"
              for n, line in enumerate(path.read_text().splitlines(), 1) if re.search(r"\blm\.lock\b", line)]
    assert takers == []


def test_scheduler_for_returns_one_scheduler_per_model(tiny_lm):
    assert scheduler_for(tiny_lm) is scheduler_for(tiny_lm)


def load_bench():
    """bench/load.py as a module (bench/ is a folder of scripts, not a package)."""
    spec = importlib.util.spec_from_file_location("bench_load", ROOT / "bench" / "load.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module                  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("sessions,queue", [(5, 32), (20, 8)])
def test_load_of_many_sessions_loses_nothing(tiny_lm, sessions, queue):
    """A short bench/load.py on the tiny model: each session finishes with its own answer or is refused."""
    bench = load_bench()
    expected = bench.references(tiny_lm, 8)
    result = bench.scenario(tiny_lm, sessions, 8, CAPTURE_ALL, Limits(max_queue=queue), expected)
    assert result["errors"] == [] and result["lost"] == 0 and result["wrong_answers"] == 0
    assert result["served"] + result["refused"] == sessions
    fit = queue + Limits().max_batch                              # a full batch plus a full queue always fit
    assert result["served"] >= min(sessions, fit)
    assert all("waiting" in m for m in result["refusal_messages"]) and (result["refused"] > 0) == (sessions > fit)
    assert result["hooks_left"] == 0 and bench.ok(result, rss_bound_mb=512)
    assert result["wait_p95_s"] >= result["wait_p50_s"] >= 0 and result["throughput_tok_s"] > 0
    assert result["tie_divergences"] == 0                         # float32 on a CPU: every answer is the same


def test_the_load_benchmark_tells_a_rounding_tie_from_a_wrong_answer(tiny_lm):
    """bench/load.py's verdict: an answer that leaves the alone run where the alone run's two best raw logits were
    within rounding is a tie (bf16 on a GPU); leaving it at a clear winner, or at a token outside the kept logits,
    is wrong."""
    bench = load_bench()
    ref = bench.references(tiny_lm, 6)[bench.PROMPTS[0]]
    assert ref.verdict(ref.ids, ref.text) == "same" and len(ref.ids) == len(ref.logits) == 6
    kept_ids, kept = ref.logits[2]
    runner_up = int(kept_ids[1])                                  # the alone run's second choice at step 2
    left = ref.ids[:2] + [runner_up, 7]
    margin = float(kept[0] - kept[1]) / max(1.0, abs(float(kept[0])))
    loose = bench.Reference(ref.text, ref.ids, ref.logits, eps=2 * margin / bench.TIE_EPS)
    tight = bench.Reference(ref.text, ref.ids, ref.logits, eps=margin / bench.TIE_EPS / 2)
    assert loose.verdict(left, "other") == "tie" and tight.verdict(left, "other") == "wrong"
    assert loose.verdict(ref.ids[:2] + [int(kept_ids[-1]) + 10**6], "other") == "wrong"   # not among the kept
    assert loose.verdict(ref.ids, "same ids, other text") == "wrong"


def streaming_page(lm, prompt: str, session: str) -> None:
    """A minimal page that streams its answer through the scheduler, as app/runs/run.py would."""
    import streamlit as st

    from engine.errors import EngineError
    from engine.core.generate import GenerationRequest
    from engine.core.hooks import CapturePolicy
    from engine.serving.scheduler import scheduler_for

    answer, waiting = st.empty(), st.empty()
    request = GenerationRequest(prompt, max_new_tokens=10, chat=False)
    try:
        handle = scheduler_for(lm).submit(request, CapturePolicy(layers=(1,)), session=session)
    except EngineError as err:
        st.error(str(err))
        st.stop()
    pieces = []
    try:
        for record in handle.records(on_wait=lambda s: waiting.info(f"Position {s.position} in the queue")):
            if hasattr(record, "token"):
                pieces.append(record.token.id)
                answer.text(" ".join(map(str, pieces)))
    finally:
        handle.cancel()
    st.text(f"{handle.state} {len(pieces)}")


def test_streamlit_sessions_in_threads_each_stream_their_own_answer(tiny_lm, monkeypatch):
    """Four Streamlit sessions in one process stream their own answers through one scheduler at once. AppTest keeps a
    process-wide mock Runtime (`Runtime._instance`) that each run sets and clears when it ends: in threads, a session
    that finished first cleared it under another still ending its script ("Runtime hasn't been created!"; seen when
    the machine was fast enough that one answer ended before another's script). The sessions share the first mock
    for their lifetime, as a server's sessions share its one Runtime."""
    from streamlit.runtime.runtime import Runtime
    kept: list = []

    def instance(cls):  # the first mock a run set, kept while the threads run
        if cls._instance is not None and not kept:
            kept.append(cls._instance)
        return cls._instance or kept[0]
    monkeypatch.setattr(Runtime, "instance", classmethod(instance))
    prompts = [tiny_prompt(6 + i, seed=20 + i) for i in range(4)]
    apps = [AppTest.from_function(streaming_page, args=(tiny_lm, p, f"app{i}"), default_timeout=120)
            for i, p in enumerate(prompts)]
    threads = [threading.Thread(target=app.run) for app in apps]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for app, prompt in zip(apps, prompts):
        assert not app.exception and not app.error
        want = token_ids(alone(tiny_lm, GenerationRequest(prompt, max_new_tokens=10, chat=False), CAPTURE_OFF))
        texts = [t.value for t in app.text]
        assert texts[0] == " ".join(map(str, want)) and texts[-1] == f"done {len(want)}"


def test_mixed_steps_stay_out_of_the_measured_prefill_and_one_row_rates(make_scheduler):
    """A mixed step ran a prompt and a decoding row in one forward: its prefill part is a share by tokens, so the
    alone estimate's rates learn only from steps that timed prefill apart and from one-row decode-only steps."""
    from engine.serving.batch import StepInfo    # here: only this test builds the runner's step records itself
    sched = make_scheduler()

    def lived(**kw) -> None:
        defaults = dict(at=1.0, seconds=1.0, decode_rows=0, prefill_tokens=0, tags=(), cache_positions=0,
                        real_positions=0)
        sched._lived(StepInfo(**{**defaults, **kw}))

    lived(decode_rows=1, prefill_tokens=30, prefills=(("new", 30),), prefill_seconds=0.9, mixed=True)
    assert sched.rates().prefill_per_token is None and sched.rates().one_row_step is None
    lived(prefill_tokens=30, prefills=(("new", 30),), prefill_seconds=0.3, seconds=0.4)
    lived(decode_rows=1, seconds=0.02)
    assert sched.rates().prefill_per_token == pytest.approx(0.01) and sched.rates().one_row_step == 0.02
