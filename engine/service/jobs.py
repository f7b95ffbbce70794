"""The measurements a page can ask the model server for, by name: what used to be closures over the model in
the page's own process. A client sends a name and plain parameters; the service runs the function here, where
the model is, and sends back plain data (dataclasses, numpy arrays).

Two kinds:
- a **job** needs the model to itself for clean timings or to run it: it waits its turn in the scheduler's
  queue (behind the running batch), reports progress, and stops when cancelled;
- a **quick** one reads the weights or a file and runs at once beside the batch (the logit lens of one token,
  one head's attention row as a token streams, one layer's weight rows, the model folder's listing).

    value = run_quick(lm, "quant.weight_rows", {"layer": 3})
    job = JOBS["speed.context"]; value = job.fn(lm, progress, **job.check(params))

Parameters are checked here, each with its type and range, before anything runs: a page's values and an HTTP
client's are held to the same rules.
"""
from __future__ import annotations

import functools
import json
import threading
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping

import numpy as np
import torch

from engine.core.attention_maps import attention_map, attention_rows, summarise
from engine.core.generate import GenerationRequest, validate
from engine.core.hooks import CapturePolicy, LayerCapture
from engine.core.loader import LoadedModel
from engine.core.recompute import embeddings, layer_input, layer_qk
from engine.core.records import CacheState, DecodeRecord, PrefillRecord, SpecRoundRecord
from engine.core.small_batch import kernels_for
from engine.core.views import derive_captures, lens_at, lens_of, qkv_norms
from engine.errors import ContextLengthError, EngineError, InvalidRequestError
from engine.models.folder import describe_folder, time_read
from engine.serving.scheduler import scheduler_for

Progress = Callable[[float, str], None]
MAX_IDS = 32768
MAX_LIST = 64


@dataclass(frozen=True)
class Job:
    name: str
    what: str                                   # how the queue and the room call it ("the batching measurement")
    fn: Callable[..., Any]                      # fn(lm, progress, **params) for a job; fn(lm, **params) when quick
    params: Mapping[str, Callable[[Any, LoadedModel], Any]]   # name -> check(value, lm) -> the value to use
    quick: bool = False
    runs: bool = False                          # fn also takes `runs=`: the service's run store (work on a run by id)

    def check(self, params: Mapping[str, Any], lm: LoadedModel) -> dict[str, Any]:
        if not isinstance(params, Mapping):
            raise InvalidRequestError("a job's parameters must be a map of names to values")
        unknown = set(params) - set(self.params)
        if unknown:
            raise InvalidRequestError(f"{self.name} takes no parameter {sorted(map(str, unknown))[0]!r} "
                                      f"(it takes: {', '.join(self.params) or 'none'})")
        missing = {n for n, rule in self.params.items() if n not in params and not hasattr(rule, "default")}
        if missing:
            raise InvalidRequestError(f"{self.name} needs its parameter {sorted(missing)[0]!r}")
        return {name: rule(params[name], lm) if name in params else rule.default for name, rule in self.params.items()}


JOBS: dict[str, Job] = {}


def job(name: str, what: str, quick: bool = False, runs: bool = False, **params: Callable[[Any, LoadedModel], Any]):
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        JOBS[name] = Job(name, what, fn, params, quick, runs)
        return fn
    return register


def find(name: Any) -> Job:
    found = JOBS.get(name) if isinstance(name, str) else None
    if found is None:
        raise InvalidRequestError(f"there is no measurement called {str(name)[:60]!r} on this server "
                                  f"(known: {', '.join(sorted(JOBS))})")
    return found


def run_quick(lm: LoadedModel, name: str, params: Mapping[str, Any], runs: Any = None) -> Any:
    """A quick one, at once, in the caller's thread (it only reads the weights, and a run's kept state;
    EngineService.quick calls it in a passing thread, engine.core.openmp)."""
    found = find(name)
    if not found.quick:
        raise InvalidRequestError(f"{name} needs the model to itself: submit it as a job")
    return found.fn(lm, **found.check(params, lm), **({"runs": runs} if found.runs else {}))


# --- parameter rules -----------------------------------------------------------------------------------------

def whole(low: int, high: int | Callable[[LoadedModel], int]) -> Callable[[Any, LoadedModel], int]:
    def rule(value: Any, lm: LoadedModel) -> int:
        top = high(lm) if callable(high) else high
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= top:
            raise InvalidRequestError(f"a whole number from {low} to {top} was expected, not {str(value)[:40]}")
        return int(value)
    return rule


def wholes(low: int, high: int | Callable[[LoadedModel], int], most: int = MAX_LIST):
    one = whole(low, high)

    def rule(value: Any, lm: LoadedModel) -> list[int]:
        if not isinstance(value, (list, tuple)) or not 0 < len(value) <= most:
            raise InvalidRequestError(f"a list of 1 to {most} whole numbers was expected")
        return [one(v, lm) for v in value]
    return rule


def choices(options: tuple[str, ...], most: int = MAX_LIST):
    def rule(value: Any, lm: LoadedModel) -> list[str]:
        if not isinstance(value, (list, tuple)) or len(value) > most or any(v not in options for v in value):
            raise InvalidRequestError(f"a list of names from {', '.join(options)} was expected")
        return list(value)
    return rule


def layer(value: Any, lm: LoadedModel) -> int:
    return whole(0, lm.spec.n_layers - 1)(value, lm)


def token_ids(value: Any, lm: LoadedModel) -> list[int]:
    return wholes(0, lm.spec.vocab_size - 1, MAX_IDS)(value, lm)


def request(value: Any, lm: LoadedModel) -> GenerationRequest:
    if not isinstance(value, GenerationRequest):
        raise InvalidRequestError("a generation request was expected")
    validate(value)
    return value


def policy(value: Any, lm: LoadedModel) -> CapturePolicy:
    if not isinstance(value, CapturePolicy):
        raise InvalidRequestError("a capture policy was expected")
    return value


def residuals(value: Any, lm: LoadedModel) -> dict[int, np.ndarray]:
    d = lm.spec.d_model
    if not isinstance(value, Mapping) or len(value) > lm.spec.n_layers:
        raise InvalidRequestError("a map of layer to residual vector was expected")
    out = {}
    for key, vector in value.items():
        i = layer(key, lm)
        if not isinstance(vector, np.ndarray) or vector.shape != (d,) or vector.dtype.kind != "f":
            raise InvalidRequestError(f"layer {i}'s residual must be {d} floating-point numbers")
        out[i] = vector
    return out


# --- attention ---------------------------------------------------------------------------------------------

@job("attention.layer", "one layer's attention", ids=token_ids, layer=layer)
def attention_layer(lm: LoadedModel, progress: Progress, ids: list[int], layer: int) -> LayerCapture:
    # the lab's measurement code: loaded with its first job, not at every server start
    from engine.lab.attention_math import capture_attention

    return capture_attention(lm, ids, layer)


@job("attention.qkv", "the attention capture", ids=token_ids, layer=layer)
def attention_qkv(lm: LoadedModel, progress: Progress, ids: list[int], layer: int) -> Any:
    # the lab's measurement code: loaded with its first job, not at every server start
    from engine.lab.attention_math import capture_qkv

    return capture_qkv(lm, ids, layer)


# --- attention on demand, from what a run kept (engine/core/recompute.py) ---------------------------------------

def a_run(value: Any, lm: LoadedModel) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= 80:
        raise InvalidRequestError("a run id (the run_id a generation returned) was expected")
    return value


def a_layer(value: Any, lm: LoadedModel) -> int:
    top = lm.spec.n_layers - 1
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value <= top:
        raise InvalidRequestError(f"layer {str(value)[:20]} is out of range: {lm.label} has layers 0 to {top}")
    return int(value)


def heads(value: Any, lm: LoadedModel) -> list[int]:
    top = lm.spec.n_heads - 1
    ok = isinstance(value, (list, tuple)) and 0 < len(value) <= lm.spec.n_heads
    if not ok or any(isinstance(h, bool) or not isinstance(h, (int, np.integer)) or not 0 <= h <= top for h in value):
        raise InvalidRequestError(f"query heads out of range: {lm.label} has query heads 0 to {top} in each layer")
    return [int(h) for h in value]


def optional(rule: Callable[[Any, LoadedModel], Any], default: Any = None) -> Callable[[Any, LoadedModel], Any]:
    """A parameter that may be left out (its default), or null."""
    def checked(value: Any, lm: LoadedModel) -> Any:
        return default if value is None else rule(value, lm)
    checked.default = default
    return checked


def span(value: Any, lm: LoadedModel) -> tuple[int, int]:
    if (not isinstance(value, (list, tuple)) or len(value) != 2 or any(isinstance(v, bool) or not isinstance(
            v, (int, np.integer)) for v in value) or not 0 <= value[0] < value[1]):
        raise InvalidRequestError("a span of positions [start, stop) with 0 <= start < stop was expected")
    return int(value[0]), int(value[1])


@dataclass(frozen=True)
class KeptState:
    """What a run keeps to derive its views from (the residual stream), as a page or client reads it."""

    run_id: str
    positions: int              # positions kept (prompt + every generated token fed back)
    layers: tuple[int, ...]     # hidden states kept: i < n_layers the input of layer i, n_layers the final norm's
    rebuilt: tuple[int, ...]    # layers whose input was rebuilt on demand and is held now
    bytes: int                  # what it holds in all
    bytes_per_position: int
    dtype: str
    live: bool                  # the run is still generating (more positions will come)


def _kept(runs: Any, run_id: str) -> tuple[Any, Any, list[Any]]:
    return runs.kept(run_id)


def kept_state(run_id: str, info: Any, kept: Any) -> KeptState:
    return KeptState(run_id, kept.length, kept.layers, tuple(kept.recomputed), kept.nbytes, kept.bytes_per_position,
                     str(kept.dtype).removeprefix("torch."), info.live)


def position_ids(records: list[Any]) -> list[int]:
    """Every position's token id: the prompt, then each generated token fed back."""
    prefill = next((r for r in records if isinstance(r, PrefillRecord)), None)
    if prefill is None:
        return []
    tokens = [prefill.token.id]
    for r in records:
        if isinstance(r, DecodeRecord):
            tokens.append(r.token.id)
        elif isinstance(r, SpecRoundRecord):
            tokens.extend(t.id for t in r.emitted)
    return [p.id for p in prefill.prompt] + tokens[:-1]


class LayerNotKeptError(InvalidRequestError):
    """A layer's input was not kept: it must be rebuilt first (a job, since it runs layers of the model)."""


def _qk(lm: LoadedModel, kept: Any, run_id: str, layer: int) -> Any:
    return layer_qk(lm.model, layer, _qk_input(lm, kept, run_id, layer))


def _qk_input(lm: LoadedModel, kept: Any, run_id: str, layer: int) -> Any:
    """(N, d_model): the residual entering `layer` at every position the run holds, or a clear message."""
    x = kept.input(layer)
    if x is None:
        kept_layers = ", ".join(str(i) for i in kept.layers if i < lm.spec.n_layers)
        raise LayerNotKeptError(f"run {run_id[:40]!r} kept the residual entering layers {kept_layers}; layer {layer}'s "
                                f"must first be rebuilt from layer {kept.below(layer) or 0} (the job attention.rebuild)")
    if x.shape[0] == 0:
        raise InvalidRequestError(f"run {run_id[:40]!r} has no positions yet: its prompt is still being read")
    return x


@job("attention.kept", "what a run kept", quick=True, runs=True, run_id=a_run)
def attention_kept(lm: LoadedModel, runs: Any, run_id: str) -> KeptState:
    info, kept, _ = _kept(runs, run_id)
    return kept_state(run_id, info, kept)


@job("attention.map", "attention maps", quick=True, runs=True, run_id=a_run, layer=a_layer, heads=heads,
     cells=optional(whole(1, 1024), 160), rows=optional(span), keys=optional(span))
def attention_maps(lm: LoadedModel, runs: Any, run_id: str, layer: int, heads: list[int], cells: int,
                   rows: tuple[int, int] | None, keys: tuple[int, int] | None) -> list[Any]:
    """Maps of some heads of one layer (exact, or pooled into at most `cells` cells per axis, saying how)."""
    _, kept, _ = _kept(runs, run_id)
    qk = _qk(lm, kept, run_id, layer)
    for name, part in (("rows", rows), ("keys", keys)):
        if part is not None and part[1] > qk.n:
            raise InvalidRequestError(f"{name} {part[0]}..{part[1] - 1} reach past the run's {qk.n:,} positions")
    return [attention_map(qk, h, cells, rows, keys) for h in heads]


@dataclass(frozen=True)
class AttentionRow:
    """Every query head's attention from one position over all the positions before it."""

    layer: int
    position: int
    probs: np.ndarray           # (H, position + 1) float32
    kv_heads: tuple[int, ...]   # the K/V head each query head reads


@job("attention.row", "an attention row", quick=True, runs=True, run_id=a_run, layer=a_layer, position=whole(0, 2**31),
     heads=optional(heads))
def attention_row(lm: LoadedModel, runs: Any, run_id: str, layer: int, position: int,
                  heads: list[int] | None) -> AttentionRow:
    """Some query heads' (default: every head's) attention from one position: while a run streams, its newest
    position's row is there as soon as its token is (the residual is read from the batch's pool)."""
    _, kept, _ = _kept(runs, run_id)
    x = _qk_input(lm, kept, run_id, layer)
    if position >= x.shape[0]:
        raise InvalidRequestError(f"position {position:,} is out of range: the run has positions 0 to "
                                  f"{x.shape[0] - 1:,}")
    qk = layer_qk(lm.model, layer, x[: position + 1])                   # the row sees keys 0..position only
    shown = heads if heads is not None else list(range(qk.q.shape[0]))
    probs = attention_rows(qk, shown, position, position + 1)[:, 0].cpu().numpy()
    return AttentionRow(layer, position, probs, tuple(qk.kv_head(h) for h in shown))


@job("attention.rebuild", "rebuilding a layer's input", runs=True, run_id=a_run, layer=a_layer)
def attention_rebuild(lm: LoadedModel, progress: Progress, runs: Any, run_id: str, layer: int) -> KeptState:
    """A layer whose input the run did not keep, rebuilt from the nearest kept layer below (a partial prefill)."""
    info, kept, records = _kept(runs, run_id)
    first = kept.below(layer) or 0
    report = lambda i: progress((i - first + 1) / max(layer - first, 1),   # noqa: E731
                                f"layer {i} over {kept.length:,} positions")
    progress(0.0, f"layers {first} to {layer - 1} over {kept.length:,} positions")
    layer_input(lm.model, kept, layer, position_ids(records), report)
    return kept_state(run_id, info, kept)


@job("attention.summary", "the per-head summaries", runs=True, run_id=a_run, window=optional(whole(1, 4096), 16))
def attention_summary(lm: LoadedModel, progress: Progress, runs: Any, run_id: str, window: int) -> Any:
    """Every head of every layer summarised over the whole run (entropy, sink, distance, local mass), blockwise."""
    _, kept, records = _kept(runs, run_id)
    held = getattr(kept, "summaries", {})
    if window not in held:
        first = kept.input(0)
        first = embeddings(lm.model, position_ids(records)[: kept.length], lm.device) if first is None else first
        n = lm.spec.n_layers
        held[window] = summarise(lm.model, first, lambda i: kept.input(i) if i in kept.layers else None, n, window,
                                 lambda i, text: progress(i / n, text))
        kept.summaries = held
    return held[window]


QUICK_SUMMARY = 512    # positions up to which a run that kept every layer is summarised at once, beside the batch


@job("attention.summary_now", "the per-head summaries", quick=True, runs=True, run_id=a_run,
     window=optional(whole(1, 4096), 16))
def attention_summary_now(lm: LoadedModel, runs: Any, run_id: str, window: int) -> Any:
    """attention.summary at once, for a run short enough (QUICK_SUMMARY positions) that kept every layer: one pass
    of each layer's Q and K over its positions, as a page draws a short run's maps."""
    _, kept, _ = _kept(runs, run_id)
    if kept.length > QUICK_SUMMARY or not set(range(lm.spec.n_layers)) <= set(kept.layers):
        raise InvalidRequestError(f"run {run_id[:40]!r} is summarised by the job attention.summary (it is longer than "
                                  f"{QUICK_SUMMARY:,} positions, or did not keep every layer)")
    return attention_summary(lm, lambda *args: None, runs, run_id, window)


def context_lengths(value: Any, lm: LoadedModel) -> list[int]:
    """Lengths for the long-text job: 1 to the model's context, and no more than this server's prompt limit."""
    lengths = wholes(1, 2**31, 16)(value, lm)
    limit = scheduler_for(lm).limits.max_prompt_tokens
    if max(lengths) > lm.spec.max_context:
        raise ContextLengthError(f"{max(lengths):,} tokens were asked for; {lm.label} reads at most "
                                 f"{lm.spec.max_context:,}")
    if max(lengths) > limit:
        raise ContextLengthError(f"{max(lengths):,} tokens were asked for; this server reads at most {limit:,} tokens "
                                 f"of prompt ({lm.label} itself reads {lm.spec.max_context:,})")
    return lengths


@job("attention.context", "attention over a long text", lengths=context_lengths, window=optional(whole(1, 4096), 16))
def attention_context(lm: LoadedModel, progress: Progress, lengths: list[int], window: int) -> list[Any]:
    """The first N tokens of a long public-domain text, for each N: prefill time, KV bytes, every head summarised.
    Each length's point is sent as it is measured (JobProgress.partial), so a page redraws as N grows."""
    # the lab's measurement code: loaded with its first job, not at every server start
    from engine.lab.long_context import sweep

    points = []
    for point in sweep(lm, lengths, window, progress):
        points.append(point)
        progress(len(points) / len(lengths), f"N = {point.n:,} measured", list(points))
    return points


@job("lens", "the logit lens", quick=True, resid=residuals, top=whole(1, 20))
def lens(lm: LoadedModel, resid: dict[int, np.ndarray], top: int) -> dict[int, list[tuple[int, float]]]:
    """Each layer's top tokens through the final norm and the LM head from residuals a client sends (a recording
    made before runs kept their residual on the server): reads two weights, never the cache."""
    if not resid:
        return {}
    order = sorted(resid)
    tops = lens_of(lm.model, torch.from_numpy(np.stack([resid[i].astype(np.float32) for i in order])), top)
    return dict(zip(order, tops))


@job("run.lens", "the logit lens of a run", quick=True, runs=True, run_id=a_run, position=whole(0, 2**31),
     top=optional(whole(1, 20), 5))
def run_lens(lm: LoadedModel, runs: Any, run_id: str, position: int, top: int) -> Any:
    """One position of a run through the layers: each kept layer's logit lens and the residual's norm leaving it,
    derived from the residual the run kept (two weight reads per layer; live runs too)."""
    _, kept, _ = _kept(runs, run_id)
    if position >= kept.length:
        raise InvalidRequestError(f"position {position:,} is out of range: the run holds positions 0 to "
                                  f"{kept.length - 1:,}")
    return lens_at(lm.model, kept, position, top)


@dataclass(frozen=True)
class QKVNorms:
    """|Q| per query head and |K|, |V| per K/V head of one layer at one position of a run."""

    layer: int
    position: int
    q: np.ndarray               # (H,)
    k: np.ndarray               # (KVH,)
    v: np.ndarray               # (KVH,)


@job("run.norms", "the Q, K, V norms of a run", quick=True, runs=True, run_id=a_run, layer=a_layer,
     position=whole(0, 2**31))
def run_norms(lm: LoadedModel, runs: Any, run_id: str, layer: int, position: int) -> QKVNorms:
    """|Q|, |K|, |V| per head at one position, from the layer's own projections on the residual the run kept."""
    _, kept, _ = _kept(runs, run_id)
    x = _qk_input(lm, kept, run_id, layer)
    if position >= x.shape[0]:
        raise InvalidRequestError(f"position {position:,} is out of range: the run has positions 0 to "
                                  f"{x.shape[0] - 1:,}")
    q, k, v = qkv_norms(lm.model, kept, layer, [position])
    return QKVNorms(layer, position, q[0], k[0], v[0])


@job("run.views", "a run's captures", quick=True, runs=True, run_id=a_run)
def run_views(lm: LoadedModel, runs: Any, run_id: str) -> list[Any]:
    """A finished run's records with the views its policy names derived into them (what its files carry)."""
    info, kept, records = _kept(runs, run_id)
    if info.live:
        raise InvalidRequestError(f"run {run_id[:40]!r} is still running; its views are ready once it finishes")
    return derive_captures(lm.model, kept, records, info.policy)


# --- the speed lab and the serving pages ---------------------------------------------------------------------

@job("speed.context", "the prompt-length measurement", lengths=wholes(1, lambda lm: lm.spec.max_context - 16),
     repeats=whole(1, 5))
def speed_context(lm: LoadedModel, progress: Progress, lengths: list[int], repeats: int) -> list[Any]:
    # the lab's measurement code: loaded with its first job, not at every server start
    from engine.lab.speed import DEFAULT_DECODE_STEPS, measure_context

    points = []
    for i, n in enumerate(lengths):
        progress(i / len(lengths), f"prefill of {n:,} tokens, then {DEFAULT_DECODE_STEPS} decode steps")
        points.append(measure_context(lm, n, repeats=repeats))
    return points


@job("batching.real", "the batching measurement", batches=wholes(1, 64, 8), rounds=whole(1, 5))
def batching_real(lm: LoadedModel, progress: Progress, batches: list[int], rounds: int) -> list[dict]:
    # the lab's measurement code: loaded with its first job, not at every server start
    from engine.lab.batching import measure_batching

    return [p.to_dict() for p in measure_batching(lm, batches, rounds=rounds, progress=progress)]


@job("cost.phases", "the prefill and decode measurement", batches=wholes(1, 64, 8), prompt=whole(1, 8192),
     new=whole(1, 64), rounds=whole(1, 5))
def cost_phases(lm: LoadedModel, progress: Progress, batches: list[int], prompt: int, new: int,
                rounds: int) -> list[dict]:
    # the lab's measurement code: loaded with its first job, not at every server start
    from engine.lab.batching import measure_phases

    return [p.to_dict() for p in measure_phases(lm, batches, prompt, new, rounds, progress)]


def two_requests(value: Any, lm: LoadedModel) -> list[GenerationRequest]:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise InvalidRequestError("two generation requests were expected")
    return [request(v, lm) for v in value]


@job("prefix.reuse", "the prefix-cache measurement", prompts=two_requests)
def prefix_reuse(lm: LoadedModel, progress: Progress, prompts: list[GenerationRequest]) -> dict[str, dict]:
    # the lab's measurement code: loaded with its first job, not at every server start
    from engine.lab.prefix_reuse import measure_prefix_reuse

    first, other = prompts
    progress(0.0, "a different question after the same opening")
    shared = measure_prefix_reuse(lm, first, other)
    progress(0.5, "the same prompt again, as when a presenter's prompt is sent by the whole room")
    return {"same opening": asdict(shared), "same prompt": asdict(measure_prefix_reuse(lm, first, first))}


@job("kv.on_off", "the cache on/off measurement", prompt=whole(1, 4096), steps=whole(1, 256))
def kv_on_off(lm: LoadedModel, progress: Progress, prompt: int, steps: int) -> tuple[Any, Any, str]:
    """The same greedy answer with the cache and without, token by token; and the answer's text."""
    # the lab's measurement code: loaded with its first job, not at every server start
    from engine.lab.kv_cache import generate_both
    # the lab's measurement code: loaded with its first job, not at every server start
    from engine.lab.speed import prompt_of_length

    ids = prompt_of_length(lm, prompt)
    on, off = generate_both(lm, ids, steps, progress=lambda i: progress(i / steps, f"token {i} both ways"))
    return on, off, lm.tokenizer.decode(list(on.tokens))


@job("observer.effect", "the observer-effect measurement", request=request, policy=policy, rounds=whole(1, 5))
def observer(lm: LoadedModel, progress: Progress, request: GenerationRequest, policy: CapturePolicy,
             rounds: int) -> Any:
    # the lab's measurement code: loaded with its first job, not at every server start
    from engine.lab.speed import observer_effect

    return observer_effect(lm, request, policy, rounds, progress)


def boolean(value: Any, lm: LoadedModel) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequestError("true or false was expected")
    return value


@job("device.roof", "this device's peaks", quick=True, again=boolean)
def device_roof(lm: LoadedModel, again: bool) -> Any:
    """This device's memory bandwidth and FLOP/s (a spec sheet for a known GPU, else measured once, ~1 s; `again`
    measures anew)."""
    if again:
        _roof.cache_clear()
    return _roof(str(lm.device), lm.dtype_name)


@functools.lru_cache(maxsize=4)
def _roof(device: str, dtype: str) -> Any:
    # the lab's measurement code: loaded with its first job, not at every server start
    from engine.lab.speed import measure_roof

    with _ROOF_LOCK:
        return measure_roof(device, getattr(torch, dtype))


_ROOF_LOCK = threading.Lock()


# --- explainers -------------------------------------------------------------------------------------------------

@job("fusion.sweep", "the attention timing", lengths=wholes(1, 131072, 16), repeats=whole(1, 5))
def fusion_sweep(lm: LoadedModel, progress: Progress, lengths: list[int], repeats: int) -> list[dict]:
    # the lab's measurement code: loaded with its first job, not at every server start
    from engine.lab.fusion import sweep_fusion

    return [p.to_dict() for p in sweep_fusion(lm.spec, lengths, lm.device, lm.dtype, repeats, progress=progress)]


def _eval_ids(lm: LoadedModel) -> list[int]:
    # the lab's measurement code: loaded with its first job, not at every server start
    from engine.lab.quant_detail import EVAL_TEXT, EVAL_TOKENS
    # the lab's measurement code: loaded with its first job, not at every server start
    from engine.lab.quantize import text_ids

    return text_ids(lm, EVAL_TEXT, EVAL_TOKENS)


@job("quant.outliers", "the outlier measurement")
def quant_outliers(lm: LoadedModel, progress: Progress) -> dict[str, Any]:
    # the lab's measurement code: loaded with its first job, not at every server start
    from engine.lab.quant_detail import activation_channels, int8_errors_by_layer, layer_inputs

    ids = _eval_ids(lm)
    hidden = layer_inputs(lm, ids)
    normed, resid = activation_channels(lm, hidden)
    return {"normed": normed, "resid": resid, "errors": int8_errors_by_layer(lm, hidden), "tokens": len(ids)}


@job("quant.grids", "the 4-bit comparison", schemes=lambda value, lm: choices(_schemes())(value, lm))
def quant_grids(lm: LoadedModel, progress: Progress, schemes: list[str]) -> dict[str, Any]:
    # the lab's measurement code: loaded with its first job, not at every server start
    from engine.lab.quant_detail import grid_share, scheme_quality
    # the lab's measurement code: loaded with its first job, not at every server start
    from engine.lab.quantize import all_logits

    ids, share = _eval_ids(lm), grid_share(lm)
    reference = all_logits(lm, ids)
    rows = []
    for i, scheme in enumerate(schemes):
        progress(i / len(schemes), f"{scheme}: quantizing a copy, one pass over the text")
        rows.append(scheme_quality(lm, scheme, ids, reference).__dict__)
    return {"rows": rows, "share": share, "tokens": len(ids)}


def _schemes() -> tuple[str, ...]:
    # the lab's measurement code: loaded with its first job, not at every server start
    from engine.lab.quant_detail import SCHEMES

    return tuple(SCHEMES)


@job("quant.methods", "the GPTQ/AWQ comparison", layer=layer)
def quant_methods(lm: LoadedModel, progress: Progress, layer: int) -> Any:
    # the lab's measurement code: loaded with its first job, not at every server start
    from engine.lab.quant_calibrated import compare_methods
    # the lab's measurement code: loaded with its first job, not at every server start
    from engine.lab.quant_detail import q_proj_inputs

    return compare_methods(q_proj_inputs(lm, _eval_ids(lm), layer), lm.model.model.layers[layer].self_attn.q_proj.weight)


@job("quant.weight_rows", "one layer's weights", quick=True, layer=layer)
def quant_weight_rows(lm: LoadedModel, layer: int) -> tuple[np.ndarray, np.ndarray]:
    # the lab's measurement code: loaded with its first job, not at every server start
    from engine.lab.quant_detail import weight_rows

    return weight_rows(lm.model.model.layers[layer].self_attn.q_proj.weight)


@job("quant.notable_weights", "some real weights", quick=True)
def quant_notable_weights(lm: LoadedModel) -> list[tuple[str, float]]:
    # the lab's measurement code: loaded with its first job, not at every server start
    from engine.lab.quant_detail import notable_weights

    return notable_weights(lm)


@job("precision.compare", "the precision measurement", schemes=choices(("int8", "int4"), 2),
     group=lambda v, lm: _group(v))
def precision_compare(lm: LoadedModel, progress: Progress, schemes: list[str], group: int) -> dict[str, Any]:
    """Quantized copies (made once per scheme and kept), their predictions on a fixed text and their decode speed,
    interleaved with the loaded model's: one row per precision."""
    # the lab's measurement code: loaded with its first job, not at every server start
    from engine.lab.quantize import compare_models, text_ids
    # the lab's measurement code: loaded with its first job, not at every server start
    from engine.lab.speed import compare_decode, prompt_of_length

    copies = []
    for i, scheme in enumerate(schemes):
        progress(0.3 * i / len(schemes), f"quantizing a copy to {scheme.upper()}")
        copies.append(_quantized_copy(lm, scheme, group))
    ids = text_ids(lm)
    progress(0.3, f"comparing predictions on a {len(ids)}-token text")
    qualities = [compare_models(lm, q.lm, ids) for q in copies]
    timings = compare_decode([lm] + [q.lm for q in copies], prompt_of_length(lm, PRECISION_PROMPT), PRECISION_STEPS,
                             PRECISION_ROUNDS, progress=lambda f, m: progress(0.5 + 0.5 * f, f"timing decode: {m}"))
    rows = [_precision_row(lm.dtype_name.upper(), None, lm, None, timings[0])]
    rows += [_precision_row(q.scheme.upper() + (f" (g{q.group_size})" if q.group_size else ""), q, lm, quality, t)
             for q, quality, t in zip(copies, qualities, timings[1:])]
    return {"rows": rows, "tokens": len(ids)}


PRECISION_PROMPT, PRECISION_STEPS, PRECISION_ROUNDS = 32, 8, 2


def _group(value: Any) -> int:
    # the lab's measurement code: loaded with its first job, not at every server start
    from engine.lab.quantize import GROUP_SIZES

    if value not in GROUP_SIZES:
        raise InvalidRequestError(f"the group size must be one of {', '.join(map(str, GROUP_SIZES))}")
    return int(value)


_COPIES: dict[tuple, Any] = {}
_COPIES_LOCK = threading.Lock()
MAX_COPIES = 3


def _quantized_copy(lm: LoadedModel, scheme: str, group: int) -> Any:
    """One quantized copy per (model, scheme, group), kept for the next measurement; the model is never changed."""
    # the lab's measurement code: loaded with its first job, not at every server start
    from engine.lab.quantize import quantize_copy

    key = (id(lm), scheme, group)
    with _COPIES_LOCK:
        if key not in _COPIES:
            while len(_COPIES) >= MAX_COPIES:
                _COPIES.pop(next(iter(_COPIES)))
            _COPIES[key] = quantize_copy(lm, scheme, group)
        return _COPIES[key]


def _precision_row(label: str, q: Any, lm: LoadedModel, quality: Any, timing: Any) -> dict:
    return {"precision": label, "stored_bytes": q.stored_bytes if q else lm.weight_bytes,
            "bits_per_weight": q.bits_per_weight if q else 8 * lm.dtype.itemsize,
            "weight_error": q.weight_error if q else 0.0, "mode": q.mode if q else "float matmul",
            "compute": q.compute_dtype if q else lm.dtype_name,
            "agreement": quality.top1_agreement if quality else 1.0,
            "ppl": quality.ppl_candidate if quality else None, "ppl_change": quality.ppl_change if quality else 0.0,
            "kl": quality.mean_kl if quality else 0.0, "itl": timing.itl, "tok_s": timing.tokens_per_second}


# --- the model folder --------------------------------------------------------------------------------------------

@job("folder.report", "the model folder", quick=True)
def folder_report(lm: LoadedModel) -> dict[str, Any]:
    """The folder the weights were loaded from, as it is on the server's disk, and its config.json."""

    report = describe_folder(lm.source)
    return {"report": report, "config": json.loads((report.path / "config.json").read_text())}


@job("folder.read", "reading the weight files", quick=True)
def folder_read(lm: LoadedModel) -> dict[str, float]:
    timing = time_read(describe_folder(lm.source))
    return {"bytes": timing.nbytes, "seconds": timing.seconds}


# --- memory --------------------------------------------------------------------------------------------------------

@job("memory.ledger", "the memory ledger", quick=True, runs=True, cache_length=whole(0, 2**31),
     cache_bytes=whole(0, 2**62), run_id=optional(a_run))
def memory_ledger(lm: LoadedModel, runs: Any, cache_length: int, cache_bytes: int, run_id: str | None) -> Any:
    """The server's memory now (torch.cuda's own figures on a GPU) beside the formula, with a run's cache and the
    residual it keeps (`run_id`, when the server still keeps it)."""
    # the lab's measurement code: loaded with its first job, not at every server start
    from engine.lab.memory import memory_ledger as ledger

    try:
        kept = runs.kept(run_id)[1] if run_id is not None else None
    except EngineError:                        # capture off, or dropped: the ledger without it
        kept = None
    return ledger(lm, CacheState(cache_length, cache_bytes, []) if cache_length else None, kept=kept)


@job("batch.kernels", "the small-batch kernel", quick=True)
def batch_kernels(lm: LoadedModel) -> dict[str, Any] | None:
    """The weights the batched CPU steps use packed, and the timings that chose them (measured at start)."""
    kernels = kernels_for(lm, pack=False)
    return None if kernels is None else {"weights": kernels.weights, "faster": kernels.faster_shapes(),
                                         "ordered": kernels.ordered}


# --- same question, same numbers (issue 51) ---------------------------------------------------------------------------

LESSON_CHARS = 2000


def lesson_prompt(value: Any, lm: LoadedModel) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > LESSON_CHARS:
        raise InvalidRequestError(f"a prompt of 1 to {LESSON_CHARS:,} characters was expected")
    return value


def lesson_dtype(value: Any, lm: LoadedModel) -> str:
    # the lab's measurement code: loaded with its first job, not at every server start
    from engine.lab.invariance import DTYPES

    if value not in DTYPES:
        raise InvalidRequestError(f"one of {', '.join(DTYPES)} was expected, not {str(value)[:20]!r}")
    return value


@job("invariance.answer", "the same-numbers comparison", prompt=lesson_prompt, dtype=lesson_dtype, on=boolean,
     new=whole(1, 64), batch=boolean)
def invariance_answer(lm: LoadedModel, progress: Progress, prompt: str, dtype: str, on: bool, new: int,
                      batch: bool) -> Any:
    """One prompt's greedy answer, alone or as one row of a batch of 8, in one dtype, with the batch-invariant
    kernels off or on; the log-probabilities of every token (engine.lab.invariance.comparison compares two)."""
    # the lab's measurement code: loaded with its first job, not at every server start
    from engine.lab.invariance import answer, lesson_ids

    return answer(lm, dtype, on, lesson_ids(lm, prompt), new, batch, progress)


@job("invariance.sum", "one sum in two orders", quick=True, prompt=lesson_prompt)
def invariance_sum(lm: LoadedModel, prompt: str) -> Any:
    """One row of layer 0's q_proj for the last token of the prompt's own text (not the chat template's, the same
    for every prompt), added in two orders (reads the weights only)."""
    # the lab's measurement code: loaded with its first job, not at every server start
    from engine.lab.invariance import check_model, lesson_ids, two_orders

    check_model(lm)
    return two_orders(lm, lm.tokenizer(prompt, add_special_tokens=False)["input_ids"] or lesson_ids(lm, prompt))
