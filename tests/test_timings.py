"""Why was my answer slow: a scripted room on the tiny model, and the accounting identities of each request's split.

Deterministic by construction, never by speed: the long prompt is submitted from inside the worker (a listener of
the second short request's first decode record), so it joins at a known step; every check is an identity between
the step log and the split, not a time the model must hit.
"""
from __future__ import annotations

import pytest

from conftest import Pause, tiny_prompt, worker_held, write_tiny_llama
from engine.core.generate import GenerationRequest
from engine.core.hooks import CAPTURE_OFF
from engine.core.records import DecodeRecord, DoneRecord
from engine.serving.batch import PREFILL_CHUNK
from engine.serving.limits import Limits
from engine.serving.scheduler import Scheduler
from engine.serving.timeline import _count, _step_parts, split, timeline_dict

EPS = 1e-6          # far above float rounding of sums of perf_counter differences, far below any step
LONG = 600          # prompt tokens of the long request: three prefill chunks of PREFILL_CHUNK


@pytest.fixture(scope="module")
def long_lm(tmp_path_factory):
    from engine.core.loader import load_model

    folder = write_tiny_llama(tmp_path_factory.mktemp("tiny-long"), max_position_embeddings=1024)
    return load_model(str(folder), device="cpu", dtype="float32")


@pytest.fixture
def make_scheduler(long_lm):
    made = []

    def make(**limits) -> Scheduler:
        made.append(Scheduler(long_lm, Limits(**limits)))
        return made[-1]

    yield make
    for s in made:
        s.close()


def short(seed: int, new: int = 16) -> GenerationRequest:
    return GenerationRequest(tiny_prompt(8, seed=seed), max_new_tokens=new, chat=False, seed=seed)


def to_length(scheduler: Scheduler, count: int, new: int = 16) -> list[GenerationRequest]:
    """Short requests that run to their full length alone (no EOS on the way): found by running them."""
    found = []
    for seed in range(60):
        records = scheduler.submit(short(seed, new), CAPTURE_OFF).result(timeout=120)
        if records[-1].finish_reason == "length":
            found.append(short(seed, new))
        if len(found) == count:
            return found
    raise AssertionError("no short request ran to its length")


def assert_adds_up(handle) -> None:
    """The parts of the wall time add up to it; the wall time is the handle's own, not the step log's."""
    timeline, timings = handle.timeline, handle.timings
    parts = timings.split
    end = timeline.stopped if timeline.stopped is not None else handle.finished
    assert parts.total == pytest.approx(end - handle.submitted, abs=EPS)
    assert parts.parts == pytest.approx(parts.total, abs=EPS)
    assert parts.queue == pytest.approx(handle.started - handle.submitted, abs=EPS)
    assert min(parts.queue, parts.prefill, parts.decode, parts.batch, parts.others_prefill) >= 0
    assert parts.between_steps >= -EPS                  # the steps do not overlap and lie within its life
    if timings.first_token_split is not None:
        first = timings.first_token_split
        assert first.parts == pytest.approx(first.total, abs=EPS)
        assert first.total == pytest.approx(timings.time_to_first_token_seconds, abs=EPS)
        assert_a_prefix(handle)


SPLIT = ("queue", "prefill", "decode", "batch", "others_prefill", "between_steps", "total")


def assert_a_prefix(handle) -> None:
    """The split to the first token is a prefix of the whole one: with the split of the rest (the first token to the
    end) it adds up to the whole, part by part, and no part of it exceeds the whole's (the page's two lines tell one
    story: engine.serving.timeline.split's parts are sums of overlaps)."""
    timeline, timings = handle.timeline, handle.timings
    one_row = timings.one_row_step_seconds
    first, whole = timings.first_token_split, timings.split
    rest = split(timeline, one_row, since=timeline.first_token)
    assert rest.parts == pytest.approx(rest.total, abs=EPS) and rest.queue == 0.0
    for part in SPLIT:
        assert getattr(first, part) + getattr(rest, part) == pytest.approx(getattr(whole, part), abs=EPS), part
        if part != "between_steps":
            assert 0.0 <= getattr(first, part) <= getattr(whole, part) + EPS, part


def assert_steps_are_the_logs(scheduler: Scheduler, handle) -> None:
    """A request's steps are exactly the logged steps that ran between its admission and its end."""
    timeline = handle.timeline
    end = timeline.end
    logged = [s for s in scheduler.room().steps if s.started >= timeline.admitted and s.at <= end]
    assert [(s.started, s.seconds) for s in timeline.steps] == [(s.started, s.seconds) for s in logged]


def test_the_short_requests_wait_behind_the_long_prompt_chunk_by_chunk(long_lm, make_scheduler):
    scheduler = make_scheduler(max_batch=4, prefix_cache_mb=0)
    a_req, b_req = to_length(scheduler, 2)
    long_req = GenerationRequest(tiny_prompt(LONG, seed=99), max_new_tokens=4, chat=False)
    joined = []

    def join_long(handle, record) -> None:            # in the worker, at B's first decode step
        if isinstance(record, DecodeRecord) and not joined:
            joined.append(scheduler.submit(long_req, CAPTURE_OFF))

    with worker_held(scheduler):                      # both admitted in one step, whatever the machine's speed
        a = scheduler.submit(a_req, CAPTURE_OFF)
        b = scheduler.submit(b_req, CAPTURE_OFF, listeners=(join_long,))
    for handle in (a, b):
        assert handle.result(timeout=120)[-1].finish_reason == "length"
    c = joined[0]
    c.result(timeout=120)
    chunks = [s for s in c.timeline.steps if s.prefill_tokens(c.id)]
    n_long = c.timeline.prompt_tokens
    assert n_long >= LONG and len(chunks) == -(-n_long // PREFILL_CHUNK) == 3
    assert sum(s.prefill_tokens(c.id) for s in chunks) == n_long
    assert all(s.prefills == ((c.id, s.prefill_tokens(c.id)),) for s in chunks)   # nobody else's in those steps
    for short_handle in (a, b):
        timeline, timings = short_handle.timeline, short_handle.timings
        shared = [s for s in timeline.steps if s.prefill_tokens(c.id)]
        assert shared == chunks                                   # it decoded through every chunk of the long prompt
        for step in timeline.steps:                               # step by step: the stall is the long prompt's
            parts = _step_parts(step, timeline.id, timings.one_row_step_seconds, timeline.admitted, timeline.end)
            if step in chunks:
                assert parts["others"] == pytest.approx(step.prefill_seconds, abs=EPS) and step.prefill_seconds > 0
                assert parts["prefill"] == 0.0 and timeline.id in step.rows
            elif not step.prefill_tokens(timeline.id):
                assert parts["others"] == pytest.approx(step.prefill_seconds, abs=EPS)
        others = [s.prefill_seconds * (1 - s.prefill_tokens(timeline.id) / s.prefill_tokens())
                  for s in timeline.steps if s.prefills]          # a padded pass shared with B: by tokens
        assert timings.split.others_prefill == pytest.approx(sum(others), abs=EPS)
        assert timings.split.others_prefill >= sum(s.prefill_seconds for s in chunks) - EPS
        # the long prompt is among those it waited behind, with every token; not necessarily first: A and B's
        # shared first pass can weigh more than the long prompt's three chunks on a machine that reads those fast
        long_one = next(x for x in timings.behind if x.id == c.id)
        assert long_one.tokens == n_long and long_one.seconds >= sum(s.prefill_seconds for s in chunks) - EPS
        assert min(timings.batch_sizes) >= 2 if short_handle is b else max(timings.batch_sizes) >= 2
        assert_adds_up(short_handle)
        assert_steps_are_the_logs(scheduler, short_handle)
    long_split = c.timings.first_token_split
    assert c.timings.split.prefill == pytest.approx(sum(s.prefill_seconds for s in chunks), abs=EPS)
    first = c.timeline.first_token                                # sampled inside the last chunk's prefill part
    assert long_split.prefill == pytest.approx(sum(min(s.started + s.prefill_seconds, first) - s.started
                                                   for s in chunks), abs=EPS)
    assert long_split.batch > 0 and long_split.others_prefill == pytest.approx(0.0, abs=EPS)
    assert c.timings.behind == ()
    assert_adds_up(c)
    assert_steps_are_the_logs(scheduler, c)


def test_a_request_alone_has_no_waiting_and_nothing_added_by_others(make_scheduler):
    scheduler = make_scheduler(max_batch=4)
    (req,) = to_length(scheduler, 1, new=12)
    handle = scheduler.submit(req, CAPTURE_OFF)
    assert handle.result(timeout=120)[-1].generated_tokens == 12
    timeline, timings = handle.timeline, handle.timings
    assert timeline.wait_reason == "" and timeline.waited_steps == 0 and timeline.ahead == 0
    assert timings.split.others_prefill == 0.0 and timings.split.batch == 0.0 and timings.behind == ()
    assert timings.batch_sizes == {1: 11}                         # 11 decode steps of one row after the prefill
    assert timings.alone_seconds is not None and timings.one_row_step_seconds is not None
    assert_adds_up(handle)
    assert_steps_are_the_logs(scheduler, handle)


def test_a_stopped_request_s_timeline_ends_at_its_stop(make_scheduler):
    scheduler = make_scheduler(max_batch=4)
    (req,) = to_length(scheduler, 1, new=40)

    def stop_at_the_third(handle, record) -> None:   # in the worker: Stop pressed during a known step
        if isinstance(record, DecodeRecord) and record.step == 3:
            handle.cancel()

    handle = scheduler.submit(req, CAPTURE_OFF, listeners=(stop_at_the_third,))
    done = handle.result(timeout=120)[-1]
    assert isinstance(done, DoneRecord) and done.finish_reason == "cancelled"
    timeline, timings = handle.timeline, handle.timings
    assert timeline.stop_pressed <= timeline.stopped <= handle.finished
    assert all(s.ended <= timeline.stopped for s in timeline.steps)        # nothing after the Stop
    assert len(timeline.steps) == done.generated_tokens - 1 == 3         # the prefill step decodes too
    assert timings.stopped and timings.split.total == pytest.approx(timeline.stopped - handle.submitted, abs=EPS)
    assert timeline_dict(timeline)["events"]["stopped"] is not None
    assert_adds_up(handle)


def test_a_request_cancelled_while_queued_only_waited(make_scheduler):
    scheduler = make_scheduler(max_batch=1)
    (req,) = to_length(scheduler, 1, new=40)
    with Pause() as pause:                           # the running one held at its first token: it cannot have ended
        running = scheduler.submit(req, CAPTURE_OFF, listeners=(pause,))    # before the second comes, however fast
        pause.wait()
        queued = scheduler.submit(short(1), CAPTURE_OFF)
        queued.cancel()
    running.result(timeout=120)
    assert queued.timeline.wait_reason == "the batch full"
    assert queued.timings.split.queue == pytest.approx(queued.timings.split.total, abs=EPS)
    assert split(queued.timeline, None).parts == pytest.approx(queued.timings.split.total, abs=EPS)


def test_without_timelines_nothing_is_kept(make_scheduler):
    scheduler = make_scheduler(max_batch=4)
    scheduler.keep_timelines = False
    handle = scheduler.submit(short(0, new=4), CAPTURE_OFF)
    handle.result(timeout=120)
    assert handle.timeline is None and handle.timings is None


def test_the_alone_estimate_counts_in_words_a_projector_can_read():
    """'1 pass', not '1 pass(es)' (the journey page's alone caption, read at 1024x768)."""
    assert [_count(n, w) for n, w in ((1, "pass"), (3, "pass"), (1, "prompt token"), (1024, "prompt token"))] == \
        ["1 pass", "3 passes", "1 prompt token", "1,024 prompt tokens"]
