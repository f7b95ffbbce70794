"""What the HTTP server holds (the service once its model is loaded, the name it serves it under, its key), and
how every error becomes OpenAI's error JSON with the right status.

    {"error": {"message": "...", "type": "invalid_request_error", "param": null, "code": "context_length_exceeded"}}

`code` names the engine's error class (engine/service/client.py's ERROR_CODES), so the playground's own client
raises the same typed error it would raise in-process.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi.responses import JSONResponse

from engine import errors
from engine.server.protocol import ErrorInfo, ErrorResponse
from engine.service.board import PresenterError
from engine.service.client import error_code
from engine.service.runs import RunNotFoundError
from engine.service.service import EngineService
from engine.service.wire import WireError
from engine.serving.scheduler import SessionLimitError

log = logging.getLogger("engine.server")
RUN_HEADER = "X-Playground-Run"


class NotReadyError(errors.EngineError):
    """The server is up but its model is still loading (or failed to load)."""


class ModelNameError(errors.ModelNotFoundError):
    """A request named a model this server does not serve."""


class BodyTooLargeError(errors.InvalidRequestError):
    """A request body over the server's limit."""


class AuthError(errors.EngineError):
    """No API key, or the wrong one."""


# (error class, HTTP status, OpenAI error type): the first class a raised error is an instance of decides
STATUS: tuple[tuple[type[BaseException], int, str], ...] = (
    (AuthError, 401, "authentication_error"),
    (PresenterError, 403, "permission_error"),
    (ModelNameError, 404, "invalid_request_error"),
    (RunNotFoundError, 404, "invalid_request_error"),
    (BodyTooLargeError, 413, "invalid_request_error"),
    (SessionLimitError, 429, "rate_limit_exceeded"),
    (errors.QueueFullError, 429, "rate_limit_exceeded"),
    (NotReadyError, 503, "service_unavailable"),
    (errors.InsufficientMemoryError, 503, "service_unavailable"),
    (errors.InvalidRequestError, 400, "invalid_request_error"),
    (errors.ContextLengthError, 400, "invalid_request_error"),
    (errors.DraftMismatchError, 400, "invalid_request_error"),
    (WireError, 400, "invalid_request_error"),
    (errors.EngineError, 500, "internal_server_error"),
)
CODES = {AuthError: "invalid_api_key", ModelNameError: "model_not_found", NotReadyError: "not_ready",
         BodyTooLargeError: "request_too_large"}


def status_of(err: BaseException) -> tuple[int, str]:
    return next(((status, kind) for cls, status, kind in STATUS if isinstance(err, cls)), (500, "internal_server_error"))


def api_error(err: BaseException, body_only: bool = False, param: str | None = None) -> Any:
    """OpenAI's error shape for an error (a JSON response, or just the body's JSON text for a stream)."""
    status, kind = status_of(err)
    told = isinstance(err, (errors.EngineError, PresenterError))          # errors that say what was wrong
    message = str(err) if told else "the server failed on this request; it is still up"
    code = CODES.get(type(err)) or error_code(err)
    body = ErrorResponse(error=ErrorInfo(message=message, type=kind, param=param, code=code))
    if body_only:
        return body.model_dump_json()
    headers = {}
    retry = getattr(err, "retry_after", None)
    if status in (429, 503):
        headers["Retry-After"] = str(max(1, math.ceil(retry))) if retry else "5"
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def run_headers(run_id: str) -> dict[str, str]:
    return {RUN_HEADER: run_id}


@dataclass
class ServerState:
    """The server's one service (None while its model loads) and the names it answers to."""

    served_name: str
    api_key: str | None = None
    service: EngineService | None = None
    aliases: set[str] = field(default_factory=set)
    load_error: str | None = None
    loading: str = "starting"              # what the loader is doing, for the 503's message
    started: float = field(default_factory=time.time)

    def ready(self) -> EngineService:
        if self.service is None:
            if self.load_error:
                raise NotReadyError(f"the model could not be loaded: {self.load_error}")
            raise NotReadyError(f"the model is still loading ({self.loading}); try again in a few seconds")
        return self.service

    def check_model(self, name: str) -> None:
        if name != self.served_name and name not in self.aliases:
            raise ModelNameError(f"the model `{name[:200]}` does not exist on this server; it serves "
                                 f"`{self.served_name}` (GET /v1/models)")
