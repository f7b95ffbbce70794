"""One replica: the same model server as `python -m engine serve` (an EngineService: scheduler, continuous batch,
prefix cache, captures, run store), as a Ray Serve deployment. The ingress calls it through a DeploymentHandle:
generations and jobs stream back as the same MessagePack events the HTTP server sends; everything else is one call.

Ray Serve starts, places, health-checks (`check_health`) and restarts replicas; each reports a snapshot of its
room to the hub every second, and its load to the router (`record_routing_stats`).
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
from dataclasses import replace
from typing import Any, AsyncIterator, Mapping

import ray
from ray import serve

from engine.cluster.hub import SNAPSHOT_SECONDS, hub_actor
from engine.service.replicas import ReplicaSnapshot
from engine.errors import EngineError
from engine.server.playground_routes import as_policy, as_request, event_stream
from engine.server.streams import RecordStream
from engine.service import wire
from engine.service.client import error_code
from engine.serving.limits import Limits

READS = ("info", "tokenizer_files", "draft_options", "stats", "room", "timeline", "prefix_stats", "memory",
         "run_list", "metrics_text")
CALLS = READS + ("check", "quick", "load_draft", "run_slice", "run_wait", "run_file")
log = logging.getLogger("engine.cluster")
ROOM_SESSIONS = 10**6            # the ingress counts the room's people; a replica never refuses a session


class ModelReplica:
    """A whole model server in one Ray Serve replica."""

    def __init__(self, model: str, device: str | None, dtype: str | None, limits: Mapping[str, Any],
                 threads: int | None = None, draft: str | None = None):
        import torch  # in the replica's own Ray worker, where the model loads

        from engine.core.loader import load_model
        from engine.service.service import EngineService, freeze_heap

        if threads:
            torch.set_num_threads(threads)
        lm = load_model(model, device=device, dtype=dtype)
        self.service = EngineService(lm, replace(Limits(**limits), max_sessions=ROOM_SESSIONS), launched_draft=draft)
        freeze_heap()                            # loaded and warmed up (engine.service.service)
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.node = ray.get_runtime_context().get_node_id()
        self._stop = threading.Event()
        threading.Thread(target=self._report, name="playground-snapshot", daemon=True).start()

    # --- streams ---------------------------------------------------------------------------------------------------

    async def generate(self, route: Mapping[str, Any], body: Mapping[str, Any]) -> AsyncIterator[bytes]:
        """A generation, as the events of POST /v1/playground/generate; the first names this replica."""
        stream = RecordStream(asyncio.get_running_loop())
        handle = await asyncio.to_thread(
            self.service.submit, as_request(body.get("request")), as_policy(body.get("policy")),
            session=body.get("session"), draft=body.get("draft"), k=body.get("k", 4),
            source=body.get("source") or "page", parent=body.get("parent"), listeners=(stream,))
        stream.until_kept(self.service, handle.run_id)
        async for event in event_stream(handle, stream, self.replica):
            yield event

    async def job(self, route: Mapping[str, Any], body: Mapping[str, Any]) -> AsyncIterator[bytes]:
        stream = RecordStream(asyncio.get_running_loop())
        handle = await asyncio.to_thread(self.service.submit_job, body.get("name"), body.get("params") or {},
                                         body.get("session"), "page", (stream,))
        async for event in event_stream(handle, stream, self.replica):
            yield event

    # --- one call ----------------------------------------------------------------------------------------------------

    async def call(self, route: Mapping[str, Any], method: str, args: tuple = (), kwargs: Mapping | None = None) -> bytes:
        """One of the service's own methods (CALLS), its value or its error as a wire message."""
        if method not in CALLS:
            return wire.encode({"error": {"code": "invalid_request", "message": f"no method {method!r} here"}})
        try:
            target = self.metrics_text if method == "metrics_text" else getattr(self.service, method)
            value = await asyncio.to_thread(target, *args, **(kwargs or {}))
        except EngineError as err:
            return wire.encode({"error": {"code": error_code(err), "message": str(err)}})
        if method == "check":
            value = list(value.ids)
        return wire.encode({"value": value, "replica": self.replica})

    def metrics_text(self) -> str:
        return self.service.metrics.exposition().decode()

    # --- what Ray Serve asks --------------------------------------------------------------------------------------------

    def check_health(self) -> None:
        """Unhealthy when the scheduler's worker died with requests waiting (Ray Serve then replaces the replica)."""
        worker = self.service.scheduler._worker
        if self.service.stats().queued and worker is not None and not worker.is_alive():
            raise RuntimeError("the scheduler's worker stopped")

    def record_routing_stats(self) -> dict[str, float]:
        """The load the router weighs (requests in the batch and waiting)."""
        stats = self.service.stats()
        return {"running": stats.running, "queued": stats.queued, "max_batch": stats.max_batch}

    def __del__(self) -> None:
        self._stop.set()

    def _report(self) -> None:
        hub = hub_actor()
        while not self._stop.wait(SNAPSHOT_SECONDS):
            try:
                svc = self.service
                snapshot = ReplicaSnapshot(self.replica, self.node, svc.label, svc.room(), svc.stats(),
                                           svc.prefix_stats(), tuple(svc.runs.made(200)),
                                           tuple(svc.memory()), os.getpid())
                hub.report.remote(snapshot)
            except Exception:  # noqa: BLE001 - the hub is restarting: the next report will do
                log.warning("replica %s could not report to the hub", self.replica, exc_info=True)


def replica_deployment(replicas: int, cpus: float, gpus: float, router: bool = True) -> Any:
    """The replica class as a Ray Serve deployment: N replicas, each on its own CPU (or GPU) slice, routed by the
    playground's router (engine/cluster/router.py)."""
    options: dict[str, Any] = dict(name="ModelReplica", num_replicas=replicas,
                                   ray_actor_options={"num_cpus": cpus, "num_gpus": gpus},
                                   max_ongoing_requests=1000, health_check_period_s=2.0, health_check_timeout_s=10.0,
                                   graceful_shutdown_timeout_s=5.0)
    if router:
        options["request_router_config"] = {"request_router_class": "engine.cluster.router:PlaygroundRouter",
                                            "request_routing_stats_period_s": 1.0}
    return serve.deployment(**options)(ModelReplica)
