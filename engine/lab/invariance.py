"""Same question, same numbers, as a lesson (issue 51): one prompt answered alone and as one row of a batch, with the
batch-invariant kernels off and on, and one sum of the model's own numbers added in two orders to show why.

    step = private_step(lm, on=True)                       # the model's forward, its own flag: the room's is untouched
    alone = answer_alone(step, ids, new=16)                # greedy; Answer.logprobs [N, V] float32
    rows = answer_in_batch(step, [*others, ids], new=16)   # the same prompt among others, one step for all
    mine = answer(lm, "float32", True, ids, in_batch=True)  # one of the two above, as a job runs it (numpy out)
    lesson = comparison("float32", True, alone, mine)      # token by token: how far apart, where they part
    sums = two_orders(lm, ids)                             # one row of layer 0's q_proj, in order and in 8 lanes

Why the numbers move (engine/core/invariant.py): a floating-point sum depends on the order of its terms, and a
library kernel picks its order from the shape it is handed, so the same row multiplied alone and among 7 others is
added up differently. With the invariant kernels every row goes through the same fixed shapes, and its numbers are
the same bits whoever else is in the batch.

The lesson runs its own copy of the forward (`LeanStep` over the same parameters, nothing copied) with its own
invariant flag, its own caches and its own batch, so it never changes what the room's requests run; bfloat16 runs
on a temporary copy of the weights (at most `BF16_COPY_BYTES` of them).
"""
from __future__ import annotations

import copy
import dataclasses
import math
import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from transformers import DynamicCache

from engine.core.generate import GenerationRequest, encode_prompt
from engine.core.lean import LeanStep, causal_mask, lean_step_for, rms_norm, why_not
from engine.core.loader import LoadedModel
from engine.errors import InvalidRequestError

DEFAULT_PROMPT = "Why is the sky blue?"
NEW_TOKENS = 16                   # the answer the lesson compares, token by token
MINE = 3                          # my row in the batch of 8
OTHERS = ("What is the capital of France?", "Write a haiku about the sea.", "How do vaccines work?",
          "List three prime numbers.", "Why do cats purr?", "Explain a hash table in one sentence.",
          "Translate 'good morning' into Spanish.")
LANES = 8                         # an 8-wide vector unit: 8 partial sums, added together at the end
BF16_COPY_BYTES = 1e9             # bfloat16 lesson on a temporary copy only for models up to this size (as loaded)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
Progress = Callable[[float, str], None]


@dataclass(frozen=True)
class Answer:
    """A greedy answer and, per token, the log-probabilities of the whole vocabulary it was chosen from."""

    tokens: list[int]
    logprobs: torch.Tensor | np.ndarray   # [N, V] float32: log-softmax of the logits token i was picked from
    seconds: float = 0.0                  # how long the run held the model


@dataclass(frozen=True)
class Comparison:
    """One prompt alone and as row `MINE` of a batch of 8, in one dtype, with the invariant kernels off or on."""

    dtype: str
    on: bool
    gaps: list[float]             # per token, max over the vocabulary of |log p alone - log p in the batch|, up to
                                  # and including the token where the answers part
    parted: int | None            # the first token where the batch's answer differs from the lone one (None: never)
    alone: list[int]              # the two answers' tokens
    in_batch: list[int]
    rows: int                     # requests in the batch
    seconds: float                # both runs, as measured where the model is
    longest: float                # the longer of the two: the longest the room waited for this setting


@dataclass(frozen=True)
class TwoOrders:
    """One output of one product, sum_i w_i * x_i, added up in two orders in float32."""

    weight: str                   # the module path of the product
    token: str                    # the token whose numbers they are (x: its embedding after layer 0's norm)
    row: int                      # which output (the row of the weight)
    length: int                   # terms in the sum (d_model)
    in_order: float               # left to right, one at a time
    in_lanes: float               # in LANES partial sums (term i into sum i mod LANES), then those added
    exact: float                  # the same float32 terms added exactly (math.fsum), rounded to float64
    rows_differ: int              # outputs of this product whose two orders give different float32 results
    rows: int


def check_model(lm: LoadedModel) -> None:
    """The lesson needs the project's one forward (the invariant kernels live there): say so for any other model."""
    reason = why_not(lm.model)
    if reason is not None or lean_step_for(lm) is None:
        raise InvalidRequestError(f"{lm.label} runs through transformers' own modules ({reason or 'not covered'}); "
                                  "the batch-invariant kernels cover only the project's own forward")


def private_step(lm: LoadedModel, on: bool) -> LeanStep:
    """The model's forward over its own parameters with its own invariant flag (the room's stays as it is)."""
    step = LeanStep(lm)
    step.invariant = on
    return step


def lesson_ids(lm: LoadedModel, text: str) -> list[int]:
    """A prompt's token ids as a request would send them (through the chat template where the model has one)."""
    return encode_prompt(lm, GenerationRequest(text))


def _logprobs(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1)


def answer_alone(step: LeanStep, ids: list[int], new: int, progress: Progress | None = None) -> Answer:
    """Greedy: the prompt prefilled whole, then one token per step, the request alone (batch of one)."""
    cache, tokens, rows = DynamicCache(), [], []
    with torch.inference_mode():
        logits = step.on_cache(ids, cache)[-1]                                      # [V]
        for i in range(new):
            rows.append(_logprobs(logits))
            tokens.append(int(logits.argmax()))
            if progress is not None:
                progress(i / new, f"alone: token {i + 1} of {new}")
            if i + 1 < new:
                logits = step.on_cache(tokens[-1:], cache)[-1]
    return Answer(tokens, torch.stack(rows))


def answer_in_batch(step: LeanStep, prompts: list[list[int]], new: int,
                    progress: Progress | None = None) -> list[Answer]:
    """Greedy for every prompt at once, as the room batches them: one padded prefill (left pads, masked), then one
    decode step for all rows at a time; every row's Answer."""
    b, width = len(prompts), max(len(p) for p in prompts)
    device = step.embed.weight.device
    valid = torch.tensor([[c >= width - len(p) for c in range(width)] for p in prompts], device=device)  # [B, W]
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)                  # [B, W]
    positions = (valid.cumsum(dim=1) - 1).clamp(min=0)                                                 # [B, W]
    cache = DynamicCache()
    kv = lambda i, k, v: cache.update(k, v, i)  # noqa: E731 - keys [B, KVH, S, D], pads included, masked
    tokens, rows = [[] for _ in prompts], [[] for _ in prompts]
    with torch.inference_mode():
        logits = step.forward(ids, positions, kv, causal_mask(valid, width))[:, -1]                   # [B, V]
        for i in range(new):
            for r in range(b):
                rows[r].append(_logprobs(logits[r]))
                tokens[r].append(int(logits[r].argmax()))
            if progress is not None:
                progress(i / new, f"in a batch of {b}: token {i + 1} of {new}")
            if i + 1 < new:
                valid = torch.cat([valid, valid.new_ones(b, 1)], dim=1)
                last = torch.tensor([[t[-1]] for t in tokens], device=device)                          # [B, 1]
                logits = step.forward(last, positions[:, -1:] + 1 + i, kv, causal_mask(valid, 1))[:, -1]
    return [Answer(t, torch.stack(r)) for t, r in zip(tokens, rows)]


def parted_at(a: Answer, b: Answer) -> int | None:
    """The first token where two answers differ, or None when they agree all along."""
    return next((i for i, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y), None)


def gaps(a: Answer, b: Answer) -> list[float]:
    """Per token, the largest |difference| in log-probability over the vocabulary, while both answers read the same
    text (up to and including the token where they part)."""
    last = parted_at(a, b)
    n = min(len(a.tokens), len(b.tokens)) if last is None else last + 1
    x, y = torch.as_tensor(a.logprobs[:n]), torch.as_tensor(b.logprobs[:n])
    return (x - y).abs().amax(dim=-1).tolist()


def in_dtype(lm: LoadedModel, dtype: torch.dtype) -> LoadedModel:
    """The model in `dtype`: itself, or a temporary copy of its weights (dropped with the lesson's step)."""
    if lm.dtype == dtype:
        return lm
    if lm.weight_bytes > BF16_COPY_BYTES:
        raise InvalidRequestError(f"the {str(dtype).removeprefix('torch.')} lesson copies the weights, and "
                                  f"{lm.label}'s {lm.weight_bytes / 1e9:.1f} GB are more than the "
                                  f"{BF16_COPY_BYTES / 1e9:.0f} GB it copies")
    model = copy.deepcopy(lm.model).to(dtype)
    return dataclasses.replace(lm, model=model, dtype=dtype, lock=threading.Lock(), small_batch=None,
                               batch_graphs=None, lean=None, layout={})


def others(lm: LoadedModel) -> list[list[int]]:
    return [lesson_ids(lm, text) for text in OTHERS]


def answer(lm: LoadedModel, dtype: str, on: bool, ids: list[int], new: int = NEW_TOKENS, in_batch: bool = False,
           progress: Progress | None = None) -> Answer:
    """`ids` answered alone, or as row MINE of a batch of 8 (the 7 OTHERS around it), in `dtype`, with the invariant
    kernels `on` or off: one job's worth (the room waits for one run at a time). Log-probabilities as numpy."""
    check_model(lm)
    start = time.perf_counter()
    step = private_step(in_dtype(lm, DTYPES[dtype]), on)
    if in_batch:
        prompts = others(lm)
        prompts.insert(MINE, ids)
        got = answer_in_batch(step, prompts, new, progress)[MINE]
    else:
        got = answer_alone(step, ids, new, progress)
    return Answer(got.tokens, got.logprobs.numpy(), time.perf_counter() - start)


def comparison(dtype: str, on: bool, alone: Answer, in_batch: Answer) -> Comparison:
    """The two answers token by token: how far apart their log-probabilities are, and where they part."""
    return Comparison(dtype, on, gaps(alone, in_batch), parted_at(alone, in_batch), alone.tokens, in_batch.tokens,
                      len(OTHERS) + 1, alone.seconds + in_batch.seconds, max(alone.seconds, in_batch.seconds))


def compare(lm: LoadedModel, dtype: str, on: bool, ids: list[int], new: int = NEW_TOKENS) -> Comparison:
    """Both runs of one setting, one after the other, compared."""
    return comparison(dtype, on, answer(lm, dtype, on, ids, new), answer(lm, dtype, on, ids, new, in_batch=True))


def two_orders(lm: LoadedModel, ids: list[int]) -> TwoOrders:
    """The products w_i * x_i of layer 0's q_proj for the prompt's last token (x: its embedding after the layer's
    norm), each row's terms added left to right and in LANES partial sums, both in float32; the row where the two
    orders end farthest apart."""
    layer = lm.model.model.layers[0]
    with torch.inference_mode():
        x = lm.model.model.embed_tokens(torch.tensor(ids[-1:], device=lm.device))[0]                 # [d]
        x = rms_norm(x, layer.input_layernorm.weight, float(lm.model.config.rms_norm_eps)).float()
        terms = (layer.self_attn.q_proj.weight.float() * x).cpu().numpy()                           # [out, d] f32
    in_order = np.cumsum(terms, axis=1, dtype=np.float32)[:, -1]                                    # sequential
    padded = np.pad(terms, ((0, 0), (0, -terms.shape[1] % LANES)))                                  # + exact zeros
    lanes = np.cumsum(padded.reshape(terms.shape[0], -1, LANES), axis=1, dtype=np.float32)[:, -1]   # [out, LANES]
    in_lanes = np.cumsum(lanes, axis=1, dtype=np.float32)[:, -1]
    apart = np.abs(in_order.astype(np.float64) - in_lanes.astype(np.float64))
    row = int(apart.argmax())
    return TwoOrders("model.layers.0.self_attn.q_proj", lm.tokenizer.decode(ids[-1:]), row, terms.shape[1],
                     float(in_order[row]), float(in_lanes[row]), math.fsum(terms[row].astype(np.float64).tolist()),
                     int((in_order != in_lanes).sum()), terms.shape[0])
