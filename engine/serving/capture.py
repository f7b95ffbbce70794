"""How much a run captures, always within the server's capture limits, with memory that grows with the length.

Every run that captures keeps one thing: the residual stream at every position (engine/core/hooks.py), in the
model's own dtype, (layers + 1) x d_model values per position. Everything a page shows is derived from it when
someone looks: any layer's and head's attention, a row as a token streams, a pooled overview, the per-head summaries,
the norms and the logit lens (engine/core/views.py, engine/core/attention_maps.py). When every layer does not fit
the budget, the hidden states kept are spread over the depth and a layer between them is rebuilt from the one below.

A run's policy also says what its exports carry (a run file, a recording): a short run's files hold every layer's
attention maps, norms and lens, derived when the file is written, so a recording shows them without the model; a
long run's maps would not fit, so its files hold the tokens and timings and the maps are derived on the server.

The same rule for a browser's run and for an HTTP client that asks for the page's capture
(`"playground": {"capture": true}`).

    policy, note = capture_policy(spec, n_prompt=40, max_new=64, budget=limits.max_capture_bytes, value_bytes=4)
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.core.hooks import CAPTURE_OFF, CapturePolicy
from engine.projection.specs import ModelSpec
from engine.projection.units import fmt_bytes

ATTENTION_BUDGET = 256 * 2**20        # bytes one run may capture (the CPU default of --max-capture-mb)
LOGIT_LENS_TOP = 5
CAPTURED_BYTES = 4                    # derived attention leaves the engine as float32
SPARE_LAYERS = 1                      # room kept for one layer rebuilt on demand when not every layer fits


def attention_bytes(spec: ModelSpec, n_prompt: int, max_new: int, matrix: bool) -> int:
    """Bytes of attention probabilities one layer's views take in a file: the prefill rows plus one row per step."""
    prefill_rows = n_prompt * n_prompt if matrix else n_prompt
    decode_rows = sum(n_prompt + s for s in range(1, max_new))
    return spec.n_heads * (prefill_rows + decode_rows) * CAPTURED_BYTES


def input_bytes_per_layer(spec: ModelSpec, positions: int, value_bytes: int) -> int:
    """One hidden state kept over `positions` positions: d_model values each."""
    return spec.d_model * positions * value_bytes


def spread_layers(n_layers: int, k: int) -> tuple[int, ...]:
    """k of n_layers spread over the depth, the first and the last always among them (k=1: the first)."""
    if k >= n_layers:
        return tuple(range(n_layers))
    if k <= 1:
        return (0,) if k == 1 else ()
    return tuple(sorted({round(i * (n_layers - 1) / (k - 1)) for i in range(k)}))


@dataclass(frozen=True)
class KeptPlan:
    """Which hidden states a run keeps (0..layers: each layer's input, then the final norm's), and their cost."""

    layers: tuple[int, ...]
    per_position: int             # bytes per position (all kept states)
    total: int                    # bytes for the whole run (prompt + new tokens)


def kept_plan(spec: ModelSpec, positions: int, budget: int, value_bytes: int) -> KeptPlan:
    """Every hidden state when they fit `budget`; else as many spread over the depth as fit (the first and the last
    among them), with room for one layer rebuilt on demand."""
    states = spec.n_layers + 1
    one = input_bytes_per_layer(spec, positions, value_bytes)
    k = states if one * states <= budget else max(0, budget // max(one, 1) - SPARE_LAYERS)
    layers = spread_layers(states, int(k))
    return KeptPlan(layers, len(layers) * spec.d_model * value_bytes, len(layers) * one)


def capture_policy(spec: ModelSpec, n_prompt: int, max_new: int, enabled: bool = True,
                   budget: int = ATTENTION_BUDGET, max_layers: int | None = None,
                   value_bytes: int = CAPTURED_BYTES) -> tuple[CapturePolicy, str | None]:
    """The residual of every layer when it fits (else the layers that fit, spread over the depth), and every view in
    its exports when they fit beside it.

    `budget` (bytes) and `max_layers` are the server's capture limits, `value_bytes` the model's bytes per value.
    Returns the policy and, when not every layer is kept, a sentence the page shows."""
    if not enabled:
        return CAPTURE_OFF, "Capture is off: no attention maps, logit lens or norms for this run."
    plan = kept_plan(spec, n_prompt + max_new, budget, value_bytes)
    if not plan.layers:
        return CAPTURE_OFF, on_demand_note(spec, n_prompt + max_new, plan, budget)
    whole = len(plan.layers) == spec.n_layers + 1
    maps = attention_bytes(spec, n_prompt, max_new, matrix=True) * spec.n_layers
    allowed = min(spec.n_layers, max_layers or spec.n_layers)
    exports = whole and maps + plan.total <= budget and allowed == spec.n_layers
    policy = CapturePolicy(layers=None if exports else (), logit_lens=LOGIT_LENS_TOP,
                           inputs=None if whole else plan.layers)
    return policy, None if whole else on_demand_note(spec, n_prompt + max_new, plan, budget)


def on_demand_note(spec: ModelSpec, positions: int, plan: KeptPlan, budget: int) -> str:
    """What the page says about a run that keeps fewer than every layer's residual."""
    if not plan.layers:
        return (f"Not even one layer's residual stream fits this server's {fmt_bytes(budget)} capture budget at "
                f"{positions:,} positions, so this run keeps nothing to show: no attention, norms or logit lens. A "
                "larger --max-capture-mb would keep it.")
    kept = [i for i in plan.layers if i < spec.n_layers]
    every = (spec.n_layers + 1) * spec.d_model * positions * (plan.per_position // max(len(plan.layers), 1)
                                                               // spec.d_model)
    return (f"The residual stream of every layer ({fmt_bytes(every)}) would not fit this server's "
            f"{fmt_bytes(budget)} capture budget at {positions:,} positions, so the server keeps it entering "
            f"{len(kept)} of {spec.n_layers} layers ({', '.join(map(str, kept))})"
            + (" and leaving the last" if spec.n_layers in plan.layers else "")
            + ": any other layer's attention is rebuilt from the one below it first (a queued job), and the logit "
            "lens shows the layers whose output was kept.")
