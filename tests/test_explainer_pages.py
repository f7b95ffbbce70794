"""The explainer pages through streamlit.testing.v1.AppTest on the tiny Llama the tests write themselves: every
measurement runs for real on a button press, and what the page shows is what the engine returned."""
from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from app.attention.math import CAPTURE
from app.kv.on_off import RESULT
from app.explainers.engines import ENGINES, MECHANISMS
from app.explainers.flash_attention import POINTS
from app.explainers.quantization import GRIDS, OUTLIERS
from engine.lab.fusion import eager_bytes, AttentionShape

TIMEOUT = 120


@pytest.fixture
def page(open_script):
    def open_page(script: str) -> AppTest:
        at = open_script(script, TIMEOUT)
        assert not at.error, [e.value for e in at.error]
        return at
    return open_page


def assert_clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def text_of(at: AppTest) -> str:
    return " ".join([m.value for m in at.markdown] + [c.value for c in at.caption] + [s.value for s in at.success])


def test_flash_attention_page_measures_eager_against_fused(page, tiny_lm):
    at = page("flash_attention.py")
    assert "Projected for Llama 3.1 8B on H100 SXM" in text_of(at)
    assert "exceed the card's 80 GiB = 85.90 GB" in text_of(at)                    # 32K: 137 GB of scores in one layer
    at.button(key="fusion.measure").click().run()
    assert_clean(at)
    points = at.session_state[POINTS]
    assert [p["tokens"] for p in points] == [256]                      # the tiny model's context is 256
    shape = AttentionShape.of_spec(tiny_lm.spec, 256, 4)
    assert points[0]["eager_bytes"] == eager_bytes(shape) and points[0]["max_difference"] < 1e-5
    assert "Measured on this machine: at N = 256" in text_of(at)
    assert len(at.table) == 2


def test_kv_on_off_page_generates_both_ways(page):
    at = page("kv_on_off.py")
    at.slider(key="cache.steps").set_value(12).run()
    at.button(key="cache.measure").click().run()
    assert_clean(at)
    result = at.session_state[RESULT]
    rows = result["rows"]
    assert len(rows) == 11 and rows[0]["length"] == 9                  # 8-token prompt; the prefill left out
    assert all(r["flops_off"] > r["flops_on"] for r in rows)
    assert rows[-1]["saved"] == pytest.approx(1 - rows[-1]["flops_on"] / rows[-1]["flops_off"])
    assert "more per 100 tokens of context" in text_of(at)
    assert "Projected for Llama 3.1 8B on H100 SXM" in text_of(at) and at.table[0].value.shape[0] == 4


def test_attention_math_page_walks_one_head(page):
    at = page("attention_math.py")
    at.text_input(key="math.prompt").set_value("w1 w2 w3 w4 w5 w6").run()
    at.button(key="math.capture_button").click().run()
    assert_clean(at)
    qkv = at.session_state[CAPTURE]
    assert len(qkv.tokens) == 6 and qkv.hf_difference < 1e-5
    assert any("matches the model's own attention output" in s.value for s in at.success)
    at.slider(key="math.head").set_value(3).run()
    at.selectbox(key="math.query").set_value(5).run()
    assert_clean(at)
    assert "query head 3 reads K/V head 1" in text_of(at)
    rows = at.dataframe[0].value
    assert list(rows.columns) == ["key", "q·k", "÷√16", "masked", "softmax p"] and len(rows) == 6
    assert sum(float(p) for p in rows["softmax p"]) == pytest.approx(1, abs=1e-3)


def test_attention_math_page_refuses_an_empty_prompt(page):
    at = page("attention_math.py")
    at.text_input(key="math.prompt").set_value("   ").run()
    assert at.button(key="math.capture_button").disabled


def test_quantization_page_measures_outliers_grids_and_bits(page):
    at = page("quantization.py")
    assert [row for row in at.table[0].value["format"]] == ["FP32", "BF16", "FP16"]
    at.button(key="quantlab.outliers").click().run()
    assert_clean(at)
    assert at.session_state[OUTLIERS]["normed"].max_abs.shape == (3, 64)
    assert "INT8 with one scale for the whole activation matrix" in text_of(at)
    at.button(key="quantlab.grids").click().run()
    assert_clean(at)
    data = at.session_state[GRIDS]
    assert [r["scheme"] for r in data["rows"]] == ["rtn-asym-g32", "rtn-asym-g64", "rtn-sym-g32", "rtn-sym-g64",
                                                   "nf4-b64"]
    assert data["share"] == 0.0 and all(r["weight_error"] > 0.01 for r in data["rows"])
    assert "were never on such a grid" in text_of(at)
    at.number_input(key="quantlab.m_layer").set_value(1).run()
    at.button(key="quantlab.methods").click().run()
    assert_clean(at)
    methods = next(t.value for t in at.table if "method" in t.value.columns)
    assert list(methods["method"]) == ["RTN", "GPTQ", "AWQ"]
    assert "layer 1, symmetric INT4 per 32 inputs" in text_of(at)


def test_model_folder_page_lists_files_and_times_the_read(page, tiny_model_dir):
    at = page("model_folder.py")
    files = list(at.table[0].value["file"])
    assert "config.json" in files and "model.safetensors" in files
    at.button(key="folder.read_button").click().run()
    assert_clean(at)
    assert at.session_state["folder.read"]["bytes"] == (tiny_model_dir / "model.safetensors").stat().st_size
    moves = list(at.table[-1].value["moving the weights"])
    assert "over PCIe 5.0 x16 (H100's host link) (projected, full rate)" in moves


def test_engines_page_names_every_engine_for_every_mechanism(page):
    at = page("engines.py")
    assert len(at.table) == len(MECHANISMS)
    for table in at.table:
        assert list(table.value["engine"]) == list(ENGINES) and all(table.value["where to read"])
    assert all(m.where.keys() == set(ENGINES) for m in MECHANISMS)
