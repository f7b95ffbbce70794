"""How much a run captures: every layer and head when the prompt is short, fewer layers or only the last query row
when it is long, always within the server's capture limits. The same rule for a browser's run and for an HTTP
client that asks for the page's capture (`"playground": {"capture": true}`).

    policy, note = capture_policy(spec, n_prompt=40, max_new=64, budget=limits.max_capture_bytes)
"""
from __future__ import annotations

from engine.core.hooks import CAPTURE_OFF, CapturePolicy
from engine.projection.specs import ModelSpec
from engine.projection.units import fmt_bytes

ATTENTION_BUDGET = 256 * 2**20        # bytes of attention probabilities one run may capture
LOGIT_LENS_TOP = 5
CAPTURED_BYTES = 4                    # the engine captures float32 probabilities


def attention_bytes(spec: ModelSpec, n_prompt: int, max_new: int, matrix: bool) -> int:
    """Bytes of attention probabilities one layer captures: the prefill rows plus one row per step."""
    prefill_rows = n_prompt * n_prompt if matrix else n_prompt
    decode_rows = sum(n_prompt + s for s in range(1, max_new))
    return spec.n_heads * (prefill_rows + decode_rows) * CAPTURED_BYTES


def spread_layers(n_layers: int, k: int) -> tuple[int, ...]:
    """k layers spread over the depth (k=1: the middle one)."""
    if k >= n_layers:
        return tuple(range(n_layers))
    if k == 1:
        return (n_layers // 2,)
    return tuple(sorted({round(i * (n_layers - 1) / (k - 1)) for i in range(k)}))


def capture_policy(spec: ModelSpec, n_prompt: int, max_new: int, enabled: bool = True,
                   budget: int = ATTENTION_BUDGET, max_layers: int | None = None) -> tuple[CapturePolicy, str | None]:
    """All layers and heads when the prompt is short; fewer layers, or last rows only, when it is long.

    `budget` (bytes) and `max_layers` are the server's capture limits. Returns the policy and, when
    something was left out, a sentence the page shows.
    """
    if not enabled:
        return CAPTURE_OFF, "Capture is off: no attention maps, logit lens or norms for this run."
    full = attention_bytes(spec, n_prompt, max_new, matrix=True)
    allowed = min(spec.n_layers, max_layers or spec.n_layers)
    if full * spec.n_layers <= budget and allowed == spec.n_layers:
        return CapturePolicy(logit_lens=LOGIT_LENS_TOP, lens_on_demand=True), None
    if full * allowed <= budget:
        layers = spread_layers(spec.n_layers, allowed)
        note = (f"This server captures at most {allowed} layers per request, so attention maps (and the logit "
                f"lens) were kept for layers {', '.join(map(str, layers))} of {spec.n_layers}.")
        return CapturePolicy(layers=layers, logit_lens=LOGIT_LENS_TOP, lens_on_demand=True), note
    k = min(budget // full, allowed)
    if k >= 1:
        layers = spread_layers(spec.n_layers, int(k))
        note = (f"The prompt is long ({n_prompt:,} tokens), so full attention maps (and the logit lens) were kept "
                f"for {len(layers)} of {spec.n_layers} layers ({', '.join(map(str, layers))}) to stay within "
                f"{fmt_bytes(budget)} of capture.")
        return CapturePolicy(layers=layers, logit_lens=LOGIT_LENS_TOP, lens_on_demand=True), note
    rows = attention_bytes(spec, n_prompt, max_new, matrix=False)
    layers = spread_layers(spec.n_layers, max(1, min(int(budget // rows), allowed)))
    note = (f"The prompt is very long ({n_prompt:,} tokens): only the last query row of each step was kept, "
            f"for {len(layers)} of {spec.n_layers} layers.")
    return CapturePolicy(layers=layers, prefill_matrix=False, logit_lens=LOGIT_LENS_TOP,
                         lens_on_demand=True), note
