"""One unit convention (engine/projection/units.py): decimal KB / MB / GB everywhere, a GPU's capacity stated once as
"80 GiB = 85.90 GB", and the numbers a page shows add up on screen."""
from __future__ import annotations

import re

import pytest
from streamlit.testing.v1 import AppTest

from app.ui.nav import PAGES
from engine.projection.cost import Layout, memory_plan
from engine.projection.specs import GPU_PRESETS, MODEL_PRESETS
from engine.projection.units import CONVENTION, card_size, fmt_bytes

MAIN = "../app/main.py"
BINARY = re.compile(r"\b[KMGT]iB\b")
CARD = re.compile(r"\b\d+(?:\.\d+)? GiB = [\d,.]+ GB\b")           # the stated conversion, the one binary figure
GB_NUMBER = r"([\d,]+\.\d\d) GB"


@pytest.fixture
def app(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("PLAYGROUND_MODEL", str(tiny_model_dir))
    monkeypatch.setenv("PLAYGROUND_DEVICE", "cpu")
    monkeypatch.setenv("PLAYGROUND_DTYPE", "float32")
    return AppTest.from_file(MAIN, default_timeout=60).run()


def page_text(at: AppTest) -> str:
    """Every string the page sends to the browser: text, metrics, tables, help and the charts' JSON."""
    return "\n".join(str(node.proto) for node in walk(at._tree) if hasattr(node, "proto"))


def walk(node):
    yield node
    for child in getattr(node, "children", {}).values():
        yield from walk(child)


def gb(text: str) -> float:
    return float(text.replace(",", ""))


def test_sizes_are_decimal_and_the_card_is_stated_in_both_units():
    assert fmt_bytes(131_072) == "131.07 KB" and fmt_bytes(16_060_522_496) == "16.06 GB"
    assert fmt_bytes(134_217_728) == "134.22 MB" and fmt_bytes(999) == "999 B"
    assert card_size(80) == "80 GiB = 85.90 GB" and GPU_PRESETS["h100-sxm"].memory_bytes == 80 * 2**30
    assert "10⁹" in CONVENTION and CARD.search(CONVENTION)


@pytest.mark.parametrize("model,gpu,gpus", [("llama-3.1-8b", "h100-sxm", 1), ("llama-3.1-70b", "h200", 2),
                                            ("mistral-7b-v0.1", "l40s", 1)])
def test_kv_page_numbers_add_up_to_the_card(app, model, gpu, gpus):
    at = app.switch_page("../pages/kv_cache.py").run()
    at.selectbox(key="kv.model").set_value(model)
    at.selectbox(key="kv.gpus").set_value(gpus)
    at.selectbox(key="kv.gpu").set_value(gpu).run()
    assert not at.exception
    line = next(t.value for t in at.text if " left for the cache + " in t.value)
    card, weights, room, headroom, free, reserve = map(gb, re.findall(GB_NUMBER, line))
    assert card_size(GPU_PRESETS[gpu].memory_gb) in line
    assert weights + room + headroom == pytest.approx(card, abs=0.015)    # on screen, within the last digit
    assert free + reserve == pytest.approx(headroom, abs=0.015)
    each = " per GPU" if gpus > 1 else ""
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Weights" + each] == f"{weights:,.2f} GB"
    assert metrics["Left for the cache" + each] == f"{room:,.2f} GB"
    plan = memory_plan(MODEL_PRESETS[model], GPU_PRESETS[gpu], context=8192, layout=Layout(gpus))  # the engine's split
    assert room == pytest.approx((plan.usable - plan.weights) / 1e9, abs=0.005)


SIZE_PAGES = ["kv_cache.py", "speed_cost.py", "speed_precision.py", "flash_attention.py", "model_folder.py",
              "quiz.py", "recordings.py", "room.py", "speed_lab.py", "journey.py"]


def test_no_page_mixes_binary_and_decimal_units(app):
    """Before: the KV page wrote 'Weights 16.06 GB' beside 'Left for the cache 55.70 GiB'."""
    scripts = {p.script for p in PAGES}
    assert set(SIZE_PAGES) <= scripts
    for script in SIZE_PAGES:
        at = app.switch_page(f"../pages/{script}").run()
        assert not at.exception, (script, [e.value for e in at.exception])
        text = page_text(at)
        assert " GB" in text or " MB" in text or " KB" in text, script
        leftover = BINARY.findall(CARD.sub("", text))
        assert not leftover, (script, leftover)
