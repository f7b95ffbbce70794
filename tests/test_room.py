"""The room view: its numbers come from the scheduler's real steps on the tiny model, and the page draws them."""
from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from app.speed.room import member_rows, room_numbers, step_rows
from conftest import tiny_prompt
from engine.generate import GenerationRequest
from engine.hooks import CAPTURE_OFF
from engine.limits import Limits
from engine.scheduler import Scheduler


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
def open_page(tiny_model_dir, monkeypatch):
    """A page of the app on the tiny model, run once with no exception."""
    monkeypatch.setenv("PLAYGROUND_MODEL", str(tiny_model_dir))
    monkeypatch.setenv("PLAYGROUND_DEVICE", "cpu")
    monkeypatch.setenv("PLAYGROUND_DTYPE", "float32")

    def run(script: str) -> AppTest:
        at = AppTest.from_file(f"../pages/{script}", default_timeout=120).run()
        assert not at.exception, [e.value for e in at.exception]
        return at
    return run


def test_the_room_page_draws_the_live_batch(tiny_model_dir, open_page):
    at = open_page("room.py")
    assert any(m.label == "In the batch" for m in at.metric)
    from app.model import model_slot
    from engine.scheduler import scheduler_for

    lm = model_slot(str(tiny_model_dir), "cpu", "float32").lm
    scheduler_for(lm).submit(GenerationRequest(tiny_prompt(6), max_new_tokens=8, chat=False)).result(timeout=60)
    at.run()
    assert not at.exception
    assert len(at.get("plotly_chart")) == 2


def test_the_batch_cache_layout_is_the_runners_own(busy_room, tiny_lm):
    """Rows, pads and bytes read from the steps equal the lengths and the KV formula, and paging is computed."""
    from app.speed.room import cache_rows, cache_use
    from engine.card import kv_bytes_per_token

    scheduler, handles = busy_room
    for h in handles:
        h.result(timeout=60)
    steps = [s for s in scheduler.room().steps if len(s.rows) >= 2]
    assert steps
    step = steps[-1]
    widths = {real + pads for _, real, pads in step.rows}
    assert len(widths) == 1 and min(pads for _, _, pads in step.rows) == 0       # left-padded to the longest row
    assert step.bytes_per_position == kv_bytes_per_token(tiny_lm.spec, "float32")
    rows = [{"request": r, "real": real, "pads": pads, "bytes_per_position": step.bytes_per_position}
            for r, real, pads in step.rows]
    use = cache_use(rows, block=4)
    assert use["padded"] == len(rows) * widths.pop() and use["real"] == sum(r["real"] for r in rows)
    assert use["paged"] == sum(-(-r["real"] // 4) * 4 for r in rows) and use["real"] <= use["paged"]
    assert cache_rows(scheduler.room())                  # the page reads the last step that had rows


def test_prefix_reuse_is_measured_and_reuses_the_shared_start(tiny_lm):
    from engine.batch import measure_prefix_reuse

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
