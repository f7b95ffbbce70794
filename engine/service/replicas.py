"""A model server's replicas as the room sees them: one for a single server, N for a cluster on Ray Serve
(engine/cluster/). Plain data, so that every client can draw them."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

MISSING_SECONDS = 3.0           # a replica silent this long (three reports) is shown as missing


@dataclass(frozen=True)
class ReplicaSnapshot:
    """One replica as it was a moment ago: what the room page draws for it."""

    replica: str                   # Ray Serve's replica id
    node: str                      # the node it runs on
    label: str                     # the model's label
    room: Any                      # engine.serving.scheduler.RoomState
    stats: Any                     # engine.serving.scheduler.SchedulerStats
    prefix: Any                    # engine.serving.prefix.PrefixStats
    runs: tuple[str, ...]          # its newest run ids (which replica holds a run)
    memory: tuple[Any, ...] = ()   # engine.service.service.MemoryRow
    pid: int = 0                   # its process on its node
    at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class ReplicaView:
    """A replica as the room sees it: its latest snapshot and whether it is still reporting."""

    snapshot: ReplicaSnapshot
    seconds_ago: float

    @property
    def missing(self) -> bool:
        return self.seconds_ago > MISSING_SECONDS
