"""The OpenAI API's requests, responses and errors as pydantic models, declared once (as vLLM's
entrypoints/openai/*/protocol.py do), and our one extension: the `playground` field.

Fields OpenAI defines that this server does not implement are declared too, so that a client sending their
default gets on and a client asking for more gets a 400 that names the field; anything else unknown is a 400
(`extra="forbid"`), as OpenAI's own API answers "Unrecognized request argument".
"""
from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_STOP = 8                       # engine.core.generate.MAX_STOPS
MAX_TOP_LOGPROBS = 20


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- errors ------------------------------------------------------------------------------------------------------

class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


# --- the playground extension --------------------------------------------------------------------------------------

class CaptureSpec(Strict):
    """What to capture, in the engine's own terms (engine.core.hooks.CapturePolicy); checked against the limits."""

    layers: list[int] | None = None
    heads: list[int] | None = None
    attention: bool = True
    prefill_matrix: bool = True
    max_keys: int | None = Field(default=None, ge=1)
    stats: bool = True
    logit_lens: int = Field(default=0, ge=0, le=MAX_TOP_LOGPROBS)
    inputs: list[int] | None = Field(default_factory=list)   # layers whose input is kept (attention on demand); null: all


class PlaygroundOptions(Strict):
    """`"playground": {...}` in a request body: captures (false, true for the pages' policy, or a CaptureSpec), the
    session it counts for (optional: a browser session's id, for the one-request-per-session rule), and whether to
    return `playground.logits_sha256` at the end (always returned while the server's invariant mode is on)."""

    capture: bool | CaptureSpec = False
    session: str | None = Field(default=None, max_length=128)
    logits_sha256: bool = False


# --- shared request fields ------------------------------------------------------------------------------------------

class StreamOptions(Strict):
    include_usage: bool = False


class SamplingFields(Strict):
    model: str = Field(max_length=1024)
    max_tokens: int | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)          # vLLM's extension; -1 and 0 are off
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = Field(default=None, max_length=256)
    playground: PlaygroundOptions | None = None

    @field_validator("n")
    @classmethod
    def _one(cls, n: int) -> int:
        if n != 1:
            raise ValueError("this server returns one choice per request: n must be 1")
        return n

    @field_validator("stop")
    @classmethod
    def _stops(cls, stop: str | list[str] | None) -> list[str]:
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings")
        return stops

    @model_validator(mode="after")
    def _unsupported(self) -> "SamplingFields":
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise ValueError(f"{name} is not supported by this server (leave it at 0)")
        if self.logit_bias:
            raise ValueError("logit_bias is not supported by this server")
        return self


# --- chat ----------------------------------------------------------------------------------------------------------

class TextPart(Strict):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")          # `name`, `refusal` and the like are accepted and not used
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None

    @model_validator(mode="after")
    def _chat_only(self) -> "ChatCompletionRequest":
        if self.tools or self.tool_choice not in (None, "none"):
            raise ValueError("tools are not supported by this server")
        if self.response_format not in (None, {"type": "text"}):
            raise ValueError("only response_format {\"type\": \"text\"} is supported")
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class TimeSplit(BaseModel):
    """A stretch of a request's life taken apart, in seconds; the parts add up to `total`
    (engine/serving/timeline.py)."""

    queue: float                     # submitted until admitted to the batch
    prefill: float                   # its own share of the prefill passes it ran in
    decode: float                    # its decode rows at one row's pace (this server's one-row step)
    batch: float                     # what the batch's size added (its rows above one row's pace, others' decode)
    others_prefill: float            # the other requests' prefill chunks in the steps it lived through
    between_steps: float             # the server's own time between those steps
    total: float


class Behind(BaseModel):
    """Another request whose prompt was prefilled in the steps this one lived through."""

    id: int                          # the scheduler's request number
    tokens: int                      # its prompt tokens computed in those steps
    seconds: float                   # what they added to this request


class Timings(BaseModel):
    """Why this answer took the time it took, from the server's own step log; the metric-named fields are what
    /metrics observes for the same request (playground:request_queue_time_seconds, ...)."""

    run_id: str
    e2e_request_latency_seconds: float
    request_queue_time_seconds: float
    request_prefill_time_seconds: float | None = None
    request_decode_time_seconds: float | None = None
    time_to_first_token_seconds: float | None = None
    split: TimeSplit
    first_token_split: TimeSplit | None = None
    behind: list[Behind] = []
    batch_sizes: dict[str, int] = {}  # decode rows -> steps it decoded in with that many rows
    steps: int = 0
    wait_reason: str = ""
    alone_seconds: float | None = None
    alone_how: str = ""
    one_row_step_seconds: float | None = None
    stopped: bool = False


class PlaygroundInfo(BaseModel):
    """Our extension in a response: the run's id (GET /v1/playground/runs/{run_id}) and the engine's own reason;
    `timings` in the body (or a stream's last chunk) once the request has ended."""

    run_id: str
    finish_reason: str | None = None
    captured: bool = False
    capture_note: str | None = None
    timings: Timings | None = None
    logits_sha256: str | None = None  # at the end: sha256 over the float32 bytes of every step's logits row; two
    #                                   runs with the same value computed bitwise the same numbers (issue 51)


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str | None
    logprobs: ChatLogprobs | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage
    playground: PlaygroundInfo


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    playground: PlaygroundInfo | None = None


# --- completions ---------------------------------------------------------------------------------------------------

class CompletionRequest(SamplingFields):
    prompt: str | list[str]
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt: str | list[str]) -> str:
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise ValueError("this server takes one prompt per request")
            return prompt[0]
        return prompt

    @model_validator(mode="after")
    def _completions_only(self) -> "CompletionRequest":
        if self.echo or self.suffix or (self.best_of or 1) != 1:
            raise ValueError("echo, suffix and best_of are not supported by this server")
        return self


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None
    playground: PlaygroundInfo | None = None


# --- models --------------------------------------------------------------------------------------------------------

class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "inference-playground"
    max_model_len: int | None = None          # vLLM's extension


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
