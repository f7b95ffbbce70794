"""Batch-invariant kernels: a row's numbers do not depend on the other rows, the thread count or the chunking.

    enabled()                                      # the `invariant` setting: LeanStep.invariant runs these two
    y = linear(x, weight, bias)                    # x [..., d_in] -> [..., d_out], one fixed order per output
    out = attention(q, keys, values, mask, scaling)   # [B, H, T, D], one fixed split along the keys

Why (Thinking Machines, "Defeating Nondeterminism in LLM Inference"; SGLang's and vLLM's batch-invariant modes): a
floating-point sum depends on its order, and a library kernel picks its order from the shape it is handed. On this
CPU (bench/invariance.py) MKL's sgemm gives a row other bits when the product has 2, 7 or 32 rows than when it has
one (a matrix-vector path at one row, blocked paths above), and SDPA gives a query other bits in a prefill chunk
than in a decode step. Here every product is made on the same fixed shapes whatever the batch:

- `linear`: in float32 on the CPU, the row kernel (engine/core/kernels/rows.c): each output's sum in ONE fixed
  order (two accumulators of 16 lanes fed in k's order, added up in one fixed tree), whatever the rows. Up to 8
  rows `rows_linear` (the usual lone decode step's products: a lone row's products are the same bits with the
  mode on or off); more rows `tiles_linear` (`tiled`), the same order in register tiles of 4 rows x 3 outputs over
  cache-sized blocks of the weights, threads over outputs, never along k. So a row's product has the same bits
  alone, in a room's decode step of any size, in a prefill chunk of any length and on any number of threads
  (tests/test_row_kernel.py checks it bitwise, and that a copy of rows.c whose full tiles round differently
  fails), and a lone row takes no padding. Where the model's weights have the row kernel's packed panels (the
  server's room: engine/core/small_batch.py, `ordered_linear`), the forward keeps those in the mode: the same order
  again, faster for many rows (docs/engine.md, "Room products on panels"). Elsewhere (another dtype or device, or
  where the kernel cannot be built) `padded`: the rows padded with zero rows to a multiple of `ROW_TILE` and
  multiplied in one torch call. On this CPU MKL's sgemm adds up each output in the same order for every row count
  that is a multiple of 8 (8 to 2,048 rows checked on SmolLM2's products, one thread and two), but not for 1, 2 or
  7 rows. That is what this machine's MKL does, not what MKL promises, so each weight shape is probed once, at its
  first product (`one_call_holds`: 8 rows alone against the same 8 among 16 to 264, bitwise, at the current thread
  count); where the library orders them differently, that shape is multiplied 8 rows at a time, one call per tile
  (`tiled`): the same bits on any library, each weight read once per tile;
- `attention`: in float32 on the CPU, engine/core/kernels/attend.c (attend.py loads it): per query row and head, the
  row's keys in blocks of KEY_BLOCK from its first real key, the online softmax block after block in key order, each
  score one multiply-add chain in d's order, threads over (row, kv head, query tile) items only; where it does not
  fit (another dtype or device) or cannot be built, `torch_attention`, the same split in torch's operations:
  queries padded to a multiple of `ROW_TILE` (each head's in one product, as `linear`, where the probe
  `blocks_hold` finds that order kept; else 8 query rows a product), keys in blocks of `KEY_BLOCK` counted from
  position 0, the softmax
  made online block after block in key order (flash attention's split, fixed): a block past a query's position
  adds exact zeros, so a query computes the same sum in a decode step, in a prefill chunk of any length and after
  a prefix from the cache. Left pads (a batch's decode rows) are moved to the end first, so a row's keys always
  start the first block. Two walks of the same blocks, bitwise equal (tests/test_invariance.py): `_blocks` makes
  each block's products and softmax in turn (a long prefill: its scores are never all in memory), and
  `_blocks_at_once` (a decode step, a short chunk: up to AT_ONCE scores) makes every block's products in one
  batched call each, the blocks as the batch (each the same (T', D) x (D, KEY_BLOCK) product), the softmax's
  elementwise work on the real query rows only, and walks in Python only the rescaled sums, in key order.

The norms are transformers' own per-row reductions (engine.core.lean.rms_norm). What the products cost against
MKL's, and the mode against the usual kernels: docs/engine.md, "Same question, same numbers".
"""
from __future__ import annotations

import torch
from torch.nn import functional as F

from engine import settings
from engine.core import kernels
from engine.core.kernels.attend import attend_kernel

ENV = "PLAYGROUND_INVARIANT"      # the setting's variable (engine/settings.py: on by default in a hosted room)
ROW_TILE = 8                      # rows per product
KEY_BLOCK = 64                    # keys per attention block
AT_ONCE = 1 << 22                 # B * H * T' * S' up to which every key block's scores are made at once
PROBE_ROWS = (16, 32, 72, 264)    # row counts whose first 8 rows must equal 8 rows alone for the one-call product


def enabled(environ: dict[str, str] | None = None) -> bool:
    """Whether the settings turn the invariant kernels on (`invariant`: PLAYGROUND_INVARIANT or --invariant, else on
    in a hosted room); a value that is not on or off raises SettingsError naming the variable."""
    return bool(settings.of(environ).invariant)


def _pad_rows(x: torch.Tensor, tile: int) -> torch.Tensor:
    """x [M, d] with zero rows appended up to a multiple of `tile`."""
    pad = -x.shape[0] % tile
    return F.pad(x, (0, 0, 0, pad)) if pad else x


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T + bias as F.linear, x [..., d_in] -> [..., d_out]: in float32 on the CPU the row kernel (one
    fixed order per output: `linear` for up to kernels.MAX_ROWS rows, the weights streamed once as a lone step's
    are, `tiled` for more, the same bits); elsewhere `padded`."""
    flat = x.reshape(-1, x.shape[-1])                                               # [M, d_in]
    kernel = kernels.row_kernel()
    if kernel is not None and flat.shape[0] and kernels.fits(flat, weight, bias, max_rows=None):
        product = kernel.linear if flat.shape[0] <= kernels.MAX_ROWS else kernel.tiled
        return product(flat, weight, bias).view(*x.shape[:-1], weight.shape[0])
    return padded(x, weight, bias)


linear.ordered = True                     # type: ignore[attr-defined]  # LeanStep.forward: a product it keeps


def padded(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`linear` in torch's products (other dtypes and devices, or no row kernel): the rows padded to a multiple of
    ROW_TILE and multiplied in one call where this library keeps each row's order for every multiple of 8 rows
    (`one_call_holds`), else 8 rows a call: x [..., d_in]."""
    flat = x.reshape(-1, x.shape[-1])
    rows = _pad_rows(flat, ROW_TILE)
    out = (F.linear(rows, weight) if one_call_holds(weight) else tiled(rows, weight))[:flat.shape[0]]
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


def tiled(rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """rows [M, d_in] (M a multiple of ROW_TILE) times weight.T, one F.linear per tile of 8 rows: [M, d_out]."""
    return torch.cat([F.linear(rows[i:i + ROW_TILE], weight) for i in range(0, rows.shape[0], ROW_TILE)])


def one_call_holds(weight: torch.Tensor) -> bool:
    """Whether one product of any multiple of 8 rows gives each row the bits it gets among 8 alone, for a weight of
    this shape here: probed bitwise with random rows against the weight itself (the order of a sum does not depend on
    its values) at PROBE_ROWS rows, once per (shape, dtype, device, thread count)."""
    key = (tuple(weight.shape), weight.dtype, weight.device, torch.get_num_threads())
    if key not in _HOLDS:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(max(PROBE_ROWS), weight.shape[1], generator=gen).to(device=weight.device, dtype=weight.dtype)
        alone = F.linear(x[:ROW_TILE], weight)
        _HOLDS[key] = all(torch.equal(F.linear(x[:m], weight)[:ROW_TILE], alone) for m in PROBE_ROWS)
    return _HOLDS[key]


def blocks_hold(d: int, dtype: torch.dtype, device: torch.device) -> bool:
    """As `one_call_holds`, for attention's two products per key block ((T', D) x (D, KEY_BLOCK) and (T', KEY_BLOCK)
    x (KEY_BLOCK, D), batched over heads): whether any multiple of 8 query rows gives each row the bits of 8 alone.
    Where not, `attention` multiplies 8 query rows at a time."""
    key = ("attention", d, dtype, device, torch.get_num_threads())
    if key not in _HOLDS:
        gen = torch.Generator().manual_seed(0)
        q, k, p, v = (torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
                      for shape in ((2, max(PROBE_ROWS), d), (2, d, KEY_BLOCK), (2, max(PROBE_ROWS), KEY_BLOCK),
                                    (2, KEY_BLOCK, d)))
        same = lambda a, b: all(torch.equal(torch.bmm(a[:, :m], b)[:, :ROW_TILE], torch.bmm(a[:, :ROW_TILE], b))  # noqa: E731
                                for m in PROBE_ROWS)
        _HOLDS[key] = same(q, k) and same(p, v)
    return _HOLDS[key]


_HOLDS: dict[tuple, bool] = {}


def _left_to_right(keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor):
    """Each row's keys moved so that its first real key is column 0: keys, values [B, KVH, S, D], mask [B, 1, T, S]
    (True: attend) -> the same three, rolled per row by its left pads: the leading keys its last query (always a
    real token) does not read. Not the keys no query reads: in a padded prefill each pad's query reads itself
    (engine.core.lean.causal_mask), and counting those as real shifted the row's key blocks."""
    pads = (~mask[:, 0, -1]).int().cumprod(dim=1).sum(dim=1)                   # [B] leading unread keys
    if pads.device.type == "cpu" and not bool(pads.any()):                     # nothing to move (a lone row)
        return keys, values, mask
    s = keys.shape[2]                    # on a GPU always gathered: no host sync, so a CUDA graph could capture it
    index = (torch.arange(s, device=keys.device)[None] + pads[:, None]) % s    # [B, S]
    take = index[:, None, :, None]
    return (keys.gather(2, take.expand_as(keys)), values.gather(2, take.expand_as(values)),
            mask.gather(3, index[:, None, None, :].expand_as(mask)))


def attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
              scaling: float) -> torch.Tensor:
    """Softmax(q K^T * scaling) V with a fixed split: q [B, H, T, D]; keys, values [B, KVH, S, D]; mask
    [B, 1, T, S] (True: attend) or None for causal over the last T keys. Returns [B, H, T, D]. float32 on the CPU
    goes to attend.c (engine/core/kernels/attend.py: the same split, one C loop per query row); else torch's."""
    kernel = attend_kernel()
    if kernel is not None and kernel.fits(q, keys, values, mask):
        return kernel.attention(q, keys, values, mask, scaling)
    return torch_attention(q, keys, values, mask, scaling)


def torch_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
                    scaling: float) -> torch.Tensor:
    """`attention` in torch's operations (any dtype and device): the same split along the keys, made as padded
    batched products (the module's docstring says how)."""
    b, h, t, d = q.shape
    s = keys.shape[2]
    if mask is None:                                                                # causal: no pads to move
        own = torch.arange(s - t, s, device=q.device)[:, None]
        mask = (torch.arange(s, device=q.device) <= own)[None, None].expand(b, 1, t, s)
    else:
        keys, values, mask = _left_to_right(keys, values, mask)
    tq = -t % ROW_TILE
    keys, values = _heads_padded(keys, h), _heads_padded(values, h)                  # [B, H, S', D]
    mask = F.pad(mask, (0, keys.shape[2] - s, 0, tq), value=False)                  # [B, 1, T', S']
    q = F.pad(q, (0, 0, 0, tq))                                                     # [B, H, T', D]
    if blocks_hold(d, q.dtype, q.device):
        walk = _blocks_at_once if b * h * q.shape[2] * keys.shape[2] <= AT_ONCE else _blocks
        return walk(q, keys, values, mask, scaling, t)
    return torch.cat([_blocks(q[:, :, i:i + ROW_TILE], keys, values, mask[:, :, i:i + ROW_TILE], scaling, ROW_TILE)
                      for i in range(0, q.shape[2], ROW_TILE)], dim=2)[:, :, :t]       # 8 query rows a product


def _heads_padded(x: torch.Tensor, heads: int) -> torch.Tensor:
    """x [B, KVH, S, D] -> [B, H, S', D]: each K/V head repeated for the query heads it serves (as
    repeat_interleave) and zero keys appended up to a multiple of KEY_BLOCK, in one copy."""
    b, kvh, s, d = x.shape
    out = x.new_zeros(b, kvh, heads // kvh, s + -s % KEY_BLOCK, d)
    out[:, :, :, :s] = x[:, :, None]
    return out.view(b, heads, -1, d)


def _blocks(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
            scaling: float, t: int) -> torch.Tensor:
    """The online softmax over key blocks in order, per head one product (T', D) x (D, KEY_BLOCK) and one
    (T', KEY_BLOCK) x (KEY_BLOCK, D), T' a multiple of ROW_TILE (as `linear`: the same order for each query row
    whatever T'): q [B, H, T', D], keys/values [B, H, S', D], mask [B, 1, T', S']. Returns the first t query rows
    [B, H, t, D]."""
    b, h, tp, d = q.shape
    rows = q.reshape(b * h, tp, d)                                                   # [N, T', D]
    top = q.new_full((b * h, tp, 1), float("-inf"))
    total = q.new_zeros((b * h, tp, 1))
    acc = q.new_zeros((b * h, tp, d))
    for j in range(0, keys.shape[2], KEY_BLOCK):
        k = keys[:, :, j:j + KEY_BLOCK].reshape(b * h, KEY_BLOCK, d)                 # [N, block, D]
        v = values[:, :, j:j + KEY_BLOCK].reshape(b * h, KEY_BLOCK, d)
        m = mask[:, :, :, j:j + KEY_BLOCK].expand(b, h, tp, KEY_BLOCK).reshape(b * h, tp, KEY_BLOCK)
        scores = torch.bmm(rows, k.transpose(1, 2)) * scaling
        scores = scores.masked_fill(~m, float("-inf"))
        new_top = torch.maximum(top, scores.amax(dim=-1, keepdim=True))
        safe = torch.where(new_top == float("-inf"), 0.0, new_top)                  # a row with nothing read yet
        p = torch.exp(scores - safe)
        shrink = torch.exp(top - safe)
        total = total * shrink + p.sum(dim=-1, keepdim=True)
        acc = acc * shrink + torch.bmm(p, v)
        top = new_top
    return (acc / total).reshape(b, h, tp, d)[:, :, :t]


def _blocks_at_once(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                    scaling: float, t: int) -> torch.Tensor:
    """`_blocks` with every key block's two products made in one batched call each (the same (T', D) x (D, KEY_BLOCK)
    and (T', KEY_BLOCK) x (KEY_BLOCK, D) per block, the blocks as the batch), the softmax's elementwise work on the
    t real query rows only (a padded row's weights are zeros either way), and only the rescaled sums walked block
    by block, in key order, with `_blocks`' operations: the same bits, bitwise (tests/test_invariance.py), without
    a dozen operations per block. For a decode step's few rows: its scores are all in memory at once."""
    b, h, tp, d = q.shape
    n, nb = b * h, keys.shape[2] // KEY_BLOCK
    rows = q.reshape(n, 1, tp, d).expand(n, nb, tp, d).reshape(n * nb, tp, d)     # [N * nb, T', D]
    k = keys.reshape(n * nb, KEY_BLOCK, d)                                          # block j of head i at i * nb + j
    scores = (torch.bmm(rows, k.transpose(1, 2)) * scaling).view(n, nb, tp, KEY_BLOCK)[:, :, :t]
    m = mask[:, :, :t].reshape(b, 1, t, nb, KEY_BLOCK).transpose(2, 3)               # [B, 1, nb, t, block]
    scores = scores.masked_fill(~m.expand(b, h, nb, t, KEY_BLOCK).reshape(n, nb, t, KEY_BLOCK), float("-inf"))
    tops = scores.amax(dim=-1, keepdim=True).cummax(dim=1).values                   # [N, nb, t, 1] running max
    safe = torch.where(tops == float("-inf"), 0.0, tops)
    before = torch.cat([tops.new_full((n, 1, t, 1), float("-inf")), tops[:, :-1]], dim=1)
    p = torch.exp(scores - safe)                                                     # [N, nb, t, block]
    shrink, sums = torch.exp(before - safe), p.sum(dim=-1, keepdim=True)
    p = F.pad(p, (0, 0, 0, tp - t)).reshape(n * nb, tp, KEY_BLOCK)
    pv = torch.bmm(p, values.reshape(n * nb, KEY_BLOCK, d)).view(n, nb, tp, d)[:, :, :t]
    total, acc = q.new_zeros((n, t, 1)), q.new_zeros((n, t, d))
    for j in range(nb):                                                              # the rescale, in key order
        total = total * shrink[:, j] + sums[:, j]
        acc = acc * shrink[:, j] + pv[:, j]
    return (acc / total).reshape(b, h, t, d)
