"""Why was my answer slow, on the pages: the line and the chart under the journey's answer, from the run's own
timeline (the one the API returns), and any request picked on the room page."""
from __future__ import annotations

import json

import pytest
from streamlit.testing.v1 import AppTest

from conftest import tiny_prompt
from app.ui.format import fmt_ms
from app.journey.why import after_first, behind_in, fmt_s, held_spans, segments, why_figure, why_line
from engine.serving.timeline import Rates, RequestTimeline, StepSeen, story, timings_of

MAIN = "../app/main.py"


@pytest.fixture
def app(app_env):
    return AppTest.from_file(MAIN, default_timeout=120).run()


def generate(at: AppTest, prompt: str, max_new: int) -> AppTest:
    at.switch_page("../pages/journey.py").run()
    at.text_area(key="journey.prompt").set_value(prompt)
    at.number_input(key="journey.max_new").set_value(max_new)
    at.button(key="journey.generate").click().run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_the_journey_shows_why_under_the_answer_with_the_runs_own_timings(app):
    at = generate(app, tiny_prompt(10), 6)
    run = at.session_state["last_run"]
    timeline = run.timeline
    assert timeline is not None and timeline["run_id"] == run.id and timeline["generated"] == 6
    t = timeline["timings"]
    line = next(m.value for m in at.markdown if "to the first token" in m.value)
    assert line == why_line(timeline)
    assert f"{fmt_s(t['first_token_split']['total'])} to the first token" in line
    assert f"{fmt_s(t['split']['total'])} in all" in line
    shown = next(m.value for m in at.metric if m.label == "Time to first token")
    assert shown == fmt_ms(t["time_to_first_token_seconds"])          # the metric and the line: one TTFT (queue + prefill)
    figure = next(json.loads(c.proto.spec) for c in at.get("plotly_chart")
                  if any("you (request" in str(d.get("y")) for d in json.loads(c.proto.spec)["data"]))
    mine = [d for d in figure["data"] if d["name"] in ("you: prefill", "you: decode")]
    assert sum(len(d["y"]) for d in mine) == 1 + 5                     # its prefill, then one bar per decode step
    assert at.session_state["journey.why.gpu"]                          # a GPU to project it on


def test_the_chart_draws_each_step_as_the_step_log_has_it():
    timeline = {"id": 3, "events": {"admitted": 0.1, "first_token": 0.3, "stopped": None},
                "steps": [{"start": 0.1, "seconds": 0.2, "prefill_seconds": 0.15, "rows": [1, 3],
                           "prefills": [[3, 30], [4, 120]]},
                          {"start": 0.35, "seconds": 0.1, "prefill_seconds": 0.0, "rows": [1, 3, 4], "prefills": []}]}
    rows = segments(timeline)
    assert rows[3] == [(0.1, pytest.approx(0.03), "prefill"), (0.25, pytest.approx(0.05), "decode"),
                       (0.35, 0.1, "decode")]
    assert rows[4][0] == (pytest.approx(0.13), pytest.approx(0.12), "prefill")
    figure = why_figure(timeline)
    assert list(figure.layout.yaxis.categoryarray)[-1] == "you (request 3)"


def test_a_step_it_lived_through_without_a_part_of_its_own_is_drawn_in_its_row():
    """Admitted, but the step's prefill chunk went to another's long prompt: its row shows that step as held, so
    the chart shows where "behind request 4's prompt" went (a screenshot at 1024x768 had a gap there)."""
    timeline = {"id": 3, "events": {"admitted": 0.1, "first_token": 0.5, "stopped": None},
                "steps": [{"start": 0.1, "seconds": 0.2, "prefill_seconds": 0.2, "rows": [1], "prefills": [[4, 256]]},
                          {"start": 0.3, "seconds": 0.2, "prefill_seconds": 0.15, "rows": [1, 3],
                           "prefills": [[4, 64], [3, 30]]},                # its chunk, then its first decode row
                          {"start": 0.5, "seconds": 0.1, "prefill_seconds": 0.0, "rows": [1, 3], "prefills": []}]}
    spans = held_spans(timeline)                # the whole first step; the second until its own chunk began
    assert spans == [(0.1, 0.2, "held"), (0.3, pytest.approx(0.15 * 64 / 94), "held")]
    assert spans[1][0] + spans[1][1] == pytest.approx(segments(timeline)[3][0][0])    # where its prefill bar starts
    held = [d for d in why_figure(timeline).data if d.name == "you: behind others' prefill"]
    assert len(held) == 1 and set(held[0].y) == {"you (request 3)"} and list(held[0].base) == [0.1, 0.3]


def shared_first_step() -> dict:
    """Request 3's story as the engine tells it: admitted in a step whose prefill part computed its 30-token prompt,
    then request 4's 120 tokens (its first token came where its own span ended), and one decode step after."""
    steps = [StepSeen(0, 10.1, 0.2, 0.15, (1, 3), ((3, 30), (4, 120))), StepSeen(1, 10.35, 0.1, 0.0, (1, 3, 4), ())]
    timeline = RequestTimeline(3, 10.0, admitted=10.1, first_token=10.13, finished=10.45, prompt_tokens=30,
                               generated=2, steps=steps)
    return story(timeline, timings_of(timeline, Rates(one_row_step=0.04, prefill_per_token=0.001)))


def test_the_two_lines_tell_one_story_the_first_token_then_the_rest():
    timeline = shared_first_step()
    t = timeline["timings"]
    first, rest = t["first_token_split"], after_first(t)
    for part in first:                               # the first token's split is a prefix of the whole one
        assert first[part] + rest[part] == pytest.approx(t["split"][part])
        assert 0 <= first[part] <= t["split"][part] + 1e-9
    assert first["prefill"] == pytest.approx(t["split"]["prefill"]) == pytest.approx(0.03)   # its prompt: all before
    assert behind_in(timeline, 0.0, first["total"]) == []                       # request 4 came after its first token
    assert behind_in(timeline, 0.0, t["split"]["total"]) == [pytest.approx(b) for b in t["behind"]]   # the engine's
    assert why_line(timeline) == (
        "**130 ms to the first token**: 100 ms waiting for a place, 30 ms your prefill.  \n"
        "**then 320 ms to the end** (450 ms in all): 120 ms behind request 4's 120-token prompt, 80 ms your tokens "
        "at one row's pace, 70 ms the batch's other rows, 50 ms the server between steps.")


def test_a_request_the_time_limit_stopped_does_not_say_its_stop():
    """A timeout ends the story as a Stop does, but nobody pressed Stop: the line says what stopped it."""
    timeline = shared_first_step()
    timeline["timings"]["stopped"] = True
    assert "**then 320 ms to its Stop** (450 ms in all)" in why_line({**timeline, "finish_reason": "cancelled"})
    assert "**then 320 ms to the time limit** (450 ms in all)" in why_line({**timeline, "finish_reason": "timeout"})


def test_the_room_page_shows_any_recent_request_the_same_way(app):
    at = generate(app, tiny_prompt(9), 4)
    run = at.session_state["last_run"]
    at.switch_page("../pages/room.py").run()
    assert not at.exception, [e.value for e in at.exception]
    pick = at.selectbox(key="room.why.pick")
    label = next(o for o in pick.options if o.startswith(f"request {run.timeline['id']} "))
    pick.set_value(label).run()
    assert not at.exception, [e.value for e in at.exception]
    assert any(m.value == why_line(run.timeline) for m in at.markdown)   # the same line the journey showed


# --- the presenter pushes a picked request to the room ----------------------------------------------------------------

TOKEN = "room-why-presenter-token"


@pytest.fixture
def board(app, app_env, monkeypatch):
    """Presenter mode on: the app's own model service holds the board (as a model server does for every web
    process); the `app` session made that service."""
    from app.room.presenter import PresenterBoard
    from conftest import app_client

    b = PresenterBoard(TOKEN)
    monkeypatch.setattr(app_client(app_env), "board", b)
    yield b
    lm = app_client(app_env).lm
    from engine.serving.scheduler import scheduler_for

    for at in SESSIONS:                                 # each AppTest counts as a person: leave as a closed tab would
        if "session.id" in at.session_state:
            scheduler_for(lm).leave(at.session_state["session.id"])
    SESSIONS.clear()


SESSIONS: list[AppTest] = []


def session() -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=120).run()
    assert not at.exception, [e.value for e in at.exception]
    SESSIONS.append(at)
    return at


def api_run(app_env) -> str:
    """A request as an API client makes one, through the same service; its run id once it has ended."""
    from conftest import app_client
    from engine.core.generate import GenerationRequest
    from engine.core.hooks import CAPTURE_OFF

    service = app_client(app_env)
    handle = service.submit(GenerationRequest(tiny_prompt(7, seed=3), max_new_tokens=5, chat=False), CAPTURE_OFF,
                            source="api")
    handle.result(timeout=120)
    info = service.run_wait(handle.run_id, 1 << 30, 60).info
    assert not info.live
    return handle.run_id


def test_the_presenter_pushes_a_picked_request_and_every_follower_sees_it(app, board, app_env):
    lead, follower, late = app, session(), session()
    SESSIONS.append(lead)
    generate(follower, tiny_prompt(9), 4)                       # a person's request, then an API client's
    person = follower.session_state["last_run"]
    client_run = api_run(app_env)
    lead.run()                                                  # the presenter's box, now that the board is on
    lead.text_input(key="presenter.token_input").input(TOKEN).run()
    lead.switch_page("../pages/room.py").run()
    pick = lead.selectbox(key="room.why.pick")
    for run_id, who in ((client_run, "an API client"), (person.id, "a person")):
        label = next(o for o in pick.options if who in o and o.startswith("request "))
        pick.set_value(label).run()
        lead.text_input(key="room.presenter_note").input(f"Look at {who}'s request").run()
        lead.button(key="room.presenter_push").click().run()
        assert not lead.exception and lead.success
        assert board.latest().run == run_id and board.latest().page == "room"
        pushed = next(i for i in app_client_runs(app_env) if i.id == run_id)
        for at in (follower, late):                             # on the journey page and on the home page
            at.run()
            assert not at.exception, [e.value for e in at.exception]
            assert at.title[0].value == "The room is the batch"
            assert at.selectbox(key="room.why.pick").value == label
            assert any(m.value == why_line(pushed.timeline) for m in at.markdown)
            assert "The presenter pushed this request: here is why it took its time." in [c.value for c in at.caption]
        assert pushed.source == ("api" if who == "an API client" else "page")
    follower.switch_page("../pages/room.py").run()              # (AppTest reruns the page it was last sent to)
    assert follower.selectbox(key="room.why.pick").value == label
    other = next(o for o in follower.selectbox(key="room.why.pick").options if o != label)
    follower.selectbox(key="room.why.pick").set_value(other).run()
    follower.run()
    assert follower.selectbox(key="room.why.pick").value == other                # adopted once: it explores on


def app_client_runs(app_env) -> list:
    from conftest import app_client

    return app_client(app_env).run_list(limit=40)
