"""Continuous batching: every running request advances in the same forward pass, one step at a time.

    runner = BatchRunner(lm, max_batch=8)
    runner.add(Slot(request, ids, policy, emit=print, fail=print))
    while not runner.idle:
        info = runner.step()     # up to one prefill chunk of newcomers' prompts, then one decode pass

Requests join at a step boundary and leave as soon as they finish. A newcomer gets a block table in the paged
pool (`engine.serving.paged`) and its prompt is prefilled straight into it, at most `prefill_chunk` prompt tokens per
step for all newcomers together (every newcomer that fits starts in the same step, their rests left-padded into one
pass), so a long prompt never freezes the others' decode and nothing is copied when it joins the decoding rows. Each
prefill and decode pass writes its new K/V at the rows' slots and reads the rows' keys gathered left-padded to the
longest: the mask hides the pads and each token's RoPE position counts from its own row's first token, so every row
computes what it would compute alone (`engine.serving.lean.pool_prefill`, `decode`).
Prefill and decode go through the project's one forward (engine/core/lean.py) where it covers the model, and
transformers' modules otherwise (the same pool, through `PagedBatch.cache`). A model whose layers keep a sliding
window (`batchable`) runs one request at a time on an HF cache of its own (`SoloBatch`).
A request that captures keeps its residual stream (engine/core/kept.py), written inside that forward into the
residual pool beside its K/V blocks, at the slot each token's K/V goes to, in prefill and decode alike (eagerly, or
inside a CUDA graph). Every view of it is derived on demand (engine/core/views.py), so a session sees exactly its
own request's.

Each request yields the same records as `engine.core.generate` (PrefillRecord, DecodeRecord..., DoneRecord)
through its `emit` callback; a request that fails calls `fail` and the others go on.
"""
from __future__ import annotations

import hashlib
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from engine.projection.card import forward_shapes
from engine.errors import EngineError
from engine.core.generate import (GenerationRequest, TextStream, eos_ids, finish_reason, forward,
                                  pick_token, pick_tokens, prompt_pieces, sync, trim_stop)
from engine.core.hooks import CapturePolicy
from engine.core.kept import KeptInputs
from engine.core.loader import LoadedModel
from engine.core.small_batch import kernels_for
from engine.serving.graphed import GraphedDecode
from engine.serving.lean import LeanDecode, decode, mixed_step, pool_prefill
from engine.serving.paged import BlockTable, PagedBatch, SoloBatch, row_cache_state
from engine.serving.prefix import PrefixCache, load_prefix
from engine.core.records import DecodeRecord, DoneRecord, PrefillRecord, Record, SampledToken

PREFILL_CHUNK = 256        # prompt tokens prefilled per step while others decode


@dataclass(eq=False)
class Slot:
    """One request in the runner: its prompt ids, what it captures, and where its records go."""

    request: GenerationRequest
    ids: list[int]                                   # prompt token ids, chat template applied
    policy: CapturePolicy
    emit: Callable[[Record], None]                   # receives each record
    fail: Callable[[Exception], None]                # called once if the request fails
    should_stop: Callable[[], bool] = lambda: False  # cancel / time limit, checked before each step
    kept: KeptInputs | None = None                   # where its residual goes (the policy's hidden states)
    tag: Any = None                                  # the caller's (the scheduler's handle)
    label: Any = None                                # what step records name it by (kept; no big objects)
    # --- state, kept by the runner ---
    prefilled: int = 0                               # prompt tokens whose K/V is in the cache
    reused: int = 0                                  # of those, taken from the prefix cache
    looked_up: bool = False                          # the prefix cache was asked (once per request)
    cache: DynamicCache | None = None                # a solo batch's request: its own cache while prefilling
    token: SampledToken | None = None                # the newest token: the next decode step's input
    generated: list[int] = field(default_factory=list)
    length: int = 0                                  # real positions in the pool (no pads)
    started: float = 0.0
    last: float = 0.0                                # when the newest token was sampled
    ttft: float = 0.0
    finished: bool = False
    digest: Any = None                               # sha256 of the float32 bytes of every step's logits row,
    #                                                  when it is asked for or the invariant mode is on (`begin`)

    def begin(self, lm: LoadedModel, own_cache: bool = False, checksum: bool = False) -> None:
        """Ready to run; `own_cache`: its K/V on an HF cache of its own (a solo batch), not in the paged pool;
        `checksum`: its logits hashed step by step (`DoneRecord.logits_sha256`) even if the request did not ask."""
        self.generator = torch.Generator(device=lm.device).manual_seed(self.request.seed)
        self.stream, self.eos = TextStream(lm.tokenizer), eos_ids(lm)
        self.cache = DynamicCache(config=lm.model.config) if own_cache else None
        self.digest = hashlib.sha256() if checksum or self.request.logits_sha256 else None
        self.started = self.last = time.perf_counter()


@dataclass(frozen=True)
class StepInfo:
    """What one step of the runner did: the live batch, for the room to see."""

    at: float                    # perf_counter when the step ended
    seconds: float               # the whole step: prefill chunk + decode pass + sampling
    decode_rows: int             # requests that got a token from the decode pass
    prefill_tokens: int          # prompt tokens prefilled in this step (0 when none)
    tags: tuple[Any, ...]        # the labels of the requests in the decode pass
    cache_positions: int         # slots in the blocks handed out (each request's last block partly empty)
    real_positions: int          # slots actually holding some request's K/V
    rows: tuple[tuple[Any, int, int], ...] = ()   # per row after the step: (label, real, left pads in the
    #                                               gathered view attention reads; not stored)
    bytes_per_position: int = 0  # K and V bytes of one position, all layers
    blocks: BlockTable | None = None   # the paged cache's block table after the step
    started: float = 0.0         # perf_counter when the step began (`at - seconds`, read once)
    prefill_seconds: float = 0.0  # of `seconds`, the prefill part (stopping, then the newcomers' chunk); 0 when none;
    #                               in a mixed step the forward's share by tokens (`mixed_share`), an estimate
    prefills: tuple[tuple[Any, int], ...] = ()   # (label, prompt tokens computed in this step) per newcomer
    mixed: bool = False          # decode rows and prompt chunks ran in one forward: its parts were not timed apart


def mixed_share(seconds: float, prompt_tokens: int, decode_rows: int) -> float:
    """The prefill part of a mixed step's `seconds`, by tokens: one forward ran `prompt_tokens` prompt tokens and
    `decode_rows` decode tokens together, so its time cannot be timed apart; each token takes an equal share."""
    total = prompt_tokens + decode_rows
    return seconds * prompt_tokens / total if total else 0.0


def _computed(before: list[tuple[Slot, int]]) -> tuple[tuple[Any, int], ...]:
    """(label, prompt tokens computed since `before`) of each newcomer that prefilled some (reused ones not counted)."""
    return tuple((s.label, n) for s, was in before if (n := s.prefilled - s.reused - was) > 0)


def batchable(lm: LoadedModel) -> bool:
    """Can rows of this model's cache be padded and stacked? Only when every layer keeps every position
    (sliding-window layers drop old positions per layer, so their rows would not line up)."""
    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=lm.model.config).layers)


class BatchRunner:
    """Runs many requests on one model: each `step()` prefills one chunk and decodes one token for all."""

    def __init__(self, lm: LoadedModel, max_batch: int = 8, prefill_chunk: int = PREFILL_CHUNK,
                 prefix: PrefixCache | None = None, graphs: GraphedDecode | None = None):
        """`graphs`: decode steps that capture nothing run as CUDA graphs on its kept pool (engine.serving.graphed)."""
        if max_batch < 1 or prefill_chunk < 1:
            raise ValueError("max_batch and prefill_chunk must be at least 1")
        self.lm, self.prefill_chunk, self.prefix = lm, prefill_chunk, prefix
        self.max_batch = max_batch if batchable(lm) else 1
        self.graphs = graphs if batchable(lm) else None
        self.batch = SoloBatch() if not batchable(lm) else graphs.new_batch() if self.graphs else PagedBatch()
        self.prefilling: deque[Slot] = deque()
        # decode steps on the project's forward (engine.serving.lean) where it covers the model
        self.lean = LeanDecode.for_model(lm) if batchable(lm) else None
        if self.max_batch > 1 and self.graphs is None:
            kernels = kernels_for(lm)        # pack now (under a second), not in the first batched step
            if self.lean is not None:
                self.lean.fused(kernels)

    @property
    def slots(self) -> list[Slot]:
        return [*self.prefilling, *self.batch.slots]

    @property
    def idle(self) -> bool:
        """Nothing to run: no request, and no finished run's residual left to move out of the pool (`step`)."""
        return not self.prefilling and not self.batch.slots and not getattr(self.batch, "held", None)

    @property
    def room(self) -> int:
        return self.max_batch - len(self.prefilling) - len(self.batch.slots)

    def _invariant(self) -> bool:
        """Whether this runner's forward runs the batch-invariant kernels (engine.core.invariant): then every request
        keeps its logits checksum, the mode's proof (docs/engine.md, "Same question, same numbers")."""
        return self.lean is not None and self.lean.lean.invariant

    def add(self, slot: Slot) -> None:
        """Take a request; it starts prefilling at the next step."""
        if self.room <= 0:
            raise EngineError(f"the batch already holds {self.max_batch} requests")
        slot.begin(self.lm, own_cache=isinstance(self.batch, SoloBatch), checksum=self._invariant())
        self.prefilling.append(slot)

    def step(self) -> StepInfo:
        """Drop stopped requests, prefill up to one chunk of newcomers' prompts, decode one token for the batch."""
        t0 = time.perf_counter()
        self._drop_stopped()
        if not self.prefilling and not self.batch.slots and isinstance(self.batch, PagedBatch):
            self.batch.settle()              # nothing else to run: finished runs' residual moves out of the pool
        before = [(s, s.prefilled - s.reused) for s in self.prefilling]
        tags = tuple(s.label for s in self.batch.slots)
        mixed = self._mixed_step() if self._mixes() else None
        if mixed is not None:                    # one forward: its prefill part cannot be told apart from the rest
            prefilled, rows = mixed
            t1 = t0 + mixed_share(time.perf_counter() - t0, prefilled, rows)
        else:
            prefilled = self._prefill() if self.prefilling else 0
            t1 = time.perf_counter()
            tags = tuple(s.label for s in self.batch.slots)
            rows = self._decode_step() if self.batch.slots else 0
        layout = tuple((s.label, s.length, p) for s, p in zip(self.batch.slots, self.batch.pads()))
        table = self.batch.table()
        end = time.perf_counter()
        return StepInfo(end, end - t0, rows, prefilled, tags[:rows] if rows else (),
                        table.used * table.block if table else 0, table.tokens if table else 0, layout,
                        table.bytes_per_block // table.block if table else 0, table, started=t0,
                        prefill_seconds=t1 - t0 if before else 0.0, prefills=_computed(before),
                        mixed=mixed is not None)

    # --- stopping ------------------------------------------------------------------------------------

    def _drop_stopped(self) -> None:
        stopped = {s for s in self.slots if s.should_stop()}
        for slot in stopped:
            self._finish(slot, "cancelled")
        self.prefilling = deque(s for s in self.prefilling if s not in stopped)
        self.batch.drop(stopped)

    def _finish(self, slot: Slot, reason: str) -> None:
        if slot.finished:
            return
        slot.finished = True                     # its residual, still in its blocks, moves out as the batch drops it
        total = time.perf_counter() - slot.started
        ttft = slot.ttft if slot.generated else total
        slot.emit(DoneRecord(trim_stop(slot.stream.text, slot.request.stop), reason, len(slot.ids),
                             len(slot.generated), ttft, total - ttft, total,
                             logits_sha256=slot.digest.hexdigest() if slot.digest is not None else None))

    def _fail(self, slot: Slot, err: Exception) -> None:
        if not slot.finished:
            slot.finished = True                 # the caller drops it from the batch (its residual copied out)
            slot.fail(err)

    # --- prefill -------------------------------------------------------------------------------------

    def _prefill(self) -> int:
        """Prompt tokens of the oldest newcomers, at most `prefill_chunk` in all per step (the oldest always
        gets its chunk): the oldest newcomers whose rest of prompt fits the budget together in one padded pass,
        else the next chunk of the oldest alone. Every newcomer that fits the step's budget starts in this step: a
        room pressing Generate together gets its first tokens together."""
        done = 0
        while self.prefilling and (done == 0 or done < self.prefill_chunk):
            budget = self.prefill_chunk - done
            group = self._prefill_group(budget) or [self.prefilling[0]]
            done += self._prefill_rows(group, budget)
        return done

    def _prefill_group(self, budget: int) -> list[Slot]:
        """The oldest newcomers, in order, whose rest of prompt fits `budget` together, for one padded pass: from
        scratch, or on top of a start already in the pool (a reused prefix, earlier chunks)."""
        group, tokens = [], 0
        for slot in self.prefilling:
            self._admit(slot)
            rest = len(slot.ids) - slot.prefilled
            if tokens + rest > budget:
                break
            group.append(slot)
            tokens += rest
        return group

    def _admit(self, slot: Slot) -> None:
        """Once per newcomer: a block table in the paged pool (its prompt's K/V and residual are written there),
        then the longest stored start it shares (the prefix cache)."""
        if slot.looked_up:
            return
        slot.looked_up = True
        if isinstance(self.batch, PagedBatch):
            self.batch.admit(slot, self.lm.spec, self.lm.dtype, self.lm.device)
        if self.prefix is not None:
            self._reuse_prefix(slot)

    def _prefill_rows(self, group: list[Slot], budget: int) -> int:
        """One pass over the next tokens of each newcomer in `group` (the whole rest of each, or the oldest's next
        chunk of at most `budget` when it is alone); those whose prompt is in take their first token. A pass that
        raises is run again with the oldest alone, which then fails alone. Returns the tokens done."""
        self._admit(group[0])
        chunks = [len(s.ids) - s.prefilled for s in group]
        if len(group) == 1:
            chunks = [min(chunks[0], budget)]
        try:
            with torch.inference_mode():
                logits = self._prefill_pass(group, chunks)                       # [B, V]
        except Exception as err:  # noqa: BLE001 - this request fails alone; the batch goes on
            if len(group) > 1:
                return self._prefill_rows(group[:1], self.prefill_chunk)
            self.prefilling.remove(group[0])
            self.batch.drop({group[0]})
            self._fail(group[0], err)
            return chunks[0]
        self._took_prefill(group, chunks, logits)
        return sum(chunks)

    def _took_prefill(self, group: list[Slot], chunks: list[int], logits: torch.Tensor) -> None:
        """Each newcomer's `chunks[b]` tokens are in; those whose prompt is in take their first token (logits
        [B, V])."""
        for b, (slot, n) in enumerate(zip(group, chunks)):
            slot.prefilled += n
            if isinstance(self.batch, PagedBatch):
                slot.length = slot.prefilled
                if slot.kept is not None:
                    slot.kept.commit(slot.length)
            if slot.prefilled == len(slot.ids):
                self.prefilling.remove(slot)
                self._first_token(slot, logits[b])

    def _prefill_pass(self, group: list[Slot], chunks: list[int]) -> torch.Tensor:
        """Logits [B, V] of each row's last new token; each row's K/V and kept residual written where it lives."""
        if isinstance(self.batch, SoloBatch):              # sliding-window layers: the request's own cache
            slot, n = group[0], chunks[0]
            return forward(self.lm, slot.ids[slot.prefilled:slot.prefilled + n], slot.cache, slot.kept)[None]
        return pool_prefill(self.lm, self.batch, group, chunks, self.lean)

    def _reuse_prefix(self, slot: Slot) -> None:
        """Start from the longest stored prompt start this one shares: its K/V (and residual) as is."""
        entry, n = self.prefix.lookup(slot.ids, slot.kept.layers if slot.kept is not None else ())
        if entry is None:
            return
        slot.prefilled = slot.reused = n
        if isinstance(self.batch, SoloBatch):
            load_prefix(slot.cache, entry, n)
            if slot.kept is not None:               # the reused part's residual comes from the entry as well
                for i in slot.kept.layers:
                    slot.kept.write(i, 0, entry.inputs[i][:n])
                slot.kept.commit()
            return
        where = self.batch.load(slot, entry.keys, entry.values, n)
        slot.length = n
        if slot.kept is not None:
            with torch.inference_mode():
                for i in slot.kept.layers:
                    self.batch.pool.resid[i, where] = entry.inputs[i][:n].to(self.batch.pool.resid.dtype)
            slot.kept.commit(n)

    def _first_token(self, slot: Slot, logits: torch.Tensor) -> None:
        """The prompt is in: sample the first token, send the PrefillRecord, join the batch."""
        slot.token = pick_token(self.lm, logits, slot.request, slot.generator, slot.stream)
        sync(self.lm.device)
        hash_wanted([slot], logits[None])
        slot.last = time.perf_counter()
        slot.ttft = slot.last - slot.started
        slot.length = len(slot.ids)
        slot.generated.append(slot.token.id)
        paged = isinstance(self.batch, PagedBatch)
        state = self.batch.state(slot.length) if paged else row_cache_state(slot.cache, slot.length)
        slot.emit(PrefillRecord(prompt_pieces(self.lm, slot.ids), forward_shapes(self.lm.spec, len(slot.ids)),
                                slot.ttft, state, slot.token, reused_tokens=slot.reused))
        # stored once the first token is on its way: copying the prompt's K/V out of the pool is not its wait
        if self.prefix is not None:
            inputs = slot.kept.prompt(len(slot.ids)) if slot.kept is not None else None
            self.prefix.store(slot.ids, self.batch.own_cache(slot, self.lm.model.config) if paged else slot.cache,
                              inputs)
        if self._maybe_finish(slot):
            self.batch.drop({slot})
        elif paged:
            self.batch.join(slot)
        else:
            self.batch.add(slot, slot.cache)
        slot.cache = None

    def _maybe_finish(self, slot: Slot) -> bool:
        reason = finish_reason(slot.token.id, slot.stream.text, slot.eos, slot.request, len(slot.generated))
        if reason is not None:
            self._finish(slot, reason)
        return reason is not None

    # --- decode --------------------------------------------------------------------------------------

    def _decode_step(self) -> int:
        """One forward pass for every row of the batch, one sampled token each; returns the rows."""
        slots = list(self.batch.slots)
        try:
            logits = self._batch_forward(slots)
        except Exception as err:  # noqa: BLE001 - find the request that fails; the others go on
            self._isolate(err)       # no row's length moved: the new token's slot is simply written again
            return 0
        self._took_decode(slots, logits)
        return len(slots)

    def _took_decode(self, slots: list[Slot], logits: torch.Tensor) -> None:
        """Every row's next token from its logits [B, V]; finished runs leave the batch."""
        tokens = pick_tokens(self.lm, logits, [s.request for s in slots], [s.generator for s in slots],
                             [s.stream for s in slots])
        sync(self.lm.device)
        hash_wanted(slots, logits)
        now_done: set[Slot] = set()
        for b, slot in enumerate(slots):
            self._advance(slot, tokens[b])
            if slot.finished:
                now_done.add(slot)
        self.batch.drop(now_done, hold=True)     # a finished run's residual moves out later, off this step

    # --- the mixed step ------------------------------------------------------------------------------------

    def _mixes(self) -> bool:
        """A step with newcomers and decoding rows runs as one forward where the forward covers the model (eagerly:
        on CUDA the decode rows' graphed step and the prefill run apart; so do they in the invariant mode, whose
        attention kernel stands in for the forward's and reads no segments)."""
        return bool(self.prefilling and self.batch.slots and isinstance(self.batch, PagedBatch)
                    and self.graphs is None and self.lean is not None and self.lean.stands_in()
                    and not self.lean.lean.invariant)

    def _chunk_plan(self) -> list[tuple[Slot, int]]:
        """The newcomers' prompt tokens of this step, as `_prefill` takes them: in order, each the rest of its prompt
        while the step's budget lasts, the one that reaches it a chunk of what is left (the oldest always some)."""
        plan, budget = [], self.prefill_chunk
        for slot in self.prefilling:
            if budget <= 0:
                break
            self._admit(slot)
            n = min(len(slot.ids) - slot.prefilled, budget)
            plan.append((slot, n))
            budget -= n
        return plan

    def _mixed_step(self) -> tuple[int, int] | None:
        """The decode rows and the newcomers' chunks in ONE forward over the flattened step
        (engine.serving.lean.mixed_step): (prompt tokens, decode rows). None when it raised: nothing has moved, and
        the step runs apart, where a request whose part fails fails alone."""
        plan, rows = self._chunk_plan(), list(self.batch.slots)
        newcomers, chunks = [s for s, _ in plan], [n for _, n in plan]
        try:
            logits = mixed_step(self.lean.lean, self.batch, rows, newcomers, chunks,
                                self.lean.products(len(rows) + sum(chunks)))              # [B + C, V]
        except Exception:  # noqa: BLE001 - run apart: the failing request fails alone there
            return None
        self._took_decode(rows, logits[:len(rows)])
        self._took_prefill(newcomers, chunks, logits[len(rows):])
        return sum(chunks), len(rows)

    def _batch_forward(self, slots: list[Slot]) -> torch.Tensor:
        """Logits [B, V] of every row's next token; the residual of every row that captures written where it is
        kept (the pool at its new token's slot, or a solo request's own buffers). How: engine.serving.lean.decode."""
        return decode(self.lm, self.batch, slots, self.lean, self.graphs)

    def _advance(self, slot: Slot, token: SampledToken) -> None:
        slot.length += 1
        if slot.kept is not None:
            slot.kept.commit(slot.length)       # the position just fed is readable
        slot.token = token
        now = time.perf_counter()
        slot.generated.append(slot.token.id)
        slot.emit(DecodeRecord(len(slot.generated) - 1, now - slot.last, self.batch.state(slot.length), slot.token))
        slot.last = now
        self._maybe_finish(slot)

    def _isolate(self, err: Exception) -> None:
        """A batched step raised: the request behind it fails alone and the others go on.

        With several rows, each runs alone once; those that raise again are the culprits. A fault
        no row repeats alone (a passing one, or memory the whole batch needed) fails the newest
        request, as a server preempts the last one in.
        """
        slots = list(self.batch.slots)
        errors = {s: e for b, s in enumerate(slots) if len(slots) > 1 and (e := self._probe(b, s)) is not None}
        if not errors:
            errors = {slots[-1]: err}
        for slot, error in errors.items():
            self._fail(slot, error)
        self.batch.drop(set(errors))

    def _probe(self, b: int, slot: Slot) -> Exception | None:
        try:
            with torch.inference_mode():
                forward(self.lm, [slot.token.id], self.batch.row_cache(b, self.lm.model.config))
        except Exception as err:  # noqa: BLE001 - what this row raises alone
            return err
        return None


def hash_wanted(slots: Sequence[Slot], logits: torch.Tensor) -> None:
    """`hash_rows` for the slots that keep a checksum (logits [B, V], batch order); no copy when none does."""
    wanted = [b for b, slot in enumerate(slots) if slot.digest is not None]
    if wanted:
        hash_rows([slots[b] for b in wanted], logits[wanted] if len(wanted) < len(slots) else logits)


def hash_rows(slots: Sequence[Slot], logits: torch.Tensor) -> None:
    """Each slot's running sha256 takes its row of this step's logits [B, V], as float32 bytes (one copy to the host
    for the whole batch): two runs of one request have the same `DoneRecord.logits_sha256` only if every step's
    logits were bitwise the same (issue 51: with PLAYGROUND_INVARIANT=on, whoever else is in the room)."""
    rows = logits.detach().to(device="cpu", dtype=torch.float32).contiguous().numpy()   # [B, V]
    for slot, row in zip(slots, rows):
        slot.digest.update(row)


# --- padding rows of different lengths into one tensor ----------------------------------------------

def pad_id(lm: LoadedModel) -> int:
    tok = lm.tokenizer
    for candidate in (tok.pad_token_id, tok.eos_token_id, 0):
        if candidate is not None:
            return int(candidate)
    return 0


def left_pad(rows: Sequence[Sequence[int]], pad: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of ids -> input_ids [B, T] and attention mask [B, T] (1 = real token), pads on the left."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long, device=device)
    mask = torch.zeros((len(rows), width), dtype=torch.long, device=device)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = torch.tensor(row, dtype=torch.long, device=device)
        mask[i, width - len(row):] = 1
    return ids, mask
