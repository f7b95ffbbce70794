"""A run's records delivered to the event loop: the bridge between the scheduler's worker thread and an HTTP
response. The scheduler calls the stream (a listener) for every record as it is made; the response awaits them.

    stream = RecordStream(asyncio.get_running_loop())
    handle = service.submit(request, listeners=(stream,))      # in a worker thread: it tokenizes
    async for record in stream.records(tick=1.0):              # None every `tick` seconds without a record
        ...

Nothing here blocks a thread per waiting request: 30 streaming clients hold 30 queues, not 30 threads.
"""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

from engine.serving.scheduler import Handle


class RecordStream:
    """An asyncio queue fed from the worker thread; ends with the scheduler's end marker."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.queue: asyncio.Queue[Any] = asyncio.Queue()

    def __call__(self, handle: Handle, record: Any) -> None:
        """A scheduler listener (called in the worker's thread)."""
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.queue.put_nowait, record)

    async def records(self, tick: float | None = None) -> AsyncIterator[Any]:
        """Each record until the end; None every `tick` seconds while there is none (a chance to send a keep-alive
        or a queue position, which also finds out that the client has gone)."""
        while True:
            try:
                item = await asyncio.wait_for(self.queue.get(), tick) if tick else await self.queue.get()
            except asyncio.TimeoutError:
                yield None
                continue
            if item is Handle.END:
                return
            yield item
