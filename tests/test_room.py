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
    import app.runs.run
    from app.runs.run import Throttle

    clock, running = [100.0], [1]
    monkeypatch.setattr(app.runs.run.time, "perf_counter", lambda: clock[0])
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


# --- every sentence from the numbers it describes (issue 55) ---------------------------------------------------

def test_the_speeds_say_what_they_average_and_multiply_out(busy_room):
    """'3 of 32 ... all 19.8 ... each 17.1' read as a contradiction: the speeds average the recent steps, whose batch
    is not the batch now. The line under them says so, and its product is the 'all' figure."""
    from app.ui.format import fmt_rate
    from app.speed.room import speeds_note

    scheduler, handles = busy_room
    for h in handles:
        h.result(timeout=60)
    n = room_numbers(scheduler.room())
    recent = [s for s in scheduler.room().steps[-50:] if s.decode_rows]
    assert n.steps == len(recent) and n.mean_rows == pytest.approx(sum(s.decode_rows for s in recent) / len(recent))
    assert n.total_tok_s == pytest.approx(n.per_user_tok_s * n.mean_rows)
    note = speeds_note(n)
    assert (f"the last {len(recent)} decode steps, with {n.mean_rows:.2f} requests in a step on average" in note
            and f"{fmt_rate(n.per_user_tok_s)} each × {n.mean_rows:.2f} = {fmt_rate(n.total_tok_s)} for all" in note)


def trade_rows(*steps: tuple[int, float]) -> list[dict]:
    return [{"t": float(i), "decode_rows": b, "prefill_tokens": 0, "step_ms": ms, "tok_s": b / ms * 1e3, "empty": 0}
            for i, (b, ms) in enumerate(steps)]


def test_the_trade_off_caption_reads_the_charts_points():
    """The issue's room: steps of 31 / 66 / 30 ms for 1 / 2 / 3 requests under 'a little slower'. The sentence now
    gives the chart's own ends and calls the 2-request point out of line; the points are the chart's."""
    from app.speed.room import tradeoff_figure, tradeoff_points, tradeoff_reading

    rows = trade_rows((1, 30), (1, 31), (1, 32), (2, 66), (2, 70), (3, 30), (3, 30))
    fig = tradeoff_figure(rows)
    points = tradeoff_points(rows)
    assert list(fig.data[0].x) == [1, 2, 3] and list(fig.data[0].y) == [p.step_ms for p in points] == [31, 68, 30]
    assert list(fig.data[1].y) == pytest.approx([1 / 0.031, 2 / 0.068, 3 / 0.030])
    text = tradeoff_reading(points)
    assert "From 1 request to 3 requests the median step went from 31 to 30 ms (0.97×" in text
    assert f"from {1 / 0.031:,.1f} to {3 / 0.030:,.1f} ({(3 / 0.030) / (1 / 0.031):.2f}×)" in text
    assert "The 2-request point (68 ms, median of 2 steps) is out of line" in text and "a little" not in text
    steady = tradeoff_reading(tradeoff_points(trade_rows((1, 30), (2, 33), (4, 40))))
    assert "throughput grows faster than the step slows" in steady.lower() and "out of line" not in steady
    assert "gained nothing" in tradeoff_reading(tradeoff_points(trade_rows((1, 30), (2, 61))))
    assert "So far every decode step had 1 request" in tradeoff_reading(tradeoff_points(trade_rows((1, 30))))


def test_a_thread_trial_that_no_thread_count_explains_is_called_an_outlier():
    """'2 threads 543 ms, 1 thread 35 ms': one thread fewer changes the arithmetic by at most 2x on 2 cores, so a
    15x gap is a step that waited for its cores; the line says what a trial measures and that."""
    from app.speed.room import threads_note
    from engine.serving.threads import ThreadChoice

    odd = threads_note(ThreadChoice(1, 2, True, ((2, 0.543, 1), (1, 0.035, 1)), 3, 1))
    assert "2 threads 543 ms, 1 thread 35 ms" in odd
    assert "a trial times at most 3 steps on each count" in odd
    assert "2-thread step, 16× slower, is an outlier" in odd and "at most 2.0×" in odd
    plain = threads_note(ThreadChoice(2, 2, True, ((2, 0.030, 1), (1, 0.041, 1)), 3, 0))
    assert "outlier" not in plain
    assert threads_note(ThreadChoice(1, 2, False)) == "CPU threads: 1 torch thread of 2 cores (fixed)."
