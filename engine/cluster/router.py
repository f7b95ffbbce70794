"""Which replica serves a request: a Ray Serve request router (ray.serve.request_router.RequestRouter) that keeps the
lessons true across replicas.

In order of preference:
1. a request for one replica's state (a run it holds): that replica;
2. a browser session's request: the replica it started on, so its one-request-at-a-time rule, its runs and its
   prefix-cache hits stay together (Ray Serve's `session_id` handle option carries it);
3. a prompt that shares a long start with a recent one: the replica that prefilled it, unless that replica is
   IMBALANCE requests busier than the least loaded (SGLang's and vLLM's routers weigh cache affinity against load
   the same way);
4. otherwise the least loaded replica (requests running plus queued, from the replicas' own routing stats).

Whatever it picks is only the first rank: the others follow by load, so a replica that is gone or full never holds
a request (Ray Serve tries the next rank).
"""
from __future__ import annotations

import os
from collections import OrderedDict, deque
from typing import Any, List, Optional

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

MIN_SHARED_CHARS = 256          # a shared start shorter than this is not worth a detour (the chat template is ~150)
PREFIXES_KEPT = 512             # recent prompts remembered for prefix affinity
PREFIX_CHARS = 4096             # of each, the start that is compared
SESSIONS_KEPT = 100_000
IMBALANCE = 4                   # requests more than the least loaded a cache-affine replica may have


class PlaygroundRouter(RequestRouter):
    """Explicit replica > session affinity > prefix affinity > least loaded; every other replica after, by load."""

    def initialize_state(self, **kwargs: Any) -> None:
        self._sessions: OrderedDict[str, str] = OrderedDict()          # session -> replica id
        self._prefixes: deque[tuple[str, str]] = deque(maxlen=PREFIXES_KEPT)   # (prompt start, replica id)
        self.decisions: deque[tuple[str, str]] = deque(maxlen=1000)    # (why, replica id): for tests and the docs

    async def choose_replicas(self, candidate_replicas: List[RunningReplica],
                              pending_request: Optional[PendingRequest] = None) -> List[List[RunningReplica]]:
        if not candidate_replicas:
            return []
        by_load = sorted(candidate_replicas, key=self._load)
        preferred, why = self._preferred(by_load, pending_request)
        if pending_request is not None:
            pending_request.routing_context.playground_why = why        # read back in on_request_routed
        if preferred is None:
            return [[r] for r in by_load]
        return [[preferred]] + [[r] for r in by_load if r is not preferred]

    def _preferred(self, by_load: List[RunningReplica],
                   pending: Optional[PendingRequest]) -> tuple[Optional[RunningReplica], str]:
        route = route_of(pending)
        ids = {r.replica_id.unique_id: r for r in by_load}
        if route.get("replica") in ids:
            return ids[route["replica"]], "replica"
        session = pending.metadata.session_id if pending is not None else ""
        if session and self._sessions.get(session) in ids:
            self._sessions.move_to_end(session)
            return ids[self._sessions[session]], "session"
        affine = self._prefix_replica(route.get("prompt") or "", ids)
        if affine is not None and self._load(affine) <= self._load(by_load[0]) + IMBALANCE:
            return affine, "prefix"
        return None, "load"

    def _prefix_replica(self, prompt: str, ids: dict[str, RunningReplica]) -> Optional[RunningReplica]:
        best, best_n = None, MIN_SHARED_CHARS - 1
        for start, replica in self._prefixes:
            n = len(os.path.commonprefix([start, prompt[:PREFIX_CHARS]]))
            if n > best_n and replica in ids:
                best, best_n = ids[replica], n
        return best

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        """Remember where a session went and where a prompt was prefilled."""
        why = getattr(pending_request.routing_context, "playground_why", "load")
        chosen = replica_id.unique_id
        self.decisions.append((why, chosen))
        session = pending_request.metadata.session_id
        if session and self._sessions.get(session) != chosen:
            self._sessions[session] = chosen
            while len(self._sessions) > SESSIONS_KEPT:
                self._sessions.popitem(last=False)
        prompt = route_of(pending_request).get("prompt")
        if prompt and len(prompt) >= MIN_SHARED_CHARS:
            self._prefixes.append((prompt[:PREFIX_CHARS], chosen))

    def _load(self, replica: RunningReplica) -> float:
        """Requests on the replica: the router's own count of what it sent (fresh), or the replica's last report."""
        cached = self._replica_queue_len_cache.get(replica.replica_id)
        reported = replica.routing_stats or {}
        return float(max(cached or 0, reported.get("running", 0) + reported.get("queued", 0)))


def route_of(pending: Optional[PendingRequest]) -> dict[str, Any]:
    """The ingress's routing hints: the first argument of every call to a replica."""
    if pending is None or not pending.args or not isinstance(pending.args[0], dict):
        return {}
    return pending.args[0]
