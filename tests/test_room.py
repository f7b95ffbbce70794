"""The room view: its numbers come from the scheduler's real steps on the tiny model, and the page draws them."""
from __future__ import annotations

import pytest

from app.speed.room import member_rows, room_numbers, step_rows, steps_figure, tradeoff_figure
from conftest import tiny_prompt, app_lm
from engine.core.generate import GenerationRequest
from engine.core.hooks import CAPTURE_OFF
from engine.lab.prefix_reuse import measure_prefix_reuse
from engine.serving.limits import Limits
from engine.serving.scheduler import Scheduler


@pytest.fixture
def busy_room(tiny_lm):
    scheduler = Scheduler(tiny_lm, Limits(max_batch=3))
    handles = [scheduler.submit(GenerationRequest(tiny_prompt(5 + i, seed=i), max_new_tokens=10, chat=False),
                                CAPTURE_OFF, session=f"s{i}abcdef") for i in range(4)]
    yield scheduler, handles
    scheduler.close()


def test_room_numbers_follow_the_steps_the_scheduler_took(busy_room):
    scheduler, handles = busy_room
    for h in handles:
        h.result(timeout=60)
    state = scheduler.room()
    rows, numbers = step_rows(state), room_numbers(state)
    assert len(rows) == len(state.steps) and all(r["step_ms"] > 0 for r in rows)
    assert max(r["decode_rows"] for r in rows) == 3                                 # the batch filled up
    assert sum(r["decode_rows"] for r in rows) == sum(h.tokens for h in handles) - len(handles)  # 1st token: prefill
    assert sum(r["prefill_tokens"] for r in rows) == sum(len(h.ids) for h in handles)
    recent = [s for s in state.steps[-50:] if s.decode_rows]
    assert numbers.total_tok_s == pytest.approx(sum(s.decode_rows for s in recent) / sum(s.seconds for s in recent))
    assert numbers.running == 0 and numbers.max_batch == 3 and numbers.queued == 0


def test_the_room_charts_show_every_point_on_axes_of_their_own(busy_room):
    """Every y axis starts at 0 and ends above its largest value, with ticks of its own (plotly gives an overlaying
    axis the first's tick grid by default, and a chart redrawn every second kept an older range). The steps chart
    overlays its two axes; the trade-off chart has a panel for each, so no written value sits on the other curve."""
    scheduler, handles = busy_room
    for h in handles:
        h.result(timeout=60)
    rows = step_rows(scheduler.room())
    steps, tradeoff = steps_figure(rows), tradeoff_figure(rows)
    for fig in (steps, tradeoff):
        layout = fig.layout
        for axis, name in ((layout.yaxis, "y"), (layout.yaxis2, "y2")):
            values = [v for trace in fig.data if (trace.yaxis or "y") == name for v in trace.y]
            assert values and axis.range[0] == 0 and axis.range[1] > max(values)
            assert axis.tickmode == "auto" and axis.autorange is False
    assert steps.layout.yaxis2.overlaying == "y" and steps.layout.yaxis2.showgrid is False
    assert tradeoff.layout.yaxis2.overlaying is None                                  # a panel of its own
    top, bottom = tradeoff.layout.yaxis.domain, tradeoff.layout.yaxis2.domain
    assert bottom[1] < top[0]


def test_members_name_your_session_and_hide_prompts(busy_room, tiny_lm):
    scheduler, handles = busy_room
    handles[0].get(timeout=30)
    state = scheduler.room()
    rows = member_rows(state, "s0abcdef")
    assert rows and {r["session"] for r in rows} <= {"you", "session s1ab", "session s2ab", "session s3ab"}
    assert all("prompt" not in k or k == "prompt tokens" for r in rows for k in r)
    for h in handles:
        h.result(timeout=60)


@pytest.fixture
def open_page(open_script):
    """A page of the app on the tiny model, run once with no exception."""
    return open_script


def test_the_room_page_draws_the_live_batch(tiny_model_dir, open_page):
    at = open_page("room.py")
    assert any(m.label == "In the batch" for m in at.metric)
    from engine.serving.scheduler import scheduler_for

    lm = app_lm(tiny_model_dir)
    scheduler_for(lm).submit(GenerationRequest(tiny_prompt(6), max_new_tokens=8, chat=False)).result(timeout=60)
    at.run()
    assert not at.exception
    live = [c for c in at.get("plotly_chart") if "you (request" not in c.proto.spec]   # not a picked request's
    assert len(live) == 2


def test_the_block_table_is_the_runners_own(busy_room, tiny_lm):
    """Tokens, blocks and bytes read from the steps equal the requests' lengths and the KV formula."""
    from app.speed.room import allocation_compare, block_owners, last_table
    from engine.projection.card import kv_bytes_per_token

    scheduler, handles = busy_room
    for h in handles:
        h.result(timeout=60)
    steps = [s for s in scheduler.room().steps if s.blocks is not None and len(s.blocks.rows) >= 2]
    assert steps
    table = steps[-1].blocks
    assert [n for _, _, n in table.rows] == [real for _, real, _ in steps[-1].rows]
    assert table.bytes_per_block == table.block * kv_bytes_per_token(tiny_lm.spec, "float32")
    owners = block_owners(table)
    assert sum(n for _, n in owners.values()) == table.tokens and len(owners) == table.used
    use = allocation_compare(scheduler.room(), table)
    assert use["padded"] == len(table.rows) * max(n for _, _, n in table.rows)
    assert use["tokens"] <= use["paged"] < use["tokens"] + len(table.rows) * table.block
    assert last_table(scheduler.room()) is not None      # the page reads the last step that had requests


def test_the_block_picture_draws_the_pool_up_to_its_highest_block_in_use():
    from app.speed.room import GRID, block_table_figure, shown_blocks
    from engine.serving.paged import BlockTable

    table = BlockTable(16, 4095, 4000, (("a", (1, 2), 20), ("b", (70,), 3)), 1024)
    assert shown_blocks(table) == 3 * GRID                         # block 70 sits in the third row of 32
    fig = block_table_figure(table)
    drawn = {t.name: list(t.customdata) for t in fig.data}
    assert [tuple(c) for c in drawn["request a"]] == [(1, 16), (2, 4)] and [tuple(c) for c in drawn["request b"]] == [(70, 3)]
    assert len(drawn["free"]) == 3 * GRID - 3
    assert shown_blocks(BlockTable(16, 9999, 0, (("c", (9000,), 1),), 1024)) == 8 * GRID     # a huge pool: capped


def test_prefix_reuse_is_measured_and_reuses_the_shared_start(tiny_lm):
    shared = tiny_prompt(60, seed=11)
    first = GenerationRequest(shared + " w1 w2", chat=False)
    other = GenerationRequest(shared + " w3 w4 w5", chat=False)
    same = measure_prefix_reuse(tiny_lm, first, first, rounds=1)
    tail = measure_prefix_reuse(tiny_lm, first, other, rounds=1)
    assert same.reused_tokens == same.prompt_tokens - 1 and tail.reused_tokens == 60
    assert same.ttft_cold > 0 and same.ttft_warm > 0 and tail.ttft_warm > 0


def test_the_kv_page_measures_prefix_reuse_through_the_scheduler(open_page):
    at = open_page("kv_cache.py")
    at.button(key="kv.prefix.measure").click().run()
    assert not at.exception, [e.value for e in at.exception]
    results = at.session_state["kv.prefix.results"]
    assert set(results) == {"same opening", "same prompt"}
    assert results["same prompt"]["reused_tokens"] == results["same prompt"]["prompt_tokens"] - 1
    assert any("TTFT" in c.value for c in at.caption)


def test_a_busy_room_stretches_each_pages_redraw_interval_by_the_requests_running(monkeypatch):
    """With n requests running, a streaming page redraws every n x interval: the room's pages together
    redraw about as often as one page alone."""
    import app.run
    from app.run import Throttle

    clock, running = [100.0], [1]
    monkeypatch.setattr(app.run.time, "perf_counter", lambda: clock[0])
    throttle = Throttle(0.25, lambda: running[0])                        # binary fractions: exact sums

    def fires_after(seconds: float) -> bool:
        clock[0] += seconds
        return throttle()

    assert throttle() is True                                           # the first call always draws
    assert fires_after(0.125) is False and fires_after(0.125) is True     # alone: every 0.25 s
    running[0] = 4
    assert fires_after(0.5) is False and fires_after(0.5) is True         # four running: every 1 s
    running[0] = 0                                                        # an idle server counts as one
    assert fires_after(0.125) is False and fires_after(0.125) is True
    assert throttle(force=True) is True
