"""What attention at long context costs, projected from a model's config and a GPU's spec sheet (no torch): the
KV cache, what the engine keeps to recompute attention on demand, what Hugging Face's `output_attentions` would
hold instead, and the time of the prefill and of the per-head summaries.

    p = project_long_context(MODEL_PRESETS["llama-3.1-8b"], GPU_PRESETS["h100-sxm"], 32768, budget=512 * 2**20)
    p.output_attentions_bytes      # 32 layers x 32 heads x 32,768² x 2 bytes = 2.2 TB
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.projection.card import kv_bytes_per_token
from engine.projection.cost import DEFAULT_FLOPS_EFFICIENCY, causal_pairs, peak_flops, prefill_flops
from engine.projection.specs import GPUSpec, ModelSpec, dtype_bytes


@dataclass(frozen=True)
class LongContextProjection:
    tokens: int
    kv_bytes: float                 # K and V of every layer
    kept_per_token: float           # every layer's input, one position (d_model x layers x bytes)
    kept_layers: int                # layers whose input fits the capture budget (the rest rebuilt on demand)
    kept_bytes: float               # what is kept within the budget
    output_attentions_bytes: float  # layers x heads x N² probabilities in the model's dtype
    prefill_seconds: float          # compute-bound prefill at the default efficiency
    summaries_seconds: float        # lower bound: the q·k products of every head and layer, at the same efficiency
    rebuild_seconds: float          # the worst layer rebuilt from the kept one below (a partial prefill)


def project_long_context(spec: ModelSpec, gpu: GPUSpec, tokens: int, budget: float, dtype: str = "bf16",
                         efficiency: float = DEFAULT_FLOPS_EFFICIENCY) -> LongContextProjection:
    value = dtype_bytes(dtype)
    per_token = spec.n_layers * spec.d_model * value
    per_layer = spec.d_model * value * tokens
    kept_layers = spec.n_layers if per_token * tokens <= budget else max(0, int(budget // per_layer) - 1)
    rate = peak_flops(gpu, dtype) * efficiency
    prefill = prefill_flops(spec, tokens) / rate
    qk = 2.0 * spec.n_layers * spec.n_heads * spec.head_dim * causal_pairs(tokens) / rate
    gap = spec.n_layers / max(kept_layers, 1) if kept_layers < spec.n_layers else 0.0
    return LongContextProjection(tokens, kv_bytes_per_token(spec, dtype) * tokens, per_token, kept_layers,
                                 kept_layers * per_layer, spec.n_layers * spec.n_heads * tokens * tokens * value,
                                 prefill, qk, prefill * gap / spec.n_layers)
