"""Serving economics: what an input token and an output token cost, from the throughput of each phase.

    prices = token_prices(prefill_tok_s=40_000, decode_tok_s=130, dollars_per_hour=3.0, batch=1)
    prices.output_per_input          # ~300: one output token costs as much GPU time as ~300 input tokens
    rows = projected_token_prices(spec, gpu, batches=(1, 64))       # Llama 3.1 8B on an H100, from the spec sheet

A GPU rented by the hour costs the same whether it is prefilling or decoding, so a token costs the GPU
time it takes: $/hour / 3600 / (tokens per second of its phase). Input tokens are read in prefill, many
in one forward pass, so one weight read serves the whole prompt and the pass is compute-bound. Output
tokens come out of decode steps, one per user per step, and every step reads all the weights (and the
users' KV caches) again, so decode is bandwidth-bound. The ratio of the two throughputs is the ratio of
the prices: `output_per_input` = (input tokens/s in prefill) / (output tokens/s in decode).

Pure arithmetic, no torch: the measured plane (`engine.lab.batching.measure_phases`) hands in throughputs it
timed; the projected plane computes them from `engine.projection`'s cost model.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

from engine.projection.cost import (DEFAULT_BANDWIDTH_EFFICIENCY, DEFAULT_DOLLARS_PER_HOUR, DEFAULT_FLOPS_EFFICIENCY,
                                    Layout, cost_model, memory_plan)
from engine.projection.specs import GPUSpec, ModelSpec

SECONDS_PER_HOUR = 3600
PROMPT_TOKENS = 1024         # the projected plane's prompt: prefill of this many tokens, decode at this context
PRICE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class TokenPrices:
    """What one input token and one output token cost at a batch size, from the two phases' throughputs."""

    batch: int                    # users decoded together (and prompts prefilled together)
    prefill_tok_s: float          # input tokens per second while prefilling
    decode_tok_s: float           # output tokens per second, all users together, while decoding
    dollars_per_hour: float       # the machine's price

    @property
    def output_per_input(self) -> float:
        """How many input tokens cost the same GPU time as one output token."""
        return self.prefill_tok_s / self.decode_tok_s

    @property
    def input_per_million(self) -> float:
        """$ per million input tokens."""
        return dollars_per_million(self.dollars_per_hour, self.prefill_tok_s)

    @property
    def output_per_million(self) -> float:
        """$ per million output tokens."""
        return dollars_per_million(self.dollars_per_hour, self.decode_tok_s)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"output_per_input": self.output_per_input,
                               "input_per_million": self.input_per_million,
                               "output_per_million": self.output_per_million}


def dollars_per_million(dollars_per_hour: float, tokens_per_second: float) -> float:
    """$ per million tokens for a machine at `dollars_per_hour` producing `tokens_per_second`."""
    if tokens_per_second <= 0:
        raise ValueError("tokens per second must be positive")
    return dollars_per_hour / SECONDS_PER_HOUR / tokens_per_second * 1e6


def token_prices(prefill_tok_s: float, decode_tok_s: float, dollars_per_hour: float, batch: int = 1) -> TokenPrices:
    if prefill_tok_s <= 0 or decode_tok_s <= 0:
        raise ValueError("both throughputs must be positive")
    if dollars_per_hour < 0:
        raise ValueError("the price per hour cannot be negative")
    return TokenPrices(batch, prefill_tok_s, decode_tok_s, dollars_per_hour)


def projected_token_prices(spec: ModelSpec, gpu: GPUSpec, batches: Sequence[int] = PRICE_BATCHES,
                           prompt_tokens: int = PROMPT_TOKENS, weight_dtype: str = "bf16", kv_dtype: str = "bf16",
                           flops_efficiency: float = DEFAULT_FLOPS_EFFICIENCY,
                           bandwidth_efficiency: float = DEFAULT_BANDWIDTH_EFFICIENCY,
                           dollars_per_hour: float = DEFAULT_DOLLARS_PER_HOUR,
                           layout: Layout = Layout()) -> list[TokenPrices]:
    """At each batch b, one replica: b prompts of `prompt_tokens` prefilled in one pass (input tokens/s), then
    a decode step of b users each holding `prompt_tokens` cached tokens (output tokens/s), priced at
    `dollars_per_hour` per GPU. Batches whose caches do not fit beside the weights (with a server's
    headroom) are left out."""
    cm = cost_model(spec, gpu, weight_dtype, kv_dtype, flops_efficiency, bandwidth_efficiency, layout)
    price = dollars_per_hour * layout.per_replica
    rows = []
    for b in batches:
        if not memory_plan(spec, gpu, weight_dtype, kv_dtype, b, prompt_tokens, layout).fits:
            continue
        prefill = b * prompt_tokens / cm.prefill_seconds([prompt_tokens] * b)
        decode = b / cm.decode_seconds_at(b, prompt_tokens)
        rows.append(token_prices(prefill, decode, price, b))
    return rows
