"""Streaming API clients for bench/api.py, in worker processes of their own.

A process's threads share one GIL, and the official `openai` client spends about a millisecond of CPU on each
streamed chunk on a 2-core machine (it parses the SSE line and builds a pydantic object per token). One process of
30 client threads therefore tops out near a thousand tokens a second whatever the server does: on a GPU, where the
room's target is 1,500, the benchmark would measure its own clients. So the clients are spread over `procs` worker
processes (each with a thread per stream), started once and reused for every round. Only `openai` is imported
here, so a spawned worker starts in about a second.

    pool = ClientPool(procs=4, base_url="http://127.0.0.1:8000/v1")
    t0, outcomes = pool.run(model, prompts, tokens=64, capture=False)    # every stream released at t0
    pool.close()

Times are `time.time()` (shared by the processes): t0 and each outcome's `submitted`, `first`, `finished`, and
`stamps`, when each piece of text arrived (bench/vs_vllm.py's inter-token latency); `extra` adds fields to every
request's body.
"""
from __future__ import annotations

import multiprocessing as mp
import threading
import time
from typing import Any

import openai

START_AFTER = 1.0          # seconds between handing out a round and its streams starting: every worker is ready


def stream_once(client: openai.OpenAI, model: str, prompt: str, tokens: int, capture: bool, start_at: float,
                extra: dict | None = None) -> dict:
    """One client: a streaming chat completion of `prompt` (a user message's text), read to the end, released at
    `start_at`; `extra`: more fields for the request body."""
    time.sleep(max(0.0, start_at - time.time()))
    out: dict[str, Any] = {"prompt": prompt, "submitted": time.time(), "first": None, "finished": None,
                           "tokens": 0, "prompt_tokens": None, "text": None, "error": None, "refused": None,
                           "stamps": []}
    body = {**({"playground": {"capture": True}} if capture else {}), **(extra or {})} or None
    try:
        stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                                max_tokens=tokens, temperature=0, stream=True,
                                                stream_options={"include_usage": True}, extra_body=body)
        text = []
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                out["stamps"].append(time.time())
                out["first"] = out["first"] or out["stamps"][-1]
                text.append(chunk.choices[0].delta.content)
            if chunk.usage is not None:
                out["tokens"], out["prompt_tokens"] = chunk.usage.completion_tokens, chunk.usage.prompt_tokens
        out["text"] = "".join(text)
    except openai.RateLimitError as err:
        out["refused"] = str(err)
    except Exception as err:  # noqa: BLE001 - reported, and it fails the run
        out["error"] = f"{type(err).__name__}: {err}"
    out["finished"] = time.time()
    return out


def worker(conn: Any, base_url: str) -> None:
    """A worker process: runs each round it is sent, a thread per stream, and sends back the outcomes."""
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)
    while (job := conn.recv()) is not None:
        model, prompts, tokens, capture, start_at, extra = job
        outcomes: list[dict | None] = [None] * len(prompts)

        def one(i: int, prompt: str) -> None:
            outcomes[i] = stream_once(client, model, prompt, tokens, capture, start_at, extra)
        threads = [threading.Thread(target=one, args=(i, p)) for i, p in enumerate(prompts)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        conn.send(outcomes)


class ClientPool:
    """`procs` worker processes of streaming clients against one server."""

    def __init__(self, procs: int, base_url: str):
        ctx = mp.get_context("spawn")           # not fork: the parent holds a model and torch's threads
        self.conns, self.procs = [], []
        for _ in range(max(1, procs)):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=worker, args=(child, base_url), daemon=True)
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)

    def run(self, model: str, prompts: list[str], tokens: int, capture: bool, extra: dict | None = None,
            start_after: float = START_AFTER) -> tuple[float, list[dict]]:
        """Every prompt streamed at once, spread round-robin over the workers; (t0, outcomes in prompt order)."""
        n = len(self.conns)
        start_at = time.time() + start_after
        for w, conn in enumerate(self.conns):
            conn.send((model, prompts[w::n], tokens, capture, start_at, extra))
        parts = [conn.recv() for conn in self.conns]
        outcomes: list[dict] = [{}] * len(prompts)
        for w, part in enumerate(parts):
            outcomes[w::n] = part
        return start_at, outcomes

    def close(self) -> None:
        for conn in self.conns:
            conn.send(None)
        for proc in self.procs:
            proc.join(timeout=10)
