"""A run's records delivered to the event loop: the bridge between the scheduler's worker thread and an HTTP
response. The scheduler calls the stream (a listener) for every record as it is made; the response awaits them.

    stream = RecordStream(asyncio.get_running_loop())
    handle = service.submit(request, listeners=(stream,))      # in a worker thread: it tokenizes
    async for record in stream.records(tick=1.0):              # None every `tick` seconds without a record
        ...

Nothing here blocks a thread per waiting request: 30 streaming clients hold 30 queues, not 30 threads.

    stream.until_kept(service, handle.run_id)   # the final record waits until the run's file is on disk

A run's final record (DoneRecord) is held back until the run has ended (its timings taken apart, handle.timings)
and its run file is on disk (the service's `written`, engine/service/ondisk.py), so a client that saw its run finish
can open it by id whatever dies next: the acknowledgement comes after the write, as a database's commit does. That
costs the write's time at the end of each answer, never a token's.
"""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Awaitable, Callable

from starlette.concurrency import run_in_threadpool

from engine.core.records import DoneRecord
from engine.serving.scheduler import Handle


class RecordStream:
    """An asyncio queue fed from the worker thread; ends with the scheduler's end marker."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.durable: Callable[[], Awaitable[Any]] | None = None

    def until_kept(self, service: Any, run_id: str) -> None:
        """Hold the run's final record back until its run file is on disk (when the service keeps runs on disk)."""
        written = getattr(service, "written", None)
        if written is not None:
            self.durable = lambda: run_in_threadpool(written, run_id)

    def __call__(self, handle: Handle, record: Any) -> None:
        """A scheduler listener (called in the worker's thread)."""
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.queue.put_nowait, record)

    async def records(self, tick: float | None = None) -> AsyncIterator[Any]:
        """Each record until the end; None every `tick` seconds while there is none (a chance to send a keep-alive
        or a queue position, which also finds out that the client has gone)."""
        held = None
        while True:
            try:
                item = await asyncio.wait_for(self.queue.get(), tick) if tick else await self.queue.get()
            except asyncio.TimeoutError:
                yield None
                continue
            if item is Handle.END:
                if held is not None:
                    if self.durable is not None:
                        await self.durable()
                    yield held
                return
            if isinstance(item, DoneRecord):
                held = item                      # sent once the run ended (its timings made) and its file is written
                continue
            yield item
