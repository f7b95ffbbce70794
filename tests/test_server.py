"""The model server as a client sees it: `python -m engine serve` started for real on a loopback port, spoken to
with the official `openai` package, httpx and raw sockets. The tiny Llama the tests write is the model.

Checked against independent references: the command line's greedy tokens (`python -m engine generate`), the same
prompt run alone in this process (captures), and OpenAI's own error shape and status codes.
"""
from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time

import httpx
import numpy as np
import openai
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import Pause, tiny_prompt
from servers import Hold, python, running_server, tiny_args, ROOT
from engine.core.generate import GenerationRequest, generate, generate_captured
from engine.core.hooks import CapturePolicy
from engine.core.records import PrefillRecord

KEY = "a-long-enough-test-key"


@pytest.fixture(scope="module")
def hold(tmp_path_factory) -> Hold:
    """The server's worker, held at a run's record while a test acts (tests/servers.py `Hold`)."""
    return Hold(tmp_path_factory.mktemp("hold"))


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory, hold):
    with running_server(tmp_path_factory.mktemp("serve"), tiny_args(tiny_model_dir, "--max-batch", "8"),
                        hold=hold) as (url, proc):
        yield url, proc


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


def error_of(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"} and {"message", "type", "param", "code"} <= set(body["error"]), body
    assert body["error"]["message"] and "Traceback" not in body["error"]["message"]
    return body["error"]


def run_tokens(url: str, run_id: str) -> list[int]:
    records = httpx.get(f"{url}/v1/playground/runs/{run_id}", timeout=30).json()["records"]
    return [r["token"]["id"] for r in records if "token" in r]


# --- the OpenAI API, against independent references ------------------------------------------------------------

def test_models_lists_the_served_model(client, model, tiny_model_dir):
    cards = client.models.list().data
    assert len(cards) == 1 and cards[0].id == model and cards[0].owned_by == "inference-playground"


def test_greedy_completion_equals_the_command_line_token_for_token(server, client, model, tiny_model_dir):
    prompt = tiny_prompt(9, seed=3)
    out = subprocess.run([python(), "-m", "engine", "generate", *tiny_args(tiny_model_dir), "--prompt", prompt,
                          "--max-new-tokens", "12", "--raw"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    cli_ids = [r["token"]["id"] for r in lines if "token" in r]
    cli_text = lines[-1]["text"]

    reply = client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0)
    assert reply.choices[0].text == cli_text
    assert run_tokens(server[0], reply.playground["run_id"]) == cli_ids
    assert reply.usage.completion_tokens == len(cli_ids) and reply.usage.prompt_tokens == lines[0]["cache"]["length"]


def test_streaming_deltas_concatenate_to_the_same_text_with_usage_last(client, model):
    prompt = tiny_prompt(7, seed=5)
    whole = client.completions.create(model=model, prompt=prompt, max_tokens=10, temperature=0)
    chunks = list(client.completions.create(model=model, prompt=prompt, max_tokens=10, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == \
        [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_a_stop_string_ends_the_text_before_it_streamed_or_not(client, model):
    prompt = tiny_prompt(7, seed=5)
    free = client.completions.create(model=model, prompt=prompt, max_tokens=10, temperature=0).choices[0].text
    words = free.split()
    assert len(words) >= 3
    stop = " " + words[2]                                          # a stop string that appears in the answer
    cut = client.completions.create(model=model, prompt=prompt, max_tokens=10, temperature=0, stop=[stop])
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model, prompt=prompt, max_tokens=10, temperature=0, stop=[stop], stream=True) if c.choices)
    assert cut.choices[0].text == free[:free.index(stop)] == streamed
    assert cut.choices[0].finish_reason == "stop"


def test_logprobs_are_the_models_own_log_softmax(server, client, model, tiny_lm):
    prompt = tiny_prompt(6, seed=8)
    reply = client.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=0, logprobs=3)
    lp = reply.choices[0].logprobs
    records = list(generate(tiny_lm, GenerationRequest(prompt, max_new_tokens=4, chat=False)))
    tokens = [r.token for r in records if hasattr(r, "token")]
    import torch

    ids = tiny_lm.tokenizer(prompt)["input_ids"]
    with torch.no_grad():
        logits = tiny_lm.model(torch.tensor([ids + [t.id for t in tokens[:-1]]])).logits[0, len(ids) - 1:].double()
    expected = torch.log_softmax(logits, -1)
    for j, token in enumerate(tokens):
        assert lp.token_logprobs[j] == pytest.approx(float(expected[j, token.id]), abs=1e-4)
        top = sorted(lp.top_logprobs[j].values(), reverse=True)
        assert top == pytest.approx(sorted(expected[j].topk(3).values.tolist(), reverse=True), abs=1e-4)


def test_a_seeded_sample_repeats(client, model):
    prompt = tiny_prompt(5, seed=2)
    a, b = (client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=1.0, top_p=0.9,
                                      seed=1234, extra_body={"top_k": 20}).choices[0].text for _ in range(2))
    assert a == b


def test_a_chat_request_to_a_model_without_a_chat_template_is_a_clear_400(server, model):
    r = httpx.post(server[0] + "/v1/chat/completions", json={"model": model, "messages": [
        {"role": "user", "content": "w1 w2"}, {"role": "assistant", "content": "w3"}, {"role": "user", "content": "w4"}]})
    assert r.status_code == 400 and "chat template" in error_of(r)["message"]


# --- captures, runs by id, the room, metrics ---------------------------------------------------------------------

def test_a_captured_request_is_inspectable_by_id_and_equals_the_same_prompt_alone(server, client, model, tiny_lm):
    prompt = tiny_prompt(8, seed=4)
    reply = client.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=0,
                                      extra_body={"playground": {"capture": True}})
    info = reply.playground
    assert info["captured"] and info["run_id"].startswith("run-")
    for rid in (info["run_id"], reply.id):                       # by the run id and by the OpenAI response id
        part = httpx.get(f"{server[0]}/v1/playground/runs/{rid}", timeout=30).json()
        assert part["info"]["source"] == "api" and part["info"]["state"] == "done"
    request = GenerationRequest(prompt, max_new_tokens=4, chat=False)
    alone = generate_captured(tiny_lm, request, CapturePolicy(logit_lens=5))
    assert all(r.get("captures", {}) == {} for r in part["records"])    # records carry no captures: views by id
    n = len(alone[0].prompt)
    for layer in range(tiny_lm.spec.n_layers):
        body = {"name": "attention.map", "params": {"run_id": info["run_id"], "layer": layer, "heads": [0, 1, 2, 3]}}
        maps = httpx.post(f"{server[0]}/v1/playground/quick", json=body, timeout=30).json()
        for h, m in enumerate(maps):
            got = np.asarray(m["values"], dtype=np.float32)[:n, :n][np.tril_indices(n)]
            np.testing.assert_allclose(got, alone[0].captures[layer].attention[h][np.tril_indices(n)], atol=1e-5)
    body = {"name": "run.lens", "params": {"run_id": info["run_id"], "position": n - 1}}
    lens = httpx.post(f"{server[0]}/v1/playground/quick", json=body, timeout=30).json()
    assert [top[0][0] for top in lens["top"]] == [alone[0].captures[i].lens[0][0] for i in lens["layers"]]
    assert lens["layers"] == list(range(tiny_lm.spec.n_layers)) and isinstance(alone[0], PrefillRecord)


@pytest.mark.parametrize("transport", ["in-process", "remote"])
def test_a_streaming_runs_newest_row_and_lens_are_derived_by_run_id_on_either_transport(transport, server, tiny_lm,
                                                                                          tiny_model_dir, hold):
    """A page's live view: as each token arrives it asks, by run id, for the attention row of the pass that made it
    (one layer, the heads on screen) and that position's logit lens, while the run still generates (its residual
    read from the batch's pool). Both equal HF eager over the tokens so far, and the lens the same run alone gives;
    through the in-process service and through the HTTP client alike."""
    from transformers import AutoModelForCausalLM

    from engine.service.client import RemoteModel
    from engine.service.service import EngineService
    from engine.serving.capture import capture_policy

    lm = EngineService(tiny_lm) if transport == "in-process" else RemoteModel(server[0])
    request = GenerationRequest(tiny_prompt(6, seed=8), max_new_tokens=240, chat=False)
    policy, _ = capture_policy(tiny_lm.spec, 8, 240)
    asked, records, live = [], [], []
    # Held at its first decode step until the page has asked once: still generating then, however fast the machine
    # (its 240 tokens take ~0.2 s here): in-process by a listener, through HTTP in the served process.
    held = Pause(at=2) if transport == "in-process" else hold
    with contextlib.nullcontext() if transport == "in-process" else hold.at(2):
        extra = {"listeners": (held,)} if transport == "in-process" else {}
        handle = lm.submit(request, policy, **extra)
        try:
            for record in handle.records():
                records.append(record)
                if record.kind == "decode" and len(asked) < 3:
                    p = len(records[0].prompt) + record.step - 1
                    live.append(lm.quick("attention.kept", {"run_id": handle.run_id}).live)
                    asked.append((p, lm.quick("attention.row", {"run_id": handle.run_id, "layer": 1, "position": p,
                                                                "heads": [2, 3]}).probs,
                                  lm.quick("run.lens", {"run_id": handle.run_id, "position": p})))
                    held.release()
                if len(asked) == 3:
                    break
        finally:
            held.release()
            handle.cancel()
            if transport == "in-process":
                lm.close()
    assert live[0]                                                   # asked while it was held: live
    ids = [p.id for p in records[0].prompt] + [r.token.id for r in records if r.kind != "done"]
    eager = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="eager").eval()
    with torch.no_grad():
        reference = eager(torch.tensor([ids]), output_attentions=True).attentions
    n_prompt = len(records[0].prompt)
    alone = generate_captured(tiny_lm, GenerationRequest(request.prompt, max_new_tokens=len(ids) - n_prompt,
                                                         chat=False),
                              CapturePolicy(attention=False, stats=False, logit_lens=5))
    for p, row, lens in asked:
        assert row.shape == (2, p + 1) and lens.position == p and lens.layers == (0, 1, 2)
        np.testing.assert_allclose(row, reference[1][0, [2, 3], p, :p + 1].numpy(), atol=1e-5)
        want = alone[p - n_prompt + 1].captures
        assert [t[0][0] for t in lens.top] == [want[i].lens[0][0] for i in lens.layers]
        np.testing.assert_allclose([t[0][1] for t in lens.top], [want[i].lens[0][1] for i in lens.layers], atol=1e-5)


class Stop(Exception):
    """What Streamlit raises in a page's script when its person presses Stop."""


def test_a_page_that_stops_a_run_shows_its_link_once_the_server_has_its_file(server, tiny_lm):
    """app/runs/run.py `settle`, as app/runs/live.py calls it after a Stop: the page's run stops at its second record, then the
    page asks the server and says the run is kept only once its file opens; a server that went away as it stopped
    gets a line saying the run was not kept, and no link."""
    from app.runs.run import new_run, settle, stream_generation
    from engine.service.client import RemoteModel

    lm = RemoteModel(server[0])
    request = GenerationRequest(tiny_prompt(6, seed=9), max_new_tokens=240, chat=False)
    run = new_run(lm, request, CapturePolicy(attention=False, stats=False), None)

    def press_stop(r) -> None:
        if len(r.tokens) == 2:
            raise Stop

    with pytest.raises(Stop):
        stream_generation(lm, run, press_stop)
    settle(lm, run)
    assert run.kept is True and run.status == "stopped" and "kept below" in run.status_line()
    assert httpx.get(f"{server[0]}/v1/playground/runs/{run.id}/file", timeout=10).status_code == 200
    with socket.socket() as s:                               # a port nobody answers on: the server went away
        s.bind(("127.0.0.1", 0))
        lm.http = httpx.Client(base_url=f"http://127.0.0.1:{s.getsockname()[1]}", timeout=5)
        run.kept = None
        settle(lm, run)
    assert run.kept is False and "did not confirm it kept" in run.status_line() and "?run=" not in run.status_line()


def test_the_run_stream_sends_every_record_then_ends(server, client, model):
    reply = client.completions.create(model=model, prompt=tiny_prompt(5), max_tokens=5, temperature=0)
    with httpx.stream("GET", f"{server[0]}/v1/playground/runs/{reply.playground['run_id']}/stream", timeout=30) as r:
        events = [line.removeprefix("event: ") for line in r.iter_lines() if line.startswith("event: ")]
    assert events[0] == "info" and events[-1] == "end" and events.count("record") == 6     # prefill, 4 decode, done


def test_an_unknown_run_is_a_404_in_openais_shape(server):
    r = httpx.get(server[0] + "/v1/playground/runs/run-0000000000000000")
    assert r.status_code == 404 and error_of(r)["code"] == "run_not_found"


def test_metrics_use_vllms_names_and_count_requests(server, client, model):
    def scrape() -> dict[str, float]:
        text = httpx.get(server[0] + "/metrics").text
        return {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
                if line and not line.startswith("#")}
    before = scrape()
    client.completions.create(model=model, prompt=tiny_prompt(5), max_tokens=3, temperature=0)
    after = scrape()
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        assert f"playground:{name}" in after
    assert after["playground:generation_tokens_total"] - before.get("playground:generation_tokens_total", 0) == 3
    assert after["playground:time_to_first_token_seconds_count"] > before.get(
        "playground:time_to_first_token_seconds_count", 0)
    assert after["playground:prefix_cache_queries_total"] >= 5


# --- clients that go away -------------------------------------------------------------------------------------------

def test_a_client_that_disconnects_mid_stream_leaves_the_batch_at_once(server, client, model, hold):
    """Held at its first decode step until the server has noticed the client went away (a 250-token run takes ~0.2 s
    here: a fast machine finished it before the client's close arrived), then out at its next step: no token more."""
    with hold.at(2):
        stream = client.completions.create(model=model, prompt=tiny_prompt(6), max_tokens=250, temperature=0,
                                           stream=True)
        first = next(iter(stream))
        run_id = first.playground["run_id"]
        next(iter(stream))
        assert hold.held() == run_id
        stream.close()
        assert hold.cancelled() == run_id                                # noticed while its step was held
    deadline = time.monotonic() + 60                                    # a guard against a hang, not a speed
    while (info := httpx.get(f"{server[0]}/v1/playground/runs/{run_id}").json()["info"])["state"] == "running":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert info["state"] == "cancelled" and info["n_records"] == 3     # prefill, the held step, its end: no step more
    assert not httpx.get(server[0] + "/v1/playground/room").json()["members"]


def test_a_client_that_never_reads_its_stream_disturbs_nobody(server, client, model):
    body = json.dumps({"model": model, "prompt": tiny_prompt(6), "max_tokens": 200, "stream": True}).encode()
    host, port = server[0].removeprefix("http://").split(":")
    silent = socket.create_connection((host, int(port)))
    silent.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    try:
        reply = client.completions.create(model=model, prompt=tiny_prompt(5, seed=9), max_tokens=6, temperature=0)
        assert reply.choices[0].finish_reason in ("length", "stop")
        deadline = time.monotonic() + 30                        # the silent one runs to its end, then leaves the batch
        while httpx.get(server[0] + "/v1/playground/room").json()["members"]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        silent.close()
    assert httpx.get(server[0] + "/health").status_code == 200


def test_a_hundred_connections_opened_and_dropped_leave_the_server_serving(server, client, model):
    host, port = server[0].removeprefix("http://").split(":")
    for i in range(100):
        s = socket.create_connection((host, int(port)))
        if i % 3 == 1:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{\"mod")
        elif i % 3 == 2:
            s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        s.close()
    reply = client.completions.create(model=model, prompt=tiny_prompt(5), max_tokens=3, temperature=0)
    assert reply.usage.completion_tokens == 3


# --- bad input: a clear OpenAI-style error, the right status, nothing else disturbed ---------------------------------

BAD = [
    ("malformed JSON", b'{"model": "m", "prompt": ', 400, None),
    ("not UTF-8", b'{"model": "m", "prompt": "\xff\xfe"}', 400, None),
    ("wrong type", {"prompt": "w1", "temperature": "hot"}, 400, "temperature"),
    ("unknown field", {"prompt": "w1", "frobnicate": 1}, 400, "frobnicate"),
    ("n > 1", {"prompt": "w1", "n": 2}, 400, "n"),
    ("max_tokens 0", {"prompt": "w1", "max_tokens": 0}, 400, None),
    ("max_tokens 10^9", {"prompt": "w1", "max_tokens": 10**9}, 400, None),
    ("empty prompt", {"prompt": "   "}, 400, None),
    ("1 MB prompt", {"prompt": "w1 " * 350_000}, 400, None),
    ("over the context", {"prompt": "w1 " * 300}, 400, None),
    ("a penalty", {"prompt": "w1", "presence_penalty": 0.5}, 400, None),
]


@pytest.mark.parametrize("what, body, status, param", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gets_a_clear_error_with_the_right_status(server, model, what, body, status, param):
    if isinstance(body, dict):
        r = httpx.post(server[0] + "/v1/completions", json={"model": model, **body}, timeout=30)
    else:
        r = httpx.post(server[0] + "/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    error = error_of(r)
    assert error["type"] == "invalid_request_error"
    if param:
        assert param in error["message"]


def test_an_unknown_model_is_a_404_the_openai_client_understands(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="gpt-17", prompt="w1", max_tokens=2)
    assert "does not exist" in str(err.value)


def test_a_body_over_the_cap_is_a_413(server, model):
    r = httpx.post(server[0] + "/v1/completions", content=b"x" * (9 * 2**20), headers={"content-type": "application/json"})
    assert r.status_code == 413 and error_of(r)["code"] == "request_too_large"


def test_a_chunked_body_is_counted_as_it_arrives_and_one_over_the_cap_is_a_413(server, model):
    """No Content-Length: the guard reads the body (up to the cap) before the route does."""
    chunks = lambda body: (body[i:i + 2**20] for i in range(0, len(body), 2**20))  # noqa: E731 - httpx: chunked
    r = httpx.post(server[0] + "/v1/completions", content=chunks(b"x" * (9 * 2**20)),
                   headers={"content-type": "application/json"})
    assert r.status_code == 413 and error_of(r)["code"] == "request_too_large"
    body = json.dumps({"model": model, "prompt": "w1 w2", "max_tokens": 2, "temperature": 0}).encode()
    r = httpx.post(server[0] + "/v1/completions", content=chunks(body), headers={"content-type": "application/json"})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=30),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
                    max_leaves=12)
FIELDS = st.sampled_from(["model", "prompt", "messages", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop",
                          "n", "stream", "logprobs", "top_logprobs", "stream_options", "playground", "user", "echo"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.dictionaries(FIELDS, JSON, max_size=6), chat=st.booleans())
def test_any_request_body_gets_an_answer_or_a_clear_error_never_a_crash(server, model, body, chat):
    if "model" not in body or not isinstance(body["model"], str):
        body["model"] = model
    body["max_tokens"] = body.get("max_tokens") if not isinstance(body.get("max_tokens"), int) else 2
    path = "/v1/chat/completions" if chat else "/v1/completions"
    r = httpx.post(server[0] + path, content=json.dumps(body, allow_nan=True), timeout=60,
                   headers={"content-type": "application/json"})
    assert r.status_code in (200, 400, 404, 413, 429), r.text
    if r.status_code != 200:
        error_of(r)
    elif not body.get("stream"):
        assert r.json()["choices"]


def test_the_server_survives_the_fuzz(server, client, model):
    assert server[1].poll() is None
    assert client.completions.create(model=model, prompt=tiny_prompt(4), max_tokens=2, temperature=0).choices


# --- a server of its own: a key, a full queue, a model that does not load -----------------------------------------------

@pytest.fixture(scope="module")
def guarded_hold(tmp_path_factory) -> Hold:
    return Hold(tmp_path_factory.mktemp("guarded-hold"))


@pytest.fixture(scope="module")
def guarded(tiny_model_dir, tmp_path_factory, guarded_hold):
    args = tiny_args(tiny_model_dir, "--api-key", KEY, "--max-batch", "1", "--max-queue", "0")
    with running_server(tmp_path_factory.mktemp("guarded"), args, hold=guarded_hold) as (url, _):
        yield url


def test_an_api_key_guards_every_v1_route(guarded):
    r = httpx.get(guarded + "/v1/models")
    assert r.status_code == 401 and error_of(r)["type"] == "authentication_error"
    assert httpx.get(guarded + "/v1/models", headers={"Authorization": "Bearer wrong-key-0000000"}).status_code == 401
    assert httpx.get(guarded + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert httpx.get(guarded + "/health").status_code == 200


def test_a_full_queue_is_a_429_with_retry_after_and_the_running_request_goes_on(guarded, guarded_hold):
    """The one place in the batch taken, a second request is refused with 429 and Retry-After, and the first goes on.
    The first is held at its first token while the second arrives: the tiny model finished its 250 tokens before the
    second request on a busy machine (the suite once saw a 200), which five tries only made rarer."""
    c = openai.OpenAI(base_url=guarded + "/v1", api_key=KEY, max_retries=0)
    name = c.models.list().data[0].id
    with guarded_hold.at(1):
        first = c.completions.create(model=name, prompt=tiny_prompt(6), max_tokens=250, stream=True)
        next(iter(first))
        guarded_hold.held()                                         # the one place in the batch is taken
        r = httpx.post(guarded + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
                       json={"model": name, "prompt": "w1 w2", "max_tokens": 2})
    rest = "".join(chunk.choices[0].text for chunk in first if chunk.choices)
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1 and error_of(r)["code"] == "queue_full"
    assert rest                                                     # the running one finished its answer


def test_a_model_that_does_not_load_answers_503_with_the_reason(tmp_path):
    with running_server(tmp_path, ["--model", str(tmp_path / "missing"), "--device", "cpu"], ready=False) as (url, _):
        deadline = time.monotonic() + 60
        while (r := httpx.get(url + "/v1/models")).status_code == 503 and "could not be loaded" not in r.text:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert r.status_code == 503 and "could not be loaded" in error_of(r)["message"]
        assert r.headers["retry-after"]


def test_a_wide_bind_without_a_key_is_refused_at_start(tiny_model_dir):
    out = subprocess.run([python(), "-m", "engine", "serve", *tiny_args(tiny_model_dir), "--host", "0.0.0.0"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--api-key" in out.stderr and "Traceback" not in out.stderr




def test_without_replicas_nothing_of_ray_is_imported():
    """Ray is an optional extra: the server, its clients and the launcher never import it unless --replicas asks."""
    code = ("import sys, engine.cli, engine.server.app, engine.launch, engine.service.service, "
            "engine.service.client, app.launch, app.hosting.model, app.speed.room; "
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")
    out = subprocess.run([python(), "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_request_made_with_openai_comes_back_as_a_run_file(server, client, model, tiny_lm):
    """GET /v1/playground/runs/{id}/file: the run file engine.runs.load reads, its attention the engine's own for the
    same prompt (float32, to rounding), its logit lens filled in by the server; a live or unknown run is one line."""
    from engine.runs import loads

    prompt = tiny_prompt(8, seed=5)
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}], max_tokens=3,
                                           temperature=0, extra_body={"playground": {"capture": True}})
    r = httpx.get(f"{server[0]}/v1/playground/runs/{reply.id}/file", timeout=60)
    assert r.status_code == 200 and r.headers["content-type"] == "application/zip"
    run = loads(r.content, "api.run.zip")
    assert run.request.prompt == prompt and run.source == str(tiny_lm.source)
    alone = generate_captured(tiny_lm, run.request, run.policy)
    assert run.prompt_ids == [p.id for p in alone[0].prompt] and run.token_ids[0] == alone[0].token.id
    assert run.layers == list(range(tiny_lm.spec.n_layers))              # derived on the server from the residual
    for layer in run.layers:
        np.testing.assert_allclose(run.capture(layer).attention, alone[0].captures[layer].attention, atol=1e-5)
    assert len(run.logit_lens()) == len(run.layers)
    missing = httpx.get(server[0] + "/v1/playground/runs/run-0000000000000000/file")
    assert missing.status_code == 404 and error_of(missing)["code"] == "run_not_found"


def test_the_logits_checksum_comes_only_when_asked_for(client, model):
    """Without the invariant mode a completion carries `playground.logits_sha256` only where the request asked
    (`"playground": {"logits_sha256": true}`); asked twice, the same greedy question gives the same value."""
    args = dict(model=model, prompt=tiny_prompt(9, seed=5), max_tokens=4, temperature=0)
    plain = client.completions.create(**args)
    assert plain.playground.get("logits_sha256") is None
    asked = [client.completions.create(**args, extra_body={"playground": {"logits_sha256": True}}).playground
             for _ in range(2)]
    assert len(asked[0]["logits_sha256"]) == 64 and asked[0]["logits_sha256"] == asked[1]["logits_sha256"]
