"""The room is the batch: this server's live batch, drawn from the scheduler's own steps (measured).

Numbers first (`step_rows`, `room_numbers`, `member_rows`), then figures, then the page section,
which redraws itself every second while the room generates.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence
from urllib.parse import urlsplit

import plotly.graph_objects as go
from plotly.subplots import make_subplots
import streamlit as st

from app.ui.format import fmt_bytes, fmt_ms, fmt_rate
from app.runs.live import measure_in_box
from app.runs.widgets import plot
from engine.core.generate import GenerationRequest
from app.hosting.model import away_safe
from engine.service.client import ModelClient
from engine.core.small_batch import PROBE_ROWS, ROWS
from engine.serving.batch import StepInfo
from engine.serving.paged import BLOCK as PAGE_TOKENS, BlockTable
from engine.service.replicas import ReplicaView
from engine.serving.scheduler import RoomState
from engine.serving.threads import DECISIVE, TRIAL_STEPS, ThreadChoice

RECENT_STEPS = 50            # steps the headline numbers average over
TRADEOFF_LABELS = 8          # batch sizes up to which the trade-off chart writes each point's value
REFRESH_SECONDS = 1.0


# --- numbers ---------------------------------------------------------------------------------------------

def step_rows(state: RoomState) -> list[dict]:
    """One row per recent step: when, how many decoded, prompt tokens prefilled, its time, its throughput."""
    return [{"t": s.at - state.t0, "decode_rows": s.decode_rows, "prefill_tokens": s.prefill_tokens,
             "step_ms": s.seconds * 1e3, "tok_s": s.decode_rows / s.seconds if s.seconds > 0 else 0.0,
             "empty": 1 - s.real_positions / s.cache_positions if s.cache_positions else 0.0}
            for s in state.steps]


@dataclass(frozen=True)
class RoomNumbers:
    """The room's headline, from its recent decode steps. Each request in a step gets one token per step, so
    `per_user_tok_s` = 1 / `step_seconds` and `total_tok_s` = that × the mean rows per step (never below it)."""

    running: int
    max_batch: int
    queued: int
    sessions: int
    step_seconds: float | None        # mean of the recent decode steps
    total_tok_s: float | None         # tokens all users got per second, recent steps
    per_user_tok_s: float | None      # tokens one user in the batch gets per second
    empty: float | None               # share of the handed-out cache blocks' slots that hold nothing, last step
    mean_rows: float | None = None    # requests per recent decode step
    steps: int = 0                    # recent decode steps these figures average over

    @property
    def idle(self) -> bool:
        return self.running == 0 and self.queued == 0


def room_numbers(state: RoomState) -> RoomNumbers:
    recent: Sequence[StepInfo] = [s for s in state.steps[-RECENT_STEPS:] if s.decode_rows]
    seconds = sum(s.seconds for s in recent)
    step = seconds / len(recent) if recent else None
    rows = sum(s.decode_rows for s in recent) / len(recent) if recent else None
    last = state.steps[-1] if state.steps else None
    empty = (1 - last.real_positions / last.cache_positions) if last and last.cache_positions else None
    return RoomNumbers(len(state.members), state.max_batch, state.queued, state.sessions, step,
                       rows / step if step else None, 1 / step if step else None, empty, rows, len(recent))


def member_rows(state: RoomState, me: str | None) -> list[dict]:
    """Who is in the batch now; sessions are named by a short tag, yours as 'you', a request from the API as such;
    each with a link that opens its run on every page. No prompts are shown."""
    return [{"request": m.id, "session": "you" if me and m.session == me else _tag(m.session), "phase": m.phase,
             "prompt tokens": m.prompt_tokens, "generated": f"{m.tokens} of {m.max_new_tokens}" if m.max_new_tokens
             else "", "in the batch for": f"{m.seconds:.1f} s", "run": f"?run={m.run_id}" if m.run_id else None}
            for m in state.members]


def _tag(session: str | None) -> str:
    return "an API client" if not session else f"session {session[:4]}"


MEMBER_COLUMNS = {"run": st.column_config.LinkColumn(
    "run", display_text="open its run", help="Opens its run on every page (its attention too, when it was captured)")}


# --- figures ---------------------------------------------------------------------------------------------

def steps_figure(rows: list[dict]) -> go.Figure:
    """Each step over time: requests decoded (bars) and prompt tokens prefilled (bars on the right axis)."""
    fig = go.Figure()
    fig.add_bar(x=[r["t"] for r in rows], y=[r["decode_rows"] for r in rows], name="requests decoded in the step",
                marker_color="#1f77b4")
    fig.add_bar(x=[r["t"] for r in rows], y=[r["prefill_tokens"] for r in rows], name="prompt tokens prefilled",
                marker_color="#ff7f0e", yaxis="y2", opacity=0.6)
    fig.update_layout(height=340, margin=dict(l=10, r=10, t=30, b=10), barmode="overlay",
                      legend=dict(orientation="h", y=1.15), xaxis_title="seconds since the server started",
                      yaxis=from_zero("requests in the step", [r["decode_rows"] for r in rows]),
                      yaxis2=from_zero("prompt tokens", [r["prefill_tokens"] for r in rows], right=True))
    return fig


def from_zero(title: str, values: list[float], right: bool = False, headroom: float = 1.12) -> dict:
    """A y axis from 0 to a little above the largest value, its ticks its own. Set here, not left to plotly: a
    second axis overlaying the first takes the first's tick grid by default (ticks at 3.53, 7.06, ...), and a
    chart redrawn every second kept an earlier range, so a new point could run off its top."""
    top = max([v for v in values if v is not None] or [1.0]) or 1.0
    axis = dict(title=title, range=[0, top * headroom], tickmode="auto", nticks=6, autorange=False)
    return axis | (dict(overlaying="y", side="right", showgrid=False) if right else {})


@dataclass(frozen=True)
class BatchPoint:
    """The room's decode steps at one batch size: how many, their median time, the room's tokens per second."""

    size: int
    steps: int
    step_ms: float

    @property
    def tok_s(self) -> float:
        return self.size / (self.step_ms / 1e3)


def tradeoff_points(rows: list[dict]) -> list[BatchPoint]:
    """One point per batch size, from the decode steps that prefilled nothing (a prefill chunk slows a step)."""
    decode = [r for r in rows if r["decode_rows"] and not r["prefill_tokens"]]
    sizes = sorted({r["decode_rows"] for r in decode})
    return [BatchPoint(b, len(ms), statistics.median(ms)) for b in sizes
            for ms in [[r["step_ms"] for r in decode if r["decode_rows"] == b]]]


def tradeoff_figure(rows: list[dict]) -> go.Figure:
    """Step time above, total tokens/s below, against the batch size, from the room's own steps. Two panels on one
    x axis, not two y axes on one panel: overlaid, a point's written value could sit on the other curve's (the
    projector saw '130 ms' over '7.7 tok/s')."""
    points = tradeoff_points(rows)
    sizes, step, together = [p.size for p in points], [p.step_ms for p in points], [p.tok_s for p in points]
    mode = "lines+markers+text" if len(sizes) <= TRADEOFF_LABELS else "lines+markers"
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12)
    fig.add_scatter(x=sizes, y=step, mode=mode, name="decode step (ms): each user's wait per token", row=1, col=1,
                    text=[f"{v:,.0f} ms" for v in step], textposition="top center", cliponaxis=False,
                    customdata=[p.steps for p in points],
                    hovertemplate="%{x} requests: median of %{customdata} steps, %{y:,.0f} ms<extra></extra>")
    fig.add_scatter(x=sizes, y=together, mode=mode, name="tokens/s, all users together", row=2, col=1,
                    text=[f"{v:,.1f} tok/s" for v in together], textposition="top center", cliponaxis=False)
    fig.update_layout(height=340, margin=dict(l=10, r=10, t=30, b=10), legend=dict(orientation="h", y=1.15),
                      yaxis=from_zero("step (ms)", step, headroom=1.45),
                      yaxis2=from_zero("tokens/s", together, headroom=1.45))
    fig.update_xaxes(dtick=1, range=[min(sizes, default=1) - 0.5, max(sizes, default=1) + 0.5])
    fig.update_xaxes(title="requests in the batch", row=2, col=1)
    return fig


def _requests(n: int) -> str:
    return f"{n} request{'s' * (n != 1)}"


def out_of_line(points: list[BatchPoint]) -> list[BatchPoint]:
    """Batch sizes whose median step is slower than a larger batch's by more than a quarter: a step with more
    requests does at least the same work, so such a point is noise (few steps that waited for a busy core)."""
    return [p for i, p in enumerate(points) if any(p.step_ms > 1.25 * q.step_ms for q in points[i + 1:])]


def tradeoff_reading(points: list[BatchPoint]) -> str:
    """The trade-off chart in words, from its own points: the step time and the room's tokens per second at the
    smallest and largest batch, and the points out of line."""
    if not points:
        return ""
    if len(points) == 1:
        p = points[0]
        return (f"So far every decode step had {_requests(p.size)} ({p.step_ms:,.0f} ms, {p.tok_s:,.1f} tok/s): the "
                "chart gains a point for each batch size the room reaches when people generate together.")
    lo, hi = points[0], points[-1]
    slower = hi.step_ms / lo.step_ms
    text = (f"From {_requests(lo.size)} to {_requests(hi.size)} the median step went from {lo.step_ms:,.0f} to "
            f"{hi.step_ms:,.0f} ms ({slower:.2f}×: each user's wait per token) while the room's tokens per second went "
            f"from {lo.tok_s:,.1f} to {hi.tok_s:,.1f} ({hi.tok_s / lo.tok_s:.2f}×).")
    if slower < hi.size / lo.size:
        text += (" The throughput grows faster than the step slows: a step reads every weight once, whatever the "
                 "number of users, so a bigger batch costs each user less than it gains the room.")
    else:
        text += (" Here the step slowed as much as the batch grew, so batching gained nothing: on a CPU the "
                 "arithmetic, not the reading of the weights, can set the step time.")
    for p in out_of_line(points):
        text += (f" The {p.size}-request point ({p.step_ms:,.0f} ms, median of {p.steps} step{'s' * (p.steps != 1)}) "
                 "is out of line: a step with more requests took less, so those few steps waited for a core busy "
                 "with something else (the web app, a browser).")
    return text


# --- the section -------------------------------------------------------------------------------------------

def numbers_row(n: RoomNumbers) -> None:
    """The batch now; the step time and speeds of the recent steps while anyone is in the batch, none when idle."""
    cols = st.columns(5)
    cols[0].metric("In the batch", f"{n.running} of {n.max_batch}")
    cols[1].metric("Waiting", str(n.queued))
    live = not n.idle
    cols[2].metric("Decode step", fmt_ms(n.step_seconds) if live and n.step_seconds else "–",
                   help=f"Mean time of the last {RECENT_STEPS} decode steps (at most)")
    cols[3].metric("tok/s, all", fmt_rate(n.total_tok_s) if live and n.total_tok_s else "–",
                   help="Tokens per second for everyone together over the recent steps: each step gives every "
                        "request in it one token, so this is 'each' × the requests per step, averaged")
    cols[4].metric("tok/s, each", fmt_rate(n.per_user_tok_s) if live and n.per_user_tok_s else "–",
                   help="Tokens per second each request in the batch gets: one per step")
    if live and n.step_seconds:
        st.caption(speeds_note(n))


def speeds_note(n: RoomNumbers) -> str:
    """What the three speeds average over: the recent decode steps, whose batch may differ from the batch now."""
    return (f"Step and speeds: the last {n.steps} decode step{'s' * (n.steps != 1)}, with {n.mean_rows:.2f} requests "
            f"in a step on average (the batch changes as people join and finish): {fmt_rate(n.per_user_tok_s)} each × "
            f"{n.mean_rows:.2f} = {fmt_rate(n.total_tok_s)} for all.")


def idle_note(n: RoomNumbers) -> str | None:
    """The last steps' figures, said to be the last ones (None when the room never stepped)."""
    if not n.step_seconds:
        return None
    return (f"Before the room went idle, its last decode steps took {fmt_ms(n.step_seconds)} each with "
            f"{n.mean_rows:.1f} request(s) in them on average: {fmt_rate(n.per_user_tok_s)} for each request, "
            f"{fmt_rate(n.total_tok_s)} for the room.")


def live_section(lm: ModelClient, me: str | None) -> None:
    """Everything measured from the scheduler, redrawn every second (a fragment: the rest of the page stays); with
    several replicas (a cluster on Ray Serve), each one's batch side by side first."""

    @st.fragment(run_every=REFRESH_SECONDS)
    @away_safe
    def live() -> None:
        views = lm.replicas_view()
        if len(views) > 1:
            replicas_row(views, me, lm.stats().sessions)
            st.caption(f"Below: replica {views[0].snapshot.replica[:8]}'s steps in detail.")
        state = lm.room()
        numbers, rows = room_numbers(state), step_rows(state)
        numbers_row(numbers)
        if state.threads is not None:
            st.caption(threads_note(state.threads))
        if numbers.empty is not None and not numbers.idle:
            st.caption(f"Measured: the paged cache hands out {PAGE_TOKENS}-token blocks; {numbers.empty:.0%} of the "
                       "slots in them wait for tokens right now (each request's last block; see the KV-cache page).")
        members = member_rows(state, me)
        if members:
            st.dataframe(members, hide_index=True, width="stretch", column_config=MEMBER_COLUMNS)
        elif numbers.idle:
            st.info("Idle: nobody is generating right now. Press Generate on the journey page (or ask the room to) "
                    "and watch the batch fill.", icon=":material/hourglass_empty:")
            if note := idle_note(numbers):
                st.caption(note)
        if rows:
            left, right = st.columns(2)
            plot(steps_figure(rows), "room.steps", left)
            plot(tradeoff_figure(rows), "room.tradeoff", right)
            st.caption("Right: the serving trade-off, each batch size's median decode step (latency) and the room's "
                       "tokens per second (throughput). " + tradeoff_reading(tradeoff_points(rows)))
    live()


def api_note(page_url: str | None, key: str | None, presenter: bool) -> str:
    """Where this room's OpenAI API answers (the same address as the pages, under /v1), and with what key."""
    parts = urlsplit(page_url or "")
    base = f"{parts.scheme}://{parts.netloc}/v1" if parts.scheme and parts.netloc else "this address + /v1"
    if key is None:
        how = f"`OpenAI(base_url=\"{base}\", api_key=\"unused\")`"
    elif presenter:
        how = f"`OpenAI(base_url=\"{base}\", api_key=\"{key}\")` (the key is shown to you as the presenter)"
    else:
        how = f"`OpenAI(base_url=\"{base}\", api_key=...)` with the API key the presenter gives you"
    return (f"From a notebook or a script, the same model answers the OpenAI API: {how}. Those requests join this "
            "batch as \"an API client\", and *open its run* shows one on every page.")


def threads_note(choice: ThreadChoice) -> str:
    """One line on the CPU threads the steps run with, how they were chosen (engine/serving/threads.py), and what
    the last trial's times say: a ratio no thread count explains is a step that waited for its cores."""
    if not choice.auto:
        return f"CPU threads: {choice.describe()}."
    text = (f"CPU threads: {choice.describe()}. The server times its own steps with every core and with one fewer, "
            f"now and then as the room changes, and keeps the faster: a trial times at most {TRIAL_STEPS} steps on "
            f"each count and stops as soon as one step is {DECISIVE:g}× slower than the other's, so one step can "
            "decide it.")
    times = [s for _, s, _ in choice.measured]
    if len(times) > 1 and max(times) > OUTLIER * min(times):
        slow = max(choice.measured, key=lambda m: m[1])
        text += (f" The last trial's {slow[0]}-thread step, {max(times) / min(times):.0f}× slower, is an outlier: "
                 "one thread more or fewer changes the arithmetic by at most "
                 f"{choice.cores / (choice.cores - 1):.1f}×, "
                 "so that step waited for a core another program held (the web app, a browser on this machine).")
    return text


OUTLIER = 3.0       # a trial's times this far apart are not the thread count's doing


REPLICA_COLUMNS = 3          # replicas side by side (a projector's width)


def replicas_row(views: Sequence[ReplicaView], me: str | None, people: int) -> None:
    """Each replica's batch, side by side: a replica that stopped reporting is shown missing until it is back."""
    st.markdown(f"**{len(views)} replicas serve this room** ({people} people): each holds its own batch and KV cache; "
                "a person's requests stay on one replica, and prompts that start alike meet on the one that "
                "holds their start.")
    for start in range(0, len(views), REPLICA_COLUMNS):
        for col, view in zip(st.columns(REPLICA_COLUMNS), views[start:start + REPLICA_COLUMNS]):
            with col.container(border=True):
                replica_card(view, me)


def replica_card(view: ReplicaView, me: str | None) -> None:
    snap = view.snapshot
    n = room_numbers(snap.room)
    st.markdown(f"**Replica {snap.replica[:8]}**")
    if view.missing:
        st.error(f"Missing: no report for {view.seconds_ago:.0f} s. Its requests failed with a message; Ray Serve "
                 "is starting a new one.", icon=":material/error:")
        return
    st.caption(f"{n.running} of {n.max_batch} in the batch, {n.queued} waiting; a step "
               f"{fmt_ms(n.step_seconds) if n.step_seconds else '–'}, "
               f"{fmt_rate(n.total_tok_s) if n.total_tok_s else '–'} in all; {snap.stats.served} served.")
    members = member_rows(snap.room, me)
    if members:
        st.dataframe([{k: m[k] for k in ("session", "phase", "generated")} for m in members], hide_index=True,
                     width="stretch")


# --- the paged batch cache, for the KV-cache page ------------------------------------------------------------

GRID = 32                    # blocks per row of the pool's picture


def kernel_note(lm: ModelClient) -> str | None:
    """One line on the batched steps' kernel where this server packed weights for small batches (measured at
    start); None where it did not (a GPU, bfloat16, nothing faster, or one request at a time)."""
    kernels = lm.quick("batch.kernels")
    if kernels is None:
        return None
    faster = kernels["faster"]
    example = ""
    if faster:
        (out_dim, in_dim), (mkl, packed) = max(faster.items(), key=lambda item: item[0][0] * item[0][1])
        example = (f" For the largest, {out_dim:,} x {in_dim:,}, {PROBE_ROWS} requests' rows took {fmt_ms(mkl)} the "
                   f"usual way and {fmt_ms(packed)} with the rearranged copy.")
    return (f"A detail of this CPU server, measured when it started: the usual matrix-multiply routine is slow for a "
            f"batch of a few rows, so for steps of {ROWS.start} to {ROWS.stop - 1} requests the server keeps copies "
            f"of {kernels['weights']} weight {'matrix' if kernels['weights'] == 1 else 'matrices'} rearranged for a "
            "second routine that measured faster on this "
            f"machine.{example} {SAME_ORDER if kernels.get('ordered') else USUAL_ALONE}")


SAME_ORDER = ("That routine is the playground's own: it adds up each of a request's matrix products in the same order "
              "as for the request alone, so the room's size does not change them (the attention is another matter: "
              "\"Same question, same numbers?\" below).")
USUAL_ALONE = "One request alone keeps the usual routine."


def last_table(state: RoomState) -> BlockTable | None:
    """The block table after the last step that had requests in the batch (measured)."""
    return next((s.blocks for s in reversed(state.steps) if s.blocks is not None and s.blocks.rows), None)


def allocation_compare(state: RoomState, table: BlockTable) -> dict:
    """Slots the paged cache hands out (measured) against two other layouts for the same requests (computed):
    contiguous rows reserving each request's whole prompt + max new tokens, and rows padded to the longest."""
    reserve = {m.id: m.prompt_tokens + m.max_new_tokens for m in state.members}
    lengths = [n for _, _, n in table.rows]
    return {"tokens": table.tokens, "paged": table.used * table.block,
            "contiguous": sum(reserve.get(label, n) for label, _, n in table.rows),
            "padded": len(lengths) * max(lengths)}


def block_owners(table: BlockTable) -> dict[int, tuple[object, int]]:
    """Physical block -> (its request, tokens it holds)."""
    owners = {}
    for label, blocks, n in table.rows:
        for i, block in enumerate(blocks):
            owners[block] = (label, min(table.block, n - i * table.block))
    return owners


def shown_blocks(table: BlockTable, most: int = 8 * GRID) -> int:
    """Blocks the picture draws: the pool up to its highest block in use, whole rows, at most `most`."""
    highest = max((b for _, blocks, _ in table.rows for b in blocks), default=0)
    return min(table.n_blocks, max(GRID, -(-(highest + 1) // GRID) * GRID), most)


def block_table_figure(table: BlockTable) -> go.Figure:
    """The pool as a grid of blocks: each request's in its own colour, the tokens a block holds written on it."""
    owners, n = block_owners(table), shown_blocks(table)
    fig = go.Figure()
    free = [b for b in range(1, n + 1) if b not in owners]
    fig.add_scatter(x=[b % GRID for b in free], y=[b // GRID for b in free], mode="markers", name="free",
                    marker=dict(symbol="square", size=17, color="#f0f0f0", line=dict(color="#c7c7c7", width=1)),
                    hovertemplate="block %{customdata}: free<extra></extra>", customdata=free)
    for label, blocks, _ in table.rows:
        drawn = [b for b in blocks if b <= n]
        fill = [owners[b][1] for b in drawn]
        fig.add_scatter(x=[b % GRID for b in drawn], y=[b // GRID for b in drawn], mode="markers+text",
                        name=f"request {label}", text=[str(f) for f in fill], textfont=dict(size=12, color="white"),
                        marker=dict(symbol="square", size=17), customdata=list(zip(drawn, fill)),
                        hovertemplate=(f"block %{{customdata[0]}}: request {label}, %{{customdata[1]}} of "
                                       f"{table.block} tokens<extra></extra>"))
    rows = n // GRID + 1
    fig.update_layout(height=70 + 24 * rows, margin=dict(l=10, r=10, t=30, b=10), legend=dict(orientation="h", y=1.02,
                      yanchor="bottom"), xaxis=dict(visible=False, range=[-1, GRID]),
                      yaxis=dict(visible=False, range=[rows - 0.5, -0.5]))
    return fig


def batch_cache_section(lm: ModelClient | None) -> None:
    """The live block table of this server's paged batch cache (measured), and what other layouts would hold."""
    if lm is None:
        st.caption("The batch cache appears here when this server runs the model.")
        return
    st.write("Everyone generating on this server shares one paged cache, as vLLM keeps it: memory in blocks of 16 "
             "tokens, each request holding a list of blocks (its block table) and taking a new one only when its last "
             "is full. Section 4 simulates the same idea for a whole GPU (projected); here are the real blocks.")
    @st.fragment(run_every=REFRESH_SECONDS)
    @away_safe
    def live() -> None:
        state = lm.room()
        table = last_table(state)
        if table is None:
            st.info("Nobody's request is in the batch right now: when people generate, their blocks appear here.")
            return
        use = allocation_compare(state, table)
        plot(block_table_figure(table), "kv.block_table")
        if shown_blocks(table) < table.n_blocks:
            st.caption(f"The picture shows the first {shown_blocks(table)} blocks of the pool.")
        st.caption(f"Measured on this server, read from the cache after the last step that had a request in it (a "
                   "request leaves the batch in the step that makes its last token, so a finished run is shown as it "
                   f"was one step before its end, one token short): {len(table.rows)} request(s) "
                   f"hold {use['tokens']:,} tokens in {table.used} of {table.n_blocks} blocks of {table.block} tokens "
                   f"({fmt_bytes(table.bytes_per_block)} each); {table.free} blocks are free, and "
                   f"{table.empty_slots} slots in the requests' last blocks wait for tokens "
                   f"({table.fragmentation:.0%} internal fragmentation). Computed from the same requests: "
                   f"contiguous rows reserving prompt + max new tokens would hold {use['contiguous']:,} slots "
                   f"({fmt_share(use['tokens'], use['contiguous'])} used); rows padded to the longest, "
                   f"{use['padded']:,} ({fmt_share(use['tokens'], use['padded'])} used).")
    live()


def fmt_share(part: int, whole: int) -> str:
    return f"{part / whole:.0%}" if whole else "–"


# --- prefix caching, for the KV-cache page ------------------------------------------------------------------

PREFIX_RESULTS = "kv.prefix.results"
PREFIX_PROMPTS = ("Explain in two sentences what the capital of France is famous for.",
                  "Explain in two sentences why the sky looks blue on a clear day.")


def prefix_figure(results: dict) -> go.Figure:
    """Time to first token from scratch and with the prompt's start reused, for each case (measured)."""
    cases = list(results)
    fig = go.Figure()
    fig.add_bar(x=cases, y=[results[c]["ttft_cold"] * 1e3 for c in cases], name="computed from scratch")
    fig.add_bar(x=cases, y=[results[c]["ttft_warm"] * 1e3 for c in cases], name="start reused from the prefix cache")
    fig.update_layout(barmode="group", height=300, margin=dict(l=10, r=10, t=30, b=10),
                      legend=dict(orientation="h", y=1.15), yaxis_title="time to first token (ms)")
    return fig


def prefix_section(lm: ModelClient | None) -> None:
    """This server's prefix cache (live counters) and a measured TTFT with and without reuse."""
    if lm is None:
        st.caption("Prefix caching is measured when this server runs the model.")
        return
    st.write("A token's keys and values depend only on the tokens before it, so two prompts that open alike (the "
             "chat template's system prompt, or the same prompt sent by a whole room) can share the cached "
             "start: only the rest is computed.")
    stats = lm.prefix_stats()
    st.caption(f"Measured on this server so far: {stats.hits} of {stats.lookups} prompts reused a stored start, "
               f"{stats.reused_tokens:,} prompt tokens not computed again; {stats.entries} prompt(s) kept in "
               f"{fmt_bytes(stats.bytes)}.")
    if st.button("Measure the time to first token with and without reuse", key="kv.prefix.measure"):
        prompts = [GenerationRequest(p) for p in PREFIX_PROMPTS]     # the chat template's opening, then the same prompt
        results = measure_in_box(lm, "Measuring prefix reuse…", "prefix.reuse", {"prompts": prompts})
        if results is not None:
            st.session_state[PREFIX_RESULTS] = results
    results = st.session_state.get(PREFIX_RESULTS)
    if results:
        plot(prefix_figure(results), "kv.prefix")
        st.caption("Measured here, best of 3: " + "; ".join(
            f"{case}: {r['reused_tokens']} of {r['prompt_tokens']} prompt tokens reused, TTFT "
            f"{fmt_ms(r['ttft_cold'])} → {fmt_ms(r['ttft_warm'])}" for case, r in results.items()) + ".")
