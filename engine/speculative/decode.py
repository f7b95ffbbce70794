"""Speculative decoding: a draft proposes k tokens, the target checks them all in one forward pass.

    draft = draft_from_spec("ngram", lm)                  # or "early-exit:8", or "qwen-0.5b"
    for rec in speculative_generate(lm, GenerationRequest("..."), draft, k=4):
        ...   # PrefillRecord, SpecRoundRecord per round, SpecDoneRecord

Each round: the draft proposes d_1..d_k; the target runs once over [last token, d_1..d_k] and
gives k+1 distributions p_1..p_{k+1}; the longest prefix the target agrees with is accepted, plus
one token of the target's own (a correction on the first disagreement, or a bonus from p_{k+1}
when all k were accepted). Rejected positions are cropped from both KV caches; the prefix is never
recomputed. At temperature 0 the text equals plain greedy decoding; when sampling, rejection
sampling keeps the output distribution exactly the target's.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch
from transformers import DynamicCache

from engine.projection.card import forward_shapes
from engine.speculative.drafts import (Draft, Drafter, EarlyExitDraft, ModelDraft, NgramDraft, Proposal, check_depth,
                                       check_vocabulary, crop_to)
from engine.errors import InvalidRequestError
from engine.core.generate import (GenerationRequest, TextStream, admit, cache_state, describe_token, eos_ids,
                                  finish_reason, forward, pick_token, prompt_pieces, sync, trim_stop)
from engine.core.hooks import CAPTURE_OFF, CapturePolicy
from engine.core.kept import KeptInputs, kept_for
from engine.core.loader import LoadedModel, load_model
from engine.core.records import (DraftedToken, PrefillRecord, SampledToken, SpecDoneRecord, SpecRecord,
                                 SpecRoundRecord, to_json)
from engine.core.sampling import logits_to_probs, sample

MAX_K = 16

__all__ = ["Draft", "EarlyExitDraft", "ModelDraft", "NgramDraft", "DraftedToken", "SpecRoundRecord",
           "SpecDoneRecord", "accept", "best_k", "draft_from_spec", "expected_speedup", "expected_tokens_per_pass",
           "record_to_json", "speculative_generate", "speedup_curve"]


def expected_tokens_per_pass(acceptance: float, k: int) -> float:
    """(1 - a^(k+1)) / (1 - a): tokens per target pass when each draft token passes independently with rate a."""
    if acceptance >= 1.0:
        return float(k + 1)
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


def expected_speedup(acceptance: float, k: int, cost: float, check: float = 0.0) -> float:
    """E[tokens per pass] / (1 + k·(c + u)): a round drafts k tokens at `cost` c plain target steps each and verifies
    them in one pass that costs a plain step plus `check` u for each drafted token it checks."""
    return expected_tokens_per_pass(acceptance, k) / (1 + k * (cost + check))


def speedup_curve(acceptance: float, cost: float, ks: Sequence[int], check: float = 0.0) -> list[float]:
    return [expected_speedup(acceptance, k, cost, check) for k in ks]


def best_k(acceptance: float, cost: float, ks: Sequence[int], check: float = 0.0) -> tuple[int, float]:
    """The k of `ks` with the highest expected speedup, and that speedup."""
    curve = speedup_curve(acceptance, cost, ks, check)
    i = max(range(len(curve)), key=curve.__getitem__)
    return ks[i], curve[i]


# --- acceptance ---------------------------------------------------------------------------------------

def accept(drafted: list[int], q: torch.Tensor | None, logits: torch.Tensor, p: torch.Tensor, temperature: float,
           generator: torch.Generator) -> tuple[int, int]:
    """(number of drafted tokens accepted, the target's token after them).

    logits, p: (k+1, V) the target's raw logits and filtered probabilities at each drafted position and
    one past; q: (k, V) the draft's distributions, or None when proposals are deterministic (one-hot).
    """
    assert logits.shape[0] == p.shape[0] == len(drafted) + 1, (logits.shape, len(drafted))
    if temperature <= 0:
        return accept_greedy(drafted, logits)
    return accept_sampled(drafted, q, p, generator)


def accept_greedy(drafted: list[int], logits: torch.Tensor) -> tuple[int, int]:
    best = logits.argmax(dim=-1).tolist()                     # (k+1,) the target's greedy choice per position
    n = 0
    while n < len(drafted) and drafted[n] == best[n]:         # accept while the draft chose the target's argmax
        n += 1
    return n, best[n]


def accept_sampled(drafted: list[int], q: torch.Tensor | None, p: torch.Tensor,
                   generator: torch.Generator) -> tuple[int, int]:
    for i, x in enumerate(drafted):
        q_i = q[i].to(p.device) if q is not None else _one_hot(x, p.shape[-1], p.device)  # (V,)
        r = float(torch.rand(1, generator=generator, device=generator.device))
        if r * float(q_i[x]) < float(p[i, x]):                # accept x with probability min(1, p(x) / q(x))
            continue
        residual = (p[i] - q_i).clamp(min=0)                  # rejected: draw from normalize(max(0, p - q))
        return i, _draw(residual if residual.sum() > 0 else p[i], generator)
    return len(drafted), _draw(p[len(drafted)], generator)    # all accepted: the bonus comes from p_{k+1}


def _one_hot(x: int, size: int, device: torch.device) -> torch.Tensor:
    return torch.zeros(size, device=device).index_fill_(0, torch.tensor([x], device=device), 1.0)


def _draw(weights: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(weights, 1, generator=generator))   # multinomial normalises the weights


# --- one run's state -------------------------------------------------------------------------------

@dataclass
class _Run:
    lm: LoadedModel
    request: GenerationRequest
    n_prompt: int
    tokens: list[int]             # prompt and answer so far
    cache: DynamicCache
    stream: TextStream
    generator: torch.Generator
    eos: set[int]
    kept: KeptInputs | None = None  # the target's hidden states the run keeps
    digest: Any = field(default_factory=hashlib.sha256)   # every emitted token's logits row, as the batch hashes it

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.n_prompt

    def hash_row(self, logits: torch.Tensor) -> None:
        """The target's logits row (V,) a token was picked from, as float32 bytes (engine.serving.batch.hash_rows:
        a speculative run's `logits_sha256` is a plain run's when the rows are bitwise the same)."""
        self.digest.update(logits.detach().to(device="cpu", dtype=torch.float32).contiguous().numpy())

    def pick(self, logits: torch.Tensor) -> tuple[int, torch.Tensor]:
        r = self.request
        return sample(logits, r.temperature, r.top_k, r.top_p, self.generator)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """(T, V) logits -> (T, V) probabilities under the request's filters (T=1 shown at temperature 0)."""
        r = self.request
        return logits_to_probs(logits, r.temperature if r.temperature > 0 else 1.0, r.top_k, r.top_p)


@dataclass
class _Tally:
    rounds: int = 0
    emitted: int = 0
    drafted_at: list[int] = field(default_factory=list)     # [j]: rounds that drafted position j
    accepted_at: list[int] = field(default_factory=list)    # [j]: rounds that accepted position j
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0

    def add(self, rec: SpecRoundRecord) -> None:
        self.rounds, self.emitted = self.rounds + 1, self.emitted + len(rec.emitted)
        self.draft_seconds += rec.draft_seconds
        self.verify_seconds += rec.verify_seconds
        for j in range(len(rec.drafted)):
            if j == len(self.drafted_at):
                self.drafted_at.append(0)
                self.accepted_at.append(0)
            self.drafted_at[j] += 1
            self.accepted_at[j] += int(j < rec.accepted)


# --- the loop ----------------------------------------------------------------------------------------

def speculative_generate(target: LoadedModel, request: GenerationRequest, draft: Draft, k: int = 4,
                         policy: CapturePolicy = CAPTURE_OFF,
                         should_stop: Callable[[], bool] | None = None,
                         ids: list[int] | None = None, kept: KeptInputs | None = None) -> Iterator[SpecRecord]:
    """Yield a PrefillRecord, one SpecRoundRecord per draft/verify round, and a SpecDoneRecord.

    `kept` receives the target's hidden states that `policy` keeps, every position (a verify pass writes its drafts'
    positions; the rejected ones are dropped after it). `ids`: the prompt as the door (Scheduler.submit)
    checked and tokenized it; None admits the request here. Close the generator (or make `should_stop`
    return True) to cancel; both caches belong to this run, so the shared models are ready at once.
    """
    ids = admit(target, request) if ids is None else ids
    if not 1 <= k <= MAX_K:
        raise InvalidRequestError(f"k (tokens drafted per round) must be 1 to {MAX_K}")
    draft.check(target, len(ids), request.max_new_tokens)
    run = _Run(target, request, len(ids), list(ids), DynamicCache(config=target.model.config),
               TextStream(target.tokenizer), torch.Generator(device=target.device).manual_seed(request.seed),
               eos_ids(target))
    drafter, tally = draft.start(), _Tally()
    run.kept = kept if kept is not None else kept_for(target, policy, len(ids) + request.max_new_tokens + k)
    with torch.inference_mode():
        t0 = time.perf_counter()
        prefill = _prefill(run)
        yield prefill
        reason = finish_reason(prefill.token.id, run.stream.text, run.eos, request, 1)
        while reason is None:
            if should_stop is not None and should_stop():
                reason = "cancelled"
                break
            rec, reason = _round(run, drafter, k, tally.rounds + 1)
            tally.add(rec)
            yield rec
    yield _summary(run, draft, k, tally, reason, prefill.seconds, time.perf_counter() - t0)


def _prefill(run: _Run) -> PrefillRecord:
    """The target reads the prompt and samples the first token, exactly as plain generation does."""
    t = time.perf_counter()
    logits = forward(run.lm, run.tokens, run.cache, run.kept)
    token = pick_token(run.lm, logits, run.request, run.generator, run.stream)
    sync(run.lm.device)
    seconds = time.perf_counter() - t
    run.hash_row(logits)
    run.tokens.append(token.id)
    return PrefillRecord(prompt_pieces(run.lm, run.tokens[:run.n_prompt]), forward_shapes(run.lm.spec, run.n_prompt),
                         seconds, cache_state(run.cache), token)


def _round(run: _Run, drafter: Drafter, k: int, number: int) -> tuple[SpecRoundRecord, str | None]:
    """Draft up to k tokens, verify them in one target pass, keep the agreeing prefix plus the target's token."""
    k_round = min(k, run.request.max_new_tokens - run.generated - 1)   # never draft past max_new_tokens
    t0 = time.perf_counter()
    proposal = drafter.propose(run.tokens, k_round, run.pick)
    sync(run.lm.device)
    t1 = time.perf_counter()
    start = run.cache.get_seq_length()                                # every token so far but the newest
    assert start == len(run.tokens) - 1, (start, len(run.tokens))
    fed = [run.tokens[-1], *proposal.tokens]  # [last accepted, d_1..d_k]: one target pass scores all k
    logits = forward(run.lm, fed, run.cache, run.kept, keep=len(fed))  # (k+1, V)
    probs = run.probs(logits)                                         # (k+1, V)
    n_ok, bonus_id = accept(proposal.tokens, proposal.probs, logits, probs, run.request.temperature, run.generator)
    emitted, reason = _emit(run, logits, probs, [*proposal.tokens[:n_ok], bonus_id])
    crop_to(run.cache, start + len(emitted))                          # drop the rejected positions' K/V
    if run.kept is not None:
        run.kept.rewind(start + len(emitted))                         # and their residual
    drafter.rollback(len(run.tokens) - 1)
    sync(run.lm.device)
    t2 = time.perf_counter()
    bonus = emitted[n_ok] if len(emitted) > n_ok else describe_token(run.lm, logits[n_ok], probs[n_ok], bonus_id,
                                                                   run.lm.tokenizer.decode([bonus_id]))
    record = SpecRoundRecord(number, _drafted(run, proposal, probs, n_ok), n_ok, bonus, emitted, t1 - t0, t2 - t1,
                             cache_state(run.cache), drafter.cache_length, proposal.fed)
    return record, reason


def _emit(run: _Run, logits: torch.Tensor, probs: torch.Tensor,
          new: list[int]) -> tuple[list[SampledToken], str | None]:
    """Append the round's tokens one by one, stopping exactly where plain decoding would stop."""
    emitted: list[SampledToken] = []
    for i, token_id in enumerate(new):
        emitted.append(describe_token(run.lm, logits[i], probs[i], token_id, run.stream.push(token_id)))
        run.hash_row(logits[i])
        run.tokens.append(token_id)
        reason = finish_reason(token_id, run.stream.text, run.eos, run.request, run.generated)
        if reason is not None:
            return emitted, reason
    return emitted, None


def _drafted(run: _Run, proposal: Proposal, probs: torch.Tensor, n_ok: int) -> list[DraftedToken]:
    decode = run.lm.tokenizer.decode
    rows = []
    for i, x in enumerate(proposal.tokens):
        q = float(proposal.probs[i, x]) if proposal.probs is not None else 1.0
        rows.append(DraftedToken(x, decode([x]), q, float(probs[i, x]), i < n_ok))
    return rows


def _summary(run: _Run, draft: Draft, k: int, tally: _Tally, reason: str, ttft: float, total: float) -> SpecDoneRecord:
    drafted, accepted = sum(tally.drafted_at), sum(tally.accepted_at)
    return SpecDoneRecord(
        trim_stop(run.stream.text, run.request.stop), reason, run.n_prompt, run.generated, ttft, total - ttft, total,
        draft=draft.label, k=k, rounds=tally.rounds, target_passes=1 + tally.rounds, drafted=drafted,
        accepted=accepted, acceptance_rate=accepted / drafted if drafted else 0.0,
        acceptance_by_position=[a / d for a, d in zip(tally.accepted_at, tally.drafted_at)],
        tokens_per_pass=tally.emitted / tally.rounds if tally.rounds else 0.0,
        draft_seconds=tally.draft_seconds, verify_seconds=tally.verify_seconds, logits_sha256=run.digest.hexdigest())


# --- target pieces ------------------------------------------------------------------------------------

# --- command line helpers -----------------------------------------------------------------------------

def draft_from_spec(text: str, target: LoadedModel, load: Callable[..., LoadedModel] = load_model) -> Draft:
    """Parse 'ngram' (or 'ngram:N', N the largest n-gram), 'early-exit:N', or a model folder / extra ('qwen-0.5b')."""
    spec = text.strip()
    if spec == "ngram" or spec.startswith("ngram:"):
        return NgramDraft(_int_after(spec, "ngram", default=3))
    if spec.startswith(("early-exit", "early_exit")):
        layers = _int_after(spec.replace("_", "-"), "early-exit", default=None)
        check_depth(layers, len(target.model.model.layers))
        return EarlyExitDraft(target.model, layers)
    draft_lm = load(spec, device=str(target.device), dtype=target.dtype)
    check_vocabulary(target, draft_lm)
    return ModelDraft(draft_lm)


def _int_after(spec: str, name: str, default: int | None) -> int:
    _, _, value = spec.partition(":")
    if not value and default is not None:
        return default
    if not value.strip().isdigit():
        raise InvalidRequestError(f"cannot read {spec!r}; write {name}:N with a whole number N")
    return int(value)


def record_to_json(record: SpecRecord, with_captures: bool = False, with_logits: bool = False) -> dict[str, Any]:
    """Plain JSON-able dict; round records also carry `n_drafted` and `n_accepted` counts."""
    data = to_json(record, with_captures=with_captures)
    if isinstance(record, SpecRoundRecord):
        data["n_drafted"], data["n_accepted"], data["n_emitted"] = (len(record.drafted), record.accepted,
                                                                   len(record.emitted))
    return data if with_logits else _drop_logits(data)


def _drop_logits(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_logits(v) for k, v in value.items() if k not in ("logit_ids", "logits")}
    if isinstance(value, list):
        return [_drop_logits(v) for v in value]
    return value
