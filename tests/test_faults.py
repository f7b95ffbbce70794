"""Faults survived, through the scheduler's public API only: a model call that raises fails its own request
alone with a clear message and the next request runs; a browser that disconnects mid-stream frees its request
and its place. The real tiny model runs throughout; a fault is injected by wrapping its forward."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import pytest
import torch

from conftest import Pause, tiny_prompt
from engine.errors import EngineError
from engine.core.generate import GenerationRequest, generate
from engine.core.hooks import CAPTURE_OFF, CapturePolicy, count_hooks
from engine.serving.limits import Limits
from engine.core.records import DecodeRecord, DoneRecord, PrefillRecord
from engine.serving.scheduler import Scheduler

POLICY = CapturePolicy(layers=(0, 2), logit_lens=3)
POISON = "w90"                     # a word only the faulty request's prompt holds (tiny_prompt draws w0..w79)


def request(seed: int, new: int = 8, prompt: str | None = None) -> GenerationRequest:
    return GenerationRequest(prompt or tiny_prompt(8 + seed % 4, seed=seed), max_new_tokens=new, chat=False)


def token_ids(records: list) -> list[int]:
    return [r.token.id for r in records if isinstance(r, (PrefillRecord, DecodeRecord))]


def alone(lm, req: GenerationRequest, policy: CapturePolicy = POLICY) -> list[int]:
    with lm.lock:
        return token_ids(list(generate(lm, req, policy)))


@contextmanager
def faulty_forward(model: torch.nn.Module, fails: Callable[[torch.Tensor, int], bool],
                   error: Exception) -> Iterator[dict]:
    """The real forward, except that the first call for which `fails(input_ids, call_number)` holds raises."""
    real, seen = model.forward, {"calls": 0, "raised": 0}

    def forward(*args, **kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        seen["calls"] += 1
        if not seen["raised"] and ids is not None and fails(ids, seen["calls"]):
            seen["raised"] += 1
            raise error
        return real(*args, **kwargs)

    model.forward = forward
    try:
        yield seen
    finally:
        del model.forward                          # the class's own forward again


@pytest.fixture
def scheduler(tiny_lm):
    made = Scheduler(tiny_lm, Limits())
    yield made
    made.close()
    assert count_hooks(tiny_lm.model) == 0
    assert "forward" not in vars(tiny_lm.model)


def consume(handle) -> tuple[list, EngineError | None]:
    records, error = [], None
    try:
        for record in handle.records(poll=0.05):
            records.append(record)
    except EngineError as err:
        error = err
    return records, error


def wait_until(check: Callable[[], bool], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def model_is_free(lm) -> bool:
    if not lm.lock.acquire(blocking=False):
        return False
    lm.lock.release()
    return True


# --- a model call that raises ----------------------------------------------------------------------------------

def test_an_out_of_memory_in_one_request_fails_it_alone_and_the_others_are_served(tiny_lm, scheduler):
    poison_id = tiny_lm.tokenizer.convert_tokens_to_ids(POISON)
    bad = request(0, prompt=tiny_prompt(10, seed=1) + f" {POISON}")
    good = [request(seed) for seed in (2, 3, 4)]
    want = [alone(tiny_lm, r) for r in good]
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    with faulty_forward(tiny_lm.model, lambda ids, _: bool((ids == poison_id).any()), oom) as seen:
        handles = [scheduler.submit(bad, POLICY, session="unlucky")]
        wait_until(lambda: handles[0].state != "queued")    # its prompt is read in a pass of its own: the
        handles += [scheduler.submit(r, POLICY, session=f"s{i}") for i, r in enumerate(good)]   # others join later
        outcomes: dict[int, tuple] = {}
        threads = [threading.Thread(target=lambda i=i, h=h: outcomes.__setitem__(i, consume(h)))
                   for i, h in enumerate(handles)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert seen["raised"] == 1
    records, error = outcomes[0]
    assert error is not None and handles[0].state == "failed" and not any(isinstance(r, DoneRecord) for r in records)
    message = str(error)
    assert "memory" in message.lower() and "try again" in message and "\n" not in message
    for i, tokens in enumerate(want, 1):
        got, err = outcomes[i]
        assert err is None and isinstance(got[-1], DoneRecord) and token_ids(got) == tokens
    after = scheduler.submit(request(5), POLICY, session="unlucky").result(timeout=60)      # the next one runs
    assert token_ids(after) == alone(tiny_lm, request(5))
    stats = scheduler.stats()
    assert (stats.failed, stats.served, stats.queued, stats.running) == (1, 4, 0, False)
    assert model_is_free(tiny_lm)


def test_a_fault_in_the_middle_of_decoding_ends_that_stream_with_a_message(tiny_lm, scheduler):
    req = request(7, new=12)
    with faulty_forward(tiny_lm.model, lambda ids, calls: calls == 4, RuntimeError("device lost")) as seen:
        handle = scheduler.submit(req, CAPTURE_OFF, session="a")
        records, error = consume(handle)
    assert seen["raised"] == 1 and 1 <= len(records) < 12
    assert error is not None and "device lost" in str(error) and handle.state == "failed"
    assert token_ids(records) == alone(tiny_lm, req, CAPTURE_OFF)[:len(records)]            # what came was right
    assert token_ids(scheduler.submit(req, CAPTURE_OFF, session="a").result(timeout=60)) == alone(tiny_lm, req,
                                                                                                  CAPTURE_OFF)
    assert count_hooks(tiny_lm.model) == 0 and model_is_free(tiny_lm)


# --- a browser that goes away ------------------------------------------------------------------------------------

def long_request(tiny_lm) -> GenerationRequest:
    """A request that runs to its full length, so that it is still streaming when the browser leaves."""
    for seed in range(50):
        req = request(seed, new=200)
        if len(alone(tiny_lm, req, CAPTURE_OFF)) == 200:
            return req
    raise AssertionError("no prompt runs to 200 tokens")


def test_a_browser_that_disconnects_mid_stream_frees_its_request_and_its_place(tiny_lm, scheduler):
    with Pause(at=2) as pause:                            # held at its second record until the tab has closed: still
        handle = scheduler.submit(long_request(tiny_lm), POLICY, session="tab", listeners=(pause,))   # running then
        stream = handle.records(poll=0.05)
        first = [next(stream), next(stream)]              # the page drew two records, then the tab closed
        stream.close()
    assert isinstance(first[0], PrefillRecord)
    wait_until(lambda: handle.done and not scheduler.stats().running)
    assert handle.state == "cancelled" and handle.tokens < 200
    assert scheduler.stats().cancelled == 1 and model_is_free(tiny_lm)
    other = scheduler.submit(request(11), POLICY, session="someone-else").result(timeout=60)
    assert token_ids(other) == alone(tiny_lm, request(11))
    again = scheduler.submit(request(12), POLICY, session="tab").result(timeout=60)          # the tab came back
    assert isinstance(again[-1], DoneRecord) and count_hooks(tiny_lm.model) == 0


def test_an_error_in_the_page_while_streaming_cancels_the_request(tiny_lm, scheduler):
    with Pause() as pause, pytest.raises(KeyboardInterrupt):   # held at its first record until the page has stopped
        handle = scheduler.submit(long_request(tiny_lm), CAPTURE_OFF, session="tab", listeners=(pause,))
        for _ in handle.records(poll=0.05):
            raise KeyboardInterrupt                     # how a script is stopped: an exception in the loop body
    wait_until(lambda: handle.done and not scheduler.stats().running)
    assert handle.state == "cancelled" and model_is_free(tiny_lm)


def test_a_session_that_leaves_frees_its_place_in_a_full_room(tiny_lm):
    scheduler = Scheduler(tiny_lm, Limits(max_sessions=1))
    try:
        scheduler.join("first")
        with Pause() as pause:                                     # held at its first record until the tab has closed
            handle = scheduler.submit(long_request(tiny_lm), CAPTURE_OFF, session="first", listeners=(pause,))
            pause.wait()
            with pytest.raises(EngineError, match="already serves 1 person"):
                scheduler.join("second")
            scheduler.leave("first")                               # the tab closed
        wait_until(lambda: handle.done)
        assert handle.state == "cancelled"
        scheduler.join("second")
        done = scheduler.submit(request(13), CAPTURE_OFF, session="second").result(timeout=60)
        assert token_ids(done) == alone(tiny_lm, request(13), CAPTURE_OFF)
    finally:
        scheduler.close()
