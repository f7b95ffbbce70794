"""The service a cluster's ingress offers: the same interface as EngineService (so the HTTP routes serve it
unchanged, streaming included), over N replicas on Ray Serve.

What the room shares lives here, once, for every replica: the presenter's board, the count of people, which replica
holds which run. Each replica's batch is read from its latest snapshot in the hub. A request goes where the router
sends it (engine/cluster/router.py); a replica that dies mid-run fails its requests with a clear message (one that
had streamed nothing yet is retried once on another replica), and the others go on.
"""
from __future__ import annotations

import logging
import statistics
import threading
import time
from collections import OrderedDict
from dataclasses import replace
from typing import Any, Callable, Iterable, Iterator, Mapping

import ray

from engine.cluster.hub import hub_actor
from engine.service.replicas import ReplicaSnapshot, ReplicaView
from engine.core.generate import GenerationRequest
from engine.core.hooks import CAPTURE_OFF, CapturePolicy
from engine.errors import EngineError
from engine.service import wire
from engine.service.board import PresenterBoard
from engine.service.join import room_gate
from engine.service.client import ERROR_CODES, DescribedModel
from engine.service.ondisk import info_of_row, open_disk, slice_from_disk
from engine.service.runs import RunInfo, RunNotFoundError, RunSlice
from engine.store import StoreError, open_store
from engine.service.service import MemoryRow, ModelInfo, Presence
from engine.serving.people import People
from engine.serving.prefix import PrefixStats
from engine.serving.scheduler import CheckedRequest, Handle, QueueStatus, RoomState, SchedulerStats, Span
from engine.serving.timeline import story_problem

log = logging.getLogger("engine.cluster")
CALL_SECONDS = 120.0
POLL_SECONDS = 0.5               # how often the ingress reads the replicas' snapshots
RUNS_KEPT = 100_000
FORGET_SECONDS = 120.0           # a missing replica is shown this long at most


class ReplicaLostError(EngineError):
    """The replica that held a request stopped while it ran (Ray Serve is bringing it back)."""


class ClusterService(DescribedModel):
    """N replicas as one model server: the EngineService interface, routed and shared."""

    transport = "cluster"

    def __init__(self, replicas: Any, presenter_token: str | None, max_sessions: int, expected: int = 1):
        self.replicas = replicas                               # the replicas' DeploymentHandle
        self.board = PresenterBoard(presenter_token)
        self.gate = room_gate()                                # the hosted room's join code, for every replica
        self.presence = Presence()
        self.people = People(lambda: max_sessions, busy=self._busy)
        self.people.presence = self.presence
        self.max_sessions, self.expected = max_sessions, expected
        self.hub = hub_actor()
        self.disk, self.disk_note = open_disk(open_store)     # the folder every replica writes its runs to
        self._info: ModelInfo = self._call("info")
        self._snapshots: list[ReplicaSnapshot] = []
        self._where: OrderedDict[str, str] = OrderedDict()     # run id -> the replica that holds it
        self._live: dict[str, "ClusterHandle"] = {}            # session -> its request in flight
        self._lock = threading.Lock()
        self._tokenizer_lock = threading.Lock()
        self.metrics = ClusterMetrics(self)
        self._closed = threading.Event()
        threading.Thread(target=self._poll, name="playground-hub-reader", daemon=True).start()

    # --- what the model is -------------------------------------------------------------------------------------------

    def info(self) -> ModelInfo:
        return replace(self._info, presenter_mode=self.board.enabled, limits=self.limits)

    limits = property(lambda self: replace(self._info.limits, max_sessions=self.max_sessions))

    def tokenizer_files(self) -> dict[str, bytes]:
        return self._call("tokenizer_files")

    _tokenizer_files = tokenizer_files

    # --- requests ------------------------------------------------------------------------------------------------------

    def check(self, request: GenerationRequest, policy: CapturePolicy = CAPTURE_OFF) -> CheckedRequest:
        ids = self._call("check", request, policy)
        return CheckedRequest(request, policy, tuple(ids), door=self)

    def submit(self, request: GenerationRequest | CheckedRequest, policy: CapturePolicy | None = None,
               session: str | None = None, draft: str | None = None, k: int = 4, source: str = "page",
               parent: str | None = None, listeners: tuple[Callable[[Handle, Any], None], ...] = ()) -> "ClusterHandle":
        if isinstance(request, CheckedRequest):
            policy = request.policy if policy is None else policy
            request = request.request
        body = {"request": request, "policy": policy or CAPTURE_OFF, "session": session, "draft": draft, "k": k,
                "source": source, "parent": parent}
        route = {"prompt": prompt_text(request)}
        return self._stream("generate", route, body, session, request, listeners)

    def submit_job(self, name: str, params: Mapping[str, Any] | None = None, session: str | None = None,
                   source: str = "page", listeners: tuple[Callable[[Handle, Any], None], ...] = ()) -> "ClusterHandle":
        body = {"name": name, "params": dict(params or {}), "session": session}
        return self._stream("job", self._run_route(params), body, session, None, listeners)

    def quick(self, name: str, params: Mapping[str, Any] | None = None) -> Any:
        return self._call("quick", name, dict(params or {}), route=self._run_route(params))

    def draft_options(self) -> list:
        return self._call("draft_options")

    def load_draft(self, spec: str, progress: Any = None) -> str:
        return self._call("load_draft", spec)

    def _stream(self, method: str, route: dict, body: dict, session: str | None, request: GenerationRequest | None,
                listeners: tuple) -> "ClusterHandle":
        handle = ClusterHandle(self, method, route, body, session, request, listeners)
        handle.start()
        if session:
            with self._lock:
                self._live[session] = handle
        return handle

    def _run_route(self, params: Mapping[str, Any] | None) -> dict:
        """A call about one run goes to the replica that holds it."""
        run_id = (params or {}).get("run_id") if isinstance(params, Mapping) else None
        return {"replica": self._holder(run_id)} if isinstance(run_id, str) else {}

    # --- the room --------------------------------------------------------------------------------------------------------

    def replicas_view(self) -> list[ReplicaView]:
        """Every replica that reports, and one that stopped, shown missing until its replacement reports (or for
        FORGET_SECONDS)."""
        now = time.time()
        views = [ReplicaView(s, now - s.at) for s in sorted(self._snapshots, key=lambda s: s.replica)]
        live = sum(not v.missing for v in views)
        return [v for v in views if not v.missing or (live < self.expected and v.seconds_ago < FORGET_SECONDS)]

    def live_snapshots(self) -> list[ReplicaSnapshot]:
        return [v.snapshot for v in self.replicas_view() if not v.missing]

    def stats(self) -> SchedulerStats:
        parts = [s.stats for s in self.live_snapshots()]
        steps = [p.step_seconds for p in parts if p.step_seconds]
        total = {f: sum(getattr(p, f) for p in parts) for f in ("submitted", "refused", "served", "cancelled",
                                                                "timed_out", "failed", "queued", "running", "max_batch")}
        return SchedulerStats(**total, sessions=len(self.people),
                              step_seconds=statistics.median(steps) if steps else None)

    def room(self) -> RoomState:
        """The first live replica's batch (the KV page's block table is one replica's); `replicas_view` has all."""
        live = self.live_snapshots()
        if not live:
            return RoomState((), (), 0, self.limits.max_batch, len(self.people), time.perf_counter())
        return replace(live[0].room, sessions=len(self.people))

    def timeline(self) -> list[Span]:
        return [span for r in self._replica_ids() for span in self._call("timeline", route={"replica": r})]

    def prefix_stats(self) -> PrefixStats:
        parts = [s.prefix for s in self.live_snapshots()]
        return PrefixStats(**{f: sum(getattr(p, f) for p in parts) for f in ("lookups", "hits", "queried_tokens",
                                                                            "reused_tokens", "entries", "bytes")})

    def memory(self) -> list[MemoryRow]:
        return [MemoryRow(f"{row.name} (replica {s.replica[:6]})", row.bytes) for s in self.live_snapshots()
                for row in s.memory]

    def join(self, session: str, person: str | None = None) -> None:
        self.people.join(session, person)

    def leave(self, session: str) -> None:
        self.people.leave(session)
        with self._lock:
            handle = self._live.pop(session, None)
        if handle is not None:
            handle.cancel()

    def report_presence(self, process: str, sessions: Iterable[str]) -> None:
        self.presence.report(process, sessions)

    def _busy(self, session: str) -> bool:
        handle = self._live.get(session)
        return handle is not None and not handle.done

    # --- runs, by id -----------------------------------------------------------------------------------------------------

    def run_slice(self, run_id: str, since: int = 0) -> RunSlice:
        return self._held_or_kept(run_id, since, lambda replica: self._call("run_slice", run_id, since,
                                                                            route={"replica": replica}))

    def run_wait(self, run_id: str, since: int, timeout: float) -> RunSlice:
        return self._held_or_kept(run_id, since, lambda replica: self._call("run_wait", run_id, since, timeout,
                                                                            route={"replica": replica}))

    def run_list(self, limit: int = 50) -> list[RunInfo]:
        infos = [i for r in self._replica_ids() for i in self._call("run_list", limit, route={"replica": r})]
        if self.disk is not None:                 # a replica that died left its runs in the folder
            infos += [info_of_row(row) for row in self.disk.rows(limit)]
        unique: dict[str, RunInfo] = {}
        for info in infos:                        # each replica lists the shared folder's runs too: once each
            unique.setdefault(info.id, info)
        return sorted(unique.values(), key=lambda i: i.created, reverse=True)[:limit]

    def run_file(self, run_id: str) -> bytes:
        """A finished run's file: from the shared store, else built by the replica that holds it."""
        if self.disk is not None:
            try:
                return self.disk.read(run_id)
            except StoreError:
                pass
        return self._call("run_file", run_id, route={"replica": self._holder(run_id)})

    def _held_or_kept(self, run_id: str, since: int, ask: Callable[[str], RunSlice]) -> RunSlice:
        """A run from the replica that holds it; when that replica is gone (or has let go of it), from its file in
        the store every replica writes to, so a replica's runs stay readable after it dies."""
        try:
            return ask(self._holder(run_id))
        except (RunNotFoundError, ReplicaLostError) as err:
            if self.disk is None:
                raise
            try:
                part = slice_from_disk(self.disk, run_id, self._info.limits)
            except RunNotFoundError:
                raise err from None
        since = min(max(since, 0), len(part.records))
        return RunSlice(part.info, since, part.records[since:])

    def _holder(self, run_id: str) -> str:
        """The replica that holds a run: the one that made it (remembered), else the one whose snapshot lists it."""
        with self._lock:
            known = self._where.get(run_id)
        if known is not None:
            return known
        for s in self._snapshots:
            if run_id in s.runs:
                return s.replica
        raise RunNotFoundError(f"no run {str(run_id)[:40]!r} on any replica of this cluster (a replica that restarted "
                               "starts with none)")

    def remember(self, run_id: str, replica: str) -> None:
        with self._lock:
            self._where[run_id] = replica
            while len(self._where) > RUNS_KEPT:
                self._where.popitem(last=False)

    # --- calling the replicas ----------------------------------------------------------------------------------------------

    def _replica_ids(self) -> list[str]:
        return [s.replica for s in self.live_snapshots()]

    def _call(self, method: str, *args: Any, route: dict | None = None, session: str = "") -> Any:
        """One call to a replica (the router picks which); its value, or its error raised here as the same class."""
        try:
            reply = self.replicas.options(method_name="call", session_id=session or "").remote(
                route or {}, method, args).result(timeout_s=CALL_SECONDS)
        except EngineError:
            raise
        except Exception as err:  # noqa: BLE001 - a replica that died or timed out: a message, not a traceback
            raise ReplicaLostError(f"no replica answered ({type(err).__name__}); the cluster may be restarting one, "
                                   "try again in a few seconds") from None
        return unwrap(wire.decode(reply))

    def _poll(self) -> None:
        while not self._closed.wait(POLL_SECONDS):
            try:
                self._snapshots = ray.get(self.hub.snapshots.remote(), timeout=10)
            except Exception:  # noqa: BLE001 - the hub is restarting: keep the last snapshots
                log.debug("the hub did not answer", exc_info=True)

    def close(self) -> None:
        self._closed.set()


def unwrap(message: Mapping[str, Any]) -> Any:
    error = message.get("error")
    if error:
        raise ERROR_CODES.get(error.get("code"), EngineError)(error.get("message", ""))
    return message.get("value")


def prompt_text(request: GenerationRequest) -> str:
    """What prefix routing compares: the whole conversation, as the model will read it (before the template)."""
    turns = "".join(f"{role}: {text}\n" for role, text in request.history)
    return f"{request.system or ''}\n{turns}{request.prompt}"


class ClusterHandle:
    """A request on a replica: its events read by a thread and handed to the listeners, as the scheduler's own
    handle would; cancelled by cancelling the replica's stream."""

    def __init__(self, service: ClusterService, method: str, route: dict, body: dict, session: str | None,
                 request: GenerationRequest | None, listeners: tuple):
        self.service, self.method, self.route, self.body, self.session = service, method, route, body, session
        self.request, self.listeners = request, listeners
        self.run_id, self.id, self.replica = "", 0, ""
        self.state, self.error = "queued", None
        self.job = None if request is not None else body.get("name")
        self._status = QueueStatus("queued", 0, 0, None, 0.0)
        self._cancelled, self._records, self._retried = threading.Event(), 0, False
        self._gen: Any = None
        self.story: dict[str, Any] | None = None         # its timeline and timings, from the replica's end event

    @property
    def done(self) -> bool:
        return self.state in ("done", "cancelled", "failed")

    def status(self) -> QueueStatus:
        return self._status

    def start(self) -> None:
        """Send it; a refusal raises here (as the scheduler's submit does); then a thread follows its events."""
        events = self._open()
        threading.Thread(target=self._follow, args=(events,), name="playground-cluster-stream", daemon=True).start()

    def _open(self) -> Iterator[dict]:
        self._gen = self.service.replicas.options(method_name=self.method, stream=True,
                                                  session_id=self.session or "").remote(self.route, self.body)
        events = (wire.decode(chunk) for chunk in self._gen)
        try:
            first = next(events)
        except EngineError:
            raise
        except Exception as err:  # noqa: BLE001 - no replica took it
            raise ReplicaLostError(f"no replica took the request ({type(err).__name__}); try again shortly") from None
        if first.get("t") == "refused":
            unwrap(first)
        self.run_id, self.id, self.replica = first["run_id"], first["id"], first.get("replica") or ""
        self.service.remember(self.run_id, self.replica)
        return events

    def _follow(self, events: Iterator[dict]) -> None:
        try:
            for event in events:
                self._take(event)
        except Exception as err:  # noqa: BLE001 - the replica died, or the stream was cancelled
            if not self._cancelled.is_set() and not self.done:
                self._lost(err)
                return
        if not self.done:
            self.state = "cancelled" if self._cancelled.is_set() else self.state
        self._emit(Handle.END)

    def _take(self, event: Mapping[str, Any]) -> None:
        kind = event.get("t")
        if kind == "status":
            self._status = event["status"]
        elif kind == "record":
            self.state = "running"
            self._records += 1
            self._emit(event["r"])
        elif kind == "end":
            self.state = event.get("state", "done")
            timeline = event.get("timeline")              # its story and timings, as the replica's scheduler told them
            self.story = timeline if timeline is None or not story_problem(timeline) else None
            if event.get("error"):
                try:
                    unwrap(event)
                except EngineError as err:
                    self.error = err

    def _lost(self, err: Exception) -> None:
        """Its replica stopped: once, when nothing had streamed, the same request again elsewhere; else a message."""
        if self._records == 0 and not self._retried:
            self._retried = True
            log.warning("replica %s lost request %s before its first record; retrying once", self.replica, self.run_id)
            try:
                self._follow(self._open())
                return
            except EngineError as again:
                err = again
        self.state = "failed"
        self.error = ReplicaLostError(
            f"the replica serving this request stopped ({type(err).__name__}); Ray Serve is bringing it back. "
            f"{'What streamed so far is kept; ' if self._records else ''}try again in a few seconds")
        self._emit(Handle.END)

    def _emit(self, item: Any) -> None:
        for listener in self.listeners:
            try:
                listener(self, item)
            except Exception:  # noqa: BLE001 - a listener's bug must not stop the stream
                log.exception("a listener of %s failed", self.run_id)

    def cancel(self) -> None:
        if not self._cancelled.is_set():
            self._cancelled.set()
            if self._gen is not None:
                self._gen.cancel()


class ClusterMetrics:
    """/metrics for the cluster: every live replica's own metrics with a `replica` label, and the room's count."""

    def __init__(self, service: ClusterService):
        self.service = service

    def exposition(self) -> bytes:
        from prometheus_client import CollectorRegistry, generate_latest  # only when /metrics is asked for
        from prometheus_client.parser import text_string_to_metric_families

        families: dict[str, Any] = {}
        for replica in self.service._replica_ids():
            try:
                text = self.service._call("metrics_text", route={"replica": replica})
            except EngineError:
                continue
            for family in text_string_to_metric_families(text):
                samples = [s._replace(labels={**s.labels, "replica": replica[:8]}) for s in family.samples]
                if family.name in families:
                    families[family.name].samples.extend(samples)
                else:
                    family.samples = samples
                    families[family.name] = family
        registry = CollectorRegistry()
        registry.register(_Fixed(list(families.values()) + [_sessions(len(self.service.people))]))
        return generate_latest(registry)


class _Fixed:
    def __init__(self, families: list):
        self.families = families

    def collect(self) -> list:
        return self.families


def _sessions(n: int) -> Any:
    from prometheus_client.core import GaugeMetricFamily  # only when /metrics is asked for

    return GaugeMetricFamily("playground:room_sessions", "People counted against the room's limit, every replica.",
                             value=n)
