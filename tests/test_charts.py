"""Charts that read: log axes with labelled ticks and units only, labels inside the figure, colour bars beside
their own maps, the causal mask told apart from what was not captured. No model: each builder gets plain data."""
from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
import pytest

from app.attention import figures as attention_charts
from app.explainers import figures as explainer_charts
from app.kv import figures as kv_charts
from app.speed import figures as speed_charts
from app.attention.numbers import HeadSummary, Pooled
from app.ui.format import log_ticks, si_label
from engine.projection.cost import project, roofline, sweep_batch
from engine.projection.serving_sim import sweep_max_batch
from engine.projection.specs import GPU_PRESETS, MODEL_PRESETS
from engine.lab.speed import DeviceRoof, DecodePlacement

LLAMA, H100 = MODEL_PRESETS["llama-3.1-8b"], GPU_PRESETS["h100-sxm"]


@pytest.mark.parametrize("value,unit,prefix,text", [
    (1e14, "FLOP/s", "", "100 TFLOP/s"), (2e15, "FLOP/s", "", "2 PFLOP/s"), (0.02, "s", "", "20 ms"),
    (2e-6, "s", "", "2 µs"), (3e9, "B", "", "3 GB"), (2000, "tok/s", "", "2k tok/s"), (0.5, "tok/s", "", "0.5 tok/s"),
    (0.5, "", "$", "$0.5"), (1500, "", "$", "$1.5k"), (1e-4, "", "", "100µ"), (0.01, "", "", "0.01"),
    (1, "", "", "1")])
def test_si_labels(value, unit, prefix, text):
    assert si_label(value, unit, prefix) == text


def mantissa(v: float) -> float:
    return round(v / 10 ** math.floor(math.log10(v) + 1e-9), 6)


@pytest.mark.parametrize("lo,hi,allowed", [(0.2, 0.9, {1, 1.5, 2, 3, 5, 7}), (5, 400, {1, 2, 5}), (0.05, 1e4, {1}),
                                           (3e11, 9.9e14, {1}), (120, 150, {1, 1.5, 2, 3, 5, 7}), (1e-5, 1e5, {1})])
def test_log_ticks_are_1_2_5_or_decades_cover_the_data_and_say_their_unit(lo, hi, allowed):
    t = log_ticks([lo, hi, None, 0, -3], unit="tok/s")          # None, zero and negatives cannot sit on a log axis
    assert len(t["tickvals"]) >= 2 and t["type"] == "log" and t["tickmode"] == "array"
    assert {mantissa(v) for v in t["tickvals"]} <= allowed
    assert t["ticktext"] == [si_label(v, "tok/s") for v in t["tickvals"]]
    assert all(text.endswith(" tok/s") for text in t["ticktext"])
    low, high = t["range"]
    assert low <= math.log10(min(lo, t["tickvals"][0])) and high >= math.log10(max(hi, t["tickvals"][-1]))


def log_axes(fig: go.Figure) -> list[tuple[str, dict]]:
    layout = fig.to_plotly_json()["layout"]
    return [(name, axis) for name, axis in layout.items()
            if name.startswith(("xaxis", "yaxis")) and axis.get("type") == "log"]


def assert_readable_log_axes(fig: go.Figure, expect: int) -> list[tuple[str, dict]]:
    """Every log axis lists its ticks, each labelled (no bare minor digits plotly would add between decades)."""
    axes = log_axes(fig)
    assert len(axes) == expect
    for name, axis in axes:
        assert axis.get("tickmode") == "array", name
        assert len(axis["ticktext"]) == len(axis["tickvals"]) >= 2, name
        assert all(str(text).strip() for text in axis["ticktext"]), name
        for v in axis["tickvals"]:
            assert mantissa(v) in {1, 1.5, 2, 3, 5, 7} or name.startswith("xaxis"), (name, v)
    return axes


def labels(fig: go.Figure, name: str) -> list[str]:
    return fig.to_plotly_json()["layout"][name]["ticktext"]


def test_roofline_axes_share_one_si_format_with_units():
    proj = project(LLAMA, H100, batch=8)
    line = roofline(H100)
    fig = speed_charts.projected_roofline_figure(line, proj, "Llama 3.1 8B on H100")
    assert_readable_log_axes(fig, 2)
    y = labels(fig, "yaxis")
    assert all(t.endswith("FLOP/s") for t in y) and any("TFLOP/s" in t for t in y)
    assert not any("^" in t or "e+" in t or "10<sup>" in t for t in y + labels(fig, "xaxis"))
    roof = DeviceRoof("this CPU", bandwidth=7.5e9, peak_flops=2.1e10, source="measured")
    place = DecodePlacement(context=64, step_seconds=0.04, bytes_read=3e8, flops=3e8, effective_bandwidth=7.5e9,
                            achieved_flops=7.5e9, intensity=1.0, bandwidth_share=1.0, ceiling_step_seconds=0.04,
                            ratio=1.0)
    fig = speed_charts.device_roofline_figure(roof, place, (200.0, 1.5e10))
    assert all(t.endswith("FLOP/s") for t in labels(fig, "yaxis")[:1])
    assert_readable_log_axes(fig, 2)
    texts = [t for t in fig.data if t.text is not None]
    assert texts and all(t.cliponaxis is False for t in texts)       # 'prefill' at the roof is not cut off


def test_money_axes_carry_the_dollar_sign():
    projs = sweep_batch(LLAMA, H100)
    fig = speed_charts.batch_sweep_figure(projs, "sweep")
    assert_readable_log_axes(fig, 4)
    assert all(t.startswith("$") for t in labels(fig, "yaxis2"))
    assert all(t.endswith("tok/s") for t in labels(fig, "yaxis"))
    fig = speed_charts.sim_sweep_figure(sweep_max_batch(LLAMA, H100, batches=(1, 4, 16, 64)))
    axes = dict(assert_readable_log_axes(fig, 6))
    assert all(t.startswith("$") for t in axes["yaxis3"]["ticktext"])
    assert all(t.endswith("s") for t in axes["yaxis2"]["ticktext"])


def test_other_log_charts_label_every_tick():
    assert_readable_log_axes(speed_charts.experts_figure([1, 4, 16, 64, 256], [8, 20, 50, 100, 120], 128, 8), 1)
    points = [{"batch": b, "total_tok_s": 20.0 * b ** 0.8, "per_user_tok_s": 20.0 / b ** 0.2} for b in (1, 2, 4, 8)]
    assert_readable_log_axes(speed_charts.measured_batching_figure(points, [30.0 * b for b in (1, 2, 4, 8)]), 2)
    fused = [{"tokens": n, "eager_seconds": 1e-6 * n * n, "fused_seconds": 2e-5 * n, "eager_bytes": 8.0 * n * n,
              "fused_bytes": 64.0 * n} for n in (128, 256, 512, 1024)]
    fig = explainer_charts.fusion_measured_figure(fused)
    axes = dict(assert_readable_log_axes(fig, 4))
    assert all(t.endswith("s") for t in axes["yaxis"]["ticktext"])
    assert all(t.endswith("B") for t in axes["yaxis2"]["ticktext"])
    rows = [{"tokens": n, "label": f"{n // 1024}K", "linear_ms": 0.01 * n, "eager_ms": 1e-5 * n * n,
             "fused_ms": 5e-6 * n * n} for n in (1024, 8192, 65536)]
    assert_readable_log_axes(explainer_charts.fusion_projected_figure(rows, "projected"), 2)
    mx = np.abs(np.random.default_rng(0).standard_normal(64)) + 0.01
    assert_readable_log_axes(explainer_charts.channels_figure(mx * 50, mx, "layer 0", 6.0), 1)
    assert_readable_log_axes(kv_charts.users_figure([1024, 8192, 131072], [3000, 400, 20], 8192, [3500, 450, 25]), 1)


def test_the_fastest_rate_keeps_its_label_inside_the_chart():
    rates = [5.0, 167.0, 222.0, 347.0, 987.0, 133.0]
    fig = speed_charts.rates_figure([f"preset {i}" for i in range(len(rates))], rates, 20.0)
    assert_readable_log_axes(fig, 1)
    low, high = fig.layout.xaxis.range
    longest = math.log10(max(rates))
    assert (high - longest) / (high - low) >= 0.2      # a fifth of the axis past the longest bar holds '987 tok/s'
    assert low < math.log10(min(rates)) - 0.3          # the shortest bar (5 tok/s) is drawn, not a sliver


def test_every_head_at_a_glance_keeps_each_colour_bar_beside_its_own_map():
    layers, heads = list(range(30)), tuple(range(9))
    z = np.random.default_rng(1).random((30, 9))
    fig = attention_charts.summary_figure(HeadSummary(layers, heads, z, z, z, rows=10))
    domains = [fig.layout[f"xaxis{'' if i == 1 else i}"].domain for i in (1, 2, 3)]
    for trace, (d0, d1) in zip(fig.data, domains):
        bar = trace.colorbar
        assert bar.orientation == "h"
        half = bar.len / 2
        assert d0 - 1e-9 <= bar.x - half and bar.x + half <= d1 + 1e-9   # under its own map, nowhere else
        assert bar.y < 0                                                  # below the maps, not on them


def test_the_causal_mask_and_uncaptured_rows_look_different():
    n = 6
    values = np.tril(np.full((n, n), 0.2))
    values[2] = np.nan                                     # a row that was not captured
    values = np.where(np.triu(np.ones((n, n), bool), 1), np.nan, values)
    fig = attention_charts.heatmap_figure(Pooled(values, 1, n), [f"t{i}" for i in range(n)], stretch=False)
    mask = [t for t in fig.data if t.type == "scatter" and t.fill == "toself"]
    assert len(mask) == 1 and mask[0].fillpattern.shape                 # hatched, named in the legend
    assert "mask" in mask[0].name
    xs, ys = np.array(mask[0].x, float), np.array(mask[0].y, float)
    corners = {(x, y) for x, y in zip(xs, ys)}
    assert (0.5, -0.5) in corners and (n - 0.5, n - 1.5) in corners     # the staircase above the diagonal
    gaps = [t for t in fig.data if t.type == "heatmap" and t.name and "not captured" in t.name]
    assert len(gaps) == 1
    gz = np.array(gaps[0].z, float)
    assert np.isfinite(gz[2, :3]).all() and np.isnan(gz[2, 3:]).all()  # only the visible part of the missing row
    assert np.isnan(np.delete(gz, 2, axis=0)).all()
    assert fig.layout.plot_bgcolor in ("white", "#ffffff", "rgba(0,0,0,0)")   # no grey frame around the matrix
    assert fig.layout.xaxis.constrain == "domain" and fig.layout.yaxis.constrain == "domain"


def test_the_shared_shapes_figure_is_built_once_and_never_changed_by_a_session(monkeypatch):
    from app.runs import widgets
    from app.journey.figures import shapes_figure

    spec = MODEL_PRESETS["llama-3.1-8b"]
    shared = shapes_figure(spec, 40)
    assert shapes_figure(spec, 40) is shared and shapes_figure(spec, 41) is not shared   # one per prompt length
    before = shared.layout.font.size
    monkeypatch.setattr(widgets, "plot_font", lambda: 20)                 # a session in the presenter layout
    bigger = widgets.sized(shared)
    assert bigger is not shared and bigger.layout.font.size == 20
    assert shared.layout.font.size == before                              # the other sessions' copy is untouched
    monkeypatch.setattr(widgets, "plot_font", lambda: None)
    assert widgets.sized(shared) is shared


def test_no_chart_text_under_the_projector_minimum_and_no_toolbar():
    """Every chart goes through app.runs.widgets.sized: a font under MIN_TEXT_PX anywhere (layout, axes, annotations,
    traces) comes back at the minimum, a bar's label is not shrunk to its bar, a heatmap's cell text gets a size
    instead of plotly's fit-to-cell, and the shared figure itself is never changed. No toolbar over the data."""
    import plotly.graph_objects as go

    from app.runs import widgets
    from app.ui.style import MIN_TEXT_PX, at_least

    assert MIN_TEXT_PX >= 12 and widgets.PLOT_CONFIG["displayModeBar"] is False
    fig = go.Figure(go.Bar(x=[1, 2], y=[3, 4], text=["a", "b"], textfont=dict(size=9)))
    fig.add_heatmap(z=[[1, 2]], text=[["x", "y"]], texttemplate="%{text}")
    fig.update_layout(title=dict(text="t", font=dict(size=10)), xaxis=dict(tickfont=dict(size=9)))
    fig.add_annotation(text="note", font=dict(size=8))
    fixed = at_least(fig)
    assert fixed is not fig and fig.data[0].textfont.size == 9 and fig.layout.title.font.size == 10   # untouched
    assert fixed.data[0].textfont.size == fixed.data[1].textfont.size == MIN_TEXT_PX
    assert fixed.layout.title.font.size == fixed.layout.xaxis.tickfont.size == fixed.layout.annotations[0].font.size \
        == MIN_TEXT_PX
    assert fixed.layout.uniformtext.minsize == MIN_TEXT_PX and fixed.layout.uniformtext.mode == "show"
    plain = go.Figure(go.Scatter(x=[1], y=[1], textfont=dict(size=14)))
    assert at_least(plain) is plain                                        # nothing to change: no copy
    assert at_least(plain, base=15).layout.font.size == 15


def test_the_lens_axis_is_its_categories():
    """'#1'..'#5' as plotly's numbers labelled the axis only '2, 4'."""
    from app.journey.figures import lens_figure
    from engine.core.hooks import LayerCapture

    captures = {0: LayerCapture(0, lens=[(1, 0.5), (2, 0.3)]), 1: LayerCapture(1, lens=[(2, 0.6), (1, 0.2)])}
    fig = lens_figure(captures, lambda t: f"tok{t}", 2)
    assert fig.layout.xaxis.type == "category" and list(fig.data[0].x) == ["#1", "#2"]
