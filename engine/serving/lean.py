"""How a batch's steps run, chosen in one place: one step function (`step`) for its prefill chunks and decode
rows, eager on a CPU and compiled on CUDA (engine.serving.graphed compiles this same function); transformers'
modules only for the families the forward does not cover, and as the tests' oracle.

    logits = pool_prefill(lm, batch, slots, chunks)   # [B, V]: newcomers' next chunks, straight into the pool
    logits = decode(lm, batch, slots, lean, graphs)   # [B, V]: the step function (graphed or eager) or the modules
    lean = LeanDecode.for_model(lm)          # None where the forward does not cover the model
    logits = lean.decode(batch, slots)       # [B, V]: `step` eagerly, every row's residual kept where it captures

A decode step's rows differ only in data. One row (a request alone) reads its keys in place when its blocks follow
one another in the pool (a lone request's usually do: blocks are handed out lowest first), else gathered, with no
mask and its own products (engine.core.matvec); its K/V stays where the batch keeps it (the same pool, the same
block table, a new block when its last is full), so a request that arrives next joins as if its steps had been
ordinary ones. Several rows read the left-padded gather under a mask (`PagedBatch.plan`, `write_and_gather`) with
the packed small-batch products. Either way the residual of the rows that capture is written by the forward itself
into the pool at their new tokens' slots (`PoolResidual`). What it leaves out is the modules' own work around the
same arithmetic (each module's call, the 4-D mask built again from the padding): a 20-row SmolLM2 forward on this
2-core machine took 157 ms against 180 ms through the modules (docs/serving.md, "The batch on the lean step").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn import functional as F

from engine.core import matvec
from engine.core.kernels.attend import LANES, MAX_GROUP, attend_kernel
from engine.core.lean import KV, Attention, Fused, LeanStep, Linear, PoolResidual, causal_mask, one_forward
from engine.core.loader import LoadedModel
from engine.core.lone import SideBySide
from engine.core.openmp import in_passing_thread
from engine.core.small_batch import ROWS, SmallBatchKernels, kernels_for, packed_linear, small_batch_kernels


def decode(lm: LoadedModel, batch: Any, slots: list, lean: "LeanDecode | None", graphs: Any) -> torch.Tensor:
    """Logits [B, V] of every row's next token: the one place that chooses how a decode step runs. `graphs`: the
    model's engine.serving.graphed.GraphedDecode or None (not imported here: graphed.py compiles `step`).

    - transformers' modules, eagerly: a model the forward does not cover, or whose `forward` was replaced
      (engine.core.lean.one_forward), or a solo batch (sliding-window layers);
    - on CUDA, the forward compiled and replayed as a CUDA graph at a fixed row bucket and key width
      (engine.serving.graphed) when the step fits the kept pool; a step that cannot runs as below;
    - else the same step function eagerly (`LeanDecode.decode`)."""
    if lean is None or not lean.stands_in():
        return modules_decode(lm, batch, slots)
    if graphs is not None and (shape := graphs.fits(batch)):
        try:
            return graphs.forward(batch, shape)             # the batch's rows are `slots`
        except Exception as err:  # noqa: BLE001 - a step that cannot run graphed runs eagerly, as all after it
            graphs.give_up(err)
    return lean.decode(batch, slots)


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


def step(lean: LeanStep, ids: torch.Tensor, positions: torch.Tensor, kv: KV, mask: torch.Tensor | None = None,
         resid: torch.Tensor | None = None, write: torch.Tensor | None = None, linear: Linear = F.linear,
         fused: list[Fused] | None = None, logits_to_keep: int | torch.Tensor = 1,
         attention: Attention | None = None, lone: Any = None) -> torch.Tensor:
    """The one step function: every step of the batch that the forward covers runs it, eagerly on a CPU and compiled
    (engine.serving.graphed) on CUDA. ids and positions [R, T]; `kv` writes the new K/V at the rows' slots and
    returns the keys each row reads; `mask` [R, 1, T, S] where rows read pads (None: causal); with the residual pool
    `resid` [L + 1, slots, d_model], each new token's residual is written inside the forward at its slot `write`
    [R * T] (SCRATCH: keeps none). Logits [R, K, V] (engine.core.lean.LeanStep.forward)."""
    keep = PoolResidual(resid, write) if resid is not None else None
    return lean.forward(ids, positions, kv, mask, keep, linear=linear, fused=fused, logits_to_keep=logits_to_keep,
                        attention=attention, lone=lone)


class LeanDecode:
    """The batch's decode steps on the one step function; what differs with the rows is data only."""

    def __init__(self, lean: LeanStep):
        self.lean = lean
        self._fused: list[Fused] | None = None
        self._fused_weights: list[torch.Tensor] = []     # the weights packed into `_fused`, and where they were then
        self._fused_where: list[int] = []
        self.linear = matvec.linear          # one row's products (bench/lone_step.py sets F.linear to compare)
        self.side_by_side: SideBySide | None = SideBySide(lean)    # q|k|v, gate|up as one product each (or None)
        self.plan_layers = True              # a lone step's layers through LonePlan where it applies
        self.attention = lone_attention(lean)    # a lone row's attention: attend.c where it fits, else SDPA (None)
        self.attend_threads = 0              # threads its kv heads are dealt to in LonePlan (0: the step's; 1: the
                                             # step's own thread, as before: bench/lone_parts.py's "attention-alone")
        self.ends_in_c = True                # a lone token whole in one C call (LonePlan.token) where it can be;
                                             # off: its embedding, norm and head from Python ("ends-apart")
        self.row = RowInputs(lean.embed.weight.device)    # a lone row's token, position and new slot

    @classmethod
    def for_model(cls, lm: LoadedModel) -> "LeanDecode | None":
        """None where the forward does not cover the model (engine.core.lean.why_not)."""
        lean = one_forward(lm)
        return cls(lean) if lean is not None else None

    def stands_in(self) -> bool:
        """Whether the forward may stand in for the model's modules now (engine.core.lean.one_forward)."""
        return one_forward(self.lean.lm) is not None

    def decode(self, batch: Any, slots: list) -> torch.Tensor:
        """Logits [B, V] of every row's next token (batch order) through `step`; each row's new K/V, and the
        residual of the rows that keep one (`slot.kept`), written at its next position. One row reads its keys in
        place (or gathered where its blocks do not follow one another), with its own products (engine.core.matvec)
        and no mask; several rows read the left-padded gather under the mask, with the packed products."""
        lone = None
        if len(slots) == 1:
            kv = one_row(batch, slots[0])
            ids, positions, write = self.row.of(slots[0].token.id, slots[0].length, kv.write)
            mask, ((linear, fused), lone) = None, self.lone_step()
            attention = self.attention
        else:
            device = self.lean.embed.weight.device
            ids = torch.tensor([[s.token.id] for s in slots], device=device)         # [B, 1]
            positions = torch.tensor([[s.length] for s in slots], device=device)     # [B, 1] own positions
            mask = batch.step_mask().bool()[:, None, None, :]                        # [B, 1, 1, W + 1]
            kv, write = batch.write_and_gather, batch.residual_slots
            (linear, fused), attention = self.products(len(slots), pack=True), None
        resid = batch.pool.resid if any(s.kept is not None for s in slots) else None
        with torch.inference_mode():
            return step(self.lean, ids, positions, kv, mask, resid, write, linear, fused, attention=attention,
                        lone=lone)[:, -1]

    def products(self, rows: int, pack: bool = False) -> tuple[Linear, list[Fused] | None]:
        """(linear, fused) for a step of `rows` tokens in all (a room's decode rows, a prefill chunk, a mixed step):
        the packed small-batch products (engine.core.small_batch, q|k|v and gate|up packed as one each) where the
        model has them (packed now if `pack`: a room's first batched step; the runner packs at its start) and `rows`
        is in their ROWS; else F.linear (MKL)."""
        kernels = kernels_for(self.lean.lm, pack=pack)
        ordered = kernels is not None and self.lean.invariant and kernels.ordered     # the mode's, at any rows
        if kernels is None or (rows not in ROWS and not ordered):
            return F.linear, None
        fused = self.fused(kernels)
        stale = list(map(torch.Tensor.data_ptr, self._fused_weights)) != self._fused_where
        linear = kernels.ordered_linear if ordered else kernels.linear
        return linear, None if stale else fused        # a weight pointed elsewhere: its own product

    def lone_step(self) -> tuple[tuple[Linear, list[Fused] | None], Any]:
        """A lone step's ((linear, fused), plan): every product bound once where they are the row kernel's
        (engine.core.lone: `SideBySide.bound`), else `self.linear` with q|k|v and gate|up as one product each where
        they can be; and, where they are bound and `plan_layers` is on (the bench turns it off to compare), its layers
        in C calls (engine.core.lone.LonePlan), else None. The weights are checked once for both (`SideBySide.bound`:
        their places, read cold after every step)."""
        bound = self.side_by_side.bound() if self.side_by_side and self.linear is matvec.linear else None
        if bound is None:
            return (self.linear, self.lone_fused()), None
        plan = self.side_by_side.plan() if self.plan_layers else None
        if plan is not None:
            plan.state.attend_threads, plan.ends_in_c = self.attend_threads, self.ends_in_c
        return bound, plan

    def lone_fused(self) -> list[Fused] | None:
        """q|k|v and gate|up as one split product each (engine.core.lone), where the products are the split ones."""
        return self.side_by_side.fused() if self.side_by_side and self.linear is matvec.linear else None

    def fused(self, kernels: SmallBatchKernels | None) -> list[Fused] | None:
        """Each layer's q|k|v and gate|up as one packed product each, made once when the batch runner starts (a
        20-row SmolLM2 forward here: 136 against 143 ms with each weight on its own)."""
        if kernels is None:
            return None
        if self._fused is None:              # packed in a passing thread: the step loop's keeps the only OpenMP team
            self._fused_weights = [p[0] for w in self.lean.layers for p in (w.q, w.k, w.v, w.gate, w.up)]
            self._fused_where = list(map(torch.Tensor.data_ptr, self._fused_weights))
            self._fused = in_passing_thread(lambda: [
                Fused(_product(kernels.fuse([w.q, w.k, w.v])), _product(kernels.fuse([w.gate, w.up])))
                for w in self.lean.layers])
        return self._fused


def lone_attention(lean: LeanStep) -> Attention | None:
    """A lone row's attention (one query a head against its keys, no mask) through attend.c, the invariant mode's
    kernel, where it is built and fits the model (float32 on the CPU, a head's width a multiple of its LANES, at most
    MAX_GROUP query heads a kv head); None (SDPA) elsewhere. One C call where SDPA made several operators' work,
    each cold after the products streamed the weights (docs/engine.md, "A lone row's attention in C"); with the
    mode on or off a lone row's attention is then the same bits, as its products already were."""
    weight = lean.embed.weight
    if weight.device.type != "cpu" or weight.dtype != torch.float32 or lean.head_dim % LANES \
            or lean.heads % lean.kv_heads or lean.heads // lean.kv_heads > MAX_GROUP:
        return None
    kernel = attend_kernel()
    return kernel.attention if kernel is not None else None


def _product(fused: tuple[torch.Tensor, torch.Tensor | None] | None):
    """x -> x times the fused packed matrix (plus its bias), or None where nothing was fused."""
    if fused is None:
        return None
    packed, bias = fused
    return lambda x: packed_linear(x, packed, bias)


class RowInputs:
    """A lone row's step inputs: its token and position [1, 1] and its new token's slot [1], each in a tensor made
    once and filled in place through numpy on a CPU, not made afresh each step, each call cold after the weights have
    streamed through the caches (with the pick's outputs in one allocation: a lone token's host work 0.95 against
    1.10 ms, docs/engine.md, "A lone token's host work, remeasured"); new tensors on other devices. Only the step
    reads them (the forward takes ints from them for a lone row, or embeds and indexes with them), so the next step
    may overwrite them."""

    def __init__(self, device: torch.device):
        self.device, self.arrays = device, None
        if device.type == "cpu":
            with torch.inference_mode(False):    # normal tensors: usable in and out of inference mode
                self.tensors = (torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long),
                                torch.zeros(1, dtype=torch.long))
            self.arrays = tuple(t.numpy() for t in self.tensors)

    def of(self, token: int, position: int, write: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(ids [1, 1], positions [1, 1], write [1]) holding these."""
        if self.arrays is None:
            return (torch.tensor([[token]], device=self.device), torch.tensor([[position]], device=self.device),
                    torch.tensor([write], device=self.device))
        ids, positions, write_at = self.arrays
        ids[0, 0], positions[0, 0], write_at[0] = token, position, write
        return self.tensors


def one_row(batch: Any, slot: Any) -> "RowKV":
    """A decode step's K/V of the batch's only row (its new token's slot: `.write`): its `length`
    positions are in the pool, the newest token goes to position `length` (a new block when its last is full). The
    new K/V is copied into a view of its slot, and the keys are read in place as one view when its blocks follow one
    another in the pool (a lone request's usually do: blocks are handed out lowest first), else gathered."""
    pool, block, n = batch.pool, batch.block, slot.length
    table = batch.tables[slot]
    if n == len(table) * block:
        table.append(pool.allocate())
    write = table[n // block] * block + n % block
    take, first = _reader(table, block, n + 1, pool.keys[0].device)
    return RowKV(pool, write, take, first, n + 1)


@dataclass(frozen=True)
class RowKV:
    """The step's `kv` for one row: called as kv(i, k, v), it copies k, v [1, KVH, 1, D] into layer i's slot `write`
    and returns [1, KVH, n + 1, D] views or gathers of the row (`take`); a LonePlan writes the slot itself in C at
    the addresses `slots()` gives (float32 on the CPU) and reads with `read(i)`."""

    pool: Any
    write: int
    take: Any
    first: int | None = None       # the slot of the row's first key where its keys lie in place (None: gathered)
    n: int = 0                     # the keys the row reads, its new one included

    def __call__(self, i: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.pool.keys[i], self.pool.values[i]
        rows(keys, self.write, 1).copy_(k)
        rows(values, self.write, 1).copy_(v)
        return self.take(keys), self.take(values)

    def read(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.take(self.pool.keys[i]), self.take(self.pool.values[i])

    def in_place(self) -> tuple[list[torch.Tensor], list[torch.Tensor], int, int, int] | None:
        """(each layer's keys, values [slots, KVH, D], the new slot, the first key's slot, the keys read) where the
        row's keys lie one after another in a float32 CPU pool (a LonePlan then makes every layer in one C call);
        None where they are gathered or the pool is not one."""
        if self.first is None or not self.in_c():
            return None
        return self.pool.keys, self.pool.values, self.write, self.first, self.n

    def in_c(self) -> bool:
        """Whether C reads and writes the pool by address: float32, on the CPU, contiguous."""
        keys = self.pool.keys[0]
        return keys.dtype == torch.float32 and keys.is_cpu and keys.is_contiguous()

    def slots(self) -> list[tuple[int, int]] | None:
        """Per layer, the addresses of the row's slot in the keys and the values; None off a float32 CPU pool."""
        keys = self.pool.keys
        if not self.in_c():
            return None
        at = 4 * self.write * keys[0].stride(0)
        return [(k.data_ptr() + at, v.data_ptr() + at) for k, v in zip(keys, self.pool.values)]


def rows(pool: torch.Tensor, first: int, n: int) -> torch.Tensor:
    """pool [slots, KVH, D], contiguous as BlockPool keeps it -> slots first .. first + n - 1 as [1, KVH, n, D], a
    view: what slicing, transposing and unsqueezing make (the same sizes and strides), in one operator call, not six."""
    _, heads, dim = pool.shape
    return pool.as_strided((1, heads, n, dim), (heads * dim, dim, heads * dim, 1),
                           pool.storage_offset() + first * heads * dim)


def _reader(table: list[int], block: int, n: int, device: torch.device):
    """(pool [slots, KVH, D] -> the row's first n positions [1, KVH, n, D], the slot of its first key where they lie
    in place, else None): a view where its blocks are consecutive, else gathered."""
    first = table[0]
    if table == list(range(first, first + len(table))):
        return (lambda pool: rows(pool, first * block, n)), first * block
    index = (torch.tensor(table)[:, None] * block + torch.arange(block)).flatten()[:n].to(device)
    return (lambda pool: pool.index_select(0, index).transpose(0, 1)[None]), None


@dataclass(frozen=True)
class Segments:
    """A flattened step's attention (`step`'s `attention`): N new tokens as one sequence, queries [1, H, N, D],
    split by segment. The first `rows` tokens are decode rows, each a query per head against its own keys (`reads`
    [B, W], left-padded with the null slot and hidden by `mask` [B, 1, 1, W]); then each prefill chunk (its first
    token, its n tokens, the slots it reads [S] and its mask [1, 1, n, S], None where it reads only itself: causal).
    The keys and values are a layer's whole pool [slots, KVH, D], as the step's `kv` returns them."""

    rows: int
    reads: torch.Tensor | None
    mask: torch.Tensor | None
    chunks: tuple[tuple[int, int, torch.Tensor, torch.Tensor | None], ...]

    def __call__(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
                 scaling: float) -> torch.Tensor:
        # q: [1, H, N, D]; keys, values: [slots, KVH, D] -> [1, H, N, D]
        gqa, out = q.shape[1] != keys.shape[1], []
        if self.rows:
            b, w = self.reads.shape
            k, v = (p.index_select(0, self.reads.reshape(-1)).view(b, w, *p.shape[1:]).transpose(1, 2)
                    for p in (keys, values))                                                   # [B, KVH, W, D]
            rows = q[0, :, :b].transpose(0, 1)[:, :, None]                                     # [B, H, 1, D]
            o = F.scaled_dot_product_attention(rows, k, v, attn_mask=self.mask, scale=scaling, enable_gqa=gqa)
            out.append(o[:, :, 0].transpose(0, 1)[None])                                       # [1, H, B, D]
        for first, n, reads, chunk_mask in self.chunks:
            k, v = (p.index_select(0, reads).transpose(0, 1)[None] for p in (keys, values))   # [1, KVH, S, D]
            out.append(F.scaled_dot_product_attention(q[:, :, first:first + n], k, v, attn_mask=chunk_mask,
                                                      is_causal=chunk_mask is None and n > 1, scale=scaling,
                                                      enable_gqa=gqa))                         # [1, H, n, D]
        return torch.cat(out, dim=2)


@dataclass
class Flat:
    """The new tokens of a flattened step, segment after segment: ids, positions, K/V slots, residual slots."""

    ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    write: list[torch.Tensor] = field(default_factory=list)
    resid: list[torch.Tensor] = field(default_factory=list)
    last: list[int] = field(default_factory=list)        # the tokens whose logits the step keeps


def _rows_segment(batch: Any, rows: list, flat: Flat) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The decode rows' tokens (one each, their keys left-padded as a decode step's); their (reads, mask)."""
    if not rows:
        return None, None
    valid = batch.plan([1] * len(rows), slots=rows)                                      # [B, W + 1]
    flat.ids += [s.token.id for s in rows]
    flat.positions += [s.length for s in rows]
    flat.write.append(batch.writes.reshape(-1))
    flat.resid.append(batch.residual_slots)
    flat.last += range(len(rows))
    return batch.reads, valid[:, None, None, :]


def _chunk_segment(batch: Any, slot: Any, n: int, flat: Flat) -> tuple[int, int, torch.Tensor, torch.Tensor | None]:
    """A newcomer's next n prompt tokens: (first token, n, the slots it reads, its mask or None: causal)."""
    reads, write, resid = batch.segment(slot, n)                                         # [length + n], [n], [n]
    first = len(flat.ids)
    flat.ids += slot.ids[slot.length:slot.length + n]
    flat.positions += range(slot.length, slot.length + n)
    flat.write.append(write)
    flat.resid.append(resid)
    flat.last.append(first + n - 1)
    mask = causal_mask(torch.ones(1, len(reads), dtype=torch.bool, device=reads.device), n) if slot.length else None
    return first, n, reads, mask


def mixed_inputs(batch: Any, rows: list, newcomers: list, chunks: list[int]) -> dict[str, Any]:
    """`step`'s arguments for one flattened step, as vLLM and nano-vllm lay one out: the decode `rows` (the batch's,
    one token each) and each newcomer's next `chunks[c]` prompt tokens, all N new tokens in one [1, N] sequence
    with their own positions and pool slots; logits kept at each row's token, then at each chunk's last."""
    flat = Flat()
    reads, mask = _rows_segment(batch, rows, flat)
    segments = tuple(_chunk_segment(batch, slot, n, flat) for slot, n in zip(newcomers, chunks))
    pool, device, where = batch.pool, batch.pool.keys[0].device, torch.cat(flat.write)

    def kv(i: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # k, v: [1, KVH, N, D] -> the pool at their slots; returns the layer's whole pool [slots, KVH, D]
        pool.keys[i][where] = k[0].transpose(0, 1)
        pool.values[i][where] = v[0].transpose(0, 1)
        return pool.keys[i], pool.values[i]
    capturing = any(getattr(s, "kept", None) is not None for s in [*rows, *newcomers])
    return dict(ids=torch.tensor([flat.ids], device=device), positions=torch.tensor([flat.positions], device=device),
                kv=kv, resid=pool.resid if capturing else None, write=torch.cat(flat.resid),
                logits_to_keep=torch.tensor(flat.last, device=device),
                attention=Segments(len(rows), reads, mask, segments))


def mixed_step(lean: LeanStep, batch: Any, rows: list, newcomers: list, chunks: list[int],
               products: tuple[Linear, list[Fused] | None] = (F.linear, None)) -> torch.Tensor:
    """Logits [B + C, V]: each decode row's next token, then each newcomer's after its chunk, from ONE call of `step`
    over every new token of the step (`mixed_inputs`): the products (`products`: linear, fused; LeanDecode.products)
    run once over all N tokens, attention by segment. Decode rows are not padded to the chunk's length."""
    linear, fused = products
    with torch.inference_mode():
        return step(lean, **mixed_inputs(batch, rows, newcomers, chunks), linear=linear, fused=fused)[0]


def pool_prefill(lm: LoadedModel, batch: Any, slots: list, chunks: list[int],
                 decoder: "LeanDecode | None" = None) -> torch.Tensor:
    """Logits [B, V] of each row's last new token: row b feeds the next `chunks[b]` tokens of its prompt after its
    `length` (its reused prefix, earlier chunks), written straight into the paged pool at its slots with its
    residual when it keeps one (`slot.kept`), as nano-vllm's `prepare_prefill` slot mapping does; the rows are
    left-padded to the longest chunk and the mask hides the pads. The project's forward where it covers the model,
    else transformers' modules (the same pool through `batch.cache`, the same 4-D mask). `decoder`: its products for
    the step's B x T tokens (LeanDecode.products: the packed ones for a short chunk), else F.linear."""
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
        # None: causal over the chunk alone (SDPA's own); one row after a prefix reads every key before its chunk,
        # a mask made once here, not per layer by the forward
        mask = causal_mask(valid, t) if len(slots) > 1 or valid.shape[1] != t else None
        resid = batch.pool.resid if keep is not None else None
        linear, fused = decoder.products(ids.numel()) if decoder is not None else (F.linear, None)
        return step(lean, ids, positions, batch.write_and_gather, mask, resid, batch.residual_slots, linear,
                    fused)[:, -1]
    out = lm.model(input_ids=ids, attention_mask=causal_mask(valid, t), position_ids=positions, cache=batch.cache,
                   use_cache=True, logits_to_keep=1, output_hidden_states=keep is not None)
    for i, h in enumerate(out.hidden_states if keep is not None else ()):
        keep.write(i, h)
    return out.logits[:, -1]
