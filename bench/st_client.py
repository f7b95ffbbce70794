"""A Streamlit tab without a browser: speaks the app's own websocket protocol, as the frontend does.

The server cannot tell it from a browser tab: it opens /_stcore/stream, asks for the page, reruns each
`st.fragment(run_every=...)` on the interval the server sends (as the frontend's timers do), follows the page
the server switches to, and reads the deltas it is sent. It renders nothing, so a room of them measures what
the *server* holds; real browsers do their rendering on the people's own machines.

Used by bench/watch.py to stand in for most of a room of followers (a few real Chromium tabs beside them
check the whole path). Only what watching needs: no widgets are touched (each keeps its default), no uploads.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import websockets
from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

UP_CLOSE = "4. One token up close"        # the journey page's section drawn only for a finished run


@dataclass
class Tab:
    """One tab's view of a run: when each "Generated tokens" count, the "Done:" line and the whole page of the
    finished run first arrived."""
    url: str
    counts: list[tuple[int, float]] = field(default_factory=list)     # (count, wall-clock s), each count once
    done_at: float | None = None
    page_at: float | None = None          # when the journey page drew the finished run ("4. One token up close")
    messages: int = 0
    bytes: int = 0
    page_hash: str = ""
    error: str | None = None              # why the tab stopped reading before it was closed
    _timers: dict[str, asyncio.Task] = field(default_factory=dict)

    async def run(self, stop: asyncio.Event) -> None:
        ws_url = self.url.replace("http", "ws", 1) + "/_stcore/stream"
        async with websockets.connect(ws_url, subprotocols=["streamlit"], max_size=None) as ws:
            await self._rerun(ws)                                       # the first page load
            reader = asyncio.ensure_future(self._read(ws))
            await stop.wait()
            reader.cancel()
            for timer in self._timers.values():
                timer.cancel()

    async def _read(self, ws) -> None:
        try:
            async for raw in ws:
                self.messages += 1
                self.bytes += len(raw)
                msg = ForwardMsg()
                msg.ParseFromString(raw)
                self._handle(ws, msg)
        except asyncio.CancelledError:
            raise
        except Exception as err:              # a tab that stops reading must say why, not go quiet
            self.error = f"{type(err).__name__}: {err}"[:300]
        else:
            self.error = f"the server closed the connection ({ws.close_code} {ws.close_reason})"

    def _handle(self, ws, msg: ForwardMsg) -> None:
        kind = msg.WhichOneof("type")
        if kind == "new_session" and not msg.metadata.run.fragment_ids:
            self.page_hash = msg.new_session.page_script_hash          # a whole-page run, as the frontend:
            self._stop_timers(list(self._timers))                      # its page from now on, the old timers go
        elif kind == "navigation":                                     # the page st.navigation ran, as the
            self.page_hash = msg.navigation.page_script_hash             # frontend: its reruns name that page
        elif kind == "auto_rerun":
            self._start_timer(ws, msg.auto_rerun.fragment_id, msg.auto_rerun.interval)
        elif kind == "stop_auto_rerun":
            self._stop_timers(list(msg.stop_auto_rerun.fragment_ids))
        elif kind == "delta" and msg.delta.WhichOneof("type") == "new_element":
            self._read_element(msg.delta.new_element)

    def _read_element(self, element) -> None:
        now = time.time()
        which = element.WhichOneof("type")
        if which == "metric" and element.metric.label == "Generated tokens":
            count = int(element.metric.body.replace(",", "") or 0)
            if count > (self.counts[-1][0] if self.counts else 0):
                self.counts.append((count, now))
        elif which == "markdown" and element.markdown.body.startswith("Done:") and self.done_at is None:
            self.done_at = now
        elif which == "heading" and element.heading.body == UP_CLOSE and self.page_at is None:
            self.page_at = now

    def _start_timer(self, ws, fragment_id: str, interval: float) -> None:
        if fragment_id in self._timers:
            return

        async def tick() -> None:
            while True:
                await asyncio.sleep(interval)
                await self._rerun(ws, fragment_id)
        self._timers[fragment_id] = asyncio.ensure_future(tick())

    def _stop_timers(self, fragment_ids: list[str]) -> None:
        for fid in fragment_ids:
            timer = self._timers.pop(fid, None)
            if timer is not None:
                timer.cancel()

    async def _rerun(self, ws, fragment_id: str = "") -> None:
        msg = BackMsg()
        state = msg.rerun_script
        state.query_string = ""
        state.page_script_hash = self.page_hash
        state.fragment_id = fragment_id
        state.is_auto_rerun = bool(fragment_id)
        state.widget_states.SetInParent()
        await ws.send(msg.SerializeToString())


def first_seen(counts: list[tuple[int, float]]) -> dict[int, float]:
    """Token count -> the wall-clock time (s) a tab first showed at least that count."""
    seen: dict[int, float] = {}
    for count, at in counts:
        for k in range(max(seen, default=0) + 1, count + 1):
            seen[k] = at
    return seen
