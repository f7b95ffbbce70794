"""How a batch's steps run, chosen in one place: its prefill (`pool_prefill`) and its decode step (`decode`, and its
two eager readers of the paged pool).

    logits = pool_prefill(lm, batch, slots, chunks)   # [B, V]: newcomers' next chunks, straight into the pool
    logits = decode(lm, batch, slots, lean, graphs)   # [B, V]: the modules, the graphed forward, lone or rows
    lean = LeanDecode.for_model(lm)          # None where the forward does not cover the model
    logits = lean.lone(batch, slot)          # [1, V]; the new K/V written into the slot's next position
    logits = lean.rows(batch, slots)         # [B, V]; every row's, its residual kept where it captures

Every route but the modules' is the project's one forward (engine.core.lean), eager on a CPU and compiled on CUDA
(engine.serving.graphed); they differ only in how the keys are read. When one request is decoding and it captures
nothing, the step is `lone`: no left-padded gather, no mask. Its K/V stays where the batch keeps it (the same pool,
the same block table, a new block when its last is full), so a request that arrives next joins the batch as if the
lone steps had been ordinary ones. Its keys are read in place when its blocks follow one another in the pool (a
lone request's usually do: blocks are handed out lowest first), else gathered.

A batch of several rows steps on `rows`: the left-padded gather and mask (`PagedBatch.plan`, `write_and_gather`),
the packed small-batch kernel for the products, and the residual of the rows that capture written by the forward
itself into the pool at their new tokens' slots (`PoolResidual`). What it leaves out is the modules' own work
around the same arithmetic (each module's call, the 4-D mask built again from the padding): a 20-row SmolLM2
forward on this 2-core machine took 157 ms against 180 ms through the modules (docs/serving.md, "The batch on the
lean step").
"""
from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F

from engine.core import matvec
from engine.core.lean import Fused, LeanStep, PoolResidual, causal_mask, one_forward
from engine.core.loader import LoadedModel
from engine.core.lone import SideBySide
from engine.core.openmp import in_passing_thread
from engine.core.small_batch import ROWS, SmallBatchKernels, kernels_for, packed_linear, small_batch_kernels
from engine.serving.graphed import GraphedDecode


def decode(lm: LoadedModel, batch: Any, slots: list, lean: "LeanDecode | None",
           graphs: GraphedDecode | None) -> torch.Tensor:
    """Logits [B, V] of every row's next token: the one place that chooses how a decode step runs.

    - transformers' modules, eagerly: a model the forward does not cover, or whose `forward` was replaced
      (engine.core.lean.one_forward), or a solo batch (sliding-window layers);
    - on CUDA, the forward compiled and replayed as a CUDA graph at a fixed row bucket and key width
      (engine.serving.graphed) when the step fits the kept pool; a step that cannot runs as below;
    - else the same forward eagerly: `lone` for one row that keeps nothing (its keys read in place), `rows` for the
      rest (the left-padded gather)."""
    if lean is None or not lean.stands_in():
        return modules_decode(lm, batch, slots)
    if graphs is not None and (shape := graphs.fits(batch)):
        try:
            return graphs.forward(batch, [s.token.id for s in slots], [s.length for s in slots], shape)
        except Exception as err:  # noqa: BLE001 - a step that cannot run graphed runs eagerly, as all after it
            graphs.give_up(err)
    if len(slots) == 1 and slots[0].kept is None:
        return lean.lone(batch, slots[0])
    return lean.rows(batch, slots)


def modules_decode(lm: LoadedModel, batch: Any, slots: list) -> torch.Tensor:
    """The step through transformers' modules (the oracle, and the route of the families the forward does not
    cover): logits [B, V]; the residual of the rows that keep one from `output_hidden_states`."""
    ids = torch.tensor([[s.token.id] for s in slots], device=lm.device)                 # [B, 1]
    positions = torch.tensor([[s.length] for s in slots], device=lm.device)             # [B, 1] own positions
    mask = batch.step_mask()                                                            # [B, L + 1]
    capturing = any(s.kept is not None for s in slots)
    with torch.inference_mode(), small_batch_kernels(lm):
        out = lm.model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=batch.cache,
                       use_cache=True, logits_to_keep=1, output_hidden_states=capturing)
        if capturing:
            batch.keep_residual(out.hidden_states)
    return out.logits[:, -1]                                                            # [B, V]


class LeanDecode:
    """The batch's decode steps on the lean step: its only row's, or all of its rows'."""

    def __init__(self, lean: LeanStep):
        self.lean = lean
        self._fused: list[Fused] | None = None
        self.linear = matvec.linear          # a lone step's products (bench/lone_step.py sets F.linear to compare)
        self.side_by_side: SideBySide | None = SideBySide(lean)    # q|k|v, gate|up as one product each (or None)

    @classmethod
    def for_model(cls, lm: LoadedModel) -> "LeanDecode | None":
        """None where the forward does not cover the model (engine.core.lean.why_not)."""
        lean = one_forward(lm)
        return cls(lean) if lean is not None else None

    def stands_in(self) -> bool:
        """Whether the forward may stand in for the model's modules now (engine.core.lean.one_forward)."""
        return one_forward(self.lean.lm) is not None

    def lone(self, batch: Any, slot: Any) -> torch.Tensor:
        """Logits [1, V] of the next token of `slot`, the batch's only row (its `length` positions are in the
        pool; the newest token, `slot.token`, goes to position `length`)."""
        pool, block, n = batch.pool, batch.block, slot.length
        table = batch.tables[slot]
        if n == len(table) * block:
            table.append(pool.allocate())
        write = table[n // block] * block + n % block
        take = _reader(table, block, n + 1, pool.keys[0].device)

        def kv(i: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            # k, v: [1, KVH, 1, D] -> the pool's slot; returns [1, KVH, n + 1, D] views or gathers of the row
            keys, values = pool.keys[i], pool.values[i]
            keys[write].copy_(k[0, :, 0])
            values[write].copy_(v[0, :, 0])
            return take(keys).transpose(0, 1)[None], take(values).transpose(0, 1)[None]

        device = pool.keys[0].device
        with torch.inference_mode():                      # one row: the products split into blocks (engine.core.matvec)
            return self.lean.forward(torch.tensor([[slot.token.id]], device=device), torch.tensor([[n]], device=device),
                                     kv, linear=self.linear, fused=self.lone_fused())[:, -1]       # [1, V]

    def lone_fused(self) -> list[Fused] | None:
        """q|k|v and gate|up as one split product each (engine.core.lone), where the products are the split ones."""
        return self.side_by_side.fused() if self.side_by_side and self.linear is matvec.linear else None

    def rows(self, batch: Any, slots: list) -> torch.Tensor:
        """Logits [B, V] of every row's next token (batch order); each row's new K/V, and the residual of the rows
        that keep one (`slot.kept`), written at its next position."""
        device = self.lean.embed.weight.device
        mask = batch.step_mask().bool()[:, None, None, :]                            # [B, 1, 1, W + 1]
        ids = torch.tensor([[s.token.id] for s in slots], device=device)             # [B, 1]
        positions = torch.tensor([[s.length] for s in slots], device=device)         # [B, 1]
        keep = (PoolResidual(batch.pool.resid, batch.residual_slots)
                if any(s.kept is not None for s in slots) else None)
        kernels = kernels_for(self.lean.lm)
        linear = kernels.linear if kernels is not None else F.linear
        if len(slots) == 1:                              # one row (one that captures): the lone step's products
            linear = self.linear
        with torch.inference_mode():
            return self.lean.forward(ids, positions, batch.write_and_gather, mask, keep, linear,
                                     self.fused(kernels) if len(slots) in ROWS else None)[:, -1]

    def fused(self, kernels: SmallBatchKernels | None) -> list[Fused] | None:
        """Each layer's q|k|v and gate|up as one packed product each, made once when the batch runner starts (a
        20-row SmolLM2 forward here: 136 against 143 ms with each weight on its own)."""
        if kernels is None:
            return None
        if self._fused is None:              # packed in a passing thread: the step loop's keeps the only OpenMP team
            self._fused = in_passing_thread(lambda: [
                Fused(_product(kernels.fuse([w.q, w.k, w.v])), _product(kernels.fuse([w.gate, w.up])))
                for w in self.lean.layers])
        return self._fused


def _product(fused: tuple[torch.Tensor, torch.Tensor | None] | None):
    """x -> x times the fused packed matrix (plus its bias), or None where nothing was fused."""
    if fused is None:
        return None
    packed, bias = fused
    return lambda x: packed_linear(x, packed, bias)


def _reader(table: list[int], block: int, n: int, device: torch.device):
    """pool [slots, KVH, D] -> the row's first n positions [n, KVH, D]: a slice where its blocks are consecutive."""
    first = table[0]
    if table == list(range(first, first + len(table))):
        return lambda pool: pool[first * block:first * block + n]
    index = (torch.tensor(table)[:, None] * block + torch.arange(block)).flatten()[:n].to(device)
    return lambda pool: pool.index_select(0, index)


def pool_prefill(lm: LoadedModel, batch: Any, slots: list, chunks: list[int]) -> torch.Tensor:
    """Logits [B, V] of each row's last new token: row b feeds the next `chunks[b]` tokens of its prompt after its
    `length` (its reused prefix, earlier chunks), written straight into the paged pool at its slots with its
    residual when it keeps one (`slot.kept`), as nano-vllm's `prepare_prefill` slot mapping does; the rows are
    left-padded to the longest chunk and the mask hides the pads. The project's forward where it covers the model,
    else transformers' modules (the same pool through `batch.cache`, the same 4-D mask)."""
    t = max(chunks)
    valid = batch.plan(chunks, slots=slots)                                              # [B, S] real keys
    starts = torch.tensor([s.length for s in slots])[:, None]
    fed = torch.tensor(chunks)[:, None]
    column = torch.arange(t)[None, :] - (t - fed)                                        # [B, T] < 0: a pad
    ids = torch.tensor([[0] * (t - n) + s.ids[s.length:s.length + n] for s, n in zip(slots, chunks)])
    ids, positions = ids.to(lm.device), (starts + column.clamp(min=0)).to(lm.device)
    keep = (PoolResidual(batch.pool.resid, batch.residual_slots)
            if any(s.kept is not None for s in slots) else None)
    lean = one_forward(lm)
    if lean is not None:
        mask = causal_mask(valid, t) if len(slots) > 1 else None      # one row reads every key before its chunk
        return lean.forward(ids, positions, batch.write_and_gather, mask, keep)[:, -1]
    out = lm.model(input_ids=ids, attention_mask=causal_mask(valid, t), position_ids=positions, cache=batch.cache,
                   use_cache=True, logits_to_keep=1, output_hidden_states=keep is not None)
    for i, h in enumerate(out.hidden_states if keep is not None else ()):
        keep.write(i, h)
    return out.logits[:, -1]
