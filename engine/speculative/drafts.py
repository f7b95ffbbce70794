"""The three kinds of speculative draft: a smaller model, the target's own first layers, n-gram lookup.

A `Draft` is a stateless description that sessions may share (it holds models, never a cache).
`draft.start()` makes a `Drafter` that owns one run's state: it proposes up to k tokens after the
context, and after the target has verified them it is rolled back to the accepted length.

    drafter = EarlyExitDraft(lm.model, layers=8).start()
    proposal = drafter.propose(context, k=4, pick=greedy)   # Proposal(tokens, probs, fed)
    drafter.rollback(len(context) + accepted)               # crop the draft's KV cache
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, ClassVar, Protocol, Union

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view
from transformers import DynamicCache
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from engine.errors import DraftMismatchError, InvalidRequestError
from engine.core.generate import check_context, forward
from engine.core.loader import LoadedModel

Pick = Callable[[torch.Tensor], tuple[int, torch.Tensor]]    # logits (V,) -> (token id, probs (V,) it came from)
Step = Callable[[list[int], DynamicCache], torch.Tensor]     # new ids after the cache -> logits (V,) of the last


@dataclass
class Proposal:
    tokens: list[int]                 # drafted ids, at most k
    probs: torch.Tensor | None        # (len(tokens), V) distributions they were drawn from; None: one-hot
    fed: int = 0                      # context tokens the draft read to catch up before drafting


class Drafter(Protocol):
    def propose(self, context: list[int], k: int, pick: Pick) -> Proposal: ...

    def rollback(self, length: int) -> None: ...

    @property
    def cache_length(self) -> int | None: ...


def crop_to(cache: DynamicCache, length: int) -> None:
    """Keep the first `length` positions of every layer (DynamicCache.crop takes a negative count)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


class CachedDrafter:
    """Drafts autoregressively with its own KV cache: read what the cache lacks, then k one-token steps."""

    def __init__(self, step: Step, cache: DynamicCache):
        self.step, self.cache = step, cache

    def propose(self, context: list[int], k: int, pick: Pick) -> Proposal:
        feed = context[self.cache.get_seq_length():]     # 1 token, 2 after a full accept, the prompt at first
        fed, tokens, probs = len(feed), [], []
        for _ in range(k):
            token, dist = pick(self.step(feed, self.cache))
            tokens.append(token)
            probs.append(dist)
            feed = [token]
        return Proposal(tokens, torch.stack(probs) if probs else None, fed if k else 0)

    def rollback(self, length: int) -> None:
        crop_to(self.cache, length)

    @property
    def cache_length(self) -> int | None:
        return self.cache.get_seq_length()


class NgramDrafter:
    """Prompt lookup: no model and no cache, so nothing to roll back."""

    def __init__(self, max_ngram: int):
        self.max_ngram = max_ngram

    def propose(self, context: list[int], k: int, pick: Pick) -> Proposal:
        return Proposal(ngram_lookup(context, k, self.max_ngram), None, 0)

    def rollback(self, length: int) -> None:
        pass

    @property
    def cache_length(self) -> int | None:
        return None


def ngram_lookup(context: list[int], k: int, max_ngram: int = 3) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the context's last n tokens.

    Tries n = max_ngram first and falls back to shorter n-grams; [] when no n-gram recurs.
    """
    seq = np.asarray(context, dtype=np.int64)
    if k <= 0:
        return []
    for n in range(min(max_ngram, len(seq) - 1), 0, -1):
        windows = sliding_window_view(seq[:-1], n)              # (len - n, n): each n-gram with a successor
        hits = np.flatnonzero((windows == seq[-n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return seq[start:start + k].tolist()
    return []


# --- early exit: the target's own first N layers ---------------------------------------------------

def early_exit_logits(model: Any, n_layers: int, ids: list[int], cache: DynamicCache) -> torch.Tensor:
    """Logits (V,) of the newest position after only the first n_layers decoder layers, the final norm and LM head.

    Reads the shared model without changing it (no config edit, no hook); K/V go into `cache`.
    """
    base = model.model
    start = cache.get_seq_length()
    input_ids = torch.tensor([ids], device=model.device)                                  # [1, T]
    positions = torch.arange(start, start + len(ids), device=model.device)[None]          # [1, T]
    hidden = base.embed_tokens(input_ids)                                                  # [1, T, d_model]
    masks = _masks(base.config, hidden, cache, positions)
    rope = base.rotary_emb(hidden, positions)                                             # cos, sin [1, T, head_dim]
    for i, layer in enumerate(base.layers[:n_layers]):
        hidden = layer(hidden, attention_mask=masks[_mask_kind(base.config, i)], position_embeddings=rope,
                       position_ids=positions, cache=cache, use_cache=True)     # [1, T, d_model]
    return model.lm_head(base.norm(hidden[:, -1]))[0]                                     # (V,)


def _mask_kind(config: Any, i: int) -> str:
    types = getattr(config, "layer_types", None)
    if types:
        return types[i]
    return "sliding_attention" if getattr(config, "sliding_window", None) else "full_attention"


def _masks(config: Any, hidden: torch.Tensor, cache: DynamicCache, positions: torch.Tensor) -> dict[str, Any]:
    args = dict(config=config, inputs_embeds=hidden, attention_mask=None, cache=cache,
                position_ids=positions)
    kinds = {_mask_kind(config, i) for i in range(config.num_hidden_layers)}
    masks = {"full_attention": create_causal_mask(**args)}
    if "sliding_attention" in kinds:
        masks["sliding_attention"] = create_sliding_window_causal_mask(**args)
    return masks


def _model_logits(lm: LoadedModel, ids: list[int], cache: DynamicCache) -> torch.Tensor:
    return forward(lm, ids, cache)                                              # (V,)


# --- the draft descriptions a run is started from ---------------------------------------------------

@dataclass(frozen=True)
class ModelDraft:
    """A separate, smaller model that shares the target's tokenizer."""

    lm: LoadedModel
    kind: ClassVar[str] = "model"

    @property
    def label(self) -> str:
        return self.lm.label

    def check(self, target: LoadedModel, n_prompt: int, max_new_tokens: int) -> None:
        check_vocabulary(target, self.lm)
        check_context(self.lm, n_prompt, max_new_tokens)

    def start(self) -> Drafter:
        return CachedDrafter(partial(_model_logits, self.lm), DynamicCache(config=self.lm.model.config))


@dataclass(frozen=True)
class EarlyExitDraft:
    """Self-speculation: the target's first `layers` decoder layers, then its final norm and LM head."""

    model: Any
    layers: int
    kind: ClassVar[str] = "early-exit"

    @property
    def label(self) -> str:
        return f"early exit after {self.layers} of {len(self.model.model.layers)} layers"

    def check(self, target: LoadedModel, n_prompt: int, max_new_tokens: int) -> None:
        if self.model is not target.model:
            raise InvalidRequestError("an early-exit draft must be made from the target model itself")
        check_depth(self.layers, len(target.model.model.layers))

    def start(self) -> Drafter:
        step = partial(early_exit_logits, self.model, self.layers)
        return CachedDrafter(step, DynamicCache(config=self.model.config))


@dataclass(frozen=True)
class NgramDraft:
    """Prompt lookup: propose what followed the latest n-gram the last time it appeared."""

    max_ngram: int = 3
    kind: ClassVar[str] = "ngram"

    @property
    def label(self) -> str:
        return f"n-gram lookup (n <= {self.max_ngram})"

    def check(self, target: LoadedModel, n_prompt: int, max_new_tokens: int) -> None:
        if not 1 <= self.max_ngram <= 16:
            raise InvalidRequestError("the n-gram size must be 1 to 16")

    def start(self) -> Drafter:
        return NgramDrafter(self.max_ngram)


Draft = Union[ModelDraft, EarlyExitDraft, NgramDraft]


def check_depth(layers: int, n_layers: int) -> None:
    if not 1 <= layers <= n_layers:
        raise InvalidRequestError(f"the early-exit depth must be 1 to {n_layers} (the model has {n_layers} layers)")


def check_vocabulary(target: LoadedModel, draft: LoadedModel) -> None:
    """Raise DraftMismatchError unless both models map the same ids to the same tokens."""
    sizes = (target.model.config.vocab_size, draft.model.config.vocab_size)
    if sizes[0] != sizes[1]:
        raise DraftMismatchError(
            f"the draft {draft.label} has {sizes[1]:,} vocabulary rows but the target {target.label} has {sizes[0]:,}; "
            "a draft must share the target's tokenizer (e.g. Llama 3.2 1B for Llama 3.1 8B)")
    t_vocab, d_vocab = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    if t_vocab != d_vocab:
        differing = sum(1 for tok, i in t_vocab.items() if d_vocab.get(tok) != i) + max(0, len(d_vocab) - len(t_vocab))
        raise DraftMismatchError(
            f"the draft {draft.label} uses a different tokenizer from the target {target.label} "
            f"({differing:,} of {len(t_vocab):,} tokens differ); a draft must share the target's tokenizer")
