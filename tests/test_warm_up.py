"""The warm-up: a fresh scheduler runs one short prefill and one decode step of two rows through its own batch runner
before anyone's request, so the first person's timeline does not blame the model's first call on their prefill; the
server says it is ready only after it. Checked by what ran and in which order, never by how long anything took."""
from __future__ import annotations

import gc
import threading

import pytest
import torch

from conftest import tiny_prompt
from engine.core.generate import GenerationRequest, generate
from engine.core.hooks import CAPTURE_OFF
from engine.core.records import DoneRecord
from engine.serving.scheduler import WARM_UP_PROMPTS, Scheduler, scheduler_for


@pytest.fixture
def fresh_lm(tiny_model_dir):
    """A model no scheduler has seen (scheduler_for keeps one per loaded model)."""
    from engine.core.loader import load_model

    return load_model(str(tiny_model_dir), device="cpu", dtype="float32")


def test_a_new_scheduler_warms_up_through_its_own_runner_and_keeps_no_trace(fresh_lm):
    scheduler = scheduler_for(fresh_lm)
    try:
        steps = scheduler.warmed
        first, second = [scheduler.check(GenerationRequest(p, max_new_tokens=2)).n_prompt for p in WARM_UP_PROMPTS]
        assert [s.prefill_tokens for s in steps if s.prefill_tokens] == [first, 2 * second]   # alone, then two rows
        assert sorted({s.decode_rows for s in steps} - {0}) == [1, 2]        # a lone decode step and one of two rows
        assert scheduler.room().steps == () and scheduler.stats().submitted == 0     # no one's step, no request
        rates = scheduler.rates()
        assert rates.one_row_step is None and rates.prefill_per_token is None     # no pace measured from it
        assert scheduler.prefix.stats.lookups == 0 and scheduler.prefix.stats.entries == 0
        request = GenerationRequest(tiny_prompt(9, seed=3), max_new_tokens=6, chat=False)
        served = [r.token.id for r in scheduler.submit(request, CAPTURE_OFF).result(timeout=120)
                  if not isinstance(r, DoneRecord)]
        assert served == [r.token.id for r in generate(fresh_lm, request) if not isinstance(r, DoneRecord)]
        assert scheduler_for(fresh_lm).warmed is steps                       # once per scheduler
    finally:
        scheduler.close()


def test_limits_that_refuse_the_warm_up_leave_a_scheduler_that_serves(fresh_lm):
    from engine.serving.limits import Limits

    scheduler = Scheduler(fresh_lm, Limits(max_prompt_tokens=4))
    try:
        assert scheduler.warm_up() == () and scheduler._runner.idle
        request = GenerationRequest(tiny_prompt(3), max_new_tokens=2, chat=False)
        assert isinstance(scheduler.submit(request).result(timeout=120)[-1], DoneRecord)
    finally:
        scheduler.close()


def test_the_model_server_says_ready_only_after_the_warm_up(tiny_model_dir, monkeypatch):
    """The server's own start (engine.launch.load_service in the loading thread of engine.server.app), with the real
    warm-up held at its door: until it has run, every request hears "still loading (... warming up ...)"."""
    from engine.launch import load_service
    from engine.server.app import load_in_background
    from engine.server.state import NotReadyError, ServerState
    from engine.settings import Settings

    asked, go, real = threading.Event(), threading.Event(), Scheduler.warm_up

    def held(self: Scheduler):
        asked.set()
        assert go.wait(300)
        return real(self)

    monkeypatch.setattr(Scheduler, "warm_up", held)
    threads = torch.get_num_threads()
    state = ServerState(served_name="")
    settings = Settings(model=str(tiny_model_dir), device="cpu", port=8000)
    loading = load_in_background(state, lambda progress: load_service(settings, state, None, progress))
    try:
        assert asked.wait(300), state.load_error
        with pytest.raises(NotReadyError, match="still loading .*warming up the model"):
            state.ready()
        go.set()
        loading.join(300)
        service = state.ready()
        assert service.scheduler.warmed and max(s.decode_rows for s in service.scheduler.warmed) == 2
        assert gc.get_freeze_count() > 0              # ready: its start-up heap frozen (service.freeze_heap)
    finally:
        go.set()
        loading.join(300)
        if state.service is not None:
            state.service.scheduler.close()
        torch.set_num_threads(threads)
        gc.unfreeze()                                 # the test process's heap as it was


def test_the_server_loads_its_model_in_a_thread_that_ends_with_the_load(tiny_model_dir, monkeypatch):
    """engine.launch.load_service loads on a passing thread (engine.core.openmp): the OpenMP team the load's parallel
    work makes must not outlive it, or libgomp throttles the step loop's team (a lone step in the server took 31-39 ms
    against 20-22 with the load's team gone)."""
    import engine.core.loader as loader
    from engine.launch import load_service
    from engine.server.state import ServerState
    from engine.settings import Settings

    seen, real = [], loader.load_model
    monkeypatch.setattr(loader, "load_model", lambda *a, **k: seen.append(threading.current_thread()) or real(*a, **k))
    threads = torch.get_num_threads()
    state = ServerState(served_name="")
    service = load_service(Settings(model=str(tiny_model_dir), device="cpu", port=8000), state, None, lambda *a: None)
    try:
        assert len(seen) == 1 and seen[0] is not threading.current_thread() and not seen[0].is_alive()
    finally:
        service.scheduler.close()
        torch.set_num_threads(threads)
        gc.unfreeze()                                 # load_service froze the heap (service.freeze_heap)
