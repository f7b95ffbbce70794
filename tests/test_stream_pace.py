"""A streamed answer reaches its client token by token, as the steps make them (issue 54): through the real server
(`python -m engine serve` on a loopback port, the official `openai` client), counted in chunks and steps, never timed
against a wall-clock limit."""
from __future__ import annotations

import openai
import pytest

from conftest import tiny_prompt
from servers import running_server, tiny_args


@pytest.fixture(scope="module")
def client(tiny_model_dir, tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("pace"), tiny_args(tiny_model_dir)) as (url, _):
        yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_every_token_comes_in_its_own_chunk_one_chunk_a_step(client):
    """Each token chunk carries exactly one token (nothing held back to go out with a later one), in the order made;
    there are as many as the answer's tokens, and as many as the server's steps for the request: its prefill's
    token and one a decode step (`playground.timings`, counted by the server)."""
    model = client.models.list().data[0].id
    stream = client.completions.create(model=model, prompt=tiny_prompt(6), max_tokens=24, temperature=0,
                                       stream=True, logprobs=0, stream_options={"include_usage": True})
    chunks = list(stream)
    tokens = [c for c in chunks if c.choices and c.choices[0].logprobs and c.choices[0].logprobs.tokens]
    usage = [c.usage for c in chunks if c.usage is not None]
    timings = [c.playground["timings"] for c in chunks
               if isinstance(getattr(c, "playground", None), dict) and c.playground.get("timings")]
    assert usage and timings, "the stream ends with its usage and the server's timings"
    assert all(len(c.choices[0].logprobs.tokens) == 1 for c in tokens)
    assert len(tokens) == usage[-1].completion_tokens > 1
    assert sum(timings[-1]["batch_sizes"].values()) + 1 == len(tokens)
    whole = client.completions.create(model=model, prompt=tiny_prompt(6), max_tokens=24, temperature=0)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
