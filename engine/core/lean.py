"""The project's forward for the Llama family, on the checkpoint's own tensors: prefill chunks and decode rows alike.

    lean = one_forward(lm)                                  # None for a model it does not cover (`why_not` says why)
    logits = lean.forward(ids, positions, kv, mask, keep)   # [B, K, V]: ids, positions [B, T]; any mix of rows
    logits = lean.on_cache(ids, cache, kept)                # one sequence's next tokens on an HF cache: [K, V]
    logits = lean(token_id, position, kv)                   # (V,): one token of one sequence

`forward` is one step for B rows of T new tokens each, as gpt-fast's `Transformer.forward(idx, input_pos)` and
nano-vllm's model are: a prefill chunk (T tokens of one row), the padded prefill of several newcomers (left pads,
hidden by `mask`), a batch's decode rows (T = 1), a speculative verify pass (T = k + 1, `logits_to_keep`) or a
flattened mixed step (one row of every new token of the step, decode rows' and prompt chunks', attention split by
segment through `attention`, `logits_to_keep` the indices kept: engine.serving.lean.mixed_step). The caller hands
it:
- `kv(layer, k, v)`: stores the new K/V ([B, KVH, T, D]) where the rows keep it (a paged pool at their slots, an HF
  cache) and returns every key and value each row reads, [B, KVH, S, D];
- `mask` [B, 1, T, S] (True: attend) where rows read padded keys; None when they do not: each query then sees every
  key up to its own position (causal over the new tokens);
- `keep`: where the residual goes (the one capture point): the stream entering every layer and the final norm's
  input (hidden state i as transformers' `output_hidden_states` numbers them) is handed to `keep.write(i, x)` inside
  the forward, x [B, T, d], for the rows that keep one: `PoolResidual` writes it into the paged residual pool at the
  rows' slots (decode), `RowsResidual` into each run's own buffers (prefill, a run outside the batch).

It is the same arithmetic as transformers' modules in a dozen tensor operations per layer, reading the same
parameters (nothing is copied): the RMS norms as transformers writes them, its rotary embedding and
`apply_rotary_pos_emb`'s arithmetic (`rotary`; a lone row's q|k rotated as one: docs/engine.md, "The work around
the products, with fewer calls"), q/k/v/o and the gated MLP as `F.linear` on the modules' weights and biases (or `linear`, the
packed small-batch kernel, engine/core/small_batch.py) and attention as one SDPA call. No hooks run. A 20-row SmolLM2
decode step here took 157 ms against 180 ms through the modules (docs/serving.md, "The batch on the lean step").

Which models: the plain decoder stacks whose layers are exactly that (`model_type` llama, qwen2, mistral without a
sliding window). Any other (per-head Q/K norms as in Qwen3 and OLMo 2, sliding windows as in Gemma and Mistral with
a window, other activations, `pretraining_tp`) keeps transformers' modules: they compute what this forward would not,
and proving each against its oracle is a family's worth of work. transformers' modules are also the route while
something has replaced the model's `forward` (a wrapper that instruments or injects faults must see every step), and
the oracle of the tests (tests/test_lean.py: logits and every residual within 1e-5 in float32).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import torch
from torch.nn import functional as F

from engine.core import invariant
from engine.core.kernels.glue import glue_kernel
from engine.core.loader import LoadedModel

COVERED = ("llama", "qwen2", "mistral")
# kv(layer, k, v): k, v [B, KVH, T, D] of the new positions; returns the keys and values each row reads [B, KVH, S, D]
KV = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
# linear(x, weight, bias): x @ weight.T + bias, as F.linear
Linear = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]
# x -> the products of x with several weights, side by side (e.g. [q | k | v])
Product = Callable[[torch.Tensor], torch.Tensor]
# attention(q [B, H, T, D], keys, values [B, KVH, S, D], mask [B, 1, T, S] or None (causal), scaling) -> [B, H, T, D]
Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, float], torch.Tensor]


class Residual(Protocol):
    """Where a step's residual goes: `write(i, x)` receives hidden state i of every row, x [B, T, d_model]."""

    def write(self, layer: int, x: torch.Tensor) -> None: ...


@dataclass(frozen=True)
class PoolResidual:
    """The paged residual pool [L + 1, slots, d_model] at one slot per new token, `where` [B * T] (SCRATCH for rows
    that keep none): one in-place copy per hidden state at fixed addresses (a CUDA graph replays it)."""

    resid: torch.Tensor
    where: torch.Tensor

    def write(self, layer: int, x: torch.Tensor) -> None:
        # One index_put_ on the pool itself, not a copy into a view of it (`resid[layer].index_copy_`): a compiler
        # that functionalizes a write into a view of an input copies the whole of that view, [slots, d], at every
        # layer (inductor did: docs/engine.md, "The one forward", the lone step compiled on a CPU); on the pool it writes
        # in place.
        self.resid.index_put_((self.where.new_full((1,), layer), self.where), x.reshape(-1, x.shape[-1]))


@dataclass(frozen=True)
class RowsResidual:
    """Each keeping row's own buffers (engine/core/kept.py): (row b, its KeptInputs, the position of its first real
    token, the column of that token in the step's [B, T]: its left pads)."""

    rows: Sequence[tuple[int, Any, int, int]]

    def write(self, layer: int, x: torch.Tensor) -> None:
        for b, kept, start, first in self.rows:
            kept.write(layer, start, x[b, first:])


@dataclass(frozen=True)
class Fused:
    """A layer's products that share an input, each made as one product (None: one weight at a time)."""

    qkv: Product | None = None
    gate_up: Product | None = None


NOT_FUSED = Fused()


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer's parameters (the module's own tensors, not copies)."""

    ln1: torch.Tensor
    ln2: torch.Tensor
    q: tuple[torch.Tensor, torch.Tensor | None]
    k: tuple[torch.Tensor, torch.Tensor | None]
    v: tuple[torch.Tensor, torch.Tensor | None]
    o: tuple[torch.Tensor, torch.Tensor | None]
    gate: tuple[torch.Tensor, torch.Tensor | None]
    up: tuple[torch.Tensor, torch.Tensor | None]
    down: tuple[torch.Tensor, torch.Tensor | None]


def why_not(model: Any) -> str | None:
    """Why the forward cannot stand in for this model's modules, or None when it can."""
    config = model.config
    if getattr(config, "model_type", None) not in COVERED:
        return f"model type {getattr(config, 'model_type', None)!r} (covered: {', '.join(COVERED)})"
    if getattr(config, "hidden_act", "silu") != "silu" or getattr(config, "pretraining_tp", 1) != 1:
        return "an activation other than SiLU, or split weights (pretraining_tp)"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "sliding-window attention"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "rotary_emb") or not hasattr(model, "lm_head"):
        return "not a decoder stack with rotary embeddings and an LM head"
    attn = inner.layers[0].self_attn
    if any(hasattr(attn, name) for name in ("q_norm", "k_norm")):
        return "per-head Q/K norms"
    mlp = inner.layers[0].mlp
    if not all(isinstance(m, torch.nn.Linear) for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj,
                                                         mlp.gate_proj, mlp.up_proj, mlp.down_proj)):
        return "projections that are not plain linear layers (a quantized copy: engine.lab.quantize)"
    return None


def _lin(module: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    return module.weight, module.bias


def _layer_weights(layer: Any) -> LayerWeights:
    attn, mlp = layer.self_attn, layer.mlp
    return LayerWeights(layer.input_layernorm.weight, layer.post_attention_layernorm.weight, _lin(attn.q_proj),
                        _lin(attn.k_proj), _lin(attn.v_proj), _lin(attn.o_proj), _lin(mlp.gate_proj),
                        _lin(mlp.up_proj), _lin(mlp.down_proj))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm, operation for operation: x [..., d]. The casts are skipped where x is float32
    (each a no-op there that still costs a call), the sum of squares' + eps and rsqrt made in place on the mean's own
    fresh tensor: the same operations in the same order, so the same bits (tests/test_lone_glue.py)."""
    h = x if x.dtype == torch.float32 else x.to(torch.float32)
    h = h * h.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_()
    return weight * (h if h.dtype == x.dtype else h.to(x.dtype))


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb on one tensor x [B, heads, T, D], cos and sin already [B, 1, T, D]:
    x * cos + rotate_half(x) * sin, the same operations (rotate_half: the halves swapped, the second negated)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class TorchGlue:
    """The work around the products in torch's operators, transformers' arithmetic operation for operation: any
    dtype and device, and the form a compiler traces. cos, sin [B, T, D]: this step's rotary table."""

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor):
        self.cos, self.sin = cos.unsqueeze(1), sin.unsqueeze(1)                    # [B, 1, T, D]: once a step

    norm = staticmethod(rms_norm)

    def rotate(self, x: torch.Tensor, heads: int, dim: int) -> torch.Tensor:
        """x [B, T, heads * dim] (a product's columns) -> [B, heads, T, dim], each head rotated."""
        b, t = x.shape[:2]
        return rotary(x.view(b, t, heads, dim).transpose(1, 2), self.cos, self.sin)

    @staticmethod
    def gated(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return F.silu(gate) * up


class CGlue(TorchGlue):
    """The same work in C (engine/core/kernels/glue.c), one call each over every row, for a float32 step on the CPU:
    rope is transformers' bits, made in place on the product's own columns; the norm and the SiLU differ from torch's
    operators in the last bits (a sum of squares in another fixed order, another exp). Each row's numbers are its
    own whatever the other rows and threads, as the row kernel's products are."""

    def __init__(self, kernel: Any, cos: torch.Tensor, sin: torch.Tensor):
        super().__init__(cos, sin)
        self.kernel, self.table = kernel, (cos.contiguous(), sin.contiguous())     # [B, T, D] each

    def norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return self.kernel.norm(x, weight, eps)

    def rotate(self, x: torch.Tensor, heads: int, dim: int) -> torch.Tensor:
        b, t, _ = x.shape
        if x.stride(2) != 1 or x.stride(0) != t * x.stride(1):                        # rows not evenly strided
            return super().rotate(x, heads, dim)
        self.kernel.rope_(x, *self.table, heads, dim)
        return x.view(b, t, heads, dim).transpose(1, 2)

    def gated(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        if gate.stride() != up.stride() or gate.stride(-1) != 1:
            return super().gated(gate, up)
        return self.kernel.silu_mul(gate, up)


def glue_for(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> TorchGlue:
    """The glue a step runs: C where its stream is float32 on the CPU and glue.c is built (not while a compiler
    traces the forward, nor for autograd: the kernel has no backward), else torch's operators."""
    if x.dtype != torch.float32 or x.device.type != "cpu" or torch.compiler.is_compiling() or x.requires_grad:
        return TorchGlue(cos, sin)
    kernel = glue_kernel()
    return CGlue(kernel, cos, sin) if kernel is not None else TorchGlue(cos, sin)


def causal_mask(valid: torch.Tensor, t: int) -> torch.Tensor:
    """[B, 1, T, S] (True: attend) for T new tokens that are the last T of S keys: a query sees the valid keys
    (`valid` [B, S], False for pads) up to its own column, and always itself, so a pad's query reads something and
    its row stays finite (nothing real reads a pad)."""
    s = valid.shape[1]
    keys = torch.arange(s, device=valid.device)
    own = torch.arange(s - t, s, device=valid.device)[:, None]                     # [T, 1] each query's column
    return ((valid[:, None, :] & (keys <= own)) | (keys == own))[:, None]           # [B, 1, T, S]


class LeanStep:
    """The model's forward over its own parameters: embedding, every layer, the final norm and the LM head."""

    def __init__(self, lm: LoadedModel):
        model = lm.model
        self.lm, self.config = lm, model.config
        self.layers = [_layer_weights(layer) for layer in model.model.layers]
        self.embed, self.norm = model.model.embed_tokens, model.model.norm.weight
        self.head = _lin(model.lm_head)
        self.rotary = model.model.rotary_emb
        self.eps = float(self.config.rms_norm_eps)
        self.heads, self.kv_heads, self.head_dim = lm.spec.n_heads, lm.spec.n_kv_heads, lm.spec.head_dim
        self.scaling = float(getattr(model.model.layers[0].self_attn, "scaling", self.head_dim ** -0.5))
        self.invariant = invariant.enabled()       # PLAYGROUND_INVARIANT: every product from engine.core.invariant

    def __call__(self, token: int, position: int, kv: KV) -> torch.Tensor:
        """Logits (V,) of the token after `token`, which sits at `position`; `kv` keeps and returns the K/V."""
        device = self.embed.weight.device
        return self.forward(torch.tensor([[token]], device=device), torch.tensor([[position]], device=device), kv)[0, 0]

    def on_cache(self, ids: list[int], cache: Any, kept: Any = None, logits_to_keep: int = 1) -> torch.Tensor:
        """One sequence's new tokens after what the HF `cache` holds (its K/V appended there); with `kept`, their
        residual written into its buffers and committed. Logits [logits_to_keep, V] of the last positions."""
        device, start, t = self.embed.weight.device, cache.get_seq_length(), len(ids)
        positions = torch.arange(start, start + t, device=device)[None]                # [1, T]
        mask = causal_mask(torch.ones(1, start + t, dtype=torch.bool, device=device), t) if start and t > 1 else None
        keep = RowsResidual([(0, kept, start, 0)]) if kept is not None else None
        logits = self.forward(torch.tensor([ids], device=device), positions,
                              lambda i, k, v: cache.update(k, v, i), mask, keep, logits_to_keep=logits_to_keep)
        if kept is not None:
            kept.commit()
        return logits[0]

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, kv: KV, mask: torch.Tensor | None = None,
                keep: Residual | None = None, linear: Linear = F.linear, fused: list[Fused] | None = None,
                logits_to_keep: int | torch.Tensor = 1, attention: Attention | None = None,
                lone: Any = None) -> torch.Tensor:
        """Logits [B, K, V] of each row's last K = `logits_to_keep` positions (or, a tensor of K indices, of those
        positions: a flattened mixed step's), as transformers' `logits_to_keep`: ids and positions [B, T] (each token's
        own position); `mask` [B, 1, T, S] where rows read padded keys, None for causal over the new tokens (the
        keys before them all read); `keep` receives the L + 1 residuals; `fused`, per layer, products made as one;
        `attention` in place of SDPA. With `invariant` set, the batch-invariant kernels stand in for all three (products
        marked `ordered`, the row kernel's panels with their fused ones, are kept: engine.core.small_batch).
        `lone`: a lone decode step's layers in two C calls each (engine.core.lone.LonePlan), where it `takes` the step:
        the same operations on the same products (for one row, the row kernel's with the mode on or off)."""
        if self.invariant:                       # products in one order per output (`ordered`) are kept
            attention = invariant.attention
            if not getattr(linear, "ordered", False):
                linear, fused = invariant.linear, None
        if lone is not None and lone.takes(ids, mask, keep, logits_to_keep):
            return self._lone(lone, ids, positions, kv, keep, linear, attention)
        x = F.embedding(ids, self.embed.weight)                                         # [B, T, d]
        g = glue_for(x, *self.rotary(x, positions))                                     # cos, sin [B, T, D] each
        for i, w in enumerate(self.layers):
            f = fused[i] if fused is not None else NOT_FUSED
            if keep is not None:
                keep.write(i, x)
            x = x + self._attention(i, w, g.norm(x, w.ln1, self.eps), g, kv, mask, linear, f, attention)
            h = g.norm(x, w.ln2, self.eps)
            gate, up = f.gate_up(h).chunk(2, dim=-1) if f.gate_up else (linear(h, *w.gate), linear(h, *w.up))
            x = x + linear(g.gated(gate, up), *w.down)
        if keep is not None:
            keep.write(len(self.layers), x)
        kept = x[:, -logits_to_keep:] if isinstance(logits_to_keep, int) else x[:, logits_to_keep]     # [B, K, d]
        return linear(g.norm(kept, self.norm, self.eps), *self.head)                    # [B, K, V]

    def _lone(self, lone: Any, ids: torch.Tensor, positions: torch.Tensor, kv: KV, keep: Any, linear: Linear,
              attention: Attention | None) -> torch.Tensor:
        """`forward` for one row of one token through the plan: per layer, lone.before (its residual kept at its
        slot of the pool), the step's kv and attention, lone.after. Logits [1, 1, V]. A `kv` with `slots()` (each
        layer's (key, value) slot addresses, float32) and `read(i)` has its new K/V written by lone.before in C;
        where its keys also lie in place (`in_place()`) and the attention is attend.c's, every layer is one C call
        (LonePlan.layers_at_once), and where the plan knows the embedding, final norm and head, the whole token
        (LonePlan.token): the same functions in the same order, so the same bits."""
        resid = keep.resid if keep is not None else None
        at, stride = (None, 0) if resid is None else (     # where layer i's residual goes: at + 4 i stride
            resid.data_ptr() + 4 * int(keep.where[0]) * resid.stride(1), resid.stride(0))
        whole = kv.in_place() if hasattr(kv, "in_place") and lone.attends(attention) else None
        if whole is not None and lone.takes_token():
            return lone.token(int(ids), int(positions), *whole[:2], at, stride, *whole[2:])
        x = F.embedding(ids, self.embed.weight)                                         # [1, 1, d]
        cos, sin = (t.contiguous() for t in self.rotary(x, positions))                  # [1, 1, D] each
        x = lone.start(x, cos, sin)                                                     # the plan's buffer
        if whole is not None:                              # every layer in one C call, attention included
            lone.layers_at_once(*whole[:2], at, stride, *whole[2:])
        else:
            slots = kv.slots() if hasattr(kv, "slots") else None    # the K/V pool's slot per layer: written in C
            for i in range(len(self.layers)):
                lone.before(i, at + 4 * i * stride if at is not None else None, *(slots[i] if slots else ()))
                keys, values = kv.read(i) if slots else kv(i, lone.k, lone.v)
                lone.after(i, self._attend(lone.q, keys, values, attention))
        if keep is not None:
            keep.write(len(self.layers), x)
        return linear(glue_for(x, cos, sin).norm(x, self.norm, self.eps), *self.head)  # [1, 1, V]

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                attention: Attention | None) -> torch.Tensor:
        """One query per head against every key it reads (no mask): q [B, H, 1, D] -> [B, H, 1, D]."""
        if attention is not None:
            return attention(q, keys, values, None, self.scaling)
        return F.scaled_dot_product_attention(q, keys, values, scale=self.scaling,
                                              enable_gqa=self.heads != self.kv_heads)

    def _rotated(self, h: torch.Tensor, w: LayerWeights, g: TorchGlue, linear: Linear,
                 f: Fused) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [B, H, T, D] and k [B, KVH, T, D] rotated, v [B, KVH, T, D]. One row's q|k made as one product lie side
        by side in it: they are rotated as one tensor (a view of the product's columns), half the rotary's calls;
        every element meets the same operations as when each is rotated alone, so the same bits."""
        b, t = h.shape[:2]
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        d, kvd = heads * dim, kv_heads * dim
        if f.qkv and b == 1:
            qkv = f.qkv(h)                                                               # [1, T, d + 2 kvd]
            qk = g.rotate(qkv[..., :d + kvd], heads + kv_heads, dim)                     # [1, H + KVH, T, D]
            return qk[:, :heads], qk[:, heads:], qkv[..., d + kvd:].view(b, t, kv_heads, dim).transpose(1, 2)
        q, k, v = f.qkv(h).split((d, kvd, kvd), dim=-1) if f.qkv else (linear(h, *p) for p in (w.q, w.k, w.v))
        return g.rotate(q, heads, dim), g.rotate(k, kv_heads, dim), v.view(b, t, kv_heads, dim).transpose(1, 2)

    def _attention(self, i: int, w: LayerWeights, h: torch.Tensor, g: TorchGlue, kv: KV,
                   mask: torch.Tensor | None, linear: Linear, f: Fused,
                   attention: Attention | None = None) -> torch.Tensor:
        # h: [B, T, d] -> q [B, H, T, D], k, v [B, KVH, T, D]; keys K, V [B, KVH, S, D]; out [B, T, d]
        b, t = h.shape[:2]
        q, k, v = self._rotated(h, w, g, linear, f)
        keys, values = kv(i, k, v)
        if attention is not None:
            return linear(attention(q, keys, values, mask, self.scaling).transpose(1, 2).reshape(b, t, -1), *w.o)
        if mask is None and t > 1 and keys.shape[2] != t:           # keys before the new tokens: all read
            mask = causal_mask(torch.ones(b, keys.shape[2], dtype=torch.bool, device=h.device), t)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=mask is None and t > 1,
                                             scale=self.scaling, enable_gqa=self.heads != self.kv_heads)  # [B, H, T, D]
        return linear(out.transpose(1, 2).reshape(b, t, -1), *w.o)


def lean_step_for(lm: LoadedModel) -> LeanStep | None:
    """The forward for this model, made once and kept on it, or None where it does not apply (`why_not`, asked until
    the forward is made: a model's family and layers do not change under it; a quantized copy is a model of its own).
    Every decode step asks: `why_not` over a model whose objects the step's weights have pushed out of the caches
    took 0.05-0.09 ms of a lone step here."""
    if lm.lean is None:
        if why_not(lm.model) is not None:
            return None
        lm.lean = LeanStep(lm)
    return lm.lean


def one_forward(lm: LoadedModel) -> LeanStep | None:
    """The forward a step of this model runs now, or None for transformers' modules: a family it does not cover, or
    a model whose `forward` something has replaced (a wrapper that instruments or injects faults sees every step)."""
    return lean_step_for(lm) if "forward" not in vars(lm.model) else None
