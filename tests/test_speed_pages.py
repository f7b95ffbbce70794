"""The speed and cost pages through streamlit.testing.v1.AppTest, on the tiny Llama the tests write themselves.

Each page script runs on its own (the navigation lives in app/main.py); measurements run for real on the
tiny model, so every number on screen comes from the engine.
"""
from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from test_pages import array, charts

from app.speed.lab_feel import ANSWER, answer_pieces, due_count, presets, reading_rate, speculative_rate
from app.speed.lab_measured import POINTS
from engine.projection.economics import projected_token_prices
from engine.projection.specs import GPU_PRESETS, MODEL_PRESETS

TIMEOUT = 120


@pytest.fixture
def page(open_script):
    return lambda script: open_script(script, TIMEOUT)


def assert_clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def text_of(at: AppTest) -> str:
    return " ".join([m.value for m in at.markdown] + [c.value for c in at.caption] + [s.value for s in at.subheader])


def number(value: str) -> float:
    return float(value.split()[0].replace(",", "").lstrip("$"))


# --- pure helpers ----------------------------------------------------------------------------------------

def test_due_count_shows_token_i_at_i_over_rate():
    assert due_count(0.0, 10, 100) == 1
    assert due_count(0.099, 10, 100) == 1 and due_count(0.1, 10, 100) == 2
    assert due_count(2.0, 2000, 100) == 100 and due_count(-1, 5, 10) == 0


def test_presets_come_from_the_projection():
    rates = {p.name: p.rate for p in presets(measured=12.5)}
    assert rates["This machine (measured)"] == 12.5
    # Was 200-210 (all 16.06 GB / 3.35 TB/s): a step reads one row of the untied embedding table (issue 10).
    emb, params = 128_256 * 4096, 8_030_261_248
    read = 2 * (params - emb) + 2 * 4096 + 1024 * 131_072                    # weights it reads + a 1K-token cache
    assert rates["H100, Llama 3.1 8B, batch 1: ceiling"] == pytest.approx(3.35e12 / read)   # ~221
    # Was 0.75 here and 0.6 on the cost page (166 against 133 tok/s): one default now, 0.7 (issue 15 item 8).
    assert rates["H100, Llama 3.1 8B, batch 1"] == pytest.approx(0.7 * 3.35e12 / read)     # ~155, FACTS: ~150
    assert 2 < rates["H100 + speculative decoding"] / rates["H100, Llama 3.1 8B, batch 1"] < 2.5
    assert rates["A fast chip: B200, FP8 weights, batch 1"] > 900
    assert 4 < reading_rate() < 7
    assert speculative_rate(100, acceptance=0.0, k=4, draft_cost=0.0) == pytest.approx(100)


def test_answer_falls_back_to_words_for_a_tokenizer_that_cannot_spell_it(tiny_lm):
    prefixes, unit = answer_pieces(tiny_lm)
    assert unit.startswith("words") and prefixes[-1] == ANSWER
    assert all(b.startswith(a) for a, b in zip(prefixes, prefixes[1:]))


# --- the pages -------------------------------------------------------------------------------------------

def test_speed_lab_measures_and_the_curve_grows(page):
    at = page("speed_lab.py")
    assert at.title[0].value == "Speed lab"
    assert "Measured on this machine" in text_of(at) and "Measure N" in [b.label for b in at.button]
    at.number_input(key="speed.context_typed").set_value(100).run()
    assert at.slider(key="speed.context_slider").value == 100
    at.button(key="speed.measure").click().run()
    assert_clean(at)
    assert [p["tokens"] for p in at.session_state[POINTS]] == [100]
    at.button(key="speed.sweep").click().run()
    assert_clean(at)
    tokens = [p["tokens"] for p in at.session_state[POINTS]]
    assert tokens == sorted(tokens) and len(tokens) >= 5 and 100 in tokens
    assert all(p["ttft"] > 0 and p["itl"] > 0 for p in at.session_state[POINTS])
    assert number(metric(at, "Decode speed (measured)")) > 0
    ratio = float(metric(at, "Measured / ceiling").rstrip("%"))
    assert 0 < ratio <= 100
    assert "TTFT ≈" in text_of(at) or "no upward bend" in text_of(at)


def test_speed_lab_says_what_its_charts_show_in_one_unit(page):
    """'The decode latency (right) barely moves with N' stood under a right panel rising from 33 to 45 ms, and the fit
    read '26.2 ms + 2169.6 µs × N + 565.347 ns × N²'. Points of the issue's shape: the sentence is worked out here from
    the chart's own trace, and the fit is in ms with three figures."""
    from app.ui.format import fmt_ms

    at = page("speed_lab.py")
    lengths, itl = [128, 256, 512, 1024, 2048], [0.033, 0.034, 0.036, 0.039, 0.045]
    at.session_state[POINTS] = [{"tokens": n, "ttft": 0.0262 + 2.1696e-3 * n + 565.347e-9 * n * n, "itl": t,
                                 "repeats": 2} for n, t in zip(lengths, itl)]
    at.run()
    assert_clean(at)
    chart = next(c for c in charts(at) if any(t.get("name") == "measured ITL" for t in c["data"]))
    trace = next(t for t in chart["data"] if t.get("name") == "measured ITL")
    xs, ys = array(trace["x"]), array(trace["y"])                   # ms
    grew = ys[-1] / ys[0] - 1
    said = text_of(at)
    assert (f"The decode latency (right) grows: {fmt_ms(ys[0] / 1e3)} a token at N = {xs[0]:,.0f}, "
            f"{fmt_ms(ys[-1] / 1e3)} at N = {xs[-1]:,.0f} ({grew:+.0%})") in said
    assert "barely" not in said
    assert "TTFT ≈ 26.2 ms + 2,170 ms × K + 565 ms × K², where K = N / 1,000 tokens" in said
    assert "µs" not in said and " ns " not in said


def test_feel_the_speed_streams_at_the_chosen_rate(page):
    at = page("speed_lab.py")
    fast = next(b for b in at.button if b.label.startswith("B200"))
    fast.click().run()
    assert at.slider(key="feel.rate_slider").value > 900
    at.slider(key="feel.rate_slider").set_value(2000).run()
    at.button(key="feel.play").click().run()
    assert_clean(at)
    assert ANSWER in [m.value for m in at.markdown]
    assert any("per second shown" in c.value for c in at.caption)


def test_cost_page_reproduces_the_h100_ceiling_and_batching_economics(page):
    at = page("speed_cost.py")
    assert "Projected for Llama 3.1 8B on H100 SXM" in text_of(at)
    # Was 200-210 (bandwidth / all 16 GB): a step reads one row of the embedding table, 15.0 GB in all.
    assert 215 < number(metric(at, "Ceiling per user")) < 225
    assert metric(at, "Time to first token") == metric(at, "Prefill")             # queueing (none) + prefill
    at.select_slider(key="cost.batch").set_value(64).run()
    assert_clean(at)
    total, per_user = number(metric(at, "Total")), number(metric(at, "Per user"))
    assert total == pytest.approx(64 * per_user, rel=0.01)
    assert "× cheaper" in text_of(at).replace("**", "")
    assert len(at.get("plotly_chart")) == 3         # the roofline, the batch sweep, input against output tokens


def test_cost_page_prices_output_tokens_against_input_tokens_measured_and_projected(page):
    at = page("speed_cost.py")
    rows = projected_token_prices(MODEL_PRESETS["llama-3.1-8b"], GPU_PRESETS["h100-sxm"], prompt_tokens=1024)
    assert f"one output token costs **{rows[0].output_per_input:,.1f}×** an input token" in text_of(at)
    at.button(key="cost.measure_phases").click().run()
    assert_clean(at)
    points = at.session_state["cost.phases"]
    assert [p["batch"] for p in points] == [1, 2, 4, 8] and all(p["prompt_tokens"] == 128 for p in points)
    first = points[0]
    assert first["prefill_tok_s"] == pytest.approx(128 / first["prefill_seconds"])
    ratio = first["prefill_tok_s"] / first["decode_tok_s"]
    assert f"batch 1: input {first['prefill_tok_s']:,.0f} tok/s, output {first['decode_tok_s']:,.0f} tok/s: one " \
           f"output token costs **{ratio:,.1f}×**" in text_of(at)
    assert len(at.get("plotly_chart")) == 4


def test_cost_page_and_speed_lab_project_the_same_speed_and_say_at_which_efficiency(page):
    """Before: 8B on an H100 at batch 1 was 132.7 tok/s on the cost page and 166 on the speed lab."""
    cost, lab = page("speed_cost.py"), page("speed_lab.py")
    label = "Projected for Llama 3.1 8B on H100 SXM (batch 1)"
    per_user = metric(cost, "Per user")
    assert metric(lab, label) == per_user
    preset = next(b for b in lab.button if b.label.startswith("H100 ·"))
    assert preset.label == f"H100 · {number(per_user):,.0f}"
    assert 140 < number(per_user) < 165                                              # FACTS: real engines ~150
    stated = "projected at 70% of peak bandwidth"
    assert stated in text_of(cost) and stated in preset.help
    assert next(m for m in lab.metric if m.label == label).help.lower().startswith(stated)


def test_cost_page_says_why_a_model_does_not_fit_and_what_would(page):
    at = page("speed_cost.py")
    at.selectbox(key="cost.model").set_value("llama-3.1-405b").run()
    assert_clean(at)
    assert any("does NOT fit" in e.value for e in at.error)
    assert "16 GPUs (tensor parallel 8 × pipeline 2) per replica" in text_of(at)
    assert not any(m.label == "Per user" for m in at.metric)                       # nothing priced
    at.select_slider(key="cost.gpus").set_value(16).run()
    assert_clean(at)
    assert any("fits" in s.value for s in at.success) and number(metric(at, "Per user")) > 0
    assert "between pipeline stages" in text_of(at)


def test_cost_page_shows_what_a_mixture_of_experts_reads(page):
    at = page("speed_cost.py")
    at.selectbox(key="cost.model").set_value("mixtral-8x7b")
    at.select_slider(key="cost.gpus").set_value(2).run()
    assert_clean(at)
    assert metric(at, "Parameters held") == "46.7 B" and metric(at, "Active per token") == "12.9 B"
    assert metric(at, "Experts read per step at batch 1") == "2.0 of 8"
    at.toggle(key="cost.moe").set_value(False).run()
    assert not any(m.label == "Parameters held" for m in at.metric)


def test_batching_page_simulates_and_measures(page):
    at = page("speed_batching.py")
    table = at.table[0].value
    assert list(table.columns)[-2:] == ["static", "continuous"]
    assert list(at.table[1].value.columns)[-3:] == ["continuous", "chunked", "disaggregated"]
    assert "Goodput" in text_of(at) and "Chunked prefill" in text_of(at)
    at.button(key="batching.measure").click().run()
    assert_clean(at)
    rows = at.session_state["batching.points"]
    assert [r["batch"] for r in rows] == [1, 2, 4, 8]
    assert all(r["total_tok_s"] == pytest.approx(r["batch"] * r["per_user_tok_s"]) for r in rows)


def test_batching_page_goodput_follows_the_targets(page):
    at = page("speed_batching.py")
    at.number_input(key="batching.itl_target").set_value(1.0).run()            # 1 ms between tokens: nobody
    assert_clean(at)
    cells = at.table[0].value.set_index("").loc["requests within both targets"]
    assert list(cells) == ["0%", "0%"]
    at.number_input(key="batching.itl_target").set_value(2000.0)
    at.number_input(key="batching.ttft_target").set_value(60.0).run()          # a minute: everyone in time
    cells = at.table[1].value.set_index("").loc["requests within both targets"]
    assert list(cells) == ["100%", "100%", "100%"]


def test_batching_page_reports_a_model_that_does_not_fit(page):
    at = page("speed_batching.py")
    at.selectbox(key="batching.model").set_value("llama-3.1-405b")
    at.selectbox(key="batching.gpu").set_value("rtx-4090").run()
    assert_clean(at)
    assert any("no room" in e.value for e in at.error)


def test_precision_page_quantizes_a_copy_and_measures_it(page):
    at = page("speed_precision.py")
    at.button(key="precision.run").click().run()
    assert_clean(at)
    rows = at.session_state["precision.results"]["rows"]
    assert [r["precision"] for r in rows] == ["FLOAT32", "INT8", "INT4 (g32)"]
    assert rows[1]["stored_bytes"] < rows[0]["stored_bytes"] and rows[2]["stored_bytes"] < rows[1]["stored_bytes"]
    assert rows[1]["agreement"] >= 0.9 and all(r["tok_s"] > 0 for r in rows)
    assert "Projected for Llama 3.1 8B on H100 SXM" in text_of(at)
