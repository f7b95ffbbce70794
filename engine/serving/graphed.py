"""The batched decode step as a CUDA graph: the room's steps without the per-op launch cost of eager PyTorch.

    graphs = graphed_decode(lm, limits)            # on CUDA, for a model the forward covers; None elsewhere
    runner = BatchRunner(lm, max_batch=32, graphs=graphs)

Why: an eager decode step of Llama 3.1 8B launches about two thousand kernels, one per op, whatever the batch;
on an H200 the scheduler's eager step took 61 ms for one request and 84 ms for thirty (bench/results/gpu-load.json:
median completion less time to first token, over the 63 steps after it), while reading the weights once takes
about 4 ms. This removes that cost for the paged batch, as vLLM captures its decode step per batch size, and for a
request alone: its steps replay the graph of row bucket 1 (ROW_BUCKETS), the same forward with one row (what the
single-request fast path, engine/core/fastpath.py, did with a static cache of its own until issue 50).

The step is the project's one step function (engine/serving/lean.py `step`, over engine/core/lean.py's forward),
the function every CPU step runs eagerly; here it is compiled whole (`fullgraph=True`: a graph break is an error,
and tests/test_graphed.py traces it on the CPU with dynamo's eager backend, so a break fails the suite there and not
on the GPU). A graph replays fixed shapes at fixed addresses, so:
- rows are padded to the first row bucket that holds the batch (padding rows read the null slot and write a scratch
  slot: on a GPU a decode step reads the weights once however many rows it has, so 32 rows cost what 8 do) and the
  keys each row attends to are padded on the left to a power of two (at least 256), hidden by the mask;
- the step's inputs are one index buffer per shape (`StepInputs`, as nano-vllm's `graph_vars`), made once at a fixed
  address and filled in place from the host each step (`PagedBatch.plan_into`: every row's token, position, K/V
  slot, residual slot and the slots it reads; one copy from pinned memory on CUDA, none on a CPU); the compiled
  function takes that one tensor (the weights and the pool closed over), computes the mask from the slots read, and
  so recompiles nothing after warm-up and is handed the same tensor every step (tests/test_graphed.py);
- the K/V pool is made once, sized for the limits within a share of the free memory, and kept: its tensors
  never move. A batch that outgrows it runs eagerly from then on;
- capturing is part of the graph: the residual pool sits beside K and V at fixed addresses, and the forward writes
  each row's residual there with one `index_copy_` per hidden state at a static index (its new token's slot;
  SCRATCH for a row that captures nothing and for padding rows), as vLLM-Hook writes its rings. A step of requests
  that capture runs graphed like any other.
It is compiled with `torch.compile(mode="reduce-overhead")` (cudagraph trees) and no guard on the weights
(`unguarded_weights`), one graph per shape: one per key
width, as rows are padded to one size; the scheduler's worker compiles the usual widths (WARM_WIDTHS, or the
documented setting PLAYGROUND_BATCH_GRAPH_WIDTHS) before it serves, and a longer one when a batch first needs it.
One thread compiles, records and replays them, the graphs' own (`on_own_thread`), whichever thread asks for a step:
cudagraph trees keep their state per thread, and the one GPU run died of graphs recorded in the scheduler's caller
and replayed in its worker (issue 48). Each row
computes what it computes eagerly, within rounding (tests/test_graphed.py: the same tokens as the eager batch and as
each request alone). A model the forward does not cover has no graphed step: its batch runs transformers' modules
eagerly.
"""
from __future__ import annotations

import logging
import re
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import torch

from engine import settings
from engine.errors import EngineError
from engine.core.lean import LeanStep, lean_step_for
from engine.core.loader import LoadedModel, free_memory
from engine.projection.card import kv_bytes_per_token, residual_bytes_per_token
from engine.serving.limits import Limits
from engine.serving.lean import step
from engine.serving.paged import (BLOCK, GATHER, IDS, NULL, POS, RESID, WRITE, BlockPool, PagedBatch, pad_rows,
                                  write_and_gather)

COMPILE_MODES = ("auto", "off", "eager", "default", "reduce-overhead")
RECOMPILE_LIMIT = 64       # shapes x models before dynamo gives up and runs eagerly
ROW_BUCKETS = (1,)         # besides max_batch: a request alone replays a one-row graph, not 31 padding rows
MIN_WIDTH = 256
WARM_WIDTHS = (256, 512)   # compiled when the scheduler starts: prompts and answers of a room's usual length
POOL_SHARE = 0.2           # of the device's free memory, at most, for the kept K/V pool
log = logging.getLogger(__name__)


def resolve_mode(mode: str, device: torch.device) -> str:
    """'auto': CUDA graphs on CUDA, nothing compiled on CPU."""
    if mode not in COMPILE_MODES:
        raise EngineError(f"unknown compile mode {mode!r}; choose one of {', '.join(COMPILE_MODES)}")
    if mode == "auto":
        return "reduce-overhead" if device.type == "cuda" else "off"
    return mode


# The checkpoint's tensors the step closes over, by the names dynamo gives their guards' sources.
WEIGHTS = re.compile(r"^(?:L\['lean'\]|lean)\.(?:layers|embed|norm|head)\b")


def unguarded_weights(entries: list) -> list[bool]:
    """dynamo's guard filter for the step (`torch.compile`'s `guard_filter_fn`): every guard but those on the
    checkpoint's tensors the forward closes over (`lean`'s layers, embedding, final norm and head, and the tuples that
    hold them). Kept, they were a tensor check a weight and more on the tuples, ~3,000 guards at 32 layers, which
    every step ran on the host before its graph replayed (bench/step_guards.py; docs/engine.md, "The graphed step's
    guards"). A loaded model's weights are the same tensors for the life of its graphs (the forward is
    made once per model, after its weights moved into their pages); what can change between steps keeps its guard
    (the index buffer, the pool, the mode's flag, the forward's scalars, the global state). The weights are still
    the graph's inputs: a CUDA graph's replay checks that its static inputs (the weights, the pool) have not moved,
    and the other backends read them where they are at each call."""
    return [WEIGHTS.match(entry.name) is None for entry in entries]


def compile_options(mode: str) -> dict[str, Any]:
    """torch.compile's arguments for `mode` ('eager': dynamo's eager backend, the CPU's trace in the tests; else an
    inductor mode, 'reduce-overhead' recording CUDA graphs), with the step's guard filter (`unguarded_weights`)."""
    if mode == "eager":
        return {"backend": "eager", "options": {"guard_filter_fn": unguarded_weights}}
    from torch._inductor import list_mode_options          # what `mode=` sets; torch.compile takes mode or options
    return {"options": {**list_mode_options(mode), "guard_filter_fn": unguarded_weights}}


def _raise_recompile_limit() -> None:
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if getattr(config, name, RECOMPILE_LIMIT) < RECOMPILE_LIMIT:
            setattr(config, name, RECOMPILE_LIMIT)


def bucket(n: int, buckets: tuple[int, ...]) -> int | None:
    return next((b for b in buckets if b >= n), None)


def width_bucket(width: int, limit: int) -> int | None:
    """The power of two >= width (at least MIN_WIDTH); None past `limit`."""
    w = MIN_WIDTH
    while w < width:
        w *= 2
    return w if w <= limit else None


class GraphedDecode:
    """A kept K/V pool and the batched decode step compiled over it, one graph per (rows, width) shape."""

    def __init__(self, lm: LoadedModel, n_blocks: int, compile: str = "auto", max_rows: int = 32,
                 row_buckets: tuple[int, ...] = (), residual: bool = True):
        """Rows are padded to the first of `row_buckets` + (max_rows,) that holds the batch. `residual`: a residual
        pool beside K and V, for requests that capture (a server that allows no capture makes none)."""
        self.lm, self.mode = lm, resolve_mode(compile, lm.device)
        self.lean = lean_step_for(lm)
        if self.lean is None:
            raise ValueError("the graphed step runs the project's forward, which does not cover this model")
        spec = lm.spec
        self.pool = BlockPool(spec.n_layers, spec.n_kv_heads, spec.head_dim, lm.dtype, lm.device,
                                       BLOCK, n_blocks)
        if residual:
            self.pool.ensure_residual(spec.d_model, lm.dtype)
        for t in (*self.pool.keys, *self.pool.values, *([self.pool.resid] if residual else [])):
            torch._dynamo.mark_static_address(t)       # written and read in place by every replay
        self.address = self.pool.keys[0].data_ptr()    # a pool that outgrew itself has moved: eager from then on
        self.rows = tuple(b for b in row_buckets if b < max_rows) + (max_rows,)
        self.shapes: set[tuple[int, int]] = set()
        self.inputs: dict[tuple[int, int], StepInputs] = {}   # each shape's index buffer, made once
        self.probe: StepProbe | None = None            # where each step's time goes, when a bench asks (bench/gpu.py)
        self.error: str | None = None                  # why the graphs were given up (the batch runs eagerly)
        self.warmed = False
        self._thread = ThreadPoolExecutor(1, "graphed-step", initializer=_same_device, initargs=(lm.device,))
        self.step = graph_step(self.lean, self.pool)
        if self.mode != "off":
            _raise_recompile_limit()
            self.step = torch.compile(self.step, fullgraph=True, dynamic=False, **compile_options(self.mode))

    @property
    def graphs(self) -> bool:
        return self.mode == "reduce-overhead" and self.lm.device.type == "cuda"

    def new_batch(self) -> PagedBatch:
        """A paged batch on the kept pool (empty: every block back in the free list)."""
        self.pool.free = list(range(self.pool.n_blocks - 1, NULL, -1))
        return PagedBatch(pool=self.pool)

    def fits(self, batch: PagedBatch) -> tuple[int, int] | None:
        """The (rows, width) shape of this step, or None when it must run eagerly (pool outgrown, too wide, a request
        that captures on a pool without a residual part)."""
        if self.error is not None or batch.pool is not self.pool or self.pool.keys[0].data_ptr() != self.address:
            return None
        if self.pool.resid is None and any(getattr(s, "kept", None) is not None for s in batch.slots):
            return None
        rows = bucket(len(batch.slots), self.rows)
        width = width_bucket(batch.width + 1, self.lm.spec.max_context)
        return (rows, width) if rows is not None and width is not None else None

    def forward(self, batch: PagedBatch, shape: tuple[int, int]) -> torch.Tensor:
        """Logits [B, V] of the batch's next tokens through the graph of `shape`: the shape's index buffer filled in
        place from the host (`PagedBatch.plan_into`), then the step on it; no tensor is made for the step."""
        start = time.perf_counter()
        self.shapes.add(shape)
        return self.on_own_thread(self._fill_and_replay, batch, shape, start)[:len(batch.slots), -1]

    def _fill_and_replay(self, batch: PagedBatch, shape: tuple[int, int], start: float) -> torch.Tensor:
        """On the graphs' own thread, so that one step at a time fills a shape's buffer, whoever calls."""
        inputs = self.inputs_for(shape)
        inputs.ready()
        batch.plan_into(inputs.array)
        return self._replay(inputs, start)

    def inputs_for(self, shape: tuple[int, int]) -> StepInputs:
        if shape not in self.inputs:
            self.inputs[shape] = StepInputs(*shape, self.lm.device)
        return self.inputs[shape]

    def _replay(self, inputs: StepInputs, start: float | None = None) -> torch.Tensor:
        """The step on `inputs` (copied to the device first), on the graphs' own thread; `start`: when the caller
        asked for it (the probe's)."""
        index = inputs.load()
        if self.graphs:
            torch.compiler.cudagraph_mark_step_begin()
        mark = self.probe.before(start) if self.probe is not None and start is not None else None
        with torch.no_grad():        # not inference_mode: inference tensors stay out of the graphs
            logits = self.step(index)
        if mark is not None:
            self.probe.after(mark)
        return logits

    def on_own_thread(self, fn, *args):
        """`fn(*args)` on the graphs' own thread, the one that compiles, records and replays them; its result (or
        its exception, raised here).

        cudagraph trees keep their tree managers in thread-local storage (torch/_inductor/cudagraph_trees.py, `local`
        and `get_obj`): graphs recorded on one thread cannot be replayed from another. torch 2.11 fails such a
        replay with a bare `assert torch._C._is_key_in_tls(attr_name)` (the empty AssertionError of issue 48's run:
        the scheduler compiled them in its caller's thread and stepped in its worker); torch 2.13 gives the new
        thread a second, empty manager that records everything again (bench/load.py starts a scheduler, so a worker
        thread, per scenario). One thread of their own serves every caller; a hand-over costs microseconds where
        a step costs milliseconds."""
        return self._thread.submit(fn, *args).result()

    def ensure_warm(self) -> None:
        """`warm_up` at the usual widths once; a compiler failure leaves the steps eager."""
        if self.warmed or self.error is not None:
            return
        widths = warm_widths()
        log.info("compiling the batched decode step for %d rows at %s keys (once per process)", self.rows[-1],
                 " and ".join(map(str, widths)))
        try:
            log.info("compiled in %.0f s", self.warm_up(widths))
        except Exception as err:  # noqa: BLE001 - any compiler failure: the batch runs eagerly, the server serves
            self.give_up(err)

    def give_up(self, err: Exception) -> None:
        """A step could not run graphed (a compiler failure, say): every later step runs eagerly."""
        last = traceback.extract_tb(err.__traceback__)[-1:]        # where it was raised: the GPU run's log kept
        at = f" (at {Path(last[0].filename).name}:{last[0].lineno})" if last else ""   # only an empty AssertionError
        self.error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}{at}"
        log.warning("the batched decode step runs eagerly from now on: %s", self.error, exc_info=err)

    def warm_up(self, widths: tuple[int, ...] = WARM_WIDTHS) -> float:
        """Compile (and record) the graphs of every row bucket at these widths on an idle pool; seconds.

        Padding rows only: they read the null slot and write the scratch slot (K, V and residual), so the pool
        stays clean. On the graphs' own thread (`on_own_thread`)."""
        self.warmed = True
        start = time.perf_counter()
        for width in widths:
            for rows in self.rows:
                inputs = self.inputs_for((rows, width))         # the buffer the steps of this shape fill later
                inputs.ready()
                pad_rows(inputs.array)
                for _ in range(3):           # compile, record, replay
                    self.on_own_thread(self._replay, inputs)
                self.shapes.add((rows, width))
        return time.perf_counter() - start


def graph_step(lean: LeanStep, pool: BlockPool) -> Callable[[torch.Tensor], torch.Tensor]:
    """The function a graph replays: one decode step of `lean` over the kept `pool` (engine.serving.lean `step`), of
    ONE tensor, the shape's index buffer (StepInputs). The weights and the pool are closed over: dynamo guards them
    once, and they stay put (a pool that moves is never stepped graphed again: `fits`). The mask is computed from the
    slots read: a real key's slot is never NULL (the null block is never handed out), and each row reads its own."""
    def graphed(index: torch.Tensor) -> torch.Tensor:
        # index [R, 4 + W]: id, position, K/V slot, residual slot, the W slots read -> logits [R, 1, V]
        gather, write = index[:, GATHER:].contiguous(), index[:, WRITE:WRITE + 1]       # [R, W], [R, 1]
        valid = gather != NULL
        valid[:, -1] = True                         # its own new key (a padding row's too: its query reads one key)
        mask = valid[:, None, None, :]                                                 # [R, 1, 1, W]

        def kv(i: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return write_and_gather(pool.keys[i], pool.values[i], write, gather, k, v)
        resid = pool.resid
        return step(lean, index[:, IDS:IDS + 1], index[:, POS:POS + 1], kv, mask, resid,
                    index[:, RESID] if resid is not None else None)
    return graphed


class StepInputs:
    """One (rows, width) graph's inputs at a fixed address, made once and filled in place every step, as nano-vllm's
    `graph_vars`: `index` [R, 4 + W] int64 (columns engine.serving.paged IDS, POS, WRITE, RESID, GATHER). The host
    writes `array` (numpy over the staging tensor, pinned on CUDA); one copy takes it to `index`, which the graph
    reads (cudagraph trees copy no static input); on a CPU they are one tensor and nothing is copied. Marked static
    with a guard: a step handed any other tensor recompiles (tests/test_graphed.py counts)."""

    def __init__(self, rows: int, width: int, device: torch.device):
        cuda = device.type == "cuda"
        self.host = torch.zeros((rows, GATHER + width), dtype=torch.long, pin_memory=cuda)
        self.array = self.host.numpy()
        pad_rows(self.array)
        self.index = self.host.to(device) if cuda else self.host
        torch._dynamo.mark_static_address(self.index, guard=True)      # another tensor fails the guard
        self._copied = torch.cuda.Event() if cuda else None

    def ready(self) -> None:
        """Before the host writes the staging tensor again: its last copy has left it (the step that sampled has
        synchronised already, so this waits for nothing)."""
        if self._copied is not None:
            self._copied.synchronize()

    def load(self) -> torch.Tensor:
        """The filled inputs where the graph reads them: one asynchronous copy from pinned memory on CUDA."""
        if self.index is not self.host:
            self.index.copy_(self.host, non_blocking=True)
            self._copied.record()
        return self.index


class StepProbe:
    """Where a graphed step's time goes (bench/gpu.py), step by step: from the forward's call to the replay (the plan
    into the index buffer, its copy, the hand-over to the graphs' thread), the replay's call on the host (dynamo's
    guards, cudagraph trees' checks, the launch), the device's time between CUDA events recorded around it, and the
    wall time from one step's call to the next (the sampling and the records between steps included)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.steps: list[tuple[float, float, float, Any, Any]] = []

    def _event(self) -> Any:
        if not self.cuda:
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def before(self, start: float) -> tuple[float, float, Any]:
        return start, time.perf_counter(), self._event()

    def after(self, mark: tuple[float, float, Any]) -> None:
        self.steps.append((*mark[:2], time.perf_counter(), mark[2], self._event()))

    def report(self) -> list[dict[str, float | None]]:
        """Milliseconds per step; `wall_ms` None for the last (no next call)."""
        rows = []
        for i, (start, before, after, e0, e1) in enumerate(self.steps):
            if e1 is not None:
                e1.synchronize()
            rows.append({"host_before_replay_ms": (before - start) * 1e3, "replay_call_ms": (after - before) * 1e3,
                         "device_ms": e0.elapsed_time(e1) if e1 is not None else None,
                         "wall_ms": (self.steps[i + 1][0] - start) * 1e3 if i + 1 < len(self.steps) else None})
        return rows


def _same_device(device: torch.device) -> None:
    """The graphs' thread works on the model's device (CUDA's current device is per thread)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)


def cudagraph_counts() -> dict[str, int]:
    """Inductor's own cudagraph counters in this process (`cudagraph_skips`: graphs compiled but NOT recorded as
    CUDA graphs, their steps run as compiled kernels; the reason goes to the `cudagraphs` log artifact,
    TORCH_LOGS=cudagraphs): what a GPU run records beside its speed, so a slow replay can be told from no replay."""
    from torch._dynamo.utils import counters    # torch's private counters: read only where a report asks
    return {k: int(v) for k, v in counters["inductor"].items() if "cudagraph" in k}


def pool_blocks(lm: LoadedModel, limits: Limits) -> int:
    """Blocks for the kept pool: every place in the batch at the longest request, within POOL_SHARE of free memory
    (a block holds K and V, and the residual when the server allows capture)."""
    resid = residual_bytes_per_token(lm.spec, lm.dtype.itemsize) if limits.max_capture_bytes > 0 else 0
    per_block = (kv_bytes_per_token(lm.spec, lm.dtype_name) + resid) * BLOCK
    wanted = limits.max_batch * -(-(limits.max_prompt_tokens + limits.max_new_tokens) // BLOCK)
    affordable = int(POOL_SHARE * max(free_memory(lm.device) - limits.reserve_mb * 2**20, 0) // per_block)
    return max(2, min(wanted, affordable) + 1)                     # + the null block


def warm_widths() -> tuple[int, ...]:
    """The key widths compiled at start: the `batch_graph_widths` setting (PLAYGROUND_BATCH_GRAPH_WIDTHS,
    comma-separated) or WARM_WIDTHS."""
    text = settings.current().batch_graph_widths or ""
    widths = tuple(width_bucket(int(w), 1 << 30) for w in text.split(",") if w.strip().isdigit())
    return widths or WARM_WIDTHS


def graphed_decode(lm: LoadedModel, limits: Limits) -> GraphedDecode | None:
    """The model's graphed step, made once: on CUDA, for a model the forward covers, at row buckets 1 (a request
    alone) and max_batch (None elsewhere: the steps run the same forward eagerly, engine.serving.lean)."""
    if lm.batch_graphs is not None:
        return lm.batch_graphs
    if lm.device.type != "cuda" or lean_step_for(lm) is None:
        return None
    lm.batch_graphs = GraphedDecode(lm, pool_blocks(lm, limits), "auto", max_rows=limits.max_batch,
                                    row_buckets=ROW_BUCKETS, residual=limits.max_capture_bytes > 0)
    return lm.batch_graphs       # not compiled yet: the thread that steps compiles it (`ensure_warm`)
