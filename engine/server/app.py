"""The model server: FastAPI over one EngineService, run by uvicorn.

    python -m engine serve --model default --port 8000               # http://127.0.0.1:8000/v1
    python -m engine serve --host 0.0.0.0 --api-key "$KEY"           # wider than this machine: a key, always

It answers at once (`/health` and every model route say 503 "still loading" with Retry-After) and loads its model
in the background, so a launcher or a client can wait for it rather than guess. No UI library is imported here.
"""
from __future__ import annotations

import hmac
import logging
import threading
from typing import Any, Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.errors import EngineError, InvalidRequestError
from engine.server import openai_routes, playground_routes
from engine.server.state import AuthError, BodyTooLargeError, ServerState, api_error, log
from engine.service.board import PresenterError
from engine.service.metrics import CONTENT_TYPE

MAX_BODY_BYTES = 8 * 2**20       # a request body; a prompt over the server's own limit is refused by the door (400)
OPEN_PATHS = ("/health", "/metrics", "/docs", "/openapi.json")


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="Inference Playground model server", version="1",
                  description="The OpenAI API and the playground's own, over one instrumented model.")
    app.state.server = state
    app.include_router(openai_routes.router)
    app.include_router(playground_routes.router)
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/metrics", metrics, methods=["GET"])
    app.add_exception_handler(EngineError, engine_error)
    app.add_exception_handler(PresenterError, engine_error)          # a refused push says why (403), not a failure
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected_error)
    app.add_middleware(Guard)
    return app


async def health(request: Request) -> Response:
    """200 once the model is loaded and the scheduler's worker can take requests; 503 before (vLLM's /health)."""
    request.app.state.server.ready()
    return Response(status_code=200)


async def metrics(request: Request) -> Response:
    service = request.app.state.server.service
    body = await run_in_threadpool(service.metrics.exposition) if service is not None else b""
    return Response(body, media_type=CONTENT_TYPE)


class Guard:
    """The API key (when set) on every /v1 route, and a cap on the body's size before anything reads it.

    Plain ASGI rather than `@app.middleware("http")`: Starlette's BaseHTTPMiddleware hands every chunk of a
    streamed response through a second task and a memory stream, which cost the event loop about a fifth of its
    time with 30 streams of a fast model (py-spy)."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Callable[[], Awaitable[dict]], send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request = Request(scope)
        refusal = refused(request, scope["app"].state.server)
        if refusal is None and request.headers.get("content-length") is None and request.method in ("POST", "PUT",
                                                                                                    "PATCH"):
            body = await read_capped(receive)          # a chunked body: counted as it arrives, then handed on whole
            refusal = too_large() if body is None else None
            receive = replay(body or b"", receive)
        if refusal is not None:
            return await refusal(scope, receive, send)
        await self.app(scope, receive, send)


def refused(request: Request, state: ServerState) -> Response | None:
    """The error a request gets before its body is read: no valid key, or a declared body over the cap."""
    if state.api_key and request.url.path.startswith("/v1") and not authorized(request, state.api_key):
        return api_error(AuthError("a valid API key is needed: send it as `Authorization: Bearer <key>`"))
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
        return too_large()
    return None


def too_large() -> Response:
    return api_error(BodyTooLargeError(f"the request body is over {MAX_BODY_BYTES // 2**20} MiB, the most this server "
                                       "reads"))


def authorized(request: Request, key: str) -> bool:
    given = request.headers.get("authorization", "")
    scheme, _, token = given.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())


async def read_capped(receive: Callable[[], Awaitable[dict]]) -> bytes | None:
    """The whole body of a request sent without a Content-Length; None as soon as it passes the cap."""
    parts, seen = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(parts)                     # the client went away: what came, for the app to refuse
        parts.append(message.get("body", b""))
        seen += len(parts[-1])
        if seen > MAX_BODY_BYTES:
            return None
        if not message.get("more_body", False):
            return b"".join(parts)


def replay(body: bytes, receive: Callable[[], Awaitable[dict]]) -> Callable[[], Awaitable[dict]]:
    """A receive that gives the body read already, then whatever the connection sends next (a disconnect)."""
    sent = False

    async def again() -> dict:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}
    return again


async def engine_error(request: Request, err: Exception) -> Response:
    return api_error(err)


async def validation_error(request: Request, err: Exception) -> Response:
    """Pydantic's complaint as one sentence naming the field, in OpenAI's shape, status 400 (not FastAPI's 422)."""
    problems = err.errors() if isinstance(err, RequestValidationError) else []
    first = problems[0] if problems else {}
    where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
    if first.get("type") in ("json_invalid", "model_attributes_type"):
        message = "the body is not valid JSON (an object with the request's fields was expected)"
    elif first.get("type") == "extra_forbidden":
        message = f"unrecognized request argument supplied: {where}"
    else:
        message = f"{where}: {first.get('msg', 'invalid value')}" if where else first.get("msg", "invalid request")
    return api_error(InvalidRequestError(message.removeprefix("Value error, ")), param=where or None)


async def http_error(request: Request, err: Exception) -> Response:
    status = getattr(err, "status_code", 500)
    message = {404: f"there is no route {request.url.path[:200]!r} on this server (the API lives under /v1)",
               405: f"{request.method} is not allowed on {request.url.path[:200]!r}"}.get(status, str(err))
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                   "code": None}}, status_code=status)


async def unexpected_error(request: Request, err: Exception) -> Response:
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return api_error(err)


# --- running it --------------------------------------------------------------------------------------------------------

def load_in_background(state: ServerState, load: Callable[[Callable[[float, str], None]], Any]) -> threading.Thread:
    """Load the model (and build its service) in a thread: the server answers 503 with what it is doing meanwhile."""
    def progress(fraction: float, text: str) -> None:
        state.loading = f"{text} ({fraction:.0%})"

    def run() -> None:
        try:
            state.service = load(progress)
        except EngineError as err:
            state.load_error = str(err)
        except Exception as err:  # noqa: BLE001 - a broken checkpoint: say so on every request, do not die
            log.exception("the model could not be loaded")
            state.load_error = f"{type(err).__name__}: {err}"
        if state.load_error:
            log.error("the model could not be loaded: %s", state.load_error)
        else:
            log.info("model loaded: serving %s", state.served_name)

    thread = threading.Thread(target=run, name="playground-load", daemon=True)
    thread.start()
    return thread


def serve(state: ServerState, load: Callable[[Callable[[float, str], None]], Any], host: str, port: int,
          log_level: str = "info") -> None:
    """Start loading, then serve until interrupted (uvicorn handles the signals)."""
    import uvicorn  # the HTTP server: only when one is run, not when the app is built (tests, app/hosting/hosted.py)

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    load_in_background(state, load)
    uvicorn.run(create_app(state), host=host, port=port, log_level=log_level, access_log=False,
                timeout_graceful_shutdown=5)
