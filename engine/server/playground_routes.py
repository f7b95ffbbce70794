"""`/v1/playground/...`: everything a page does, over HTTP, for the web app's remote client and for anyone else.

For people and scripts (JSON, the default):
    GET  /v1/playground/runs                  the newest runs
    GET  /v1/playground/runs/{id}?since=N     one run: its request, state and records (tokens, timings, captures)
    GET  /v1/playground/runs/{id}/stream      the same as server-sent events while it runs
    GET  /v1/playground/runs/{id}/file        a finished run as a run file (.zip: run.json + tensors.safetensors,
                                              docs/runs.md), for engine.runs.load and the generated notebook
    GET  /v1/playground/room                  the live batch and its recent steps, as the room page draws them
For the web app's client (MessagePack, `Accept: application/x-msgpack`; engine/service/client.py): the model's
description and tokenizer, the door's check, generation and jobs as streams of records, the room, the sessions,
the presenter's board. A run id is also accepted as the OpenAI response id (`chatcmpl-...`, `cmpl-...`).
"""
from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Mapping

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.sse import EventSourceResponse
from starlette.concurrency import run_in_threadpool

from engine import runs as run_files
from engine.core.generate import GenerationRequest
from engine.core.hooks import CAPTURE_OFF, CapturePolicy
from engine.errors import InvalidRequestError, QueueFullError
from engine.service.board import PresenterError
from engine.serving.people import retry_after
from engine.server.state import ServerState, run_headers
from engine.server.streams import RecordStream
from engine.service import wire
from engine.service.client import MSGPACK, error_code, run_id
from engine.service.join import JoinRefused
from engine.service.service import EngineService
from engine.serving.scheduler import Handle

router = APIRouter(prefix="/v1/playground")
REQUEST_TYPES = wire.class_names(GenerationRequest, CapturePolicy)


class JoinRefusedError(PresenterError):
    """A join code refused: wrong, replaced, or the room closed to newcomers (403)."""


class JoinWaitError(QueueFullError):
    """Too many wrong join codes from this browser or address: wait (429 with Retry-After)."""
STATUS_SECONDS = 0.25          # how often a queued request's place in line is sent
RUN_WAIT_MAX = 10.0            # the longest a GET of a run waits for something new
RUN_STREAM_TICK = 1.0


def service(request: Request) -> EngineService:
    state: ServerState = request.app.state.server
    return state.ready()


def reply(request: Request, value: Any, headers: Mapping[str, str] | None = None) -> Response:
    """MessagePack for the playground's client, JSON (arrays as lists) for everyone else."""
    if MSGPACK in request.headers.get("accept", ""):
        return Response(wire.encode(value), media_type=MSGPACK, headers=headers)
    return JSONResponse(wire.to_plain(value), headers=headers)


async def read(request: Request) -> dict[str, Any]:
    """The body as a map: MessagePack (only plain data and the request types) or JSON (plain data)."""
    raw = await request.body()
    if request.headers.get("content-type", "").startswith(MSGPACK):
        body = wire.decode(raw, REQUEST_TYPES)
    else:
        try:
            body = json.loads(raw or b"{}")
        except (ValueError, UnicodeDecodeError):
            raise InvalidRequestError("the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise InvalidRequestError("the body must be a map of names to values")
    return body


def as_request(value: Any) -> GenerationRequest:
    if isinstance(value, dict):                       # JSON from a script: the request's fields by name
        try:
            value = GenerationRequest(**value)
        except TypeError as err:
            raise InvalidRequestError(f"not a generation request: {err}") from None
    if not isinstance(value, GenerationRequest):
        raise InvalidRequestError("`request` must be a generation request")
    return value


def as_policy(value: Any) -> CapturePolicy:
    if value is None:
        return CAPTURE_OFF
    if isinstance(value, dict):
        try:
            value = CapturePolicy(**{k: tuple(v) if isinstance(v, list) else v for k, v in value.items()})
        except TypeError as err:
            raise InvalidRequestError(f"not a capture policy: {err}") from None
    if not isinstance(value, CapturePolicy):
        raise InvalidRequestError("`policy` must be a capture policy")
    return value


def text(body: Mapping[str, Any], name: str, required: bool = True, limit: int = 256) -> str | None:
    value = body.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise InvalidRequestError(f"`{name}` must be text of at most {limit} characters")
    return value


# --- the model ------------------------------------------------------------------------------------------------------

@router.get("/model")
async def model(request: Request) -> Response:
    return reply(request, service(request).info())


@router.get("/tokenizer")
async def tokenizer(request: Request) -> Response:
    files = await run_in_threadpool(service(request).tokenizer_files)
    if MSGPACK in request.headers.get("accept", ""):
        return reply(request, files)
    return JSONResponse({name: data.decode("utf-8", "replace") for name, data in files.items()})


@router.get("/drafts")
async def drafts(request: Request) -> Response:
    return reply(request, await run_in_threadpool(service(request).draft_options))


@router.post("/drafts")
async def load_draft(request: Request) -> Response:
    body = await read(request)
    return reply(request, await run_in_threadpool(service(request).load_draft, text(body, "spec", limit=1024)))


@router.post("/check")
async def check(request: Request) -> Response:
    body = await read(request)
    checked = await run_in_threadpool(service(request).check, as_request(body.get("request")),
                                      as_policy(body.get("policy")))
    return reply(request, list(checked.ids))


# --- running ---------------------------------------------------------------------------------------------------------

@router.post("/generate")
async def generate(request: Request) -> Response:
    """A generation as a stream of MessagePack events: the run's id, its place in line, each record, the end."""
    body, svc = await read(request), service(request)
    stream = RecordStream(asyncio.get_running_loop())
    handle = await run_in_threadpool(
        svc.submit, as_request(body.get("request")), as_policy(body.get("policy")),
        session=text(body, "session", required=False), draft=text(body, "draft", required=False, limit=1024),
        k=_k(body.get("k", 4)), source=text(body, "source", required=False) or "page",
        parent=text(body, "parent", required=False), listeners=(stream,))
    stream.until_kept(svc, handle.run_id)
    return _events(handle, stream)


@router.post("/jobs")
async def jobs(request: Request) -> Response:
    body, svc = await read(request), service(request)
    stream = RecordStream(asyncio.get_running_loop())
    handle = await run_in_threadpool(svc.submit_job, text(body, "name"), body.get("params") or {},
                                     text(body, "session", required=False), "page", (stream,))
    return _events(handle, stream)


def _k(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 16:
        raise InvalidRequestError("k (tokens drafted per round) must be 1 to 16")
    return value


@router.post("/quick")
async def quick(request: Request) -> Response:
    body = await read(request)
    return reply(request, await run_in_threadpool(service(request).quick, text(body, "name"), body.get("params") or {}))


def _events(handle: Handle, stream: RecordStream) -> StreamingResponse:
    return StreamingResponse(event_stream(handle, stream), media_type=MSGPACK, headers=run_headers(handle.run_id))


async def event_stream(handle: Handle, stream: RecordStream, replica: str | None = None) -> AsyncIterator[bytes]:
    """The events of a submitted request, each one MessagePack message: `run` (its ids, and the replica that holds
    it in a cluster), `status` while it waits, each `record`, `end`. Closing the connection cancels the request:
    this generator ends at its next await, and `finally` runs."""
    try:
        yield wire.encode({"t": "run", "run_id": handle.run_id, "id": handle.id, "replica": replica})
        async for record in stream.records(tick=STATUS_SECONDS):
            if record is None:                 # waiting: in line, or being prefilled (the page says which)
                yield wire.encode({"t": "status", "status": handle.status()})
                continue
            yield wire.encode({"t": "record", "r": record})
        error = None if handle.error is None else {"code": error_code(handle.error), "message": str(handle.error)}
        yield wire.encode({"t": "end", "state": handle.state, "error": error,
                           "timeline": getattr(handle, "story", None)})
    finally:
        handle.cancel()


# --- the room ----------------------------------------------------------------------------------------------------------

def _read_route(path: str, read: str, doc: str) -> None:
    """GET /v1/playground/{path}: the service's `read()`, as it is now."""
    async def route(request: Request) -> Response:
        return reply(request, await run_in_threadpool(getattr(service(request), read)))
    route.__doc__ = doc
    router.add_api_route(f"/{path}", route, methods=["GET"], name=read)


for _path, _read, _doc in (
        ("stats", "stats", "The queue and the batch now, and counters since the start."),
        ("room", "room", "The live batch: who is in it, the recent steps (prefill tokens, decode rows, time, the "
                         "block table), the queue."),
        ("timeline", "timeline", "The last finished requests: when each was submitted, started and finished."),
        ("prefix", "prefix_stats", "The prefix cache's counters."),
        ("memory", "memory", "Weights, the server process and the GPU allocator (measured)."),
        ("replicas", "replicas_view", "Each replica's batch, queue and memory, and how long ago it last reported "
                                      "(one for a single server)")):
    _read_route(_path, _read, _doc)


@router.post("/sessions/join")
async def join(request: Request) -> Response:
    body = await read(request)
    service(request).join(text(body, "session"), text(body, "person", required=False))
    return reply(request, True)


@router.post("/sessions/leave")
async def leave(request: Request) -> Response:
    body = await read(request)
    service(request).leave(text(body, "session"))
    return reply(request, True)


@router.post("/sessions/presence")
async def presence(request: Request) -> Response:
    body = await read(request)
    sessions = body.get("sessions")
    if not isinstance(sessions, list) or len(sessions) > 10_000 or not all(isinstance(s, str) for s in sessions):
        raise InvalidRequestError("`sessions` must be a list of session ids")
    service(request).report_presence(text(body, "process"), sessions)
    return reply(request, True)


# --- the presenter's board -------------------------------------------------------------------------------------------

@router.get("/board")
async def board(request: Request) -> Response:
    return reply(request, service(request).board.state())


@router.post("/board/{action}")
async def board_write(action: str, request: Request) -> Response:
    body, b = await read(request), service(request).board
    token = text(body, "token", required=False, limit=1024)
    if action == "check":
        return reply(request, b.check(token))
    if action == "push":
        fields = {k: body.get(k) for k in ("prompt", "settings", "page", "view", "run") if body.get(k) is not None}
        return reply(request, b.push(token, note=body.get("note") or "", **fields))
    if action == "clear":
        b.clear(token)
        return reply(request, True)
    if action == "broadcast":
        await run_in_threadpool(service(request).run_slice, text(body, "run_id"), 0)   # only a run that exists
        return reply(request, b.broadcast(token, text(body, "run_id")))
    if action == "allow":
        b.allow_generate(token, bool(body.get("allowed")))
        return reply(request, True)
    raise InvalidRequestError(f"the board has no action {action[:40]!r} (check, push, clear, broadcast, allow)")


# --- the hosted room's join gate ----------------------------------------------------------------------------------

@router.post("/gate/{action}")
async def gate(action: str, request: Request) -> Response:
    """The join code of a hosted room (engine/service/join.py), for the web processes: whether one is needed, a
    member token for the right code, and (the presenter only) the code, a new one, the room closed to newcomers."""
    body, svc = await read(request), service(request)
    g = svc.gate
    if action == "status":
        return reply(request, {"required": g.required(), "closed": g.closed()})
    if action == "admits":
        return reply(request, g.admits(text(body, "token", required=False, limit=512)))
    if action == "join":
        try:
            return reply(request, g.join(text(body, "code", limit=200), text(body, "client") or "",
                                         text(body, "address", required=False) or ""))
        except JoinRefused as err:
            if err.wait_seconds > 0:
                raise retry_after(JoinWaitError(str(err)), err.wait_seconds) from None
            raise JoinRefusedError(str(err)) from None
    if not svc.board.check(text(body, "presenter", required=False, limit=1024)):
        raise PresenterError("only the presenter may see or change the join code")
    if action == "code":
        return reply(request, g.code())
    if action == "rotate":
        return reply(request, g.rotate())
    if action == "close":
        g.close(bool(body.get("closed")))
        return reply(request, True)
    raise InvalidRequestError(f"the gate has no action {action[:40]!r} (status, admits, join, code, rotate, close)")


# --- runs, by id ---------------------------------------------------------------------------------------------------------

@router.get("/runs")
async def runs(request: Request, limit: int = 50) -> Response:
    return reply(request, await run_in_threadpool(service(request).run_list, max(1, min(limit, 1000))))


@router.get("/runs/{rid}")
async def run(rid: str, request: Request, since: int = 0, wait: float = 0.0) -> Response:
    """The run's info and its records from `since` on; with `wait`, up to that many seconds for something new."""
    svc = service(request)
    if wait > 0:
        part = await run_in_threadpool(svc.run_wait, run_id(rid), since, min(wait, RUN_WAIT_MAX))
    else:
        part = await run_in_threadpool(svc.run_slice, run_id(rid), since)
    return reply(request, part)


@router.get("/runs/{rid}/stream")
async def run_stream(rid: str, request: Request, since: int = 0) -> Response:
    """Server-sent events: `info` first, then each record as it is made (JSON), until the run ends."""
    svc, rid = service(request), run_id(rid)
    await run_in_threadpool(svc.run_slice, rid, 0)                     # 404 before the stream starts
    return EventSourceResponse(_run_events(svc, rid, since, request))


@router.get("/runs/{rid}/file")
async def run_file(rid: str, request: Request) -> Response:
    """A finished run as a run file (engine/runs), the same file the pages' "Open in a notebook" carries."""
    svc, rid = service(request), run_id(rid)
    data = await run_in_threadpool(_run_file, svc, rid)
    return Response(data, media_type="application/zip",
                    headers={"Content-Disposition": f'attachment; filename="{rid[:40]}{run_files.SUFFIX}"'})


def _run_file(svc: EngineService, rid: str) -> bytes:
    return svc.run_file(rid)


async def _run_events(svc: EngineService, rid: str, since: int, request: Request) -> AsyncIterator[str]:
    first = True
    while not await request.is_disconnected():
        part = await run_in_threadpool(svc.run_wait, rid, since, RUN_STREAM_TICK)
        if first:
            yield f"event: info\ndata: {json.dumps(wire.to_plain(part.info))}\n\n"
            first = False
        for record in part.records:
            yield f"event: record\ndata: {json.dumps(wire.to_plain(record))}\n\n"
        since = part.end
        if not part.info.live and since >= part.info.n_records:
            yield "event: end\ndata: {}\n\n"
            return
