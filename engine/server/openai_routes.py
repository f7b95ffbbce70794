"""`/v1/models`, `/v1/chat/completions` and `/v1/completions`: the OpenAI API over the engine's scheduler.

The routes only translate: an OpenAI request becomes the engine's `GenerationRequest` (checked at the scheduler's
door like a browser's), the engine's records become OpenAI responses or server-sent chunks. Every request is a
run of the service's run store: its id comes back as `playground.run_id` (and the `X-Playground-Run` header), so
`GET /v1/playground/runs/{id}` shows it, captures and all when it asked for them.
"""
from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from fastapi.sse import EventSourceResponse
from starlette.concurrency import run_in_threadpool

from engine.core.generate import GenerationRequest
from engine.core.hooks import CAPTURE_OFF, CapturePolicy
from engine.core.records import DecodeRecord, DoneRecord, PrefillRecord, SampledToken
from engine.core.token_bytes import token_bytes, token_texts
from engine.errors import EngineError, InvalidRequestError
from engine.server import protocol as p
from engine.server.state import ServerState, api_error, log, run_headers
from engine.server.streams import RecordStream
from engine.service.service import EngineService
from engine.serving.capture import capture_policy
from engine.serving.scheduler import Handle

router = APIRouter()
KEEPALIVE_SECONDS = 1.0          # a comment line while a streamed request waits: it also finds a gone client
FINISH = {"eos": "stop", "stop": "stop", "length": "length"}     # anything else (cancelled, timeout): "abort"


@router.get("/v1/models", response_model=p.ModelList)
async def list_models(request: Request) -> p.ModelList:
    state: ServerState = request.app.state.server
    service = state.ready()
    card = p.ModelCard(id=state.served_name, created=int(state.started), max_model_len=service.spec.max_context)
    return p.ModelList(data=[card])


@router.post("/v1/chat/completions", response_model=p.ChatCompletion)
async def chat_completions(body: p.ChatCompletionRequest, request: Request) -> Any:
    return await complete(request, body, chat_request(body), chat=True)


@router.post("/v1/completions", response_model=p.Completion)
async def completions(body: p.CompletionRequest, request: Request) -> Any:
    return await complete(request, body, completion_request(body), chat=False)


# --- from OpenAI's request to the engine's ------------------------------------------------------------------------

def chat_request(body: p.ChatCompletionRequest) -> GenerationRequest:
    """Leading system (or developer) messages become the system prompt; the last message must be the user's; the
    turns between are the conversation so far, laid out by the model's own chat template."""
    messages = list(body.messages)
    system = []
    while messages and messages[0].role in ("system", "developer"):
        system.append(messages.pop(0).text())
    if not messages or messages[-1].role != "user":
        raise InvalidRequestError("the last message must be the user's: this server answers it as the assistant")
    history = tuple(("system" if m.role == "developer" else m.role, m.text()) for m in messages[:-1])
    return _sampled(body, messages[-1].text(), chat=True, system="\n\n".join(system) or None, history=history)


def completion_request(body: p.CompletionRequest) -> GenerationRequest:
    return _sampled(body, body.prompt, chat=False)


def _sampled(body: p.SamplingFields, prompt: str, **kw: Any) -> GenerationRequest:
    temperature = 1.0 if body.temperature is None else body.temperature      # OpenAI's defaults
    seed = body.seed if body.seed is not None else secrets.randbits(62)
    checksum = bool(body.playground and body.playground.logits_sha256)
    return GenerationRequest(prompt, 1, temperature, max(body.top_k or 0, 0),
                             1.0 if body.top_p is None else body.top_p, seed, tuple(body.stop or ()),
                             logits_sha256=checksum, **kw)


def max_new_tokens(body: Any, service: EngineService, n_prompt: int) -> int:
    """What was asked for (within this server's limit), else as many as the limit and the context allow."""
    limit = service.limits.max_new_tokens
    asked = getattr(body, "max_completion_tokens", None) or body.max_tokens
    room = service.spec.max_context - n_prompt
    if asked is None:
        return max(1, min(limit, room))
    if not 1 <= asked <= limit:
        raise InvalidRequestError(f"max_tokens is {asked:,}; this server generates 1 to {limit:,} tokens per request")
    return asked


def capture(options: p.PlaygroundOptions | None, service: EngineService, n_prompt: int,
            max_new: int) -> tuple[CapturePolicy, str | None]:
    """The capture a request asked for: none, the pages' own policy within the limits, or an explicit one (which
    the door checks against the same limits)."""
    want = options.capture if options is not None else False
    if want is False:
        return CAPTURE_OFF, None
    limits = service.limits
    if want is True:
        return capture_policy(service.spec, n_prompt, max_new, True, limits.max_capture_bytes,
                              limits.max_capture_layers, service.dtype.itemsize)
    return CapturePolicy(layers=None if want.layers is None else tuple(want.layers),
                         heads=None if want.heads is None else tuple(want.heads), attention=want.attention,
                         prefill_matrix=want.prefill_matrix, max_keys=want.max_keys, stats=want.stats,
                         logit_lens=want.logit_lens, inputs=None if want.inputs is None else tuple(want.inputs)), None


# --- running it -------------------------------------------------------------------------------------------------------

async def complete(http: Request, body: Any, request: GenerationRequest, chat: bool) -> Any:
    state: ServerState = http.app.state.server
    service = state.ready()
    state.check_model(body.model)
    n_prompt = (await run_in_threadpool(service.check, request)).n_prompt
    request = replace(request, max_new_tokens=max_new_tokens(body, service, n_prompt))
    policy, note = capture(body.playground, service, n_prompt, request.max_new_tokens)
    stream = RecordStream(asyncio.get_running_loop())
    session = body.playground.session if body.playground else None
    handle = await run_in_threadpool(service.submit, request, policy, session=session, source="api",
                                     listeners=(stream,))
    stream.until_kept(service, handle.run_id)
    reply = Reply(state.served_name, handle, chat, service, body, policy.enabled, note)
    if body.stream:
        return EventSourceResponse(reply.events(stream, http), headers=run_headers(handle.run_id))
    try:
        done = await reply.collect(stream, http)
    finally:
        handle.cancel()
    if done is None:
        return api_error(handle.error or InvalidRequestError("the request stopped before it finished"))
    return JSONResponse(reply.whole(done).model_dump(exclude_none=True), headers=run_headers(handle.run_id))


@dataclass
class Reply:
    """One request's answer as it builds up: text (held back near a stop string), token logprobs, the end."""

    model: str
    handle: Handle
    chat: bool
    service: EngineService
    body: Any
    captured: bool
    note: str | None
    created: int = field(default_factory=lambda: int(time.time()))
    text: str = ""                   # everything the tokens spelled so far
    sent: int = 0                    # characters of `text` already sent
    tokens: list[SampledToken] = field(default_factory=list)
    logits_sha256: str | None = None # the run's logits checksum, from its DoneRecord

    @property
    def id(self) -> str:
        return ("chatcmpl-" if self.chat else "cmpl-") + self.handle.run_id.removeprefix("run-")

    @property
    def hold(self) -> int:
        """Characters kept back while streaming: a stop string may still be completing in them."""
        return max((len(s) for s in self.handle.request.stop), default=1) - 1

    def add(self, record: Any) -> None:
        token = record.token if isinstance(record, (PrefillRecord, DecodeRecord)) else None
        if token is not None:
            self.tokens.append(token)
            self.text += token.text
        elif isinstance(record, DoneRecord):
            self.logits_sha256 = record.logits_sha256

    async def collect(self, stream: RecordStream, http: Request) -> DoneRecord | None:
        """Every record until the end (a client that goes away cancels the request); the DoneRecord, if any."""
        done = None
        async for record in stream.records(tick=KEEPALIVE_SECONDS):
            if record is None:
                if await http.is_disconnected():
                    self.handle.cancel()
                continue
            self.add(record)
            done = record if isinstance(record, DoneRecord) else done
        return done

    def whole(self, done: DoneRecord) -> Any:
        usage = p.Usage(prompt_tokens=done.prompt_tokens, completion_tokens=done.generated_tokens,
                        total_tokens=done.prompt_tokens + done.generated_tokens)
        finish = FINISH.get(done.finish_reason, "abort")
        info = self.info(done.finish_reason)
        if self.chat:
            choice = p.ChatChoice(message=p.AssistantMessage(content=done.text), finish_reason=finish,
                                  logprobs=self.chat_logprobs(self.tokens))
            return p.ChatCompletion(id=self.id, created=self.created, model=self.model, choices=[choice],
                                    usage=usage, playground=info)
        choice = p.CompletionChoice(text=done.text, finish_reason=finish, logprobs=self.completion_logprobs(self.tokens))
        return p.Completion(id=self.id, created=self.created, model=self.model, choices=[choice], usage=usage,
                            playground=info)

    def info(self, finish: str | None = None) -> p.PlaygroundInfo:
        story = getattr(self.handle, "story", None) if finish is not None else None   # every handle's, once ended:
        timings = (story or {}).get("timings")             # the scheduler's, a model server's, a cluster replica's
        return p.PlaygroundInfo(run_id=self.handle.run_id, finish_reason=finish, captured=self.captured,
                                capture_note=self.note,
                                logits_sha256=self.logits_sha256 if finish is not None else None,
                                timings=None if timings is None else p.Timings.model_validate(timings))

    # --- streaming ---------------------------------------------------------------------------------------------------

    async def events(self, stream: RecordStream, http: Request) -> AsyncIterator[str]:
        """Server-sent events: the role, text deltas, the finish, usage when asked; `[DONE]`. A client that goes away
        ends this generator at its next await, and the request leaves the batch before its next step."""
        done = False
        try:
            async for event in self._events(stream):
                done = done or event is None
                if event is not None:
                    yield event
            if not done:                     # failed before its end: the error as an event, as vLLM sends it
                error = self.handle.error or EngineError("the request stopped before it finished")
                yield self.sse(api_error(error, body_only=True))
        except Exception as err:  # noqa: BLE001 - a bug here: the client gets an error event, not a cut stream
            log.exception("streaming run %s failed", self.handle.run_id)
            yield self.sse(api_error(err, body_only=True))
        finally:
            self.handle.cancel()
        yield "data: [DONE]\n\n"

    async def _events(self, stream: RecordStream) -> AsyncIterator[str | None]:
        """The chunks; None once the request's end has been sent."""
        yield self.sse(self.chunk(role=True, playground=self.info()))
        async for record in stream.records(tick=KEEPALIVE_SECONDS):
            if record is None:
                yield ": waiting\n\n"
                continue
            start = len(self.tokens)
            self.add(record)
            if isinstance(record, DoneRecord):
                yield self.sse(self.chunk(text=record.text[self.sent:], tokens=self.tokens[start:],
                                          finish=record.finish_reason))
                if self.body.stream_options and self.body.stream_options.include_usage:
                    yield self.sse(self.usage_chunk(record))
                yield None
            elif len(self.tokens) > start:
                yield self.sse(self.chunk(text=self.release(), tokens=self.tokens[start:]))

    def release(self) -> str:
        """The text that can be sent now: all of it but the last `hold` characters, and nothing from a stop string
        on (the token that completes one arrives before the request's end)."""
        stops = [self.text.find(x) for x in self.handle.request.stop if x and x in self.text]
        end = max(self.sent, min([len(self.text) - self.hold, *stops]))
        piece, self.sent = self.text[self.sent:end], end
        return piece

    def chunk(self, text: str = "", tokens: list[SampledToken] | None = None, finish: str | None = None,
              role: bool = False, playground: p.PlaygroundInfo | None = None) -> Any:
        if finish is not None:
            self.sent = len(self.text)
            playground = self.info(finish)
        reason = None if finish is None else FINISH.get(finish, "abort")
        if self.chat:
            delta = p.Delta(role="assistant", content="") if role else p.Delta(content=text)
            logprobs = self.chat_logprobs(tokens or []) if tokens else None
            return p.ChatCompletionChunk(id=self.id, created=self.created, model=self.model, playground=playground,
                                         choices=[p.ChunkChoice(delta=delta, finish_reason=reason, logprobs=logprobs)])
        logprobs = self.completion_logprobs(tokens or []) if tokens else None
        return p.Completion(id=self.id, created=self.created, model=self.model, usage=None, playground=playground,
                            choices=[p.CompletionChoice(text=text, finish_reason=reason, logprobs=logprobs)])

    def usage_chunk(self, done: DoneRecord) -> Any:
        usage = p.Usage(prompt_tokens=done.prompt_tokens, completion_tokens=done.generated_tokens,
                        total_tokens=done.prompt_tokens + done.generated_tokens)
        if self.chat:
            return p.ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=[], usage=usage)
        return p.Completion(id=self.id, created=self.created, model=self.model, choices=[], usage=usage)

    @staticmethod
    def sse(model: Any) -> str:
        data = model if isinstance(model, str) else model.model_dump_json(exclude_none=True)
        return f"data: {data}\n\n"

    # --- logprobs ----------------------------------------------------------------------------------------------------

    def chat_logprobs(self, tokens: list[SampledToken]) -> p.ChatLogprobs | None:
        if not getattr(self.body, "logprobs", False):
            return None
        top = self.body.top_logprobs or 0
        return p.ChatLogprobs(content=[self._token_logprob(t, top) for t in tokens])

    def _token_logprob(self, token: SampledToken, top: int) -> p.TokenLogprob:
        total = token.log_total()
        ids = [int(i) for i in token.logit_ids[:top]]
        texts, raw = self._texts([token.id, *ids])
        alternatives = [p.TopLogprob(token=texts[j + 1], logprob=float(token.logits[j]) - total, bytes=list(raw[j + 1]))
                        for j in range(len(ids))]
        return p.TokenLogprob(token=texts[0], logprob=token.logprob() or 0.0, bytes=list(raw[0]),
                              top_logprobs=alternatives)

    def completion_logprobs(self, tokens: list[SampledToken]) -> p.CompletionLogprobs | None:
        top = getattr(self.body, "logprobs", None)
        if top is None:
            return None
        out, offset = p.CompletionLogprobs(), len(self.text) - sum(len(t.text) for t in tokens)
        for token in tokens:
            total = token.log_total()
            texts, _ = self._texts([token.id, *[int(i) for i in token.logit_ids[:top]]])
            out.tokens.append(texts[0])
            out.token_logprobs.append(token.logprob())
            out.top_logprobs.append({texts[j + 1]: float(token.logits[j]) - total for j in range(len(texts) - 1)})
            out.text_offset.append(offset)
            offset += len(token.text)
        return out

    def _texts(self, ids: list[int]) -> tuple[list[str], list[bytes]]:
        tokenizer = self.service.tokenizer
        return token_texts(tokenizer, ids), token_bytes(tokenizer, ids)
