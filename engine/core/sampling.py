"""From logits to a token: temperature, top-k, top-p, then a seeded draw (or argmax at temperature 0).

The same filtering runs on torch tensors in the decode loop and on stored numpy logits when a page
re-draws a distribution after a slider moves, so the two can never disagree.
"""
from __future__ import annotations

import math

import numpy as np
import torch


def logits_to_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0,
                    top_p: float = 1.0) -> torch.Tensor:
    """logits: (..., V) -> probabilities (..., V) after temperature, top-k and top-p (nucleus) filtering."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))          # float64 stays
    if temperature != 1.0:                  # x / 1 is x: no pass over the vocabulary for it
        logits = logits / max(temperature, 1e-5)
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass strictly above each token
        drop = before >= top_p
        drop[..., 0] = False  # the most likely token always survives, however small top_p is
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
           generator: torch.Generator | None) -> tuple[int, torch.Tensor]:
    """logits: (V,) -> (token id, the probabilities it was drawn from). Temperature 0 is greedy."""
    assert logits.dim() == 1, logits.shape
    if temperature <= 0:
        probs = logits_to_probs(logits, 1.0, top_k, top_p)
        return int(torch.argmax(logits)), probs
    probs = logits_to_probs(logits, temperature, top_k, top_p)
    return int(torch.multinomial(probs, 1, generator=generator)), probs


def filter_probs(logits: np.ndarray, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 rest_logsumexp: float | None = None, rest_count: int = 0) -> np.ndarray:
    """numpy twin of `logits_to_probs` for stored logits (K,) (no model run); temperature 0 shows T=1.

    With `rest_logsumexp`, the log Σ exp of the `rest_count` logits that were not stored, the probabilities are
    shares of the whole vocabulary, not of the K stored: the rest count as `rest_count` equal logits with that
    total, each below every stored one. Exact at temperature 1 (with top-p, while its nucleus ends among the
    stored logits) and at any temperature when top-k keeps only stored logits.
    """
    kept = torch.from_numpy(np.asarray(logits, dtype=np.float64))   # float64: thousands of tiny shares add up
    if rest_logsumexp is not None and rest_count > 0:
        each = rest_logsumexp - math.log(rest_count)
        kept = torch.cat([kept, torch.full((rest_count,), each, dtype=torch.float64)])
    probs = logits_to_probs(kept, temperature if temperature > 0 else 1.0, top_k, top_p)
    return probs[: len(logits)].numpy().astype(np.float32)
