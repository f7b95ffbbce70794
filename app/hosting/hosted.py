"""One model behind two doors, in one process on one port: the pages (Streamlit) and the OpenAI API (FastAPI).

    playground                      # http://127.0.0.1:8501 for the pages, http://127.0.0.1:8501/v1 for the API

`playground` runs `streamlit run app/asgi.py`, an `st.App` around the pages (app/main.py) with one middleware,
`ApiDoor`: a request under /v1 (or /metrics) goes to the model server's own FastAPI app (engine/server/app.py),
everything else to Streamlit. Both doors reach the same `EngineService`, so a request made with curl or the
`openai` package joins the same batch as the browsers, shows on the room page and opens on every page by
`?run=<id>`. Streamlit 1.67 already serves its pages with uvicorn and Starlette, so the pages run on the same
server as before: nothing is proxied, nothing crosses a process.

The model starts loading when the server starts (the API answers 503 "still loading" meanwhile, as
`python -m engine serve` does), and the first page waits for the same load with its progress bar.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from engine.errors import EngineError

API_PREFIXES = ("/v1/", "/metrics")        # what the API door takes; everything else is Streamlit's
POLL_SECONDS = 0.2


@dataclass
class HostedModel:
    """The process's model service and the HTTP server state around it, loading in a thread from the start."""

    state: Any                                   # engine.server.state.ServerState
    progress: tuple[float, str] = (0.0, "starting")
    done: threading.Event = field(default_factory=threading.Event)

    def report(self, fraction: float, text: str) -> None:
        self.progress = (fraction, text)
        self.state.loading = f"{text} ({fraction:.0%})"

    def wait(self, progress: Callable[[float, str], None] | None = None) -> Any:
        """The service once loaded (reporting the load's progress meanwhile); the load's error otherwise."""
        shown = None
        while not self.done.wait(POLL_SECONDS):
            if progress is not None and self.progress != shown:
                shown = self.progress
                progress(*shown)
        if self.state.service is None:
            raise EngineError(self.state.load_error or "the model did not load")
        return self.state.service


_HOSTED: HostedModel | None = None
_LOCK = threading.Lock()


def hosted() -> HostedModel | None:
    """This process's hosted model, when it was started as `app/asgi.py` (None under plain `streamlit run`)."""
    return _HOSTED


def start_hosted(load: Callable[[Callable[[float, str], None]], Any], api_key: str | None) -> HostedModel:
    """Begin loading the model in a thread (once per process); `load(progress)` returns the EngineService."""
    global _HOSTED
    from engine.server.state import ServerState  # FastAPI's side: only once this process hosts the API

    with _LOCK:
        if _HOSTED is not None:
            return _HOSTED
        model = HostedModel(ServerState(served_name="", api_key=api_key))

        def run() -> None:
            started = time.perf_counter()
            try:
                service = load(model.report)
                model.state.served_name = service.label
                model.state.aliases = {service.name, service.label, str(service.source)}
                model.state.service = service
                print(f"The model is ready for the pages and the API: {service.label} on {service.device} "
                      f"({time.perf_counter() - started:.0f} s).", flush=True)
            except Exception as err:  # noqa: BLE001 - said on every page and every API request, never a dead server
                model.state.load_error = str(err) or type(err).__name__
                print(f"The model could not be loaded: {model.state.load_error}", flush=True)
            finally:
                model.done.set()

        threading.Thread(target=run, name="playground-load", daemon=True).start()
        _HOSTED = model
        return model


class ApiDoor:
    """ASGI middleware in front of Streamlit: /v1/... and /metrics go to the API's app, the rest to the pages."""

    def __init__(self, app: Callable[..., Awaitable[None]]):
        self.app = app
        self.api: Callable[..., Awaitable[None]] | None = None

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        model = hosted()
        if scope["type"] == "http" and model is not None and scope["path"].startswith(API_PREFIXES):
            if self.api is None:
                from engine.server.app import create_app  # FastAPI's app: built on the first API request

                self.api = create_app(model.state)
            return await self.api(scope, receive, send)
        await self.app(scope, receive, send)


def api_url(page_url: str) -> str:
    """Where the OpenAI API of a room served at `page_url` answers."""
    return page_url.rstrip("/") + "/v1"
