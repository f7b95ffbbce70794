"""The cluster's front door: the model server's own FastAPI app (engine/server/app.py), served by Ray Serve's HTTP
proxy, with a ClusterService behind it instead of one EngineService. The routes are the same code; so are the
errors, the API key, /health (503 until the replicas answer) and /metrics (every replica's, labelled).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any

from ray import serve

from engine.server.app import create_app
from engine.server.state import ServerState

log = logging.getLogger("engine.cluster")


@serve.deployment(name="Ingress", num_replicas=1, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=10_000)
@serve.ingress()
class Ingress:
    """One ingress replica: HTTP in, routed calls to the model replicas out, the room's shared state here."""

    def __init__(self, replicas: Any, presenter_token: str | None, api_key: str | None, served_name: str | None,
                 max_sessions: int, expected: int = 1):
        self.state = ServerState(served_name=served_name or "", api_key=api_key)
        self._asgi = create_app(self.state)
        threading.Thread(target=self._connect, args=(replicas, presenter_token, max_sessions, expected),
                         name="playground-connect", daemon=True).start()

    def _connect(self, replicas: Any, presenter_token: str | None, max_sessions: int, expected: int) -> None:
        """Wait for the replicas (loading their models), then serve: /health says 503 until then."""
        # in the ingress's Ray worker, once it connects to the replicas
        from engine.cluster.service import ClusterService

        while True:
            try:
                self.state.loading = "waiting for the model replicas"
                service = ClusterService(replicas, presenter_token, max_sessions, expected)
                break
            except Exception as err:  # noqa: BLE001 - replicas still loading: try again
                log.info("replicas not ready yet (%s)", err)
                time.sleep(1.0)
        self.state.served_name = self.state.served_name or service.label
        self.state.aliases = {service.name, service.label, str(service.source)}
        self.state.service = service

    def __serve_build_asgi_app__(self) -> Any:
        """The app Ray Serve's proxy sends HTTP to: ours, built in the constructor around this replica's state."""
        return self._asgi
