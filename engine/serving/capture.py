"""How much a run captures, always within the server's capture limits, with memory that grows with the length:

- every run that captures keeps the residual stream entering its layers at every position (`policy.inputs`), in
  the model's own dtype: from it any layer's and head's attention, any query row, a pooled overview and the per-head
  summaries are computed again, exactly, when someone asks (engine/core/recompute.py). When every layer does not fit
  the budget, the layers kept are spread over the depth and a layer between them is rebuilt from the one below;
- a short prompt's full attention maps ride in the records too (every layer and head), so a page draws them at once
  and a recording holds them; a long prompt's are computed on demand instead, never "kept for 2 of 30 layers".

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
CAPTURED_BYTES = 4                    # the engine captures float32 probabilities
SPARE_LAYERS = 1                      # room kept for one layer rebuilt on demand when not every layer fits


def attention_bytes(spec: ModelSpec, n_prompt: int, max_new: int, matrix: bool) -> int:
    """Bytes of attention probabilities one layer captures: the prefill rows plus one row per step."""
    prefill_rows = n_prompt * n_prompt if matrix else n_prompt
    decode_rows = sum(n_prompt + s for s in range(1, max_new))
    return spec.n_heads * (prefill_rows + decode_rows) * CAPTURED_BYTES


def input_bytes_per_layer(spec: ModelSpec, positions: int, value_bytes: int) -> int:
    """One layer's kept input over `positions` positions: d_model values each."""
    return spec.d_model * positions * value_bytes


def spread_layers(n_layers: int, k: int) -> tuple[int, ...]:
    """k layers spread over the depth, the first always among them (k=1: layer 0)."""
    if k >= n_layers:
        return tuple(range(n_layers))
    if k <= 1:
        return (0,) if k == 1 else ()
    return tuple(sorted({round(i * (n_layers - 1) / (k - 1)) for i in range(k)}))


@dataclass(frozen=True)
class KeptPlan:
    """Which layers' inputs a run keeps, and what that costs per position and in all."""

    layers: tuple[int, ...]
    per_position: int             # bytes per position (all kept layers)
    total: int                    # bytes for the whole run (prompt + new tokens)


def kept_plan(spec: ModelSpec, positions: int, budget: int, value_bytes: int) -> KeptPlan:
    """Every layer's input when it fits `budget`; else as many spread over the depth as fit, with room for one layer
    rebuilt on demand."""
    one = input_bytes_per_layer(spec, positions, value_bytes)
    k = spec.n_layers if one * spec.n_layers <= budget else max(0, budget // max(one, 1) - SPARE_LAYERS)
    layers = spread_layers(spec.n_layers, int(k))
    return KeptPlan(layers, len(layers) * spec.d_model * value_bytes, len(layers) * one)


def capture_policy(spec: ModelSpec, n_prompt: int, max_new: int, enabled: bool = True,
                   budget: int = ATTENTION_BUDGET, max_layers: int | None = None,
                   value_bytes: int = CAPTURED_BYTES) -> tuple[CapturePolicy, str | None]:
    """Kept layer inputs for every run (attention on demand), and full maps in the records when they fit beside them.

    `budget` (bytes) and `max_layers` are the server's capture limits, `value_bytes` the model's bytes per value.
    Returns the policy and, when the maps are computed on demand, a sentence the page shows."""
    if not enabled:
        return CAPTURE_OFF, "Capture is off: no attention maps, logit lens or norms for this run."
    plan = kept_plan(spec, n_prompt + max_new, budget, value_bytes)
    inputs = None if len(plan.layers) == spec.n_layers else plan.layers
    maps = attention_bytes(spec, n_prompt, max_new, matrix=True) * spec.n_layers
    allowed = min(spec.n_layers, max_layers or spec.n_layers)
    if inputs is None and maps + plan.total <= budget and allowed == spec.n_layers:
        return CapturePolicy(logit_lens=LOGIT_LENS_TOP, lens_on_demand=True, inputs=inputs), None
    layers = None if allowed == spec.n_layers else spread_layers(spec.n_layers, allowed)   # norms and the lens
    policy = CapturePolicy(layers=layers, attention=False, logit_lens=LOGIT_LENS_TOP, lens_on_demand=True,
                           inputs=inputs)
    return policy, on_demand_note(spec, n_prompt + max_new, plan, budget)


def on_demand_note(spec: ModelSpec, positions: int, plan: KeptPlan, budget: int) -> str:
    """What the page says about a run whose maps are computed on demand."""
    if not plan.layers:
        return (f"Not even one layer's input fits this server's {fmt_bytes(budget)} capture budget at {positions:,} "
                "positions, so this run keeps no attention: the norms and the logit lens only. A larger "
                "--max-capture-mb would keep it.")
    kept = ("the residual stream entering every layer" if len(plan.layers) == spec.n_layers else
            f"the residual stream entering {len(plan.layers)} of {spec.n_layers} layers "
            f"({', '.join(map(str, plan.layers))}; any other layer is rebuilt from the one below it first)")
    maps = attention_bytes(spec, positions, 1, matrix=True) * spec.n_layers
    return (f"Full maps of every layer ({fmt_bytes(maps)}) would not fit this server's {fmt_bytes(budget)} capture "
            f"budget at {positions:,} positions, so the server keeps {kept}, and every layer's and head's map is "
            "computed from it, exactly, when you look at it.")
