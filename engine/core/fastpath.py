"""Static-cache decode, capturing inside the compiled step: the records of `engine.core.generate`, faster on a GPU.

    fast = enable_static_decode(lm)        # opt in: engine.core.generate(lm, ...) now runs this path
    records = list(generate(lm, GenerationRequest("Why is the sky blue?"), policy))

Why: an eager PyTorch decode step launches a few hundred kernels per token, one per op, so on a GPU
an eager loop waits on the CPU, far below what the memory bandwidth allows. Here the KV cache is a
preallocated `transformers.StaticCache` (fixed shapes and addresses), and on CUDA the decode step is
compiled with `torch.compile(mode="reduce-overhead")`, which records it once as a CUDA graph and then
replays it each token: one launch per step instead of hundreds.

The step is the project's one forward (engine/core/lean.py, `forward_step`) with one row on the static cache, the
function every other step runs; a family it does not cover runs transformers' modules (`model_step`). A run that
captures keeps the residual stream (engine/core/hooks.py): the forward writes the newest position's residual into a
buffer at a fixed address inside the step (the modules: `output_hidden_states`, traced into the graph), and the
run's KeptInputs copies it after the step. Nothing else is captured, so every capturing step is graph-safe.

What this path keeps beside the batch's: a static cache rounded to a power of two, so a GPU replays one graph per
bucket without a paged gather, and the pipelined greedy loop below. Both are for a GPU (opted in with
`enable_static_decode`, the command line's `--static`); the batch runner's lone step serves a lone request on a CPU.

Greedy requests that capture nothing run pipelined: each token is chosen on the device and the next step is
queued before the host describes this one, so the host's per-token work (a softmax and top-k over the vocabulary,
the tokenizer, the records) overlaps the next graph instead of leaving the GPU idle (`pipelined_loop`).

Prefill is eager (its length changes with every prompt). The cache length is rounded up to a power of
two (at least 256) so that requests of similar length reuse one cache and one compiled graph. On CPU
nothing is compiled unless asked for (`compile="default"` uses inductor; `"eager"` only traces, which
checks the step is one graph without graph breaks).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Generator, Iterator

import torch
from transformers import StaticCache

from engine.errors import EngineError
from engine.projection.card import forward_shapes
from engine.core.generate import (GenerationRequest, TextStream, admit, end_reason, eos_ids, facts_to_host,
                                  generation_loop, pick_token, prompt_pieces, sync, token_facts, tokens_from,
                                  trim_stop)
from engine.core.kept import KeptInputs
from engine.core.lean import LeanStep, PoolResidual, RowsResidual, one_forward
from engine.core.loader import LoadedModel
from engine.core.records import CacheState, DecodeRecord, DoneRecord, PrefillRecord, Record
from engine.core.sampling import logits_to_probs

COMPILE_MODES = ("auto", "off", "eager", "default", "reduce-overhead")
MIN_CACHE = 256
RECOMPILE_LIMIT = 64     # cache lengths x capture variants x models before dynamo gives up and runs eagerly


def resolve_mode(mode: str, device: torch.device) -> str:
    """'auto': CUDA graphs on CUDA, nothing compiled on CPU."""
    if mode not in COMPILE_MODES:
        raise EngineError(f"unknown compile mode {mode!r}; choose one of {', '.join(COMPILE_MODES)}")
    if mode == "auto":
        return "reduce-overhead" if device.type == "cuda" else "off"
    return mode


def cache_length(needed: int, limit: int) -> int:
    """Positions the static cache holds: the next power of two >= needed (at least 256), at most `limit`."""
    length = MIN_CACHE
    while length < needed:
        length *= 2
    return max(needed, min(length, limit))


def new_static_cache(lm: LoadedModel, length: int) -> StaticCache:
    """A StaticCache for batch 1, allocated now (not at the first update) so its addresses never move."""
    with torch.inference_mode(False):  # normal tensors: usable in and out of inference mode later
        cache = StaticCache(config=lm.model.config, max_cache_len=length)
        if hasattr(cache, "early_initialization"):
            cache.early_initialization(batch_size=1, num_heads=lm.spec.n_kv_heads, head_dim=lm.spec.head_dim,
                                       dtype=lm.dtype, device=lm.device)
    return cache


def static_cache_state(cache: StaticCache, length: int | None = None) -> CacheState:
    """Length counted by the cache object (a device read), or the `length` the caller knows it holds; bytes of the
    K and V slots that hold those positions."""
    length = int(cache.get_seq_length()) if length is None else length
    per_layer = [length * (_per_position(layer.keys) + _per_position(layer.values)) for layer in cache.layers]
    return CacheState(length, sum(per_layer), per_layer)


def _per_position(t: torch.Tensor) -> int:
    """Bytes one position takes in a [B, KVH, max_len, D] cache tensor."""
    return t.numel() // t.shape[2] * t.element_size()


def reserved_bytes(cache: StaticCache | None) -> int:
    """Bytes the static cache's tensors hold allocated, used or not."""
    if cache is None:
        return 0
    return sum(t.numel() * t.element_size() for layer in cache.layers
               for t in (getattr(layer, "keys", None), getattr(layer, "values", None)) if t is not None)


def model_step(model: Any, input_ids: torch.Tensor, positions: torch.Tensor, cache: StaticCache,
               hidden: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """One forward over input_ids [1, T] at absolute positions [T]; logits of the last position [1, 1, V], and with
    `hidden` the hidden states of the last position too [L + 1, 1, d_model] (what a capturing run keeps)."""
    out = model(input_ids=input_ids, position_ids=positions[None], cache=cache,
                use_cache=True, logits_to_keep=1, output_hidden_states=hidden)
    if not hidden:
        return out.logits
    return out.logits, torch.stack([h[:, -1] for h in out.hidden_states])


def forward_step(lean: LeanStep, input_ids: torch.Tensor, positions: torch.Tensor, cache: StaticCache,
                 resid: torch.Tensor | None = None) -> torch.Tensor:
    """The one forward (engine.core.lean) over input_ids [1, T] at absolute positions [T] on the static cache:
    logits of the last position [1, 1, V]; with `resid` [L + 1, T, d_model] (a buffer at a fixed address), the
    residual of these positions written into it inside the step (what a capturing run keeps)."""
    max_len = cache.layers[0].max_cache_len
    mask = (torch.arange(max_len, device=positions.device) <= positions[:, None])[None, None]   # [1, 1, T, max_len]
    keep = PoolResidual(resid, torch.arange(positions.shape[0], device=positions.device)) if resid is not None else None
    return lean.forward(input_ids, positions[None], lambda i, k, v: cache.update(k, v, i), mask, keep)


def _raise_recompile_limit() -> None:
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if getattr(config, name, RECOMPILE_LIMIT) < RECOMPILE_LIMIT:
            setattr(config, name, RECOMPILE_LIMIT)


class FastDecoder:
    """One static cache for a loaded model, with the decode step compiled on demand.

    Not for two requests at once: a second concurrent request gets a private eager decoder instead.
    """

    def __init__(self, lm: LoadedModel, compile: str = "auto", fullgraph: bool = True):
        self.lm = lm
        self.mode = resolve_mode(compile, lm.device)
        self.cache: StaticCache | None = None
        self.lock = threading.Lock()
        self.compile_error: str | None = None
        self.fullgraph = fullgraph
        self.lean = one_forward(lm)           # None: a family the forward does not cover runs the modules
        self.resid: torch.Tensor | None = None   # [L + 1, 1, d_model]: a capturing step's residual, fixed address
        self._step = self._build_step()

    def _build_step(self) -> Callable[..., torch.Tensor]:
        step = forward_step if self.lean is not None else model_step
        if self.mode == "off":
            return step
        _raise_recompile_limit()
        options = {"backend": "eager"} if self.mode == "eager" else {"mode": self.mode}
        return torch.compile(step, fullgraph=self.fullgraph, dynamic=False, **options)

    @property
    def graphs(self) -> bool:
        return self.mode == "reduce-overhead" and self.lm.device.type == "cuda"

    def reserve(self, needed: int) -> StaticCache:
        """A cleared cache of at least `needed` positions: the current one when its length fits the bucket."""
        length = cache_length(needed, self.lm.spec.max_context)
        if self.cache is not None and self.cache.layers[0].max_cache_len == length:
            self.cache.reset()
            return self.cache
        self.cache = None                         # free the old tensors before allocating the new ones
        self.cache = new_static_cache(self.lm, length)
        return self.cache

    def prefill(self, ids: list[int], kept: KeptInputs | None) -> torch.Tensor:
        """Eager forward over the prompt (its hidden states into `kept`); logits (V,) of its last position."""
        dev, model = self.lm.device, self.lm.model
        if self.lean is not None:
            positions = torch.arange(len(ids), device=dev)
            max_len = self.cache.layers[0].max_cache_len
            mask = (torch.arange(max_len, device=dev) <= positions[:, None])[None, None]      # [1, 1, T, max_len]
            logits = self.lean.forward(torch.tensor([ids], device=dev), positions[None],
                                       lambda i, k, v: self.cache.update(k, v, i), mask,
                                       RowsResidual([(0, kept, 0, 0)]) if kept is not None else None)
            if kept is not None:
                kept.commit()
            return logits[0, -1]
        out = model(input_ids=torch.tensor([ids], device=dev), position_ids=torch.arange(len(ids), device=dev)[None],
                    cache=self.cache, use_cache=True, logits_to_keep=1,
                    output_hidden_states=list(kept.layers) if kept is not None else False)
        if kept is not None:
            kept.write_states(0, [h[0] if h is not None else None for h in out.hidden_states])
            kept.commit()
        return out.logits[0, -1]

    def decode(self, token_id: int, position: int, kept: KeptInputs | None) -> torch.Tensor:
        """One token at `position` through the compiled step (its hidden states into `kept`); logits (V,)."""
        dev = self.lm.device
        ids, pos = torch.tensor([[token_id]], device=dev), torch.tensor([position], device=dev)   # [1, 1], [1]
        if kept is None:
            return self._compiled(ids, pos)
        logits, states = self._compiled(ids, pos, hidden=True)                        # (V,), [L + 1, 1, d_model]
        kept.write_states(position, list(states))
        kept.commit()
        return logits

    def launch(self, ids: torch.Tensor, pos: torch.Tensor, position: int) -> InFlight:
        """Queue one decode step whose token ids [1, 1] and position [1] are already on the device; waits for
        nothing. Only for runs that capture nothing (see `pipelined_loop`)."""
        return InFlight(self._compiled(ids, pos), pos, position)

    def _compiled(self, ids: torch.Tensor, pos: torch.Tensor, hidden: bool = False) -> Any:
        if self.graphs:
            torch.compiler.cudagraph_mark_step_begin()  # the previous step's outputs are consumed
        if self.lean is not None:
            return self._forward_step(ids, pos, hidden)
        if not hidden:
            return self._step(self.lm.model, ids, pos, self.cache)[0, -1]
        logits, states = self._step(self.lm.model, ids, pos, self.cache, True)
        return logits[0, -1], states

    def _forward_step(self, ids: torch.Tensor, pos: torch.Tensor, hidden: bool) -> Any:
        """The compiled forward: logits (V,), and with `hidden` the residual [L + 1, 1, d_model] it wrote."""
        if not hidden:
            return self._step(self.lean, ids, pos, self.cache)[0, -1]
        if self.resid is None:
            spec = self.lm.spec
            with torch.inference_mode(False):   # a normal tensor: written in and out of inference mode
                self.resid = torch.zeros(spec.n_layers + 1, 1, spec.d_model, dtype=self.lm.dtype, device=self.lm.device)
        logits = self._step(self.lean, ids, pos, self.cache, self.resid)
        return logits[0, -1], self.resid.clone()

    def generate(self, request: GenerationRequest, should_stop: Callable[[], bool] | None = None,
                 ids: list[int] | None = None, kept: KeptInputs | None = None) -> Iterator[Record]:
        """engine.core.generate's records from the static cache (the hidden states into `kept`); a concurrent
        request runs on a private one."""
        if not self.lock.acquire(blocking=False):
            yield from FastDecoder(self.lm, compile="off").generate(request, should_stop, ids, kept)
            return
        try:
            yield from static_generate(self, request, should_stop, ids, kept)
        finally:
            self.lock.release()

    def warm_up(self, max_new_tokens: int = 16, capture: tuple[bool, ...] = (False,), prompt: str = "Hello") -> float:
        """Compile (and record the graphs) now rather than in the first user's request; returns seconds.

        If the step cannot be compiled as one graph it is compiled with graph breaks allowed; if that
        fails too the decoder stays eager (mode 'off'). `compile_error` keeps the reason; the model
        keeps serving either way.
        """
        start = time.perf_counter()
        request = GenerationRequest(prompt, max_new_tokens=max_new_tokens, chat=False)
        while True:
            try:
                for keeps in capture:
                    for _ in range(2):  # reduce-overhead records the graph on a later call than the first
                        kept = KeptInputs(tuple(range(self.lm.spec.n_layers + 1)), self.lm.spec.d_model,
                                          self.lm.dtype, self.lm.device) if keeps else None
                        list(self.generate(request, kept=kept))
                return time.perf_counter() - start
            except Exception as err:  # noqa: BLE001 - any compiler failure: fall back, keep serving
                if self.mode == "off":
                    raise
                self.compile_error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                if self.fullgraph:
                    self.fullgraph = False
                else:
                    self.mode = "off"
                self._step = self._build_step()


def static_generate(fast: FastDecoder, request: GenerationRequest, should_stop: Callable[[], bool] | None = None,
                    ids: list[int] | None = None, kept: KeptInputs | None = None) -> Iterator[Record]:
    """The loop of engine.core.generate on a FastDecoder: PrefillRecord, DecodeRecord per token, DoneRecord."""
    lm = fast.lm
    ids = admit(lm, request) if ids is None else ids     # None: no door above (a benchmark, warm_up)
    cache = fast.reserve(len(ids) + request.max_new_tokens)
    with torch.no_grad():
        if overlaps(request, kept):
            done = yield from pipelined_loop(fast, request, ids, should_stop)
        else:
            done = yield from generation_loop(lm, request, ids, lambda: fast.prefill(ids, kept),
                                              lambda token, position: fast.decode(token, position, kept),
                                              lambda: static_cache_state(cache), should_stop)
    yield done


@dataclass
class InFlight:
    """A decode step queued on the device: its logits (V,) once it has run, and its position."""

    logits: torch.Tensor
    pos: torch.Tensor            # [1] on the device
    position: int


def overlaps(request: GenerationRequest, kept: KeptInputs | None) -> bool:
    """Greedy, capturing nothing: the next step's input can be chosen on the device."""
    return request.temperature <= 0 and kept is None


def pipelined_loop(fast: FastDecoder, request: GenerationRequest, ids: list[int],
                   should_stop: Callable[[], bool] | None) -> Generator[Record, None, DoneRecord]:
    """generation_loop's records for a greedy request that captures nothing, with the host's work on each token done
    while the device already computes the next.

    Token k's argmax stays on the device and feeds step k + 1, which is queued before the host waits for
    anything; the host then reads what describes token k (queued copies, whole once an event after them has
    passed) and builds its record while step k + 1 runs. On a CPU the same code runs in order. When token k
    ends the answer (an end-of-sequence token, a stop string, a cancel), step k + 1 was computed for nothing:
    its cache position is cleared with the cache before the next request. Same records as generation_loop
    (tests/test_fastpath.py).
    """
    lm, device = fast.lm, fast.lm.device
    stream, stops = TextStream(lm.tokenizer), eos_ids(lm)
    t0 = time.perf_counter()
    logits = fast.prefill(ids, None)
    token = pick_token(lm, logits, request, None, stream)
    sync(device)
    ttft = time.perf_counter() - t0
    yield PrefillRecord(prompt_pieces(lm, ids), forward_shapes(lm.spec, len(ids)), ttft,
                        static_cache_state(fast.cache, len(ids)), token)
    generated, reason = [token.id], end_reason(token.id, stream.text, stops, request, 1, should_stop)
    step = None if reason is not None else fast.launch(torch.tensor([[token.id]], device=device),
                                                       torch.tensor([len(ids)], device=device), len(ids))
    while reason is None:
        t = time.perf_counter()
        chosen = torch.argmax(step.logits[None], dim=-1)                                      # (1,), on the device
        probs = logits_to_probs(step.logits[None], 1.0, request.top_k, request.top_p)
        facts = facts_to_host(token_facts(step.logits[None], probs, chosen), non_blocking=True)
        copied, done_step = _event(device), step
        if len(generated) + 1 < request.max_new_tokens:            # a token after this one may be wanted
            step = fast.launch(chosen.view(1, 1), step.pos + 1, step.position + 1)
        if copied is not None:
            copied.synchronize()
        token = tokens_from(lm, facts, [stream.push(int(facts["ids"][0]))])[0]
        generated.append(token.id)
        yield DecodeRecord(len(generated) - 1, time.perf_counter() - t,
                           static_cache_state(fast.cache, done_step.position + 1), token)
        reason = end_reason(token.id, stream.text, stops, request, len(generated), should_stop)
    total = time.perf_counter() - t0
    return DoneRecord(trim_stop(stream.text, request.stop), reason, len(ids), len(generated), ttft, total - ttft, total)


def _event(device: torch.device) -> torch.cuda.Event | None:
    """An event recorded now on the device's stream (None off CUDA, where every copy has finished already)."""
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record()
    return event


def enable_static_decode(lm: LoadedModel, compile: str = "auto", warm_up: bool = False) -> FastDecoder:
    """Make engine.core.generate(lm, ...) use a static cache (and CUDA graphs on CUDA); returns the decoder."""
    fast = FastDecoder(lm, compile)
    if warm_up:
        fast.warm_up()
    lm.fast = fast
    return fast


def disable_static_decode(lm: LoadedModel) -> None:
    lm.fast = None
