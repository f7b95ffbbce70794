"""A lone row's products that share an input made as one: each layer's q|k|v and gate|up, where the loader laid
them side by side (engine.core.layout.side_by_side).

    grouped = SideBySide(lean)            # lean: engine.core.lean.LeanStep
    logits = lean.forward(..., linear=matvec.linear, fused=grouped.fused())   # None: each weight on its own
    linear, fused = grouped.bound()       # or None: every product of a lone step bound once (matvec.Bound)

A lone decode step multiplies one row by every matrix, each product a call with its own fixed cost. With q, k and v
one after another in memory, their products are one product (engine.core.matvec.linear: the row kernel, or the
split product) on the whole matrix, which is a view: nothing is copied per step; likewise gate and up (docs/engine.md, "Where a lone step's
time goes", measures what it saved). `fused()` checks that every weight is still where the loader put it (a
parameter pointed elsewhere since, e.g. by a test, falls back to one product per weight).

`bound()` goes one further where the row kernel is on: each product of a lone step (q|k|v, o, gate|up, down and the
LM head where the kernel takes them) is a matvec.Bound made once, its checks and C arguments made once and its output
a tensor made once that each call overwrites. That is safe in a lone step because nothing holds a product's output
past the product's next call, a step later: q and k leave the rotary as new tensors, v is copied into the pool
before attention reads it, o's, gate|up's and down's outputs are used within their layer; the logits, which the
caller keeps, get a new tensor each step (`fresh`). docs/engine.md, "The work around the products", measures it.
"""
from __future__ import annotations

import ctypes
from typing import Any

import torch

from engine.core import invariant, kernels, matvec
from engine.core.kernels.attend import LANES, MAX_GROUP, AttendKernel, attend_kernel
from engine.core.kernels.glue import LoneEnds, LoneLayer, LoneState, glue_kernel
from engine.core.lean import Fused, LeanStep, Linear, PoolResidual

ROTARY_MEMO = 8192           # positions whose rotary table a plan keeps (`LonePlan.rotary_at`): 4 MB at head dim 64
STATIC_ROPE = ("default", "linear", "llama3")     # rope types whose table depends on the position alone


class SideBySide:
    """Per layer, the Fused products over the loader's side-by-side matrices, made once."""

    def __init__(self, lean: LeanStep):
        self.lean = lean
        self._made: tuple[list[int], list[Fused], list[torch.Tensor]] | None = None
        self._bound: tuple[kernels.RowKernel, list[int], list[torch.Tensor], Linear, list[Fused]] | None = None
        self._plan: tuple[Any, LonePlan | None] | None = None     # (the `_bound` it was made from, the plan)
        self.on_cpu = lean.embed.weight.device.type == "cpu"     # the row kernel's products are a CPU's
        if self.on_cpu:
            kernels.row_kernel()         # built or found now, not at the first lone step (a build takes a second)
            glue_kernel()

    def weights(self) -> list[torch.Tensor]:
        return [p[0] for w in self.lean.layers for p in (w.q, w.k, w.v, w.gate, w.up)]

    def fused(self) -> list[Fused] | None:
        """Each layer's Fused, or None where any group is missing or a weight has moved since. Checked every step,
        over the weights as listed when made (a lone step's host work: the list made afresh and read by a
        comprehension took 0.15 ms of a step here, its caches cold after the weights have streamed through)."""
        if self._made is None:
            self._made = (*_made(self.lean), self.weights())
        where, fused, weights = self._made
        return fused if where and list(map(torch.Tensor.data_ptr, weights)) == where else None

    def bound(self) -> tuple[Linear, list[Fused]] | None:
        """A lone step's products bound once (module docstring), as the forward's (linear, fused); None where the row
        kernel is off, a group is missing or any weight it binds has moved since (checked every step)."""
        kernel = kernels.row_kernel() if self.on_cpu else None
        if kernel is None:
            return None
        if self._bound is None or self._bound[0] is not kernel:
            self._bound = (kernel, *_bound(self.lean, kernel))
        _, where, weights, linear, fused = self._bound
        return (linear, fused) if where and list(map(torch.Tensor.data_ptr, weights)) == where else None

    def plan(self) -> "LonePlan | None":
        """The lone step's layers around attention in two C calls each (LonePlan), over the products `bound()` binds:
        call it where bound() has just returned them (not None; the step checks its weights once). None where glue.c
        is not built, or where a layer's o or down is not bound."""
        if self._bound is None or glue_kernel() is None:
            return None
        if self._plan is None or self._plan[0] is not self._bound:
            self._plan = (self._bound, LonePlan.make(self.lean, kernels.row_kernel(), glue_kernel(), *self._bound[3:],
                                                     attend=attend_kernel()))
        return self._plan[1]


class LonePlan:
    """One row's decode step around its attention, in two C calls a layer (glue.c's `lone_before`: the residual kept,
    the norm, q|k|v and the rotary; `lone_after`: o, the residual add, the norm, gate|up, the SiLU, down, the add),
    over buffers made once: the same operations in the same order as the forward makes them with CGlue and the bound
    products, so the same bits (tests/test_lone_glue.py), in about a tenth of the calls. `x` holds the residual
    stream; `q`, `k`, `v` are views of the q|k|v buffer [1, heads, 1, D], each layer's (k and v copied into the pool
    before the next layer writes it: by `before` in C where the step's `kv` gives its slots, else by the `kv`)."""

    def __init__(self, lean: LeanStep, kernel: kernels.RowKernel, glue: Any, layers: list[LoneLayer],
                 keep_alive: list[torch.Tensor], attend: AttendKernel | None = None, head: matvec.Bound | None = None):
        heads, kv_heads, dim = lean.heads, lean.kv_heads, lean.head_dim
        d, f, qkv_out = lean.embed.weight.shape[1], lean.layers[0].gate[0].shape[0], (heads + 2 * kv_heads) * dim
        fits = dim % LANES == 0 and heads % kv_heads == 0 and heads // kv_heads <= MAX_GROUP
        self.attend = attend if fits else None           # attend.c, where it takes this model's heads
        with torch.inference_mode(False):        # normal tensors: usable in and out of inference mode
            self.x, self.h, self.qkv = torch.empty(1, 1, d), torch.empty(max(d, f)), torch.empty(1, 1, qkv_out)
            self.gate_up, self.delta, self.attn = torch.empty(2 * f), torch.empty(d), torch.empty(heads * dim)
        width, kvd = heads * dim, kv_heads * dim
        self.q = self.qkv[..., :width].view(1, 1, heads, dim).transpose(1, 2)            # [1, H, 1, D]
        self.k = self.qkv[..., width:width + kvd].view(1, 1, kv_heads, dim).transpose(1, 2)
        self.v = self.qkv[..., width + kvd:].view(1, 1, kv_heads, dim).transpose(1, 2)
        self.state = LoneState(kernel.address, d, qkv_out, heads + kv_heads, dim, f, width, lean.eps,
                               *(t.data_ptr() for t in (self.x, self.h, self.qkv, self.gate_up, self.delta)), None, None,
                               self.attend.row_address if self.attend else None, self.attn.data_ptr(), lean.scaling)
        self.layers, self.keep_alive = layers, keep_alive + [lean.embed.weight.detach(), lean.norm.detach()]
        self._layers = (LoneLayer * len(layers))(*layers)        # every layer's, for lone_layers
        self._all = glue.lone_layers
        self._pools: tuple[Any, Any, Any] | None = None          # (the pool's first keys tensor, keys', values' bases)
        state = ctypes.byref(self.state)
        self._before = [(glue.lone_before, state, ctypes.byref(layer)) for layer in layers]
        self._after = [(glue.lone_after, state, ctypes.byref(layer)) for layer in layers]
        self.ends, self._token = _ends(lean, head), glue.lone_token     # None: the token's ends stay in Python
        self.ends_in_c = True                    # `token` where it can (the bench turns it off to compare)
        self._rotary, self._table, self._memo = lean.rotary, None, bytearray()
        self._embed = (lean.embed.weight.data_ptr(), 4 * lean.embed.weight.stride(0), lean.embed.weight.shape[0])
        self.vocab = lean.head[0].shape[0]

    @classmethod
    def make(cls, lean: LeanStep, kernel: kernels.RowKernel, glue: Any, products: "Products",
             groups: list[Fused], attend: AttendKernel | None = None) -> "LonePlan | None":
        """From `bound()`'s products: each layer's q|k|v and gate|up (Fused of Bound) and its o and down (Products);
        None where any of them is not a Bound of the row kernel."""
        layers, keep = [], []
        for w, group in zip(lean.layers, groups):
            o, down = (products.by_id.get((id(p[0]), id(p[1]))) for p in (w.o, w.down))
            bound = (group.qkv, o, group.gate_up, down)
            if not all(isinstance(b, matvec.Bound) for b in bound):
                return None
            keep += [w.ln1, w.ln2, *(t for b in bound for t in (b.weight, b.bias) if t is not None)]
            layers.append(LoneLayer(w.ln1.data_ptr(), w.ln2.data_ptr(),
                                    *(a for b in bound for a in (b.weight.data_ptr(), _address(b.bias)))))
        head = products.by_id.get((id(lean.head[0]), id(lean.head[1])))
        return cls(lean, kernel, glue, layers, keep, attend, head if isinstance(head, matvec.Bound) else None) \
            if layers else None

    def takes(self, ids: torch.Tensor, mask: Any, keep: Any, logits_to_keep: Any) -> bool:
        """Whether a step is this plan's: one row of one token, no mask, its logits, its residual kept (if at all) at
        one slot of a float32 pool on the CPU."""
        if ids.shape != (1, 1) or mask is not None or logits_to_keep != 1:
            return False
        return keep is None or (isinstance(keep, PoolResidual) and keep.where.numel() == 1
                                and keep.resid.dtype == torch.float32 and keep.resid.is_cpu
                                and keep.resid.is_contiguous())

    def attends(self, attention: Any) -> bool:
        """Whether the step's `attention` makes attend.c's bits for this row: attend.c's own, or the invariant
        mode's (attend.c wherever it is built and fits): then `layers` may make every layer in one call."""
        return self.attend is not None and attention is not None and (
            attention == self.attend.attention or attention is invariant.attention)

    def layers_at_once(self, keys: list[torch.Tensor], values: list[torch.Tensor], resid: int | None,
                       resid_stride: int, write: int, first: int, n: int) -> None:
        """Every layer in one C call (glue.c's lone_layers), where the row's n keys lie in place from slot `first` of
        the pool's per-layer keys and values [slots, KVH, D] (float32, contiguous), its new K/V going to slot
        `write`; each layer's residual kept at resid + i * resid_stride floats (resid None: none)."""
        width = keys[0].stride(0)                                                        # KVH * D floats a slot
        self._all(ctypes.byref(self.state), self._layers, len(self.layers), ctypes.c_void_p(resid), resid_stride,
                  *self._bases(keys, values), write * width, first * width, n, torch.get_num_threads())

    def _bases(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> tuple[Any, Any]:
        """Each layer's keys' and values' addresses as C arrays, made again only when the pool is another."""
        if self._pools is None or self._pools[0] is not keys[0]:
            self._pools = (keys[0], *((ctypes.c_void_p * len(t))(*(x.data_ptr() for x in t)) for t in (keys, values)))
        return self._pools[1], self._pools[2]

    def takes_token(self) -> bool:
        """Whether `token` makes this plan's steps: its ends known (`_ends`) and not turned off."""
        return self.ends is not None and self.ends_in_c

    def token(self, token: int, position: int, keys: list[torch.Tensor], values: list[torch.Tensor],
              resid: int | None, resid_stride: int, write: int, first: int, n: int) -> torch.Tensor:
        """A lone step whole in one C call (glue.c's `lone_token`): token's embedding row, every layer as
        `layers_at_once` makes them (the same arguments), the residual entering the final norm kept at resid + L *
        resid_stride floats, the final norm and the LM head. Logits [1, 1, V], a new tensor: the caller keeps them.
        The same functions in the same order as the forward around `layers_at_once`, so the same bits
        (tests/test_lone_glue.py); Python's part is this call."""
        if not 0 <= token < self._embed[2]:
            raise IndexError(f"token id {token} is outside the embedding's {self._embed[2]} rows")
        self.state.cos, self.state.sin = self.rotary_at(position)
        logits = torch.empty(1, 1, self.vocab)
        self.ends.embed, self.ends.logits = self._embed[0] + token * self._embed[1], logits.data_ptr()
        width = keys[0].stride(0)
        self._token(ctypes.byref(self.state), self._layers, len(self.layers), ctypes.byref(self.ends),
                    ctypes.c_void_p(resid), resid_stride, *self._bases(keys, values), write * width, first * width, n,
                    torch.get_num_threads())
        return logits

    def rotary_at(self, position: int) -> tuple[int, int]:
        """The addresses of cos and sin [D] at `position` as the model's own rotary makes them (its call for that one
        position, so the same bits), kept for positions under ROTARY_MEMO where the rope's table depends on the
        position alone (STATIC_ROPE): a step then reads its row, where the rotary's operators took ~0.1 ms of a
        lone step (docs/engine.md, "A token in one call"). Other positions and ropes: made each call, into a
        spare row."""
        if self._table is None:
            dim, memo = self.q.shape[-1], ROTARY_MEMO if getattr(self._rotary, "rope_type", None) in STATIC_ROPE else 0
            with torch.inference_mode(False):
                self._table, self._memo = torch.empty(memo + 1, 2, dim), bytearray(memo)
        row = position if position < len(self._memo) else len(self._memo)
        if row == len(self._memo) or not self._memo[row]:
            cos, sin = self._rotary(self.x, torch.tensor([[position]]))            # [1, 1, D] each
            self._table[row, 0], self._table[row, 1] = cos[0, 0], sin[0, 0]
            if row < len(self._memo):
                self._memo[row] = 1
        at, size = self._table.data_ptr() + 4 * row * self._table.stride(0), 4 * self._table.stride(1)
        return at, at + size

    def start(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The step's embedding x [1, 1, d] into the residual buffer, cos and sin [1, 1, D] its rotary table (held by
        the caller for the step); returns the buffer."""
        self.x.copy_(x)
        self.state.cos, self.state.sin = cos.data_ptr(), sin.data_ptr()
        return self.x

    def before(self, i: int, resid: int | None, key: int | None = None, value: int | None = None) -> None:
        """Layer i up to attention: its residual copied to address `resid` (None: not kept), q, k, v made, and k and
        v copied to addresses `key` and `value` (the K/V pool's slot; None: the step's `kv` writes them)."""
        call, state, layer = self._before[i]
        call(state, layer, ctypes.c_void_p(resid), ctypes.c_void_p(key), ctypes.c_void_p(value),
             torch.get_num_threads())

    def after(self, i: int, attn: torch.Tensor) -> None:
        """Layer i from attention's output attn [1, H, 1, D] on: the residual stream `x` moved on."""
        call, state, layer = self._after[i]
        attn = attn if attn.is_contiguous() else attn.contiguous()      # held through the call
        call(state, layer, ctypes.c_void_p(attn.data_ptr()), torch.get_num_threads())


def _ends(lean: LeanStep, head: matvec.Bound | None) -> LoneEnds | None:
    """glue.c's lone_ends_t for `lean`'s embedding, final norm and LM head where `LonePlan.token` can make them: the
    head a row-kernel product (`head`, its Bound), the embedding's rows and the norm float32 and contiguous on the
    CPU; else None. The embedding row and the logits are filled in at each step."""
    embed, norm = lean.embed.weight, lean.norm
    if head is None or any(t.dtype != torch.float32 or not t.is_cpu for t in (embed, norm)) \
            or embed.stride(1) != 1 or not norm.is_contiguous() or embed.shape[1] != norm.shape[0]:
        return None
    return LoneEnds(None, norm.data_ptr(), head.weight.data_ptr(), _address(head.bias), head.weight.shape[0], None)


def _address(t: torch.Tensor | None) -> int | None:
    return t.data_ptr() if t is not None else None


def _made(lean: LeanStep) -> tuple[list[int], list[Fused]]:
    """(where each grouped weight starts, per layer its Fused); ([], []) where any layer's group is missing."""
    wholes, where, fused = lean.lm.side_by_side, [], []
    if len(wholes) != len(lean.layers):
        return [], []
    for w, (qkv, gate_up) in zip(lean.layers, wholes):
        groups = [(qkv, (w.q, w.k, w.v)), (gate_up, (w.gate, w.up))]
        at = [matvec.addresses(whole, [p[0] for p in pairs]) if whole is not None else None for whole, pairs in groups]
        if None in at:
            return [], []
        where += at[0] + at[1]
        fused.append(Fused(*(matvec.product(whole, _biases(pairs)) for whole, pairs in groups)))
    return where, fused


class Products:
    """linear(x, weight, bias) for a lone step: the Bound product made for this (weight, bias), else matvec.linear."""

    def __init__(self, bound: dict[tuple[int, int], matvec.Bound]):
        self.by_id = bound                   # keyed by the parameters' ids: the caller holds the parameters

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        product = self.by_id.get((id(weight), id(bias)))
        return product(x) if product is not None else matvec.linear(x, weight, bias)


def _bound(lean: LeanStep, kernel: kernels.RowKernel) -> tuple[list[int], list[torch.Tensor], Linear, list[Fused]]:
    """(where each weight it binds starts, and the embedding and final norm a whole token reads (LonePlan.token),
    those weights, `Products` over o, down and the head, per layer the Fused q|k|v and gate|up); empty lists where
    any layer's group is missing."""
    where, fused = _made(lean)
    if not where:
        return [], [], matvec.linear, []
    weights = [p[0] for w in lean.layers for p in (w.q, w.k, w.v, w.gate, w.up)]
    groups = [Fused(*(matvec.Bound(kernel, whole, _biases(pairs)) for whole, pairs in
                      (((qkv, (w.q, w.k, w.v)), (gate_up, (w.gate, w.up))))))
              for w, (qkv, gate_up) in zip(lean.layers, lean.lm.side_by_side)]
    alone = [(w, b, False) for layer in lean.layers for w, b in (layer.o, layer.down)] + [(*lean.head, True)]
    products = {(id(w), id(b)): matvec.Bound(kernel, w, b, fresh) for w, b, fresh in alone if _takes(w, b)}
    taken = [w for w, b, _ in alone if (id(w), id(b)) in products] + [lean.embed.weight, lean.norm]
    return where + [w.data_ptr() for w in taken], weights + taken, Products(products), groups


def _takes(weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether the row kernel takes one row against this weight (its layout: a weight stored transposed does not)."""
    return kernels.fits(torch.empty(1, weight.shape[1]), weight.detach(), bias.detach() if bias is not None else None)


def _biases(pairs: Any) -> torch.Tensor | None:
    """The weights' biases one after another (zeros for a weight without one), or None where none has one."""
    if all(b is None for _, b in pairs):
        return None
    return torch.cat([b if b is not None else w.new_zeros(w.shape[0]) for w, b in pairs])
