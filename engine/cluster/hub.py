"""What the replicas tell the ingress: a named Ray actor that keeps each replica's latest snapshot (its batch, its
queue, its newest runs), so the room view spans every replica and shows one that went missing.

    hub = Hub.options(name=HUB_NAME, get_if_exists=True, lifetime="detached").remote()
    hub.report.remote(ReplicaSnapshot(...))           # each replica, every second
    ray.get(hub.snapshots.remote())                   # the ingress
"""
from __future__ import annotations

from typing import Any

import ray

from engine.service.replicas import ReplicaSnapshot, ReplicaView  # noqa: F401 - what the hub keeps

HUB_NAME, HUB_NAMESPACE = "playground-hub", "playground"
SNAPSHOT_SECONDS = 1.0          # how often a replica reports


@ray.remote(num_cpus=0)
class Hub:
    """The latest snapshot of every replica that ever reported (a dead one stays, marked missing by its age)."""

    def __init__(self) -> None:
        self._latest: dict[str, ReplicaSnapshot] = {}

    def report(self, snapshot: ReplicaSnapshot) -> None:
        self._latest[snapshot.replica] = snapshot

    def forget(self, replica: str) -> None:
        self._latest.pop(replica, None)

    def snapshots(self) -> list[ReplicaSnapshot]:
        return list(self._latest.values())


def hub_actor() -> Any:
    """The cluster's hub (made by the first caller, found by the others)."""
    return Hub.options(name=HUB_NAME, namespace=HUB_NAMESPACE, get_if_exists=True, lifetime="detached").remote()
