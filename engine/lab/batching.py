"""Real batched generation on the loaded model: several prompts, one forward pass per step for all of them.

    run = generate_batch(lm, [ids_a, ids_b, ids_c], max_new_tokens=16)   # greedy
    points = measure_batching(lm, (1, 2, 4, 8))                          # tok/s against batch size

Prompts of different lengths are left-padded to the same length; the attention mask hides the pads
and each row's positions are counted from its own first real token, so every row sees exactly what
it would see alone (a test checks that each row's tokens equal unbatched greedy decoding).

Every row decodes `max_new_tokens` tokens (no early stop at end-of-text): this is static batching,
where a finished row would still ride along as padding until the longest one is done.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

import torch
from transformers import DynamicCache

from engine.errors import InvalidRequestError
from engine.core.generate import sync
from engine.core.loader import LoadedModel
from engine.core.small_batch import small_batch_kernels
from engine.lab.speed import check_room, prompt_of_length
from engine.serving.batch import left_pad, pad_id

MAX_BATCH = 64


def batch_forward(lm: LoadedModel, input_ids: torch.Tensor, mask: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
    """New tokens [B, T] after what the cache holds; `mask` [B, past + T] covers cache and new tokens.

    Returns the logits at each row's last position, [B, V]. A decode step of 2 to 32 rows uses the packed
    small-batch weights on CPU, as the server's batched steps do (engine/core/small_batch.py).
    """
    t = input_ids.shape[1]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, -t:]                           # [B, T] per-row positions
    with small_batch_kernels(lm):
        out = lm.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, cache=cache,
                       use_cache=True, logits_to_keep=1)
    return out.logits[:, -1]                                                           # [B, V]


@dataclass(frozen=True)
class BatchRun:
    """A greedy batched generation: the tokens of each row and the time of each step (seconds)."""

    prompt_lengths: tuple[int, ...]
    tokens: tuple[tuple[int, ...], ...]   # generated ids per row (the first comes out of prefill)
    prefill_seconds: float
    step_seconds: tuple[float, ...]       # decode steps, each one forward for the whole batch

    @property
    def batch(self) -> int:
        return len(self.prompt_lengths)

    @property
    def per_user_tok_s(self) -> float:
        """Tokens each row gets per second of decoding: 1 / step time."""
        return len(self.step_seconds) / sum(self.step_seconds) if self.step_seconds else float("nan")

    @property
    def total_tok_s(self) -> float:
        return self.batch * self.per_user_tok_s


def check_batch(lm: LoadedModel, rows: Sequence[Sequence[int]], max_new_tokens: int) -> None:
    if not rows or not 1 <= len(rows) <= MAX_BATCH:
        raise InvalidRequestError(f"a batch holds 1 to {MAX_BATCH} prompts")
    if any(len(r) == 0 for r in rows):
        raise InvalidRequestError("every prompt in the batch needs at least one token")
    if max_new_tokens < 1:
        raise InvalidRequestError("generate at least one token")
    check_room(lm, max(len(r) for r in rows), max_new_tokens)


def generate_batch(lm: LoadedModel, rows: Sequence[Sequence[int]], max_new_tokens: int = 16) -> BatchRun:
    """Greedy decoding of all rows together: one prefill, then one forward per step for the batch."""
    check_batch(lm, rows, max_new_tokens)
    ids, mask = left_pad(rows, pad_id(lm), lm.device)
    cache = DynamicCache(config=lm.model.config)
    out: list[torch.Tensor] = []
    steps: list[float] = []
    with torch.inference_mode():
        t0 = time.perf_counter()
        nxt = batch_forward(lm, ids, mask, cache).argmax(-1)                          # [B]
        sync(lm.device)
        prefill = time.perf_counter() - t0
        out.append(nxt)
        for _ in range(max_new_tokens - 1):
            t = time.perf_counter()
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)              # [B, past + 1]
            nxt = batch_forward(lm, nxt[:, None], mask, cache).argmax(-1)
            sync(lm.device)
            steps.append(time.perf_counter() - t)
            out.append(nxt)
    tokens = torch.stack(out, dim=1).tolist()                                          # [B, new]
    return BatchRun(tuple(len(r) for r in rows), tuple(map(tuple, tokens)), prefill, tuple(steps))


# --- tokens per second against batch size -----------------------------------------------------------

@dataclass(frozen=True)
class BatchPoint:
    batch: int
    total_tok_s: float           # all rows together
    per_user_tok_s: float        # one row
    step_ms: float               # median decode step
    prefill_ms: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def batch_prompts(lm: LoadedModel, batch: int, tokens: int) -> list[list[int]]:
    """`batch` different prompts of about `tokens` tokens (lengths differ by a few, so padding is real)."""
    base = prompt_of_length(lm, tokens + 8 * batch)
    return [base[8 * i: 8 * i + tokens - (i % 3)] for i in range(batch)]


def measure_batching(lm: LoadedModel, batch_sizes: Sequence[int] = (1, 2, 4, 8), prompt_tokens: int = 32,
                     new_tokens: int = 12, rounds: int = 1,
                     progress: Callable[[float, str], None] | None = None) -> list[BatchPoint]:
    """Run the model batched at each size and time it. With several rounds the sizes are interleaved
    (1, 2, 4, 8, 1, 2, ...) so a noisy neighbour hits every size alike; each keeps its median step."""
    steps, prefill = interleaved(lm, batch_sizes, rounds, new_tokens, lambda b: batch_prompts(lm, b, prompt_tokens),
                                 lambda b, r: f"batch of {b}" + (f", round {r + 1}" if rounds > 1 else ""), progress)
    return [_point(b, steps[b], prefill[b]) for b in batch_sizes]


def interleaved(lm: LoadedModel, batch_sizes: Sequence[int], rounds: int, new_tokens: int,
                prompts: Callable[[int], list[list[int]]], say: Callable[[int, int], str],
                progress: Callable[[float, str], None] | None) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    """`generate_batch` at each size, round after round with the sizes interleaved (1, 2, 4, 8, 1, 2, ...);
    per size the decode step times of every round and the prefill time of each. `say(b, r)` labels a run."""
    steps: dict[int, list[float]] = {b: [] for b in batch_sizes}
    prefill: dict[int, list[float]] = {b: [] for b in batch_sizes}
    total = max(1, rounds) * len(batch_sizes)
    for r in range(max(1, rounds)):
        for i, b in enumerate(batch_sizes):
            if progress:
                progress((r * len(batch_sizes) + i) / total, say(b, r))
            run = generate_batch(lm, prompts(b), new_tokens)
            steps[b] += run.step_seconds
            prefill[b].append(run.prefill_seconds)
    return steps, prefill


def exact_prompts(lm: LoadedModel, batch: int, tokens: int) -> list[list[int]]:
    """`batch` different prompts of exactly `tokens` token ids each (no padding needed)."""
    base = prompt_of_length(lm, tokens + 8 * batch)
    return [base[8 * k: 8 * k + tokens] for k in range(batch)]


@dataclass(frozen=True)
class PhasePoint:
    """Prefill and decode of one batch size, measured: `batch` prompts of `prompt_tokens` read in one pass,
    then decode steps of the whole batch."""

    batch: int
    prompt_tokens: int           # per prompt
    prefill_seconds: float       # the fastest of the rounds: one pass over batch x prompt_tokens tokens
    step_seconds: float          # the median decode step over all rounds: one token for every user

    @property
    def prefill_tok_s(self) -> float:
        """Input tokens per second while prefilling."""
        return self.batch * self.prompt_tokens / self.prefill_seconds

    @property
    def decode_tok_s(self) -> float:
        """Output tokens per second, all users together, while decoding."""
        return self.batch / self.step_seconds

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"prefill_tok_s": self.prefill_tok_s, "decode_tok_s": self.decode_tok_s}


def measure_phases(lm: LoadedModel, batch_sizes: Sequence[int] = (1, 2, 4, 8), prompt_tokens: int = 128,
                   new_tokens: int = 8, rounds: int = 2,
                   progress: Callable[[float, str], None] | None = None) -> list[PhasePoint]:
    """Input and output throughput at each batch size: `b` different prompts of exactly `prompt_tokens` tokens
    (no padding) prefilled together and decoded together, the sizes interleaved round by round."""
    if new_tokens < 2:
        raise InvalidRequestError("measuring decode needs at least 2 new tokens (the first comes out of prefill)")
    steps, prefill = interleaved(lm, batch_sizes, rounds, new_tokens, lambda b: exact_prompts(lm, b, prompt_tokens),
                                 lambda b, r: f"{b} x {prompt_tokens} prompt tokens, then decode", progress)
    return [PhasePoint(b, prompt_tokens, min(prefill[b]), statistics.median(steps[b])) for b in batch_sizes]


def _point(batch: int, steps: list[float], prefills: list[float]) -> BatchPoint:
    step = statistics.median(steps) if steps else float("nan")
    return BatchPoint(batch, batch / step, 1 / step, step * 1e3, min(prefills) * 1e3)
