"""A Streamlit tab without a browser: speaks the app's own websocket protocol, as the frontend does.

The server cannot tell it from a browser tab: it opens /_stcore/stream, asks for the page, reruns each
`st.fragment(run_every=...)` on the interval the server sends (as the frontend's timers do), follows the page
the server switches to, and reads the deltas it is sent. It renders nothing, so a room of them measures what
the *server* holds; real browsers do their rendering on the people's own machines.

Used by bench/watch.py to stand in for most of a room of followers (a few real Chromium tabs beside them
check the whole path): `Tab` touches no widget. `Person` (bench/soak_hosted.py, tests/test_soak_hosted.py) does what
people do: joins a hosted room by its link, keeps its cookies across reloads, sets widgets and presses buttons by
their keys (Generate, Stop, Open), and reads what each run of the page draws. No uploads.
"""
from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from typing import Callable

import httpx
import websockets
from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
from streamlit.proto.WidgetStates_pb2 import WidgetState

UP_CLOSE = "4. One token up close"        # the journey page's section drawn only for a finished run
MEMBER_COOKIE = "playground_member"       # the room's member token (app/room/join.py writes it from a script)
ERROR = 1                                 # Alert.Format.ERROR: st.error
WHOLE_RUN_ENDS = (0, 1)                   # ScriptFinishedStatus: a whole page ran (not a fragment, not cut short)


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


# --- a person with a browser: joins by link, keeps its cookies, presses buttons --------------------------------------

@dataclass
class Person:
    """One person's browser without the browser, for the hosted soak (bench/soak_hosted.py): it loads pages (a new
    websocket each time, as a reload does, with the cookies it was given: nginx's route, Streamlit's XSRF, the room's
    member token, which the page sets from a script as the real page does), joins with a link's `?join=` code, reads
    what every script run draws (texts, alerts, widgets by their keys) and presses buttons or sets widgets by key,
    sending exactly what the frontend sends: a rerun with those widgets' states."""
    url: str
    cookies: dict[str, str] = field(default_factory=dict)
    widgets: dict[str, str] = field(default_factory=dict)      # user key -> widget id, this page
    texts: list[str] = field(default_factory=list)             # what the page drew since the last whole rerun
    errors: list[str] = field(default_factory=list)            # its st.error boxes (the refusals and failures it says)
    exceptions: list[str] = field(default_factory=list)        # tracebacks a page showed (must stay empty)
    alerts: list[str] = field(default_factory=list)            # every alert any run of any page showed, in order
    runs: int = 0                                              # whole runs of the page finished since it loaded
    starts: int = 0                                            # whole runs of the page started since it loaded
    closed_reason: str | None = None
    page_hash: str = ""
    ticking: bool = True                                       # rerun each fragment on its timer, as a browser does
    pages: dict[str, str] = field(default_factory=dict)        # page name -> page hash, from the navigation message
    fragments: list[str] = field(default_factory=list)         # the ids of the fragments that asked for a timer
    started: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)  # each run: its page hash, fragment ids
    _ws: object = None
    _reader: asyncio.Task | None = None
    _timers: dict[str, asyncio.Task] = field(default_factory=dict)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def open(self, page: str = "", query: str = "", timeout: float = 20.0) -> None:
        """A page load (first visit or reload): fresh cookies from the server, a new websocket, the page's first run."""
        await self.close()
        async with httpx.AsyncClient(timeout=timeout) as http:
            reply = await http.get(self.url + "/_stcore/health", headers={"Cookie": self.cookie_header})
            reply.raise_for_status()
            self.cookies.update({c.name: c.value for c in reply.cookies.jar})
        header = self.cookie_header
        self._ws = await websockets.connect(self.url.replace("http", "ws", 1) + "/_stcore/stream",
                                            subprotocols=["streamlit"], max_size=None, open_timeout=timeout,
                                            additional_headers={"Cookie": header})
        self.closed_reason, self.page_hash, self.runs, self.starts = None, "", 0, 0
        self._reader = asyncio.ensure_future(self._read())
        await self.rerun(page=page, query=query)

    @property
    def cookie_header(self) -> str:
        return "; ".join(f"{k}={v}" for k, v in self.cookies.items())

    async def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        if self._reader is not None:
            self._reader.cancel()
        if self._ws is not None:
            await self._ws.close()
        self._ws = self._reader = None

    async def rerun(self, states: list | None = None, page: str = "", query: str = "", fragment: str = "",
                    page_hash: str | None = None) -> None:
        """What the frontend sends: a rerun of this page (or one fragment; or of the page `page_hash` names, as a
        request sent before the browser heard of a move does) with the widgets' new states."""
        msg = BackMsg()
        state = msg.rerun_script
        state.query_string = query
        state.page_script_hash = self.page_hash if page_hash is None else page_hash
        state.page_name = page
        state.fragment_id = fragment
        state.is_auto_rerun = bool(fragment)
        state.widget_states.SetInParent()
        for widget in states or []:
            state.widget_states.widgets.append(widget)
        await self._ws.send(msg.SerializeToString())

    async def press(self, key: str, **values: object) -> bool:
        """Press the button with this key (False when the page does not show it), setting widgets by key first."""
        if key not in self.widgets:
            return False
        states = [self._state(k, v) for k, v in values.items() if k in self.widgets]
        states.append(WidgetState(id=self.widgets[key], trigger_value=True))
        await self.rerun(states)
        return True

    def _state(self, key: str, value: object) -> WidgetState:
        widget = WidgetState(id=self.widgets[key])
        if isinstance(value, bool):
            widget.bool_value = value
        elif isinstance(value, int):
            widget.int_value = value
        elif isinstance(value, float):
            widget.double_value = value
        else:
            widget.string_value = str(value)
        return widget

    async def until(self, seen: Callable[["Person"], bool], timeout: float) -> bool:
        """Wait until `seen(self)` holds (True) or the time is up or the connection closed (False)."""
        deadline = time.monotonic() + timeout
        while not seen(self):
            left = deadline - time.monotonic()
            if left <= 0 or self.closed_reason is not None:
                return seen(self)
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), min(left, 1.0))
            except asyncio.TimeoutError:
                pass
        return True

    def shows(self, text: str) -> bool:
        return any(text in t for t in self.texts)

    async def _read(self) -> None:
        try:
            async for raw in self._ws:
                msg = ForwardMsg()
                msg.ParseFromString(raw)
                self._handle(msg)
                self._changed.set()
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - a dropped connection is what a fault looks like: say so
            self.closed_reason = f"{type(err).__name__}: {err}"[:300]
        else:
            self.closed_reason = f"the server closed the connection ({self._ws.close_code})"
        self._changed.set()

    def _handle(self, msg: ForwardMsg) -> None:
        kind = msg.WhichOneof("type")
        if kind == "new_session":
            self.started.append((msg.new_session.page_script_hash, tuple(msg.metadata.run.fragment_ids)))
        if kind == "new_session" and not msg.metadata.run.fragment_ids:
            self.page_hash = msg.new_session.page_script_hash
            self.texts, self.errors, self.widgets = [], [], {}  # what this run of the page draws
            self.starts += 1
        elif kind == "navigation":
            self.page_hash = msg.navigation.page_script_hash
            self.pages = {page.page_name: page.page_script_hash for page in msg.navigation.app_pages}
        elif kind == "auto_rerun":
            self.fragments.append(msg.auto_rerun.fragment_id)
            self._tick(msg.auto_rerun.fragment_id, msg.auto_rerun.interval)
        elif kind == "stop_auto_rerun":
            for fid in msg.stop_auto_rerun.fragment_ids:
                timer = self._timers.pop(fid, None)
                timer.cancel() if timer is not None else None
        elif kind == "script_finished" and msg.script_finished in WHOLE_RUN_ENDS:
            self.runs += 1
        elif kind == "delta" and msg.delta.WhichOneof("type") == "new_element":
            self._element(msg.delta.new_element)

    def _element(self, element) -> None:
        which = element.WhichOneof("type")
        if which is None:
            return
        value = getattr(element, which)
        if which in ("markdown", "text", "alert", "heading", "code"):
            self.texts.append(value.body)
            if which == "alert":
                self.alerts.append(value.body)
                if value.format == ERROR:
                    self.errors.append(value.body)
        elif which == "html" and MEMBER_COOKIE in value.body:
            found = re.search(MEMBER_COOKIE + r"=([A-Za-z0-9._-]+)", value.body)
            if found is not None:
                self.cookies[MEMBER_COOKIE] = found.group(1)          # what the page's script writes
        elif which == "exception":
            self.exceptions.append(f"{value.type}: {value.message}"[:300])
        elif which == "metric":
            self.texts.append(f"{value.label}: {value.body}")
        widget_id = getattr(value, "id", "")
        if isinstance(widget_id, str) and widget_id.startswith("$$ID-"):
            self.widgets[widget_id.split("-", 2)[-1]] = widget_id

    def _tick(self, fragment_id: str, interval: float) -> None:
        if fragment_id in self._timers or not self.ticking:
            return

        async def tick() -> None:
            while True:
                await asyncio.sleep(interval)
                if self._ws is not None:
                    await self.rerun(fragment=fragment_id)
        self._timers[fragment_id] = asyncio.ensure_future(tick())
