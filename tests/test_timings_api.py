"""`playground.timings` through the API: a real `python -m engine serve` spoken to with the `openai` client. The
response's timings are the run's own (GET /v1/playground/runs/{id}), their parts add up, and /metrics observes the
same queue, prefill and decode times under vLLM's names."""
from __future__ import annotations

import httpx
import openai
import pytest

from conftest import tiny_prompt
from servers import running_server, tiny_args

EPS = 1e-6
PARTS = ("queue", "prefill", "decode", "batch", "others_prefill", "between_steps")
TOKEN = "timings-presenter-token"
PHASES = ("request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds")


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    args = tiny_args(tiny_model_dir, "--max-batch", "8", "--presenter-token", TOKEN)
    with running_server(tmp_path_factory.mktemp("serve"), args) as (url, _):
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


def scrape(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=30).text
    return {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def assert_adds_up(timings: dict) -> None:
    for name in ("split", "first_token_split"):
        part = timings[name]
        assert sum(part[p] for p in PARTS) == pytest.approx(part["total"], abs=EPS)
        assert min(part[p] for p in PARTS if p != "between_steps") >= 0
    assert timings["split"]["total"] == pytest.approx(timings["e2e_request_latency_seconds"], abs=EPS)
    assert timings["first_token_split"]["total"] == pytest.approx(timings["time_to_first_token_seconds"], abs=EPS)
    assert timings["split"]["queue"] == pytest.approx(timings["request_queue_time_seconds"], abs=EPS)
    assert sum(timings[p] for p in PHASES) == pytest.approx(timings["e2e_request_latency_seconds"], abs=EPS)


def run_story(url: str, run_id: str) -> dict:
    return httpx.get(f"{url}/v1/playground/runs/{run_id}", timeout=30).json()["info"]["timeline"]


def test_a_completion_carries_its_timings_and_they_are_the_run_s(server, client, model):
    before = scrape(server)
    reply = client.completions.create(model=model, prompt=tiny_prompt(9), max_tokens=6, temperature=0)
    timings = reply.playground["timings"]
    assert timings["run_id"] == reply.playground["run_id"]
    assert_adds_up(timings)
    assert sum(timings["batch_sizes"].values()) == reply.usage.completion_tokens - 1 == timings["steps"]
    story = run_story(server, reply.playground["run_id"])
    assert story["timings"] == timings                              # the response's are the run's own
    assert story["generated"] == reply.usage.completion_tokens and story["events"]["first_token"] is not None
    assert len(story["steps"]) == timings["steps"]
    after = scrape(server)
    for name in PHASES:                                             # /metrics observed the same request
        assert after[f"playground:{name}_count"] == before.get(f"playground:{name}_count", 0) + 1
        assert after[f"playground:{name}_sum"] - before.get(f"playground:{name}_sum", 0) == pytest.approx(
            timings[name], abs=EPS)


def test_a_streamed_completion_carries_its_timings_in_its_last_chunk(server, client, model):
    chunks = list(client.completions.create(model=model, prompt=tiny_prompt(7), max_tokens=5, temperature=0,
                                            stream=True))
    with_timings = [c for c in chunks if (getattr(c, "playground", None) or {}).get("timings")]
    assert len(with_timings) == 1 and with_timings[0].choices[0].finish_reason is not None
    timings = with_timings[0].playground["timings"]
    assert_adds_up(timings)
    assert run_story(server, timings["run_id"])["timings"] == timings


def test_an_api_client_s_request_can_be_listed_and_pushed_to_the_room(server, client, model):
    """The room page's pick through a web process's remote client: an API request, gone from the server's memory to
    its run file, is still listed with its timeline; the presenter pushes it by its id; a wrong id is refused."""
    from engine.service.board import PresenterError
    from engine.service.client import RemoteModel

    reply = client.completions.create(model=model, prompt=tiny_prompt(6), max_tokens=4, temperature=0)
    run_id = reply.playground["run_id"]
    remote = RemoteModel(server)
    listed = next(info for info in remote.run_list(limit=40) if info.id == run_id)
    assert listed.source == "api" and listed.timeline["timings"] == reply.playground["timings"]
    push = remote.board.push(TOKEN, page="room", run=run_id, note="this one")
    assert remote.board.latest() == push and push.run == run_id and push.page == "room"
    for wrong in ("../etc/passwd", "run-XYZ", "x" * 100):
        with pytest.raises(PresenterError, match="run"):
            remote.board.push(TOKEN, page="room", run=wrong)
    with pytest.raises(PresenterError):
        remote.board.push("not-the-token", page="room", run=run_id)


def test_the_room_page_draws_an_api_request_from_the_timings_the_api_gave(server, client, model, tiny_model_dir,
                                                                          monkeypatch):
    """A web process that is a client of this server (PLAYGROUND_ENGINE_URL): the room page's pick of an API request
    says what the completion's own `playground.timings` say."""
    from streamlit.testing.v1 import AppTest

    from app.journey.why import why_line
    from engine.service.client import RemoteModel

    for name, value in (("PLAYGROUND_MODEL", str(tiny_model_dir)), ("PLAYGROUND_DEVICE", "cpu"),
                        ("PLAYGROUND_DTYPE", "float32"), ("PLAYGROUND_ENGINE_URL", server)):
        monkeypatch.setenv(name, value)
    reply = client.completions.create(model=model, prompt=tiny_prompt(8, seed=5), max_tokens=5, temperature=0)
    timings = reply.playground["timings"]
    story = next(i.timeline for i in RemoteModel(server).run_list(40) if i.id == reply.playground["run_id"])
    at = AppTest.from_file("../app/main.py", default_timeout=120).run()
    at.switch_page("../pages/room.py").run()
    pick = at.selectbox(key="room.why.pick")
    pick.set_value(next(o for o in pick.options if o.startswith(f"request {story['id']} · an API client"))).run()
    assert not at.exception, [e.value for e in at.exception]
    line = next(m.value for m in at.markdown if "to the first token" in m.value)
    assert line == why_line({**story, "timings": timings})          # the page's numbers are the response's
