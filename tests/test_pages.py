"""Every page through streamlit.testing.v1.AppTest, on the tiny Llama the tests write themselves.

The app reads its model from PLAYGROUND_MODEL; here that is the tiny model's folder, so a page
runs a real generation through the real engine in well under a second.
"""
from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from app.ui.nav import PAGES, page_info
from streamlit.testing.v1 import AppTest

from conftest import TINY_CONFIG, tiny_prompt
from app.attention import numbers as att
from app.ui.format import fmt_tokens, parse_tokens
from engine.projection.cost import Layout, users_that_fit
from engine.projection.specs import GPU_PRESETS, MODEL_PRESETS

MAIN = "../app/main.py"
TIMEOUT = 60


@pytest.fixture
def app(app_env):
    """The app on the tiny model, run once (home page)."""
    return AppTest.from_file(MAIN, default_timeout=TIMEOUT).run()


def open_page(at: AppTest, script: str) -> AppTest:
    at.switch_page(f"../pages/{script}").run()
    assert_clean(at)
    return at


def assert_clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def charts(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def array(value) -> np.ndarray:
    """A Plotly array from a figure's JSON: a plain list, or base64 'bdata' with dtype and shape."""
    if isinstance(value, dict) and "bdata" in value:
        flat = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        shape = value.get("shape")
        if isinstance(shape, str):
            shape = [int(s) for s in shape.split(",")]
        return flat.reshape(shape) if shape else flat
    return np.array(value, dtype=float)


def generate(at: AppTest, ns: str, prompt: str, max_new: int) -> AppTest:
    at.text_area(key=f"{ns}.prompt").set_value(prompt)
    at.number_input(key=f"{ns}.max_new").set_value(max_new)
    at.button(key=f"{ns}.generate").click().run()
    assert_clean(at)
    return at


def metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


# --- shell -----------------------------------------------------------------------------------------------

def test_home_links_every_page_and_sidebar_names_the_model(app, tiny_model_dir):
    assert_clean(app)
    assert app.title[0].value == "Inference Playground"
    from app.ui.nav import TOUR, menu

    links = [link.proto.label for link in app.get("page_link")]
    assert links[len(TOUR):] == [p.title for pages in menu().values() for p in pages]   # the sidebar's order
    assert sorted(links[len(TOUR):]) == sorted(p.title for p in PAGES)                   # every page, once
    sidebar = " ".join(m.value for m in app.sidebar.markdown)
    assert "Device: **cpu**" in sidebar and "Dtype: **float32**" in sidebar
    assert "Layers: **3**" in sidebar and "Heads (query / KV): **4 / 2**" in sidebar
    assert app.sidebar.text[0].value == tiny_model_dir.name


def test_a_model_that_does_not_load_gives_a_message_not_a_traceback(monkeypatch, tmp_path):
    monkeypatch.setenv("PLAYGROUND_MODEL", str(tmp_path / "no-such-model"))
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT).run()
    assert_clean(at)
    assert any("could not be loaded" in e.value for e in at.error)
    open_page(at, "journey.py")
    assert any("PLAYGROUND_MODEL" in i.value for i in at.info)


# --- the journey page --------------------------------------------------------------------------------------

def test_journey_shows_tokens_and_shapes_before_generating(app):
    at = open_page(app, "journey.py")
    at.text_area(key="journey.prompt").set_value("w1 w2 w3 w4 w5").run()
    assert metric(at, "Tokens the model reads") == "5"
    specs = charts(at)
    chips = specs[0]["data"]
    assert [t for t in chips[1]["text"]] == ["w1", "w2", "w3", "w4", "w5"]          # token text in the chips
    shapes = " ".join(a["text"] for a in specs[1]["layout"]["annotations"])
    assert "[5, 64]" in shapes and "4 heads × [5, 16]" in shapes and "2 heads × [5, 16]" in shapes
    assert "[96]" in shapes and "× 3 layers" in shapes                               # vocab and depth


def test_journey_generates_streams_and_redraws_without_the_model(app):
    at = open_page(app, "journey.py")
    generate(at, "journey", tiny_prompt(10), 6)
    run = at.session_state["last_run"]
    assert run.status == "done" and len(run.tokens) == 6
    assert metric(at, "Generated tokens") == "6" and metric(at, "Prompt tokens") == "10"
    assert metric(at, "Time to first token").endswith("ms")
    assert any(t.value == run.text for t in at.text)
    timeline = next(c["data"] for c in charts(at) if [t.get("name") for t in c["data"]] == ["prefill", "decode"])
    assert [trace["name"] for trace in timeline] == ["prefill", "decode"]
    assert len(array(timeline[1]["x"])) == 5                                         # five decode steps

    at.slider(key="journey.temperature").set_value(1.5).run()
    assert_clean(at)
    assert at.session_state["last_run"] is run                                       # no new generation
    dist = next(c for c in charts(at)
                if c["layout"].get("xaxis", {}).get("title", {}).get("text") == "probability (%)")
    token = run.tokens[0]
    z = token.logits.astype(np.float64) / 1.5
    expected = np.sort(np.exp(z - z.max()) / np.exp(z - z.max()).sum())[::-1][:len(array(dist["data"][0]["x"]))]
    np.testing.assert_allclose(array(dist["data"][0]["x"]) / 100, expected, rtol=1e-4, atol=1e-6)


def test_journey_measures_the_observer_effect_through_the_scheduler(app):
    at = open_page(app, "journey.py")
    generate(at, "journey", tiny_prompt(8), 4)
    at.button(key="journey.observer.measure").click().run()
    assert_clean(at)
    effect = at.session_state["journey.observer"]
    assert effect.same_tokens and len(effect.off.steps) == len(effect.on.steps) > 0
    bars = next(c for c in charts(at) if c["data"] and c["data"][0].get("y") == ["capture off", "capture on"])
    np.testing.assert_allclose(array(bars["data"][0]["x"]), [effect.off.itl * 1e3, effect.on.itl * 1e3])
    assert any(f"{effect.ratio:.2f}× as long" in c.value for c in at.caption)


def test_journey_logit_lens_covers_every_layer(app):
    at = open_page(app, "journey.py")
    generate(at, "journey", tiny_prompt(8), 3)
    lens = next(c for c in charts(at) if c["data"] and c["data"][0]["type"] == "heatmap")
    assert lens["data"][0]["y"] == ["layer 0", "layer 1", "layer 2"]
    probs = array(lens["data"][0]["z"])
    assert probs.shape == (3, 5) and np.all(np.diff(probs, axis=1) <= 1e-9)          # top-5, most likely first


@pytest.mark.parametrize("prompt,message", [
    ("   ", "the prompt is empty"),
    (tiny_prompt(300), "reads at most 256"),                                         # tiny context: 256 positions
    (tiny_prompt(250), "exceed the 256-token context"),                              # 250 + 48 new tokens
])
def test_journey_rejects_bad_input_next_to_the_prompt(app, prompt, message):
    at = open_page(app, "journey.py")
    at.text_area(key="journey.prompt").set_value(prompt).run()
    assert_clean(at)
    assert any(message in e.value for e in at.error)
    assert at.button(key="journey.generate").disabled


# --- the attention page ------------------------------------------------------------------------------------

def test_attention_page_draws_the_shared_run(app):
    at = open_page(app, "journey.py")
    generate(at, "journey", tiny_prompt(12), 4)
    run = at.session_state["last_run"]
    open_page(at, "attention.py")
    assert [h.value for h in at.subheader][:4] == ["One head", "All heads of layer 1", "Every head at a glance",
                                                    "Decoding, one step at a time"]
    heat = charts(at)[0]["data"][0]
    p = array(heat["customdata"])                                                    # probabilities, NaN = masked
    n = run.n_prompt + len(run.steps)
    assert p.shape == (n, n)
    assert np.all(np.isnan(p[np.triu_indices(n, 1)]))                               # the causal mask
    np.testing.assert_allclose(np.nansum(p, axis=1), 1.0, atol=2e-3)                 # every row a distribution
    at.slider(key=f"attention.step.{run.id}").set_value(2).run()
    assert_clean(at)
    assert any(t.value.startswith("Step 2:") for t in at.text)


def eager_attention(model_dir, ids):
    import torch
    from transformers import AutoModelForCausalLM

    eager = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager").eval()
    with torch.no_grad():
        return eager(torch.tensor([ids]), output_attentions=True).attentions


def on_demand_run(at: AppTest, inputs: tuple[int, ...] | None):
    """A long prompt's run as the page's capture makes it when not every layer fits (the residual of the layers
    `inputs` names kept on the model server), made through the app's own client (in-process or remote)."""
    from app.hosting.model import current_client
    from app.runs.run import run_from_slice
    from engine.core.generate import GenerationRequest
    from engine.core.hooks import CapturePolicy

    client = current_client()
    policy = CapturePolicy(layers=(), logit_lens=5, inputs=inputs)
    handle = client.submit(GenerationRequest(tiny_prompt(40), max_new_tokens=4), policy)
    list(handle.records())
    run = run_from_slice(client.run_slice(handle.run_id), client.spec)
    at.session_state["last_run"] = run
    return run


def test_a_long_runs_maps_are_computed_on_demand_for_every_layer(app, app_env):
    """Every layer is offered; one whose input was not kept is rebuilt first (a job), and its map, computed on the
    model server, equals HF's eager attention; the summaries cover every layer, and a step's row comes too."""
    run = on_demand_run(app, inputs=(0,))
    at = open_page(app, "attention.py")
    assert not att.captured_layers(run)
    slider = at.select_slider(key=f"attention.layer.{run.id}")
    assert [int(o) for o in slider.options] == [0, 1, 2] and int(slider.value) == 1      # layer 1: rebuilt
    assert [h.value for h in at.subheader][:2] == ["One head", "All heads of layer 1"]
    assert any("per token" in c.value and "Kept on the model server" in c.value for c in at.caption)
    p = array(charts(at)[0]["data"][0]["customdata"])
    ids = att.run_ids(run)
    reference = eager_attention(app_env, ids)[1][0, 0].numpy()
    below = np.tril_indices(len(ids))
    np.testing.assert_allclose(p[below], reference[below], atol=1e-5)                 # exact, not float16
    summary = next(c for c in charts(at) if c["layout"].get("annotations") and "entropy (bits)" in
                   [a["text"] for a in c["layout"]["annotations"]])
    assert len(summary["data"]) == 4 and len(summary["data"][0]["y"]) == 3              # 4 views x every layer
    at.slider(key=f"attention.step.{run.id}").set_value(2).run()
    assert_clean(at)
    assert any(t.value.startswith("Step 2:") for t in at.text)


def test_a_run_the_server_dropped_gets_a_message(app):
    from dataclasses import replace

    run = on_demand_run(app, inputs=None)
    app.session_state["last_run"] = replace(run, id="run-00000000deadbeef")
    at = open_page(app, "attention.py")
    assert any("no longer has this run" in e.value for e in at.error)


def walk(block):
    """Every element under an AppTest block, in the order the page draws them."""
    for node in getattr(block, "children", {}).values():
        yield node
        yield from walk(node)


def test_the_context_slider_measures_the_long_text(app):
    at = open_page(app, "attention.py")
    slider = at.select_slider(key="attention.context.n")
    assert [int(o) for o in slider.options] == [128, 256]                              # the tiny model reads 256
    assert any("whole context, 256 tokens" in c.value for c in at.caption)
    slider.set_value(256).run()
    at.button(key="attention.context.run").click().run()
    assert_clean(at)
    points = at.session_state["attention.context.points"]
    assert [p["n"] for p in points] == [128, 256] and points[-1]["kv_bytes"] == 256 * 2 * 3 * 2 * 16 * 4
    assert any("Hugging Face's output_attentions would hold" in c.value for c in at.caption)
    assert any("would fill 26 H100s" in c.value for c in at.caption)                  # 2.2 TB of maps at 32K
    curves = next(c for c in charts(at) if c["layout"].get("yaxis2", {}).get("type") == "log")
    assert all(t.endswith("B") for t in curves["layout"]["yaxis2"]["ticktext"])      # bytes: '10 MB', never '5'
    nodes = list(walk(at.main))
    slider = next(i for i, n in enumerate(nodes) if n.type == "select_slider" and n.key == "attention.context.n")
    chart = next(i for i, n in enumerate(nodes) if n.type == "plotly_chart" and json.loads(n.proto.spec) == curves)
    assert slider < chart                                                             # the controls above the charts


def test_attention_page_shows_gqa_for_the_loaded_model_and_llama_8b(app):
    at = open_page(app, "attention.py")
    assert any("Nothing generated yet" in i.value for i in at.info)
    gqa = [c for c in charts(at) if "query heads over" in c["layout"].get("title", {}).get("text", "")]
    assert len(gqa) == 2
    tiny, llama = gqa
    assert len(tiny["data"][-2]["x"]) == 4 and len(tiny["data"][-1]["x"]) == 2     # 4 query, 2 K/V heads
    assert len(llama["data"][-2]["x"]) == 32 and len(llama["data"][-1]["x"]) == 8


@pytest.mark.parametrize("max_new", [1, 2])
def test_attention_page_runs_its_own_request(app, max_new):
    at = open_page(app, "attention.py")
    generate(at, "attention", tiny_prompt(6), max_new)
    assert len(at.session_state["last_run"].tokens) == max_new
    assert any(s.value == "One head" for s in at.subheader)
    open_page(at, "journey.py")                                                      # one token: still a page
    assert metric(at, "Generated tokens") == str(max_new)


# --- the KV-cache page --------------------------------------------------------------------------------------

def users_column(at: AppTest, column: str = "users") -> dict[str, int]:
    table = at.dataframe[0].value
    return dict(zip(table["context"], table[column]))


def test_kv_calculator_gives_the_llama_8b_h100_figures(app):
    at = open_page(app, "kv_cache.py")
    at.selectbox(key="kv.model").set_value("llama-3.1-8b")
    at.selectbox(key="kv.gpu").set_value("h100-sxm").run()
    ideal = users_column(at, "all of the card")                                     # the seed's table
    assert 450 <= ideal["1K"] <= 550 and 45 <= ideal["10K"] <= 55                    # ~500, ~50
    assert ideal["100K"] == 5 and ideal["128K"] == 4                                 # ~5, ~4
    users = users_column(at)                                                         # with a server's headroom
    assert 430 <= users["1K"] <= 450 and users["128K"] == 3                          # FACTS: ~440 at 1K
    assert metric(at, "KV cache per token") == "131.07 KB"
    at.text_input(key="kv.context_text").set_value("128K").run()
    assert metric(at, "Users that fit") == "3" and metric(at, "With all of the card") == "4"
    assert metric(at, "Cache per user at 128K") == "17.18 GB"
    assert any("4× smaller" in t.value for t in at.text)                             # GQA against full MHA


def test_kv_page_shows_latent_attention_and_windows_and_flags_long_contexts(app):
    at = open_page(app, "kv_cache.py")
    at.selectbox(key="kv.model").set_value("deepseek-v3").run()
    assert_clean(at)
    assert metric(at, "KV cache per token") == "70.27 KB"                           # 70,272 bytes
    assert any("(512 latent + 64 RoPE dims" in t.value for t in at.text)
    assert any("71× smaller" in t.value for t in at.text)                            # against plain MHA
    assert metric(at, "Users that fit") == "0" and any("at least 24 GPUs" in w.value for w in at.warning)
    at.selectbox(key="kv.gpu").set_value("h200")
    at.selectbox(key="kv.gpus").set_value(8)
    at.segmented_control(key="kv.weight_dtype").set_value("FP8").run()
    assert_clean(at)
    spec, gpu = MODEL_PRESETS["deepseek-v3"], GPU_PRESETS["h200"]
    users = users_that_fit(spec, gpu, 8192, "fp8", "bf16", layout=Layout(8))
    assert users > 50 and metric(at, "Users that fit") == f"{users:,}"
    at.selectbox(key="kv.model").set_value("gemma-2-9b").run()
    assert any("21 of 42 layers keep only the last 4,095 tokens" in t.value for t in at.text)
    at.text_input(key="kv.context_text").set_value("32K").run()
    assert_clean(at)
    assert metric(at, "Users that fit") == "–" and any("at most 8K tokens" in e.value for e in at.error)
    assert users_column(at)["32K"] is None or users_column(at)["32K"] != users_column(at)["32K"]   # empty (NaN)


def test_kv_context_widgets_stay_in_step_and_bad_input_gets_a_message(app):
    at = open_page(app, "kv_cache.py")
    at.button(key="kv.context.preset.2").click().run()
    assert at.session_state["kv.context"] == 102400
    assert at.text_input(key="kv.context_text").value == "100K"
    at.text_input(key="kv.context_text").set_value("lots").run()
    assert_clean(at)
    assert any("not a token count" in e.value for e in at.error)
    assert at.session_state["kv.context"] == 102400                                  # the last good value stays
    at.select_slider(key="kv.context_slider").set_value(32768).run()
    assert at.text_input(key="kv.context_text").value == "32K"
    assert not at.error


def test_kv_page_measures_the_real_cache_against_the_formula(app):
    at = open_page(app, "kv_cache.py")
    generate(at, "kv", tiny_prompt(10), 5)
    c = TINY_CONFIG
    per_token = 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * (c["hidden_size"] // c["num_attention_heads"]) * 4
    line = next(t.value for t in at.text if "measured on the cache object" in t.value)
    assert f"{per_token:,} bytes per token" in line and "matches the formula" in line
    growth = charts(at)[0]["data"]
    assert sum(trace.get("stackgroup") == "layers" for trace in growth) == c["num_hidden_layers"]


def test_kv_page_sections_1_and_5_say_which_positions_they_count(app):
    """'106 tokens cached' in section 1 and '1 request(s) hold 105 tokens' in section 5 for the same run: section 1
    counts the prompt and every generated token but the last (sampled, never fed back), section 5 reads the block
    table after the last step that still had the request, one step before its end. Both now say so, and the numbers
    are those; the answer and the growth chart come right under Generate, above the formula."""
    at = open_page(app, "kv_cache.py")
    generate(at, "kv", tiny_prompt(10), 5)
    run = at.session_state["last_run"]
    cached = run.cache_states()[-1].length
    assert cached == run.n_prompt + len(run.tokens) - 1
    line = next(t.value for t in at.text if "measured on the cache object" in t.value)
    assert line.startswith(f"{cached:,} tokens cached (the {run.n_prompt:,}-token prompt and {len(run.tokens) - 1} of "
                           f"the {len(run.tokens)} generated: the last one was never fed back)")
    live = next(c.value for c in at.caption if "read from the cache after the last step that had a request" in c.value)
    assert "one step before its end, one token short" in live and f"1 request(s) hold {cached - 1:,} tokens" in live
    texts = [t.value for t in at.text]
    answer, formula = texts.index(run.text), next(i for i, t in enumerate(texts) if "bytes per token" in t and "×" in t)
    assert answer < texts.index(line) < formula                  # the answer, its cache line, then the formula


def test_kv_page_shows_the_measured_memory_ledger(app):
    at = open_page(app, "kv_cache.py")
    generate(at, "kv", tiny_prompt(10), 5)
    assert any(e.label == "Memory of this process, measured (CPU)" for e in at.expander)
    table = next(d.value for d in at.dataframe if "formula (model card)" in d.value.columns)
    weights = table[table[""] == "Weights"].iloc[0]
    assert weights["measured"] == weights["formula (model card)"]      # fp32 tensors = parameters x 4 bytes
    cached = next(t.value for t in at.text if "measured on the cache object" in t.value).split(" tokens cached")[0]
    kv = table[table[""] == f"KV cache of the last run ({cached} tokens)"].iloc[0]       # the run just made
    assert kv["measured"] == kv["formula (model card)"] and "Process resident memory (RSS)" in set(table[""])


def test_kv_paging_simulation_shows_paging_wastes_less(app):
    at = open_page(app, "kv_cache.py")
    wasted_contiguous = float(metric(at, "Wasted, contiguous").rstrip("%"))
    wasted_paged = float(metric(at, "Wasted, paged").rstrip("%"))
    assert wasted_paged < 10 < wasted_contiguous


# --- components the pages rely on ----------------------------------------------------------------------------

def test_pooling_averages_only_what_a_token_can_see():
    n = 10
    matrix = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]                 # uniform causal attention
    rows = np.ones(n, dtype=bool)
    pooled = att.pool(matrix, att.valid_mask(n, rows), max_cells=5)
    assert pooled.factor == 2 and pooled.values.shape == (5, 5)
    assert np.isnan(pooled.values[0, 1])                                             # wholly in the future
    assert pooled.values[1, 0] == pytest.approx((1 / 3 + 1 / 3 + 1 / 4 + 1 / 4) / 4)


@pytest.mark.parametrize("text,tokens", [("1K", 1024), ("128k", 131072), ("24576", 24576), ("1.5K", 1536)])
def test_context_lengths_parse_and_print(text, tokens):
    assert parse_tokens(text) == tokens
    assert parse_tokens(fmt_tokens(tokens)) == tokens


def test_home_gives_a_tour_in_the_sidebars_order(app):
    """A short sequence for a class, each stop a page of the menu, in the menu's order; then every page by group."""
    from app.ui.nav import TOUR, menu

    order = [p.url_path for pages in menu().values() for p in pages]
    stops = [order.index(stop.url_path) for stop in TOUR]
    assert stops == sorted(stops) and 5 <= len(TOUR) <= 8
    at = open_page(app, "home.py")
    labels = [link.label for link in at.get("page_link")]
    assert labels[:len(TOUR)] == [f"{i}. {page_info(s.url_path).title} ({s.minutes})" for i, s in enumerate(TOUR, 1)]


def test_the_embedded_model_explains_its_weak_answers():
    from app.hosting.model import SMALL_MODEL, small_model_note

    note = small_model_note(SMALL_MODEL)
    assert "tiny model" in note and "make models" in note and "Hub id" in note
    assert small_model_note("Qwen2.5-Coder-1.5B-Instruct") is None
