"""The model server past one machine: `python -m engine serve --replicas 2` starts a local Ray cluster with Ray Serve,
two replicas of the tiny model on one CPU each and one ingress; the tests speak HTTP to it with the `openai` package
and httpx, and read the room through /v1/playground/replicas.

Checked: greedy answers equal the same prompt run alone, sessions spread over both replicas and each stays on its
own, prompts that share a long start meet on the replica that holds it, and a replica killed mid-run fails its own
request with a clear message while the other replica's requests go on, and comes back; the runs it had finished
stay readable by id (every replica writes them to the same run store).
The router's policy is also checked on its own, on stand-in replicas (plain data: which replica, what load).
"""
from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import httpx
import openai
import pytest

pytest.importorskip("ray.serve", reason="the cluster extra (ray[serve]) is not installed")

from conftest import tiny_prompt  # noqa: E402
from servers import running_server, tiny_args  # noqa: E402
from engine.core.generate import GenerationRequest, generate  # noqa: E402

pytestmark = pytest.mark.serial

SHARED = "Read this passage and answer the question after it. " * 8        # a long shared start (416 chars)


@pytest.fixture(scope="module")
def cluster(tiny_model_dir, tmp_path_factory):
    args = tiny_args(tiny_model_dir, "--replicas", "2", "--replica-cpus", "1", "--threads", "1", "--max-batch", "4")
    with running_server(tmp_path_factory.mktemp("cluster"), args, env={"RAY_AUTH_MODE": "disabled"}) as (url, _):
        deadline = time.monotonic() + 60                                  # both replicas report to the hub
        while len(replicas(url)) < 2:
            assert time.monotonic() < deadline, replicas(url)
            time.sleep(0.5)
        yield url


@pytest.fixture(scope="module")
def client(cluster):
    return openai.OpenAI(base_url=cluster + "/v1", api_key="unused", max_retries=0, timeout=120)


def replicas(url: str) -> list[dict]:
    return [v for v in httpx.get(url + "/v1/playground/replicas", timeout=30).json() if v["seconds_ago"] < 3]


def all_replicas(url: str) -> list[dict]:
    """As the room page sees them: the missing ones too (until their replacement reports)."""
    return httpx.get(url + "/v1/playground/replicas", timeout=30).json()


def holder(url: str, run_id: str, seconds: float = 10) -> str:
    """Which replica holds a run, read from the room endpoint (each replica lists its newest runs)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for view in replicas(url):
            if run_id in view["snapshot"]["runs"]:
                return view["snapshot"]["replica"]
        time.sleep(0.2)
    raise AssertionError(f"no replica lists {run_id}")


def ask(client, model: str, prompt: str, session: str | None = None, tokens: int = 6):
    extra = {"playground": {"session": session}} if session else None
    return client.completions.create(model=model, prompt=prompt, max_tokens=tokens, temperature=0, extra_body=extra)


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


def test_eight_sessions_spread_over_both_replicas_and_equal_the_prompt_alone(cluster, client, model, tiny_lm):
    prompts = [tiny_prompt(6 + i, seed=i) for i in range(8)]
    replies: dict[int, object] = {}

    def one(i: int) -> None:
        replies[i] = ask(client, model, prompts[i], session=f"session-{i}", tokens=24)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i, prompt in enumerate(prompts):
        alone = list(generate(tiny_lm, GenerationRequest(prompt, max_new_tokens=24, chat=False)))[-1].text
        assert replies[i].choices[0].text == alone
        timings = replies[i].playground["timings"]                         # the replica's story, through the cluster
        assert timings["run_id"] == replies[i].playground["run_id"]
        assert sum(v for k, v in timings["split"].items() if k != "total") == pytest.approx(timings["split"]["total"])
    where = {holder(cluster, replies[i].playground["run_id"]) for i in range(8)}
    assert len(where) == 2                                                 # both replicas served some


def test_a_session_stays_on_its_replica(cluster, client, model):
    first = ask(client, model, tiny_prompt(5, seed=1), session="sticky")
    home = holder(cluster, first.playground["run_id"])
    for i in range(3):
        again = ask(client, model, tiny_prompt(5, seed=10 + i), session="sticky")
        assert holder(cluster, again.playground["run_id"]) == home


def test_prompts_that_share_a_long_start_meet_on_the_replica_that_holds_it(cluster, client, model):
    """Two long starts, each prefilled once; their follow-ups (no session) find the replica that holds each, also
    while that replica is busier than the other (the router weighs cache affinity against up to IMBALANCE requests).
    Which replica a start lands on first is the router's choice by load: only the follow-ups are asserted."""
    starts = [f"{SHARED} Topic {i}: " + tiny_prompt(3, seed=i) for i in range(2)]
    starts[1] = "A different passage to read. " * 16 + starts[1]          # no long start in common with starts[0]
    homes = [holder(cluster, ask(client, model, s + " w1", tokens=8).playground["run_id"]) for s in starts]
    busy = client.completions.create(model=model, prompt=tiny_prompt(6, seed=7), max_tokens=250, temperature=0,
                                     stream=True, extra_body={"playground": {"session": "busy"}})
    chunks = iter(busy)
    next(chunks)                                                           # one replica has a long request running
    try:
        for i, start in enumerate(starts):
            for n in (2, 3):
                again = ask(client, model, f"{start} w{n}").playground["run_id"]
                assert holder(cluster, again) == homes[i]                  # where its start was prefilled
    finally:
        busy.close()


def test_a_replica_killed_mid_run_fails_its_request_clearly_the_other_goes_on_and_it_comes_back(cluster, client,
                                                                                                model):
    kept = ask(client, model, tiny_prompt(5, seed=6), session="doomed", tokens=4)     # finished before the kill
    # The session's replica is found before the stream starts: looked for after, CI's runner once had all 250
    # tokens streamed before the kill (DID NOT RAISE).
    home = holder(cluster, kept.playground["run_id"])
    victim = next(v for v in replicas(cluster) if v["snapshot"]["replica"] == home)
    other_reply: dict[str, object] = {}
    survivor = threading.Thread(target=lambda: other_reply.setdefault("r", ask(client, model, tiny_prompt(7, seed=4),
                                                                              session="lives", tokens=40)))
    stream = client.completions.create(model=model, prompt=tiny_prompt(6, seed=3), max_tokens=250, temperature=0,
                                       stream=True, extra_body={"playground": {"session": "doomed"}})
    chunks = iter(stream)
    assert next(chunks).playground["run_id"]
    texts = [c for c, _ in zip(chunks, range(3))]                       # records have streamed: no silent retry
    assert all(c.choices[0].text for c in texts)
    os.kill(victim["snapshot"]["pid"], signal.SIGKILL)
    survivor.start()
    with pytest.raises(openai.APIError) as failed:               # the stream fails, never retried elsewhere in silence
        for _ in chunks:
            pass
    assert "replica" in str(failed.value)
    survivor.join(120)
    assert other_reply["r"].choices[0].finish_reason in ("length", "stop")  # nothing lost for the one that lives
    for path in ("", "/file"):                   # the dead replica's finished run, from the store every replica writes
        assert httpx.get(f"{cluster}/v1/playground/runs/{kept.id}{path}", timeout=30).status_code == 200
    deadline = time.monotonic() + 30                                       # the room shows it missing...
    while not any(v["snapshot"]["replica"] == home and v["seconds_ago"] > 3 for v in all_replicas(cluster)):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    deadline = time.monotonic() + 90                                       # ...then Ray Serve brings one back
    while True:
        ids = {v["snapshot"]["replica"] for v in replicas(cluster)}
        if len(ids) == 2 and victim["snapshot"]["replica"] not in ids:
            break
        assert time.monotonic() < deadline, ids
        time.sleep(1)
    assert ask(client, model, tiny_prompt(4, seed=5), session="doomed").choices[0].text   # the session goes on


# --- the router's policy on its own -------------------------------------------------------------------------------------

class StandIn:
    """A replica as the router sees one: its id and what it reported."""

    def __init__(self, name: str, running: int = 0):
        from ray.serve._private.common import DeploymentID, ReplicaID

        self.replica_id = ReplicaID(unique_id=name, deployment_id=DeploymentID(name="ModelReplica", app_name="t"))
        self.routing_stats = {"running": running, "queued": 0}


def a_router():
    from ray.serve._private.common import DeploymentHandleSource, DeploymentID

    from engine.cluster.router import PlaygroundRouter

    router = PlaygroundRouter(DeploymentID(name="ModelReplica", app_name="t"), DeploymentHandleSource.UNKNOWN)
    router.initialize_state()
    return router


def pending(route: dict, session: str = ""):
    from ray.serve._private.common import RequestMetadata
    from ray.serve.request_router import PendingRequest

    return PendingRequest(args=[route], kwargs={}, metadata=RequestMetadata(request_id="r", internal_request_id="r",
                                                                            session_id=session))


async def choose(router, replicas: list, route: dict, session: str = "") -> str:
    request = pending(route, session)
    ranks = await router.choose_replicas(replicas, request)
    chosen = ranks[0][0]
    router.on_request_routed(request, chosen.replica_id, None)
    assert sorted(r[0].replica_id.unique_id for r in ranks) == sorted(r.replica_id.unique_id for r in replicas)
    return chosen.replica_id.unique_id


def test_the_router_prefers_the_named_replica_then_the_session_then_the_prefix_then_the_least_loaded():
    asyncio.run(router_policy())


async def router_policy() -> None:
    router = a_router()
    a, b = StandIn("a", running=3), StandIn("b", running=0)
    assert await choose(router, [a, b], {}) == "b"                                      # least loaded
    assert await choose(router, [a, b], {"replica": "a"}) == "a"                        # a run it holds
    assert await choose(router, [a, b], {}, session="s1") == "b"
    b.routing_stats = {"running": 9}
    assert await choose(router, [a, b], {}, session="s1") == "b"                        # sticks, even busier
    assert await choose(router, [a, b], {"prompt": SHARED + "one"}) == "a"              # least loaded now
    a.routing_stats, b.routing_stats = {"running": 2}, {"running": 0}
    assert await choose(router, [a, b], {"prompt": SHARED + "two"}) == "a"              # its start is on a
    assert await choose(router, [a, b], {"prompt": "short and new"}) == "b"
    a.routing_stats = {"running": 9}
    assert await choose(router, [a, b], {"prompt": SHARED + "three"}) == "b"            # too busy: load wins
    a.routing_stats = {"running": 0}
    assert await choose(router, [a, b], {}, session="s2") == "a"
    assert await choose(router, [b], {}, session="s2") == "b"                           # its replica left
