"""The generation loop: prefill once, then decode one token at a time, yielding a record per step.

    records = generate(lm, GenerationRequest("Why is the sky blue?"), kept=kept)
    for rec in records: ...   # PrefillRecord, DecodeRecord..., DoneRecord

What a run captures is the residual stream: each pass writes its hidden states into `kept` (engine/core/kept.py);
every view is derived from them afterwards (engine/core/views.py).

Cache positions are counted from the cache object (`cache.get_seq_length()`), never guessed.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, Callable, Generator, Iterator

import numpy as np
import torch
from tokenizers.decoders import DecodeStream
from transformers import DynamicCache

from engine.projection.card import forward_shapes
from engine.errors import ContextLengthError, InvalidRequestError
from engine.core.hooks import CAPTURE_OFF, CapturePolicy
from engine.core.kernels.glue import glue_kernel
from engine.core.kept import KeptInputs, kept_for
from engine.core.lean import one_forward
from engine.core.loader import LoadedModel
from engine.core.openmp import one_thread
from engine.core.records import (CacheState, Candidate, DecodeRecord, DoneRecord, Piece, PrefillRecord, Record,
                                 SampledToken)
from engine.core.sampling import logits_to_probs
from engine.core.token_bytes import decodes_as_its_backend, token_texts
from engine.core.views import derive_captures

KEEP_LOGITS = 256       # raw logits stored per token so pages can re-draw the distribution
TOP_CANDIDATES = 10     # alternatives listed per token
MAX_PROMPT_CHARS = 200_000
MAX_NEW_TOKENS = 4096


@dataclass(frozen=True)
class GenerationRequest:
    prompt: str
    max_new_tokens: int = 64
    temperature: float = 0.0     # 0 = greedy
    top_k: int = 0               # 0 = off
    top_p: float = 1.0           # 1 = off
    seed: int = 0
    stop: tuple[str, ...] = ()
    chat: bool = True            # apply the chat template when the model has one
    system: str | None = None
    history: tuple[tuple[str, str], ...] = ()   # earlier turns (role, text) before `prompt`, the last user turn
    logits_sha256: bool = False  # a checksum of every step's logits at the end (DoneRecord.logits_sha256; the batch
    #                              runner keeps one for every request while the invariant mode is on)


ROLES = ("system", "user", "assistant")

_TYPES = {"prompt": (str,), "max_new_tokens": (Integral,), "temperature": (Real,), "top_k": (Integral,),
          "top_p": (Real,), "seed": (Integral,), "chat": (bool,), "system": (str, type(None)),
          "logits_sha256": (bool,)}
_WORDS = {Integral: "a whole number", Real: "a number", str: "text", bool: "true or false", type(None): "empty"}
MAX_STOPS, MAX_STOP_CHARS = 8, 200
MAX_TURNS = 256


def check_types(request: Any) -> None:
    """Refuse a request whose fields have the wrong type (a float token count, a text temperature...)."""
    if not isinstance(request, GenerationRequest):
        raise InvalidRequestError("a request must be a GenerationRequest")
    for name, kinds in _TYPES.items():
        value = getattr(request, name)
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            wanted = " or ".join(_WORDS.get(k, k.__name__) for k in kinds)
            raise InvalidRequestError(f"{name.replace('_', ' ')} must be {wanted}, not {type(value).__name__}")
    stops = request.stop
    if not isinstance(stops, (tuple, list)) or not all(isinstance(x, str) for x in stops):
        raise InvalidRequestError("stop must be a list of strings")
    if len(stops) > MAX_STOPS or any(len(x) > MAX_STOP_CHARS for x in stops):
        raise InvalidRequestError(f"at most {MAX_STOPS} stop strings of up to {MAX_STOP_CHARS} characters each")
    _check_text(request.system, "the system prompt")
    for x in stops:
        _check_text(x, "a stop string")
    check_history(request.history)


def check_history(history: Any) -> None:
    """Earlier turns of a conversation: (role, text) pairs with a known role."""
    if not isinstance(history, (tuple, list)) or len(history) > MAX_TURNS:
        raise InvalidRequestError(f"a conversation may have at most {MAX_TURNS} earlier turns")
    for turn in history:
        if not (isinstance(turn, (tuple, list)) and len(turn) == 2 and all(isinstance(x, str) for x in turn)):
            raise InvalidRequestError("each earlier turn must be a role and its text")
        if turn[0] not in ROLES:
            raise InvalidRequestError(f"a turn's role must be one of {', '.join(ROLES)}, not {turn[0][:20]!r}")
        _check_text(turn[1], f"a {turn[0]} turn")


def history_chars(request: GenerationRequest) -> int:
    return sum(len(text) for _, text in request.history)

def _check_text(text: str | None, what: str) -> None:
    if text is None:
        return
    if len(text) > MAX_PROMPT_CHARS:
        raise InvalidRequestError(f"{what} has {len(text):,} characters; the limit is {MAX_PROMPT_CHARS:,}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise InvalidRequestError(f"{what} holds text that is not valid Unicode ({err.reason})") from None


def validate(request: GenerationRequest) -> None:
    """Reject out-of-range settings with a message that names the setting."""
    check_types(request)
    if not request.prompt.strip():
        raise InvalidRequestError("the prompt is empty; type something for the model to continue")
    _check_text(request.prompt, "the prompt")
    checks = [
        (1 <= request.max_new_tokens <= MAX_NEW_TOKENS, f"max new tokens must be 1 to {MAX_NEW_TOKENS}"),
        (0.0 <= request.temperature <= 10.0, "temperature must be between 0 and 10"),  # also refuses NaN
        (request.top_k >= 0, "top-k must be 0 (off) or positive"),
        (0.0 < request.top_p <= 1.0, "top-p must be above 0 and at most 1"),
        (0 <= request.seed < 2**63, "the seed must be a non-negative integer"),
    ]
    for ok, message in checks:
        if not ok:
            raise InvalidRequestError(message)


def encode_prompt(lm: LoadedModel, request: GenerationRequest) -> list[int]:
    """Token ids of the prompt, through the chat template for instruct models unless asked not to."""
    tok = lm.tokenizer
    if request.chat and lm.has_chat_template:
        messages = ([{"role": "system", "content": request.system}] if request.system else [])
        messages += [{"role": role, "content": text} for role, text in request.history]
        messages.append({"role": "user", "content": request.prompt})
        text = chat_text(tok, messages)
        ids = tok(text, add_special_tokens=False)["input_ids"]
    elif request.history:
        raise InvalidRequestError(f"{lm.label} has no chat template, so a conversation cannot be laid out for it; "
                                  "send the text as one prompt")
    else:
        ids = tok(request.prompt)["input_ids"]
    if not ids:
        raise InvalidRequestError("the prompt encodes to no tokens for this model's tokenizer")
    return ids


def chat_text(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """The model's own chat template over the messages; a template that refuses them is a message, not a crash."""
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as err:  # noqa: BLE001 - jinja's TemplateError and friends: the template's own rules
        raise InvalidRequestError(f"the model's chat template refused these messages: {str(err)[:200]}") from None


def admit(lm: LoadedModel, request: GenerationRequest) -> list[int]:
    """The door for a caller without a scheduler: check the request and tokenize it, once; its ids go down."""
    validate(request)
    ids = encode_prompt(lm, request)
    check_context(lm, len(ids), request.max_new_tokens)
    return ids


def check_context(lm: LoadedModel, n_prompt: int, max_new_tokens: int) -> None:
    limit = lm.spec.max_context
    if n_prompt > limit:
        raise ContextLengthError(f"the prompt is {n_prompt:,} tokens; {lm.label} reads at most {limit:,}")
    if n_prompt + max_new_tokens > limit:
        raise ContextLengthError(
            f"{n_prompt:,} prompt tokens + {max_new_tokens:,} new tokens exceed the {limit:,}-token context; "
            f"ask for at most {limit - n_prompt:,} new tokens")


def eos_ids(lm: LoadedModel) -> set[int]:
    ids = lm.model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, (list, tuple)) else [ids] if ids is not None else [])
    if lm.tokenizer.eos_token_id is not None:
        ids.add(lm.tokenizer.eos_token_id)
    return ids


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def forward(lm: LoadedModel, ids: list[int], cache: DynamicCache, kept: KeptInputs | None = None,
            keep: int | None = None) -> torch.Tensor:
    """Run the model over new token ids after what the cache holds; with `kept`, write the hidden states it keeps
    (the residual stream) at these positions. The project's forward (engine/core/lean.py) where it covers the model,
    else transformers' modules.

    Returns the last position's logits (V,), or with `keep` the last `keep` positions' (keep, V).
    """
    lean = one_forward(lm)
    if lean is not None:
        logits = lean.on_cache(ids, cache, kept, keep or 1)                        # (keep, V)
        return logits if keep else logits[-1]
    start = cache.get_seq_length()
    input_ids = torch.tensor([ids], device=lm.device)                              # [1, T]
    positions = torch.arange(start, start + len(ids), device=lm.device)            # [T]
    out = lm.model(input_ids=input_ids, position_ids=positions[None], cache=cache, use_cache=True,
                   logits_to_keep=keep or 1, output_hidden_states=list(kept.layers) if kept is not None else False)
    if kept is not None:                                                           # hidden_states[i]: [1, T, d_model]
        kept.write_states(start, [h[0] if h is not None else None for h in out.hidden_states])
        kept.commit()
    logits = out.logits[0]                                                         # (keep, V)
    return logits if keep else logits[-1]


def cache_state(cache: DynamicCache) -> CacheState:
    per_layer = [layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size()
                 for layer in cache.layers if getattr(layer, "keys", None) is not None]
    return CacheState(cache.get_seq_length(), sum(per_layer), per_layer)


class TextStream:
    """Turns token ids into text pieces, holding back bytes of a character that is not complete yet.

    After each push, `text` is `tokenizer.decode(ids, skip_special_tokens=True)` (as of the last push whose text
    did not end inside a character). The pieces come from tokenizers' own incremental decoder (`DecodeStream`, as
    TGI and vLLM use it), a few tokens' work per push. Decoding the whole answer at every push instead costs a
    step of 30 rows about 1 ms of host time at 128 tokens, and grows with the answer. The whole decode is kept for
    what DecodeStream does not do the same way: a tokenizer whose decode is more than its Rust backend's (none, or
    tidying spaces afterwards: `decodes_as_its_backend`), and byte sequences DecodeStream refuses (it raises on
    some invalid UTF-8 from byte-fallback tokenizers); from that push on, the stream decodes whole.
    """

    def __init__(self, tokenizer: Any):
        self.tokenizer, self.ids, self.text = tokenizer, [], ""
        plain = decodes_as_its_backend(tokenizer)
        self._incremental = (DecodeStream(skip_special_tokens=True), tokenizer._tokenizer) if plain else None

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        if self._incremental is not None:
            stream, backend = self._incremental
            try:
                piece = stream.step(backend, token_id) or ""
            except Exception:  # noqa: BLE001 - tokenizers raises a bare Exception; decode whole from here on
                self._incremental = None
            else:
                self.text += piece
                return piece
        full = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if full.endswith("\ufffd"):
            return ""
        piece, self.text = full[len(self.text):], full
        return piece


PICK_IN_C = True       # False: every row takes torch's path (bench/lone_parts.py's "no-pick" way times both in one run)


def pick_token(lm: LoadedModel, logits: torch.Tensor, request: GenerationRequest,
               generator: torch.Generator, stream: TextStream) -> SampledToken:
    """Sample one token from logits (V,) and describe it with its alternatives (`pick_tokens` for one row)."""
    return pick_tokens(lm, logits[None], [request], [generator], [stream])[0]


def describe_token(lm: LoadedModel, logits: torch.Tensor, probs: torch.Tensor, token_id: int,
                   text: str) -> SampledToken:
    """A SampledToken for a chosen token: its probability, alternatives and kept raw logits; (V,) inputs."""
    return describe_tokens(lm, logits[None], probs[None], [token_id], [text])[0]


def pick_tokens(lm: LoadedModel, logits: torch.Tensor, requests: list[GenerationRequest],
                generators: list[torch.Generator], streams: list[TextStream]) -> list[SampledToken]:
    """`pick_token` for every row of a batched step's logits (B, V) at once: the same filtering and draws, with
    one softmax per group of rows that filter alike (row by row, this and the descriptions cost a batched decode
    step about a tenth of its time on a CPU); each row draws with its own generator. A greedy row with no filter,
    in float32 on a CPU, is picked and described by glue.c in two passes over its logits (`quick_facts`), whatever
    the other rows: the same row gets the same description alone or in any batch; where every row is, straight
    from numpy (`quick_tokens`). On a CPU on the calling thread alone (`one_thread`: a few hundred microseconds of
    work, which parallel regions only delay)."""
    quick = quick_rows(logits, requests)
    if all(quick):
        return quick_tokens(lm, logits, streams)
    with one_thread(logits.device):
        parts = []
        if any(quick):
            rows = [b for b, q in enumerate(quick) if q]
            parts.append((rows, quick_facts(logits[rows])))
        rows = [b for b, q in enumerate(quick) if not q]
        parts.append((rows, torch_facts(logits if not any(quick) else logits[rows], [requests[b] for b in rows],
                                        [generators[b] for b in rows])))
        facts = merged(parts, len(requests))
        ids = facts["ids"].tolist()
        return tokens_from(lm, facts_to_host(facts), [stream.push(i) for stream, i in zip(streams, ids)])


def quick_rows(logits: torch.Tensor, requests: list[GenerationRequest]) -> list[bool]:
    """Per row, whether glue.c picks and describes it: float32 logits on a CPU, glue.c built, a greedy request whose
    description is the plain softmax (no top-k, no top-p)."""
    if (not PICK_IN_C or logits.device.type != "cpu" or logits.dtype != torch.float32 or logits.stride(-1) != 1
            or glue_kernel() is None):
        return [False] * len(requests)
    vocab = logits.shape[-1]
    return [r.temperature <= 0 and (r.top_k == 0 or r.top_k >= vocab) and r.top_p >= 1.0 for r in requests]


def quick_arrays(logits: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Greedy rows (B, V) with no filter through glue.c's pick_row: the kept logits' ids [B, K] and values [B, K]
    ranked (the first the greedy token: the largest, the lowest id among equal ones, as argmax gives it; torch's
    top-k may rank equal logits otherwise), pick_row's stats [B, 3], and the shown candidates' probabilities [B, W],
    exp(logit - log-sum-exp) in float64 rounded to float32 (a softmax's, its sum in another order: within 1e-6,
    tests/test_pick.py). The one computation behind `quick_facts` and `quick_tokens`."""
    vocab = logits.shape[-1]
    ids, values, stats = glue_kernel().pick(logits, min(KEEP_LOGITS, vocab))
    probs = np.exp(values[:, :min(TOP_CANDIDATES, vocab)].astype(np.float64) - stats[:, :1]).astype(np.float32)
    return ids, values, stats, probs


def quick_facts(logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """`token_facts` of greedy rows (B, V) with no filter (`quick_arrays`), as torch tensors, for a batch whose other
    rows take torch's path (`merged`)."""
    vocab = logits.shape[-1]
    ids, values, stats, probs = (torch.from_numpy(a) for a in quick_arrays(logits))
    facts = {"ids": ids[:, 0].clone(), "top_ids": ids[:, :probs.shape[1]].contiguous(), "top_probs": probs,
             "kept_ids": ids, "kept_values": values, "chosen_probs": probs[:, 0].clone(),
             "chosen_logits": values[:, 0].clone()}
    if vocab > ids.shape[1]:
        facts["rest"] = stats[:, 2].float()
    facts["vocab"] = torch.tensor(vocab)
    return facts


def quick_tokens(lm: LoadedModel, logits: torch.Tensor, streams: list[TextStream]) -> list[SampledToken]:
    """`tokens_from(quick_facts(...))` where every row is greedy with no filter: the same SampledTokens, bit for bit
    (tests/test_pick.py), made from `quick_arrays`' numpy arrays with no torch operator between them. A lone step's
    pick runs after the weights have streamed through every cache, where each operator, the first of its kind, took
    tens of microseconds: the facts' twenty-odd made ~0.3 ms of a token (docs/engine.md, "A token in one call")."""
    ids, values, stats, probs = quick_arrays(logits)
    width, count = probs.shape[1], logits.shape[-1] - ids.shape[1]
    names = token_texts(lm.tokenizer, ids[:, :width].ravel().tolist())
    chosen, top, chosen_logits = ids[:, 0].tolist(), probs.tolist(), values[:, 0].tolist()
    rests = stats[:, 2].astype(np.float32).tolist() if count > 0 else [math.nan] * len(chosen)
    tokens = []
    for b, (stream, rest) in enumerate(zip(streams, rests)):
        shown = ids[b, :width].tolist()
        candidates = [Candidate(i, t, p) for i, t, p in zip(shown, names[b * width:(b + 1) * width], top[b])]
        tokens.append(SampledToken(chosen[b], stream.push(chosen[b]), top[b][0], candidates, ids[b], values[b],
                                   *((rest, count) if math.isfinite(rest) else (None, 0)), chosen_logits[b]))
    return tokens


def torch_facts(logits: torch.Tensor, requests: list[GenerationRequest],
                generators: list[torch.Generator]) -> dict[str, torch.Tensor]:
    """Each row's token drawn (or its argmax, greedy) from its filtered probabilities, and its `token_facts`."""
    probs = filtered_probs(logits, requests)
    greedy = greedy_ids(logits) if any(r.temperature <= 0 for r in requests) else []
    ids = [greedy[b] if r.temperature <= 0 else int(torch.multinomial(probs[b], 1, generator=generators[b]))
           for b, r in enumerate(requests)]
    return token_facts(logits, probs, torch.tensor(ids, device=logits.device))


def merged(parts: list[tuple[list[int], dict[str, torch.Tensor]]], rows: int) -> dict[str, torch.Tensor]:
    """Facts of row subsets (each part's rows, in order) as one batch's facts, row b where it was."""
    if len(parts) == 1:
        return parts[0][1]
    out = {}
    for key, value in parts[0][1].items():
        if key == "vocab":
            out[key] = value
            continue
        whole = torch.empty((rows, *value.shape[1:]), dtype=value.dtype, device=value.device)
        for index, facts in parts:
            whole[torch.tensor(index, device=value.device)] = facts[key].to(value.dtype)
        out[key] = whole
    return out


def filtered_probs(logits: torch.Tensor, requests: list[GenerationRequest]) -> torch.Tensor:
    """Each row's probabilities (B, V) after its request's temperature, top-k and top-p (greedy rows as at
    temperature 1, as `sample` describes them): one softmax for each group of rows that filter alike, over the
    logits themselves when every row does."""
    groups: dict[tuple[float, int, float], list[int]] = {}
    for b, r in enumerate(requests):
        groups.setdefault((r.temperature if r.temperature > 0 else 1.0, r.top_k, r.top_p), []).append(b)
    if len(groups) == 1:
        return logits_to_probs(logits, *next(iter(groups)))
    probs = torch.empty(logits.shape, dtype=torch.promote_types(logits.dtype, torch.float32), device=logits.device)
    for (temperature, top_k, top_p), rows in groups.items():
        index = torch.tensor(rows, device=logits.device)
        probs[index] = logits_to_probs(logits[index], temperature, top_k, top_p)
    return probs


def greedy_ids(logits: torch.Tensor) -> list[int]:
    """Each row's largest logit's id (B, V) -> [B], the first where several are equal, as torch.argmax gives it.
    On a CPU through numpy's argmax, which is vectorised: torch's took 42 us a row of 49,152 logits here, numpy's 4."""
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64):
        return logits.detach().numpy().argmax(-1).tolist()
    return torch.argmax(logits, dim=-1).tolist()


def describe_tokens(lm: LoadedModel, logits: torch.Tensor, probs: torch.Tensor, ids: list[int],
                    texts: list[str]) -> list[SampledToken]:
    """`describe_token` for each row of logits and probs (B, V): one top-k over every row and one tokenizer call
    for every row's alternatives."""
    chosen = torch.tensor(ids, device=logits.device)
    return tokens_from(lm, facts_to_host(token_facts(logits, probs, chosen)), texts)


def token_facts(logits: torch.Tensor, probs: torch.Tensor, chosen: torch.Tensor) -> dict[str, torch.Tensor]:
    """What describes each row's chosen token (B,), computed where the logits (B, V) are, without waiting on them:
    the top candidates, the kept raw logits, the log-sum-exp of the rest, the chosen token's probability and
    logit. `facts_to_host` brings them over, `tokens_from` makes the SampledTokens.

    One top-k over the logits serves all: the kept logits are its first KEEP_LOGITS, the one after them is the
    largest of the rest (the shift of the rest's log-sum-exp), and the top candidates are its first TOP_CANDIDATES,
    since whatever the filter, a token's probability never falls as its logit rises (temperature, top-k and top-p
    keep the order, and tokens filtered out have 0); their probabilities are read from `probs`."""
    with one_thread(logits.device):           # the same sums, in the same order, whoever calls
        return _token_facts(logits, probs, chosen)


def _token_facts(logits: torch.Tensor, probs: torch.Tensor, chosen: torch.Tensor) -> dict[str, torch.Tensor]:
    vocab = logits.shape[-1]
    width = min(KEEP_LOGITS, vocab)
    top = torch.topk(logits.float(), min(width + 1, vocab), dim=-1)             # (B, width [+ 1])
    kept_ids, kept_values = top.indices[:, :width].contiguous(), top.values[:, :width].contiguous()
    shown = kept_ids[:, :min(TOP_CANDIDATES, vocab)].contiguous()
    facts = {"ids": chosen, "top_ids": shown, "top_probs": probs.gather(-1, shown), "kept_ids": kept_ids,
             "kept_values": kept_values, "chosen_probs": probs.gather(-1, chosen[:, None])[:, 0],
             "chosen_logits": logits.gather(-1, chosen[:, None])[:, 0].float()}
    if vocab > width:
        facts["rest"] = rest_logsumexp(logits.float(), kept_ids, top.values[:, width:])
    facts["vocab"] = torch.tensor(vocab)
    return facts


def rest_logsumexp(logits: torch.Tensor, kept_ids: torch.Tensor, largest: torch.Tensor) -> torch.Tensor:
    """log Σ exp of each row's logits (B, V) other than kept_ids (B, K) -> (B,), where `largest` (B, 1) is the largest
    of them: shifted by it as torch.logsumexp shifts, the kept ones' terms zeroed. One pass to exponentiate and
    one to sum, where logsumexp over a copy with the kept ones at -inf takes five; the same value but for the
    order of the float32 sum."""
    terms = (logits - largest).exp_()                                           # (B, V), at most 1 outside kept_ids
    terms.scatter_(-1, kept_ids, 0.0)
    return terms.sum(dim=-1).log_() + largest[:, 0]


def facts_to_host(facts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The facts on the CPU."""
    return {k: v.to("cpu") for k, v in facts.items()}


def tokens_from(lm: LoadedModel, facts: dict[str, torch.Tensor], texts: list[str]) -> list[SampledToken]:
    """SampledTokens from facts on the host (see `token_facts`), one tokenizer call for every row's alternatives."""
    ids, top_ids, top_probs = facts["ids"].tolist(), facts["top_ids"].tolist(), facts["top_probs"].tolist()
    width, count = len(top_ids[0]), int(facts["vocab"]) - facts["kept_ids"].shape[-1]
    names = token_texts(lm.tokenizer, [i for row in top_ids for i in row])
    rests = [(r, count) if math.isfinite(r) else (None, 0) for r in facts["rest"].tolist()] if "rest" in facts \
        else [(None, 0)] * len(ids)
    chosen_probs, chosen_logits = facts["chosen_probs"].tolist(), facts["chosen_logits"].tolist()
    kept_ids, kept_values = facts["kept_ids"].numpy(), facts["kept_values"].numpy()
    return [SampledToken(ids[b], texts[b], chosen_probs[b],
                         [Candidate(i, t, p) for i, t, p in zip(top_ids[b], names[b * width:(b + 1) * width],
                                                                top_probs[b])],
                         kept_ids[b], kept_values[b], *rests[b], chosen_logits[b])
            for b in range(len(ids))]


def prompt_pieces(lm: LoadedModel, ids: list[int]) -> list[Piece]:
    return [Piece(i, text) for i, text in zip(ids, token_texts(lm.tokenizer, ids))]


def generate(lm: LoadedModel, request: GenerationRequest, policy: CapturePolicy = CAPTURE_OFF,
             should_stop: Callable[[], bool] | None = None, ids: list[int] | None = None,
             kept: KeptInputs | None = None) -> Iterator[Record]:
    """Yield a PrefillRecord, one DecodeRecord per further token, and a DoneRecord.

    `ids`: the prompt as the door (Scheduler.submit) checked and tokenized it; None admits the request here.
    `kept`: where the hidden states the run keeps go, every position (engine/core/kept.py); without one, a policy
    that captures keeps them in buffers made here, which go with the generator (`generate_kept` returns them).
    Close the generator (or make `should_stop` return True) to cancel; the model is ready at once.
    """
    ids = admit(lm, request) if ids is None else ids
    kept = kept if kept is not None else kept_for(lm, policy, len(ids) + request.max_new_tokens)
    cache = DynamicCache(config=lm.model.config)
    with torch.inference_mode():
        done = yield from generation_loop(lm, request, ids, lambda: forward(lm, ids, cache, kept),
                                          lambda token: forward(lm, [token], cache, kept),
                                          lambda: cache_state(cache), should_stop)
    yield done


def generate_kept(lm: LoadedModel, request: GenerationRequest, policy: CapturePolicy,
                  ids: list[int] | None = None) -> tuple[list[Record], KeptInputs | None]:
    """A whole run and what it kept (the hidden states `policy` names), for a caller that derives views from them."""
    ids = admit(lm, request) if ids is None else ids
    kept = kept_for(lm, policy, len(ids) + request.max_new_tokens)
    return list(generate(lm, request, policy, ids=ids, kept=kept)), kept


def generate_captured(lm: LoadedModel, request: GenerationRequest, policy: CapturePolicy,
                      ids: list[int] | None = None) -> list[Record]:
    """A whole run with the captures `policy` names derived into its records (engine/core/views.py), as a file
    holds them."""
    records, kept = generate_kept(lm, request, policy, ids)
    return derive_captures(lm.model, kept, records, policy)


Pass = torch.Tensor     # a forward pass: logits (V,) of its newest position


def generation_loop(lm: LoadedModel, request: GenerationRequest, ids: list[int], prefill: Callable[[], Pass],
                    decode: Callable[[int], Pass], cache_now: Callable[[], CacheState],
                    should_stop: Callable[[], bool] | None) -> Generator[Record, None, DoneRecord]:
    """Prefill, then one decode step per token until a finish reason; yields their records, returns the DoneRecord.

    `prefill()` runs the prompt, `decode(token)` one token after it, each returning the logits (V,) of the newest
    position; `cache_now()` is the cache's state. `generate`'s loop (a DynamicCache).
    """
    generator = torch.Generator(device=lm.device).manual_seed(request.seed)
    stream, stops = TextStream(lm.tokenizer), eos_ids(lm)
    t0 = time.perf_counter()
    logits = prefill()
    token = pick_token(lm, logits, request, generator, stream)
    sync(lm.device)
    ttft = time.perf_counter() - t0
    yield PrefillRecord(prompt_pieces(lm, ids), forward_shapes(lm.spec, len(ids)), ttft, cache_now(), token)
    generated, reason = [token.id], end_reason(token.id, stream.text, stops, request, 1, should_stop)
    while reason is None:
        t = time.perf_counter()
        logits = decode(token.id)
        token = pick_token(lm, logits, request, generator, stream)
        sync(lm.device)
        generated.append(token.id)
        yield DecodeRecord(len(generated) - 1, time.perf_counter() - t, cache_now(), token)
        reason = end_reason(token.id, stream.text, stops, request, len(generated), should_stop)
    total = time.perf_counter() - t0
    return DoneRecord(trim_stop(stream.text, request.stop), reason, len(ids), len(generated), ttft, total - ttft, total)


def finish_reason(token_id: int, text: str, eos: set[int], request: GenerationRequest, n: int) -> str | None:
    """Why generation ends after the n-th token, or None to go on."""
    if token_id in eos:
        return "eos"
    if any(s and s in text for s in request.stop):
        return "stop"
    if n >= request.max_new_tokens:
        return "length"
    return None


def end_reason(token_id: int, text: str, eos: set[int], request: GenerationRequest, n: int,
               should_stop: Callable[[], bool] | None) -> str | None:
    """`finish_reason`, else "cancelled" when asked to stop: checked after each token, before the next pass."""
    reason = finish_reason(token_id, text, eos, request, n)
    if reason is None and should_stop is not None and should_stop():
        return "cancelled"
    return reason


def trim_stop(text: str, stops: tuple[str, ...]) -> str:
    cut = min((text.index(s) for s in stops if s and s in text), default=len(text))
    return text[:cut]
