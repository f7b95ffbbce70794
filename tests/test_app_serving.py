"""The app on a shared server: sessions through the scheduler, recordings, presenter mode.

Every test drives the real app (app/main.py) through streamlit.testing.v1.AppTest on the tiny Llama
the tests write (PLAYGROUND_MODEL points at its folder). All sessions of the process share one
loaded model and its scheduler, exactly as browser sessions of one server do.
"""
from __future__ import annotations

import gzip
import json
import pickle
import threading
import time
from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from conftest import app_client, app_lm, ticking_clock, tiny_prompt
from app.ui.format import token_words
from app.runs.live import wait_message
from app.room.presenter import PresenterBoard
from app.runs.recordings import RECORDINGS_DIR, open_bytes, run_bytes
from engine.core.generate import GenerationRequest, generate_captured
from engine.core.hooks import CapturePolicy
from engine import runs as run_files
from base_recording import dumps_recording
from engine.serving.scheduler import scheduler_for

MAIN = "../app/main.py"
TIMEOUT = 60
TOKEN = "front-of-the-room-token"
SHIPPED = sorted(RECORDINGS_DIR.glob("*.run.zip"))


def shipped(path) -> object:
    """A shipped run file's recording."""
    return run_files.load(path).recording


@pytest.fixture
def env(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("PLAYGROUND_MODEL", str(tiny_model_dir))
    monkeypatch.setenv("PLAYGROUND_DEVICE", "cpu")
    monkeypatch.setenv("PLAYGROUND_DTYPE", "float32")
    return tiny_model_dir


_APPS: list[AppTest] = []


def new_app() -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT).run()
    assert_clean(at)
    _APPS.append(at)
    return at


@pytest.fixture(autouse=True)
def leave_when_done(tiny_model_dir):
    """Each AppTest is a browser session that counts against max_sessions: close it as a closed tab would."""
    yield
    lm = app_lm(tiny_model_dir)
    while _APPS:
        at = _APPS.pop()
        if lm is not None and "session.id" in at.session_state:
            scheduler_for(lm).leave(at.session_state["session.id"])


@pytest.fixture
def scheduler(env):
    """The scheduler every app session of this process submits to (the app's own model)."""
    new_app()
    lm = app_lm(env)
    sched = scheduler_for(lm)
    limits, clock = sched.limits, sched.clock
    yield sched
    sched.limits, sched.clock = limits, clock


def assert_clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def open_page(at: AppTest, script: str) -> AppTest:
    at.switch_page(f"../pages/{script}").run()
    assert_clean(at)
    return at


def fill(at: AppTest, ns: str, prompt: str, max_new: int) -> AppTest:
    at.text_area(key=f"{ns}.prompt").set_value(prompt)
    at.number_input(key=f"{ns}.max_new").set_value(max_new)
    return at


def generate_on(at: AppTest, ns: str, prompt: str, max_new: int, timeout: float = TIMEOUT) -> AppTest:
    fill(at, ns, prompt, max_new)
    at.button(key=f"{ns}.generate").click().run(timeout=timeout)
    assert_clean(at)
    return at


def alone(lm, prompt: str, max_new: int) -> list:
    """The same request run directly on the engine, nobody else around, with every view derived from its residual."""
    return generate_captured(lm, GenerationRequest(prompt, max_new_tokens=max_new, chat=False),
                             CapturePolicy(logit_lens=5))


def assert_server_maps(run, want: list) -> None:
    """The run's prompt maps, derived on the model server by run id, equal the same request's alone."""
    from app.hosting.model import current_client

    n = len(want[0].prompt)
    below = np.tril_indices(n)
    for layer, cap in want[0].captures.items():
        maps = current_client().quick("attention.map", {"run_id": run.id, "layer": layer, "heads": list(cap.heads),
                                                        "cells": 1024})
        for m, theirs in zip(maps, cap.attention):
            np.testing.assert_allclose(m.values[:n, :n][below], theirs[below], atol=1e-5)


def spans_of(sched, session: str) -> list:
    return [s for s in sched.timeline() if s.session == session]


def wait_until(check, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


@contextmanager
def busy_model(sched):
    """Another request holds the model: it is running, and stays blocked until the block ends."""
    sched.limits = replace(sched.limits, max_batch=1)          # one place in the batch, which the blocker takes
    sched.lm.lock.acquire()
    blocker = sched.submit(GenerationRequest(tiny_prompt(4), max_new_tokens=2, chat=False), session="blocker")
    try:
        wait_until(lambda: blocker.state == "running")
        yield blocker
    finally:
        sched.lm.lock.release()
        blocker.result(timeout=30)


def has_button(at: AppTest, key: str) -> bool:
    return any(b.key == key for b in at.button)


def texts(at: AppTest) -> list[str]:
    return [t.value for t in at.text]


# --- many sessions, one scheduler --------------------------------------------------------------------------

def test_sessions_in_threads_each_stream_their_own_answer_through_the_scheduler(scheduler, tiny_lm):
    prompts = [tiny_prompt(5 + 3 * i, seed=40 + i) for i in range(4)]
    apps = [fill(open_page(new_app(), "journey.py"), "journey", p, 6) for p in prompts]
    threads = [threading.Thread(target=at.button(key="journey.generate").click().run) for at in apps]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for at, prompt in zip(apps, prompts):
        assert_clean(at)
        run, want = at.session_state["last_run"], alone(tiny_lm, prompt, 6)
        assert run.status == "done" and [t.id for t in run.tokens] == [r.token.id for r in want[:-1]]
        assert run.n_prompt == len(want[0].prompt)                                   # its own prompt, no other
        assert_server_maps(run, want)                                                # its own attention maps
        assert [c.length for c in run.cache_states()] == [r.cache.length for r in want[:-1]]
        assert run.text in texts(at)
        spans = spans_of(scheduler, at.session_state["session.id"])
        assert [s.state for s in spans] == ["done"]                                   # went through the queue


def test_a_waiting_session_sees_its_place_in_the_queue(scheduler):
    with busy_model(scheduler):
        queued = scheduler.submit(GenerationRequest(tiny_prompt(3), max_new_tokens=2, chat=False), session="q")
        message = wait_message(queued.status())
        assert "next in line" in message and "places in the batch are taken" in message
        assert "Stop leaves the line" in message
        queued.cancel()
    assert "reading your prompt" in wait_message(replace(queued.status(), state="running"))
    between = wait_message(replace(queued.status(), state="queued", running=6, batch=32))      # waiting for a step
    assert "6 of 32 places in the batch are in use" in between and "are taken" not in between


def test_a_session_that_stops_while_queued_leaves_the_queue(scheduler):
    at = open_page(new_app(), "journey.py")
    with busy_model(scheduler):
        fill(at, "journey", tiny_prompt(6), 4)
        with pytest.raises(RuntimeError, match="timed out"):                          # the script is stopped
            at.button(key="journey.generate").click().run(timeout=2)
        session = at.session_state["session.id"]
        wait_until(lambda: [s.state for s in spans_of(scheduler, session)] == ["cancelled"])
        assert spans_of(scheduler, session)[0].started is None                        # never reached the model
        assert scheduler.stats().queued == 0


def test_a_run_over_the_time_limit_stops_with_a_warning(scheduler):
    at = open_page(new_app(), "journey.py")
    scheduler.limits = replace(scheduler.limits, request_seconds=1)
    scheduler.clock = ticking_clock()                  # a second per reading: over the limit at its second reading
    generate_on(at, "journey", tiny_prompt(8), 40)
    assert any("time limit" in w.value for w in at.warning)
    run = at.session_state.get("last_run")
    assert run is None or run.done is None or run.done.finish_reason == "timeout"


def test_a_full_queue_refuses_next_to_the_button_and_keeps_the_last_run(scheduler):
    at = generate_on(open_page(new_app(), "journey.py"), "journey", tiny_prompt(6), 3)
    before = at.session_state["last_run"]
    with busy_model(scheduler):
        scheduler.limits = replace(scheduler.limits, max_queue=0)                    # one running, none may wait
        generate_on(at, "journey", tiny_prompt(7), 3)
    assert any("already waiting" in e.value for e in at.error)
    assert at.session_state["last_run"] is before
    scheduler.limits = replace(scheduler.limits, max_queue=32)
    generate_on(at, "journey", tiny_prompt(7), 3)                                     # and then it works again
    assert at.session_state["last_run"] is not before and not at.error


def test_a_session_beyond_the_room_limit_gets_a_message_and_the_recordings(scheduler):
    scheduler.limits = replace(scheduler.limits, max_sessions=scheduler.stats().sessions)
    at = new_app()
    assert any("already serves" in e.value for e in at.error)
    open_page(at, "journey.py")
    assert not has_button(at, "journey.generate")
    assert any("Recordings still work" in i.value for i in at.info)
    open_page(at, "recordings.py")
    at.button(key="recordings.open.0").click().run()
    open_page(at, "journey.py")
    assert shipped(SHIPPED[0]).done.text in texts(at)


# --- recordings ----------------------------------------------------------------------------------------------

def test_a_shipped_recording_replays_on_every_page_without_generating(scheduler):
    rec = shipped(SHIPPED[0])
    at = open_page(new_app(), "recordings.py")
    at.button(key="recordings.open.0").click().run()
    submitted = scheduler.stats().submitted
    run = at.session_state["last_run"]
    assert [t.id for t in run.tokens] == [r.token.id for r in rec.records[:-1]]

    open_page(at, "journey.py")
    assert rec.done.text in texts(at) and any(t.startswith("Showing the recording") for t in texts(at))
    assert at.text_area(key="journey.prompt").value == rec.request.prompt            # the inputs follow the run
    assert [m.value for m in at.metric if m.label == "Generated tokens"] == [str(rec.done.generated_tokens)]
    assert any(s.value == "4. One token up close" for s in at.subheader)
    open_page(at, "attention.py")
    heat = json.loads(at.get("plotly_chart")[0].proto.spec)["data"][0]["customdata"]
    n = run.n_prompt + len(run.steps)
    assert heat["shape"].replace(" ", "") == f"{n},{n}"                              # every cached position
    open_page(at, "kv_cache.py")
    assert any("matches the formula" in t for t in texts(at))
    assert any(t.startswith(f"{rec.model} in {rec.dtype}") for t in texts(at))       # the recording's own model
    assert scheduler.stats().submitted == submitted                                   # nothing ran on the model


def test_recordings_open_when_the_model_does_not_load(monkeypatch, tmp_path):
    monkeypatch.setenv("PLAYGROUND_MODEL", str(tmp_path / "no-model-here"))
    at = new_app()
    open_page(at, "journey.py")
    assert any("not loaded" in i.value and "Recordings still work" in i.value for i in at.info)
    open_page(at, "recordings.py")
    assert any("No model is available" in i.value for i in at.info)
    at.button(key="recordings.open.1").click().run()
    rec = shipped(SHIPPED[1])
    for page in ("journey.py", "attention.py", "kv_cache.py"):
        open_page(at, page)
        assert any(t.startswith("Showing the recording") for t in texts(at)), page
    assert any(s.value == "One head" for s in open_page(at, "attention.py").subheader)
    assert rec.done.text.strip()[:20] in " ".join(texts(open_page(at, "journey.py")))


def upload(at: AppTest, name: str, data: bytes) -> AppTest:
    at.file_uploader(key="recordings.upload").set_value((name, data, "application/gzip")).run()
    assert_clean(at)
    return at


@pytest.mark.parametrize("name,make,words", [
    ("noise.json.gz", lambda good: bytes(range(256)) * 8, "neither a gzip-compressed recording nor JSON"),
    ("cut.json.gz", lambda good: good[: len(good) // 2], "damaged or truncated"),
    ("model.json.gz", lambda good: pickle.dumps({"weights": [1, 2, 3]}), "pickle"),
    ("other.json", lambda good: json.dumps({"format": "something-else", "records": []}).encode(), "not a playground recording"),
    ("empty.json.gz", lambda good: gzip.compress(b"{}"), "not a playground recording"),
])
def test_a_corrupt_or_foreign_upload_gives_a_clear_error(env, name, make, words):
    at = open_page(new_app(), "recordings.py")
    upload(at, name, make(dumps_recording(shipped(SHIPPED[0]))))         # a .json.gz as people saved them before
    assert any(words in e.value for e in at.error), [e.value for e in at.error]
    assert "last_run" not in at.session_state


def test_save_this_run_and_open_it_again(env):
    at = generate_on(open_page(new_app(), "journey.py"), "journey", tiny_prompt(9), 5)
    run = at.session_state["last_run"]
    assert at.get("download_button")                                                  # "Save this run"
    from app.hosting.model import current_client

    data = run_bytes(run, lm=current_client())                  # the views derived on the server, as the button does
    back = open_bytes(data, "saved.run.zip")
    assert [t.id for t in back.tokens] == [t.id for t in run.tokens] and back.text == run.text
    want = alone(app_lm(env), tiny_prompt(9), 5)
    assert run.prefill.captures == {} and sorted(back.prefill.captures) == sorted(want[0].captures) == [0, 1, 2]
    for layer, cap in want[0].captures.items():
        np.testing.assert_allclose(back.prefill.captures[layer].attention, cap.attention, atol=2e-3)   # float16
        assert back.prefill.captures[layer].lens[0][0] == cap.lens[0][0]
    other = open_page(new_app(), "recordings.py")
    upload(other, "saved.run.zip", data)
    assert not other.error and other.session_state["last_run"].text == run.text
    open_page(other, "journey.py")
    assert run.text in texts(other)


# --- presenter mode --------------------------------------------------------------------------------------------

@pytest.fixture
def board(env, monkeypatch):
    """Presenter mode on: the app's own model service holds the board (as a model server does for every web
    process)."""
    new_app()
    b = PresenterBoard(TOKEN)
    monkeypatch.setattr(app_client(env), "board", b)
    return b


def stored_run(env, live: bool = True):
    """A run in the app's run store, as a presenter's request would make one (no records yet)."""
    from engine.service.runs import RunInfo, new_run_id

    service = app_client(env)
    info = service.runs.open(RunInfo(new_run_id(), "generation", "page", service.label, state="running",
                                     request=GenerationRequest(tiny_prompt(4), chat=False), policy=CapturePolicy()))
    if not live:
        service.runs.close(info.id, "done")
    return service, info.id


def test_a_follower_adopts_the_presenters_push_once_and_keeps_exploring(board):
    lead, follower = new_app(), new_app()
    assert not has_button(open_page(lead, "journey.py"), "journey.presenter_push")
    lead.text_input(key="presenter.token_input").input(TOKEN).run()
    open_page(lead, "journey.py")
    lead.text_area(key="journey.prompt").input("w5 w6 w7 pushed").run()
    lead.slider(key="journey.temperature").set_value(0.7).run()
    lead.text_input(key="journey.presenter_note").input("Look at the tokens").run()
    lead.button(key="journey.presenter_push").click().run()
    assert_clean(lead) and lead.success

    follower.run()                                                      # on the home page: moved to the journey
    assert_clean(follower)
    assert follower.title[0].value == "The journey of a request"
    assert follower.text_area(key="journey.prompt").value == "w5 w6 w7 pushed"
    assert follower.slider(key="journey.temperature").value == pytest.approx(0.7)
    assert "Presenter: Look at the tokens" in [c.value for c in follower.caption]
    follower.text_area(key="journey.prompt").input("w1 w2 my own").run()
    follower.run()
    assert follower.text_area(key="journey.prompt").value == "w1 w2 my own"      # adopted once only


def test_followers_watch_the_presenters_run_without_running_the_model(board, scheduler):
    lead, followers = new_app(), [new_app() for _ in range(3)]
    lead.text_input(key="presenter.token_input").input(TOKEN).run()
    lead.toggle(key="presenter.allow_generate").set_value(False).run()
    for f in followers:
        open_page(f, "attention.py")
        assert f.button(key="attention.generate").disabled                    # the presenter keeps the model
    submitted = scheduler.stats().submitted
    generate_on(open_page(lead, "journey.py"), "journey", tiny_prompt(6), 5)
    run = lead.session_state["last_run"]
    for f in followers:
        f.run()
        assert_clean(f)
        adopted = f.session_state["last_run"]                                 # the presenter's, read from the server
        assert adopted.id == run.id and adopted.text == run.text and len(adopted.steps) == len(run.steps)
        open_page(f, "attention.py")
        assert f.title[0].value == "Attention"
        assert f.session_state["journey.prompt"] == tiny_prompt(6)                 # its form: the presenter's request
        assert f.session_state["journey.max_new"] == 5
        last = token_words(run.tokens[-1].text, run.done.finish_reason == "eos")
        assert f"produce {last}" in " ".join(texts(f))                              # its charts draw that run
    assert scheduler.stats().submitted == submitted + 1                         # one model run for the room
    lead.toggle(key="presenter.allow_generate").set_value(True).run()
    assert not open_page(followers[0], "journey.py").button(key="journey.generate").disabled


def watching(app) -> bool:
    return any("The presenter's run" in c.value for c in app.caption)


@pytest.mark.parametrize("page, lands_on", [("journey.py", "The journey of a request"), ("attention.py", "Attention"),
                                            (None, "The journey of a request")])   # None: the home page
def test_a_watcher_sees_the_presenters_run_while_it_streams(board, env, page, lands_on):
    follower = open_page(new_app(), page) if page else new_app()
    service, run_id = stored_run(env)                                            # a run that has not streamed yet
    board.broadcast(TOKEN, run_id)
    follower.run()                                           # the strip's tick: no page switch, no run of its own
    assert_clean(follower) and watching(follower)
    assert follower.session_state["presenter.watching"].id == run_id and "last_run" not in follower.session_state
    service.runs.close(run_id, "done")                                           # it ended
    follower.run()                                                               # the strip draws its end at once
    assert_clean(follower) and any("run is done" in c.value for c in follower.caption)
    assert "last_run" not in follower.session_state
    follower.run()                                                               # then the page draws it
    assert_clean(follower) and not watching(follower)
    assert follower.session_state["last_run"].id == run_id and "presenter.watching" not in follower.session_state
    assert follower.title[0].value == lands_on                 # from the home page, on to the journey page


def test_a_follower_who_comes_after_the_run_gets_it_without_moving(board, env):
    _, run_id = stored_run(env, live=False)
    board.broadcast(TOKEN, run_id)
    follower = new_app()
    assert_clean(follower) and not watching(follower)
    assert follower.session_state["last_run"].id == run_id and follower.title[0].value != "The journey of a request"


def test_a_pushed_layer_and_head_reach_a_followers_attention_page(board):
    lead, follower = new_app(), new_app()
    lead.text_input(key="presenter.token_input").input(TOKEN).run()
    generate_on(open_page(lead, "attention.py"), "attention", tiny_prompt(7), 3)
    run = lead.session_state["last_run"]
    lead.select_slider(key=f"attention.layer.{run.id}").set_value(2).run()
    lead.select_slider(key=f"attention.head.{run.id}").set_value(3).run()
    lead.button(key="attention.presenter_push").click().run()
    assert_clean(lead)

    follower.run()
    assert follower.title[0].value == "Attention"
    generate_on(follower, "attention", follower.text_area(key="attention.prompt").value, 3)
    own = follower.session_state["last_run"]
    assert own.id != run.id
    assert follower.select_slider(key=f"attention.layer.{own.id}").value == 2
    assert follower.select_slider(key=f"attention.head.{own.id}").value == 3
    follower.select_slider(key=f"attention.layer.{own.id}").set_value(0).run()
    assert follower.select_slider(key=f"attention.layer.{own.id}").value == 0     # free to explore


def stopping_script(marks: str) -> None:
    from pathlib import Path

    from streamlit.runtime.scriptrunner import get_script_run_ctx

    from app.runs.live import stop_point

    stop_point()                                     # nothing pending: draws nothing, goes on
    Path(marks).write_text("before")
    get_script_run_ctx().script_requests.request_stop()     # what a press does to the running script (fastReruns)
    stop_point()                                     # ...noticed here, with nothing drawn in between
    Path(marks).write_text("after")


def test_a_pending_stop_ends_the_script_at_the_next_record_not_the_next_redraw(tmp_path):
    """In a loaded room the answer redraws every few seconds, and Streamlit raises a Stop only inside an st call:
    every record and queue status is a stop point (app/runs/live.py), so a Stop acts within a step."""
    marks = tmp_path / "marks"
    AppTest.from_function(stopping_script, args=(str(marks),)).run(timeout=30)
    assert marks.read_text() == "before"
