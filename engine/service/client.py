"""The one typed interface to the served model, with two transports:

- in-process: `EngineService` itself (engine/service/service.py), the default of `make run`;
- remote: `RemoteModel(url)`, the same calls over HTTP to `python -m engine serve` (engine/server/), so that a web
  process holds no model and several of them share one.

    client = RemoteModel("http://127.0.0.1:8000", api_key=None)
    client.label, client.spec, client.limits           # what the model is
    handle = client.submit(GenerationRequest("Hi"), CAPTURE_ALL, session="a1b2")
    for record in handle.records(on_wait=print): ...   # the engine's own records, numpy arrays and all
    client.run_slice(handle.run_id)                    # any run by id; client.board, client.room() ...

A refusal raises the same EngineError subclass on both transports (the server sends its code, the client raises
the class). Records cross as MessagePack (engine/service/wire.py).
"""
from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Protocol

import httpx
import torch

from engine import errors
from engine.core.generate import GenerationRequest
from engine.core.hooks import CAPTURE_OFF, CapturePolicy
from engine.core.records import DoneRecord
from engine.errors import EngineError
from engine.projection.specs import ModelSpec
from engine.service import wire
from engine.service.board import BoardState, PresenterError, Push
from engine.service.join import JoinRefused, room_gate
from engine.service.replicas import ReplicaView
from engine.serving.timeline import story_problem
from engine.service.runs import RunInfo, RunNotFoundError, RunSlice
from engine.service.service import MemoryRow, ModelInfo
from engine.serving.limits import Limits
from engine.serving.prefix import PrefixStats
from engine.serving.scheduler import (CheckedRequest, JobResult, QueueStatus, RoomState, SchedulerStats,
                                      SessionLimitError, Span)
from engine.speculative.options import DraftModelOption

MSGPACK = "application/x-msgpack"
CONNECT_SECONDS, READ_SECONDS = 5.0, 120.0
BOARD_SECONDS = 0.25            # a board snapshot is reused this long (one rerun reads it several times)
TOKEN_CHECK_SECONDS = 10.0      # a presenter-token check is reused this long


class ModelClient(Protocol):
    """What a page may ask of the served model (both transports implement it)."""

    transport: str
    name: str
    label: str
    source: Any
    spec: ModelSpec
    dtype_name: str
    device: torch.device
    dtype: torch.dtype
    tokenizer: Any
    has_chat_template: bool
    weight_bytes: int
    load_seconds: float
    limits: Limits
    board: Any
    launched_draft: str | None

    def info(self) -> ModelInfo: ...
    def check(self, request: GenerationRequest, policy: CapturePolicy = CAPTURE_OFF) -> CheckedRequest: ...
    def submit(self, request: GenerationRequest | CheckedRequest, policy: CapturePolicy | None = None,
               session: str | None = None, draft: str | None = None, k: int = 4, source: str = "page",
               parent: str | None = None) -> Any: ...
    def submit_job(self, name: str, params: Mapping[str, Any] | None = None, session: str | None = None,
                   source: str = "page") -> Any: ...
    def quick(self, name: str, params: Mapping[str, Any] | None = None) -> Any: ...
    def draft_options(self) -> list[DraftModelOption]: ...
    def load_draft(self, spec: str, progress: Callable[[float, str], None] | None = None) -> str: ...
    def stats(self) -> SchedulerStats: ...
    def room(self) -> RoomState: ...
    def replicas_view(self) -> list[ReplicaView]: ...
    def timeline(self) -> list[Span]: ...
    def prefix_stats(self) -> PrefixStats: ...
    def memory(self) -> list[MemoryRow]: ...
    def join(self, session: str, person: str | None = None) -> None: ...
    def leave(self, session: str) -> None: ...
    def report_presence(self, process: str, sessions: Iterable[str]) -> None: ...
    def run_slice(self, run_id: str, since: int = 0) -> RunSlice: ...
    def run_wait(self, run_id: str, since: int, timeout: float) -> RunSlice: ...
    def run_list(self, limit: int = 50) -> list[RunInfo]: ...


class ServerUnavailableError(EngineError):
    """The model server cannot be reached, or is not ready yet."""


# --- errors across the wire --------------------------------------------------------------------------------------

ERROR_CODES: dict[str, type[Exception]] = {
    "invalid_request": errors.InvalidRequestError, "context_length_exceeded": errors.ContextLengthError,
    "insufficient_memory": errors.InsufficientMemoryError, "queue_full": errors.QueueFullError,
    "session_limit": SessionLimitError, "request_timeout": errors.RequestTimeoutError,
    "draft_mismatch": errors.DraftMismatchError, "run_not_found": RunNotFoundError,
    "model_not_found": errors.ModelNotFoundError, "presenter": PresenterError, "not_ready": ServerUnavailableError,
    "request_too_large": errors.InvalidRequestError, "engine_error": EngineError,
}


def error_code(err: BaseException) -> str:
    """The code a server sends for an error (the most specific class in ERROR_CODES it is an instance of)."""
    for code, cls in ERROR_CODES.items():
        if type(err) is cls:
            return code
    for code, cls in ERROR_CODES.items():
        if isinstance(err, cls):
            return code
    return "engine_error"


def raise_for(response: httpx.Response) -> None:
    """The EngineError a server's error response stands for (its OpenAI-shaped body carries the code)."""
    if response.status_code < 400:
        return
    try:
        body = response.json()["error"]
        message, code = str(body.get("message")), str(body.get("code"))
    except Exception:  # noqa: BLE001 - a proxy's error page, an empty body
        message, code = f"the model server answered {response.status_code}", ""
    retry = response.headers.get("retry-after", "")
    if code in ERROR_CODES:
        err = ERROR_CODES[code](message)
        err.retry_after = float(retry) if retry.isdigit() else None
        raise err
    raise (ServerUnavailableError if response.status_code == 503 else EngineError)(message)


# --- the remote transport ---------------------------------------------------------------------------------------

class DescribedModel:
    """What a model served elsewhere is, read from its ModelInfo (`self._info`), and its tokenizer, loaded here once
    from the server's files (`_tokenizer_files`): tokenizing for display costs no request."""

    _info: ModelInfo
    _tokenizer: Any = None
    _tokenizer_lock: threading.Lock            # each instance its own

    name = property(lambda self: self._info.name)
    label = property(lambda self: self._info.label)
    source = property(lambda self: Path(self._info.source))
    spec = property(lambda self: self._info.spec)
    dtype_name = property(lambda self: self._info.dtype_name)
    device = property(lambda self: torch.device(self._info.device))
    dtype = property(lambda self: getattr(torch, self._info.dtype_name))
    has_chat_template = property(lambda self: self._info.has_chat_template)
    weight_bytes = property(lambda self: self._info.weight_bytes)
    load_seconds = property(lambda self: self._info.load_seconds)
    limits = property(lambda self: self._info.limits)
    launched_draft = property(lambda self: self._info.launched_draft)

    def info(self) -> ModelInfo:
        return self._info

    @property
    def tokenizer(self) -> Any:
        with self._tokenizer_lock:
            if self._tokenizer is None:
                from transformers import AutoTokenizer  # transformers: only once a remote client needs the tokenizer

                folder = Path(tempfile.mkdtemp(prefix="playground-tokenizer-"))
                for name, data in self._tokenizer_files().items():
                    (folder / Path(name).name).write_bytes(data)
                self._tokenizer = AutoTokenizer.from_pretrained(folder)
            return self._tokenizer

    def _tokenizer_files(self) -> dict[str, bytes]:
        raise NotImplementedError


class RemoteModel(DescribedModel):
    """A ModelClient over HTTP: the served model's description, and every call one request to the server."""

    transport = "remote"

    def __init__(self, url: str, api_key: str | None = None, timeout: float = READ_SECONDS):
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=self.url, headers=headers,
                                 timeout=httpx.Timeout(timeout, connect=CONNECT_SECONDS),
                                 limits=httpx.Limits(max_connections=256, max_keepalive_connections=64))
        self._info = self._call("GET", "/v1/playground/model")
        self.board = RemoteBoard(self)
        self.gate = RemoteGate(self)
        self._tokenizer_lock = threading.Lock()

    def _tokenizer_files(self) -> dict[str, bytes]:
        return self._call("GET", "/v1/playground/tokenizer")

    # requests
    def check(self, request: GenerationRequest, policy: CapturePolicy = CAPTURE_OFF) -> CheckedRequest:
        ids = self._call("POST", "/v1/playground/check", {"request": request, "policy": policy})
        return CheckedRequest(request, policy, tuple(ids), door=self)

    def submit(self, request: GenerationRequest | CheckedRequest, policy: CapturePolicy | None = None,
               session: str | None = None, draft: str | None = None, k: int = 4, source: str = "page",
               parent: str | None = None) -> "RemoteHandle":
        if isinstance(request, CheckedRequest):
            policy = request.policy if policy is None else policy
            request = request.request
        body = {"request": request, "policy": policy or CAPTURE_OFF, "session": session, "draft": draft, "k": k,
                "source": source, "parent": parent}
        return RemoteHandle.open(self, "/v1/playground/generate", body, request)

    def submit_job(self, name: str, params: Mapping[str, Any] | None = None, session: str | None = None,
                   source: str = "page") -> "RemoteHandle":
        body = {"name": name, "params": dict(params or {}), "session": session, "source": source}
        return RemoteHandle.open(self, "/v1/playground/jobs", body, None)

    def quick(self, name: str, params: Mapping[str, Any] | None = None) -> Any:
        return self._call("POST", "/v1/playground/quick", {"name": name, "params": dict(params or {})})

    def draft_options(self) -> list[DraftModelOption]:
        return self._call("GET", "/v1/playground/drafts")

    def load_draft(self, spec: str, progress: Callable[[float, str], None] | None = None) -> str:
        return self._call("POST", "/v1/playground/drafts", {"spec": spec})

    # the room
    def stats(self) -> SchedulerStats:
        return self._call("GET", "/v1/playground/stats")

    def room(self) -> RoomState:
        return self._call("GET", "/v1/playground/room")

    def replicas_view(self) -> list[ReplicaView]:
        return self._call("GET", "/v1/playground/replicas")

    def timeline(self) -> list[Span]:
        return self._call("GET", "/v1/playground/timeline")

    def prefix_stats(self) -> PrefixStats:
        return self._call("GET", "/v1/playground/prefix")

    def memory(self) -> list[MemoryRow]:
        return self._call("GET", "/v1/playground/memory")

    def join(self, session: str, person: str | None = None) -> None:
        self._call("POST", "/v1/playground/sessions/join", {"session": session, "person": person})

    def leave(self, session: str) -> None:
        self._call("POST", "/v1/playground/sessions/leave", {"session": session})

    def report_presence(self, process: str, sessions: Iterable[str]) -> None:
        self._call("POST", "/v1/playground/sessions/presence", {"process": process, "sessions": list(sessions)})

    # runs
    def run_slice(self, run_id: str, since: int = 0) -> RunSlice:
        return self._call("GET", f"/v1/playground/runs/{run_id}", params={"since": since})

    def run_wait(self, run_id: str, since: int, timeout: float) -> RunSlice:
        return self._call("GET", f"/v1/playground/runs/{run_id}", params={"since": since, "wait": timeout})

    def run_list(self, limit: int = 50) -> list[RunInfo]:
        return self._call("GET", "/v1/playground/runs", params={"limit": limit})

    def close(self) -> None:
        self.http.close()

    # the one way a call is made
    def _call(self, method: str, path: str, body: Any = None, params: Mapping[str, Any] | None = None) -> Any:
        content = wire.encode(body) if body is not None else None
        headers = {"Accept": MSGPACK, **({"Content-Type": MSGPACK} if content is not None else {})}
        try:
            response = self.http.request(method, path, content=content, headers=headers, params=params)
        except httpx.HTTPError as err:
            raise ServerUnavailableError(f"the model server at {self.url} cannot be reached "
                                         f"({type(err).__name__}); is `python -m engine serve` running?") from None
        raise_for(response)
        return wire.decode(response.content)


class RemoteHandle:
    """A request running on the server: its records as they stream back, its place in line, Stop."""

    def __init__(self, client: RemoteModel, response: httpx.Response, events: Iterator[Any],
                 request: GenerationRequest | None, first: Mapping[str, Any]):
        self.client, self.request = client, request
        self._response, self._events = response, events
        self.run_id: str = first["run_id"]
        self.id = first["id"]
        self.state = "queued"
        self.error: EngineError | None = None
        self._status = QueueStatus("queued", 0, 0, None, 0.0)
        self._closed = False
        self.story: dict[str, Any] | None = None     # its timeline and timings, from the server's end event

    @classmethod
    def open(cls, client: RemoteModel, path: str, body: Any, request: GenerationRequest | None) -> "RemoteHandle":
        """Send the request; a refusal raises here, as in-process submit does; else the first event names the run."""
        try:
            response = client.http.send(client.http.build_request(
                "POST", path, content=wire.encode(body), headers={"Accept": MSGPACK, "Content-Type": MSGPACK}),
                stream=True)
        except httpx.HTTPError as err:
            raise ServerUnavailableError(f"the model server at {client.url} cannot be reached "
                                         f"({type(err).__name__})") from None
        if response.status_code >= 400:
            response.read()
            response.close()
            raise_for(response)
        events = wire.stream(response.iter_bytes())
        try:
            first = next(events)
        except Exception:  # noqa: BLE001 - the server went away before naming the run
            response.close()
            raise ServerUnavailableError("the model server closed the request before it started") from None
        return cls(client, response, events, request, first)

    @property
    def done(self) -> bool:
        return self.state in ("done", "cancelled", "failed")

    def status(self) -> QueueStatus:
        return self._status

    def records(self, on_wait: Callable[[QueueStatus], None] | None = None, poll: float = 0.25) -> Iterator[Any]:
        """The run's records as the server sends them; `on_wait(status)` while queued. Closing it cancels the run."""
        got_done = False
        try:
            for event in self._events:
                kind = event.get("t")
                if kind == "status":
                    self._status = event["status"]
                    if on_wait is not None:
                        on_wait(self._status)
                elif kind == "record":
                    self.state = "running"
                    record = event["r"]
                    got_done = got_done or isinstance(record, (DoneRecord, JobResult))
                    yield record
                elif kind == "end":
                    self._end(event)
                    break
            if self.error is not None and not got_done:
                raise self.error
        except httpx.HTTPError as err:
            self.state, self.error = "failed", ServerUnavailableError(
                f"the connection to the model server was lost ({type(err).__name__}): this answer stopped there (the "
                "server may be restarting; finished runs are kept on disk). Try again in a few seconds")
            raise self.error from None
        finally:
            self.cancel()

    def _end(self, event: Mapping[str, Any]) -> None:
        self.state = event.get("state", "done")
        timeline = event.get("timeline")
        self.story = timeline if timeline is None or not story_problem(timeline) else None
        error = event.get("error")
        if error:
            self.error = ERROR_CODES.get(error.get("code"), EngineError)(error.get("message", ""))

    def result(self, timeout: float | None = None) -> list[Any]:
        return list(self.records())

    def value(self, timeout: float | None = None) -> Any:
        results = [r for r in self.records() if isinstance(r, JobResult)]
        if not results:
            raise self.error or EngineError("the job was cancelled before it finished")
        return results[-1].value

    def cancel(self) -> None:
        """Stop it: closing the stream is the signal (the server frees its place at the next step)."""
        if not self._closed:
            self._closed = True
            self._response.close()
            if not self.done:
                self.state = "cancelled"


class RemoteBoard:
    """The server's presenter board, read in one snapshot (reused for a moment) and written through the server."""

    def __init__(self, client: RemoteModel):
        self.client = client
        self._state: tuple[float, BoardState] | None = None
        self._checks: dict[str, tuple[float, bool]] = {}
        self._lock = threading.Lock()

    def state(self) -> BoardState:
        with self._lock:
            if self._state is not None and time.monotonic() - self._state[0] < BOARD_SECONDS:
                return self._state[1]
        state = self.client._call("GET", "/v1/playground/board")
        with self._lock:
            self._state = (time.monotonic(), state)
        return state

    enabled = property(lambda self: self.state().enabled)
    followers_may_generate = property(lambda self: self.state().followers_may_generate)

    def latest(self) -> Push | None:
        return self.state().latest

    def live(self) -> tuple[int, str | None]:
        s = self.state()
        return s.live_version, s.live_run

    def check(self, token: str | None) -> bool:
        if not token or not self.enabled:
            return False
        with self._lock:
            hit = self._checks.get(token)
            if hit is not None and time.monotonic() - hit[0] < TOKEN_CHECK_SECONDS:
                return hit[1]
        ok = bool(self.client._call("POST", "/v1/playground/board/check", {"token": token}))
        with self._lock:
            self._checks[token] = (time.monotonic(), ok)
        return ok

    def push(self, token: str | None, **fields: Any) -> Push:
        return self._write("push", token, fields)

    def clear(self, token: str | None) -> None:
        self._write("clear", token, {})

    def broadcast(self, token: str | None, run_id: str) -> int:
        return self._write("broadcast", token, {"run_id": run_id})

    def allow_generate(self, token: str | None, allowed: bool) -> None:
        if allowed != self.followers_may_generate:
            self._write("allow", token, {"allowed": bool(allowed)})

    def _write(self, what: str, token: str | None, fields: Mapping[str, Any]) -> Any:
        value = self.client._call("POST", f"/v1/playground/board/{what}", {"token": token, **fields})
        with self._lock:
            self._state = None
        return value


class RemoteGate:
    """The model server's join gate (engine/service/join.py's JoinGate, the same calls): one code and one set of
    members for every web process of a room. What only the presenter may do carries their token."""

    def __init__(self, client: RemoteModel):
        self.client = client

    def _ask(self, action: str, **fields: Any) -> Any:
        try:
            return self.client._call("POST", f"/v1/playground/gate/{action}", fields)
        except ServerUnavailableError:
            if action not in ("status", "admits", "join"):
                raise                             # what only the presenter may do waits for the server
            return self._here(action, fields)

    def _here(self, action: str, fields: Mapping[str, Any]) -> Any:
        """While the model server is away: this process's own gate, with the launch's code and the signing key kept
        beside the run store, so members stay in and the link still works (a code the presenter replaced meanwhile
        is the server's alone)."""
        gate = room_gate()
        if action == "status":
            return {"required": gate.required(), "closed": gate.closed()}
        if action == "admits":
            return gate.admits(fields.get("token"))
        return gate.join(str(fields.get("code")), str(fields.get("client")), str(fields.get("address", "")))

    def required(self) -> bool:
        return bool(self._ask("status")["required"])

    def closed(self) -> bool:
        return bool(self._ask("status")["closed"])

    def admits(self, token: str | None) -> bool:
        return bool(token) and bool(self._ask("admits", token=token))

    def join(self, code: str, client: str, address: str = "") -> str:
        try:
            return self._ask("join", code=code, client=client, address=address)
        except EngineError as err:
            raise JoinRefused(str(err), getattr(err, "retry_after", 0.0) or 0.0) from None

    def code(self, presenter: str | None = None) -> str | None:
        return self._ask("code", presenter=presenter)

    def rotate(self, presenter: str | None = None) -> str:
        return self._ask("rotate", presenter=presenter)

    def close(self, closed: bool, presenter: str | None = None) -> None:
        self._ask("close", closed=bool(closed), presenter=presenter)


def run_id(value: str) -> str:
    """`run-1a2b...`, or the OpenAI response id of the same request (`chatcmpl-1a2b...`, `cmpl-1a2b...`)."""
    for prefix in ("chatcmpl-", "cmpl-"):
        if value.startswith(prefix):
            return "run-" + value.removeprefix(prefix)
    return value


def wait_until_ready(url: str, timeout: float = 600.0, api_key: str | None = None,
                     on_wait: Callable[[str], None] | None = None) -> RemoteModel:
    """A client of the server at `url`, once it answers (it loads its model first: 503 until then)."""
    deadline, last = time.monotonic() + timeout, "not started"
    while time.monotonic() < deadline:
        try:
            return RemoteModel(url, api_key)
        except ServerUnavailableError as err:
            last = str(err)
            if on_wait is not None:
                on_wait(last)
            time.sleep(0.5)
    raise ServerUnavailableError(f"the model server at {url} was not ready within {timeout:.0f} s: {last}")
