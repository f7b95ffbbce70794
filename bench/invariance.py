"""Same question, same numbers (issue 51): which parts of a step change a row's logits bitwise on this CPU, with the
batch-invariant kernels off and on (engine/core/invariant.py), and what the kernels cost; one process, side by side.

    python bench/invariance.py                     # SmolLM2 float32, the default model
    python bench/invariance.py --prompt 300 --prefill 2048 --rounds 3
    python bench/invariance.py --cost-only --rounds 7 --prefill 256   # only the cost, off against on
    python bench/invariance.py --lesson            # only the room page's lesson (engine/lab/invariance.py), timed

Kernels alone, on SmolLM2's own weights and activations' shapes: F.linear with M rows against one (row 0), threads
1 against 2; SDPA for a query in a prefill chunk against the same query decoded alone; RMSNorm with M rows. Then the
whole forward, off and on: a prompt's logits prefilled whole vs in chunks of 64 and 256; a request decoding alone vs
as one row of a batch of 2, 7 and 32 (the others at other positions); one thread vs two; a prefix's K/V reused.
Each comparison gives `equal` (torch.equal) and the largest difference. Cost, off against on, alternating: a lone
decode step, a 20-row decode step, a prefill (in one chunk, and in the server's chunks of 256 tokens), each step
with the products the server hands the forward (`--products server`, the default: one row the row kernel's, the
packed panels for 2 to 128 rows, with the mode on for any step; `forward`: F.linear, as the runs before the panels);
and taken apart in the same run (`--modes`): the invariant products with the usual attention, the usual products
with the invariant attention, the key blocks walked one at a time. `--lesson` runs what the room page's "Same
question, same numbers?" runs (the same jobs' code, in float32 and bfloat16, kernels off and on): each run's seconds
(how long the room waits for it), the largest log-probability gap and where the answers part. Writes
bench/results/invariance/<UTC time>-<commit>.json.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from transformers import DynamicCache  # noqa: E402

import provenance  # noqa: E402
from engine.core import invariant  # noqa: E402
from engine.core.kernels import attend  # noqa: E402
from engine.core.lean import LeanStep, causal_mask, rms_norm  # noqa: E402
from engine.core.loader import load_model  # noqa: E402
from engine.lab import invariance as lesson  # noqa: E402
from engine.serving.batch import PREFILL_CHUNK  # noqa: E402
from engine.serving.lean import LeanDecode  # noqa: E402


def compare(a: torch.Tensor, b: torch.Tensor) -> dict:
    print(".", end="", flush=True)
    return {"equal": bool(torch.equal(a, b)), "max_abs_diff": float((a - b).abs().max())}


def kv_of(cache: DynamicCache):
    """The forward's `kv(layer, k, v)` on one request's cache (as LeanStep.on_cache hands it)."""
    return lambda i, k, v: cache.update(k, v, i)


def forward_products(rows: int) -> tuple:
    """(linear, fused) the forward is handed for a step of `rows` tokens: F.linear, as LeanStep.forward's default,
    unless `--products server` sets `products` to what the server hands it (LeanDecode.products)."""
    return F.linear, None


products = forward_products


def prefill(lean: LeanStep, cache: DynamicCache, ids: list[int], chunk: int | None = None) -> torch.Tensor:
    """Logits [T, V] of every prompt position, fed in chunks of `chunk` tokens (None: whole)."""
    out, chunk = [], chunk or len(ids)
    with torch.inference_mode():
        for lo in range(0, len(ids), chunk):
            part, start = ids[lo:lo + chunk], cache.get_seq_length()
            positions = torch.arange(start, start + len(part))[None]
            linear, fused = products(len(part))
            out.append(lean.forward(torch.tensor([part]), positions, kv_of(cache), logits_to_keep=len(part),
                                    linear=linear, fused=fused)[0])
    return torch.cat(out)


def decode_batch(lean: LeanStep, caches: list[DynamicCache], tokens: list[int]) -> torch.Tensor:
    """One decode step of several requests, keys left-padded to the longest as the batch runs it: [B, V]."""
    lengths = [c.get_seq_length() for c in caches]
    width = max(lengths) + 1
    valid = torch.tensor([[col >= width - n - 1 for col in range(width)] for n in lengths])

    def kv(i, k, v):
        pairs = [c.update(k[b:b + 1], v[b:b + 1], i) for b, c in enumerate(caches)]
        return (torch.cat([F.pad(p[0], (0, 0, width - p[0].shape[2], 0)) for p in pairs]),
                torch.cat([F.pad(p[1], (0, 0, width - p[1].shape[2], 0)) for p in pairs]))
    linear, fused = products(len(tokens))
    with torch.inference_mode():
        return lean.forward(torch.tensor(tokens)[:, None], torch.tensor(lengths)[:, None], kv,
                            causal_mask(valid, 1), linear=linear, fused=fused)[:, -1]


def ids_of(n: int, seed: int, vocab: int) -> list[int]:
    return torch.randint(4, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def decode_rows(lean: LeanStep, ids: list[int], steps: int, others: int) -> list[torch.Tensor]:
    """Logits of `ids`' greedy decode steps as row 0 of a batch of others + 1 rows (others at other positions)."""
    vocab, caches, tokens = lean.config.vocab_size, [], []
    for b in range(others + 1):
        cache = DynamicCache()
        prompt = ids if b == 0 else ids_of(5 + 37 * b % 120, 100 + b, vocab)
        tokens.append(int(prefill(lean, cache, prompt)[-1].argmax()))
        caches.append(cache)
    out = []
    for _ in range(steps):
        rows = decode_batch(lean, caches, tokens)
        out.append(rows[0])
        tokens = [int(r.argmax()) for r in rows]
    return out


def worst(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> dict:
    found = [compare(a, b) for a, b in pairs]
    return {"equal": all(f["equal"] for f in found), "max_abs_diff": max(f["max_abs_diff"] for f in found)}


def kernels(lean: LeanStep) -> dict:
    """Each kernel alone: does a row's result depend on the other rows, the threads, the chunking?"""
    torch.manual_seed(0)
    w = lean.layers[0]
    out = {}
    x = torch.randn(32, w.q[0].shape[1])
    for name, (weight, _) in {"q_proj": w.q, "down_proj": w.down, "lm_head": lean.head}.items():
        xin = torch.randn(32, weight.shape[1])
        for kind, fn in (("F.linear", F.linear), ("invariant.linear", invariant.linear)):
            one = fn(xin[:1], weight)
            out[f"{kind} {name}: 1 row vs M rows"] = {m: compare(fn(xin[:m], weight)[0], one[0]) for m in (2, 7, 32)}
            torch.set_num_threads(1)
            t1 = fn(xin[:7], weight)
            torch.set_num_threads(2)
            out[f"{kind} {name}: 7 rows, 1 vs 2 threads"] = compare(t1, fn(xin[:7], weight))
    norm_one = rms_norm(x[:1], w.ln1, lean.eps)
    out["rms_norm: 1 row vs M rows"] = {m: compare(rms_norm(x[:m], w.ln1, lean.eps)[0], norm_one[0]) for m in (2, 7, 32)}
    h, kvh, d, s = lean.heads, lean.kv_heads, lean.head_dim, 300
    q, k, v = torch.randn(1, h, s, d), torch.randn(1, kvh, s, d), torch.randn(1, kvh, s, d)
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=lean.scaling, enable_gqa=True)
    alone = F.scaled_dot_product_attention(q[:, :, -1:], k, v, scale=lean.scaling, enable_gqa=True)
    out["SDPA: last query in a 300-token prefill vs decoded alone"] = compare(sdpa[:, :, -1], alone[:, :, 0])
    whole = invariant.attention(q, k, v, None, lean.scaling)
    alone = invariant.attention(q[:, :, -1:], k, v, None, lean.scaling)
    out["invariant.attention: same"] = compare(whole[:, :, -1], alone[:, :, 0])
    return out


def forward_checks(lean: LeanStep, prompt: int, steps: int) -> dict:
    """The whole forward: prefill chunks, batches, threads, a prefix reused (the mode as `lean.invariant` says)."""
    vocab = lean.config.vocab_size
    ids = ids_of(prompt, 1, vocab)
    whole = prefill(lean, DynamicCache(), ids)
    out = {f"prefill whole vs chunks of {c}": compare(prefill(lean, DynamicCache(), ids, c), whole) for c in (64, 256)}
    short = ids_of(40, 0, vocab)
    alone = decode_rows(lean, short, steps, 0)
    for others in (1, 6, 31):
        out[f"decode alone vs in a batch of {others + 1}"] = worst(list(zip(decode_rows(lean, short, steps, others), alone)))
    torch.set_num_threads(1)
    one = decode_rows(lean, short, steps, 6)
    torch.set_num_threads(2)
    out["batch of 7: 1 vs 2 threads"] = worst(list(zip(one, decode_rows(lean, short, steps, 6))))
    shared, second = ids[:130], ids_of(25, 6, vocab)
    cache = DynamicCache()
    prefill(lean, cache, shared)
    rest = prefill(lean, copy.deepcopy(cache), second)
    out["prefix K/V reused vs prefilled whole"] = compare(rest, prefill(lean, DynamicCache(), shared + second)[130:])
    return out


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def tiled_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The invariant product as it was first written: one F.linear per 8-row tile (x [..., d_in]), kept here to time
    it beside the one-call product that replaced it (engine.core.invariant.linear)."""
    flat = x.reshape(-1, x.shape[-1])
    rows = torch.cat([flat, flat.new_zeros(-flat.shape[0] % invariant.ROW_TILE, flat.shape[1])])
    out = torch.cat([F.linear(rows[i:i + invariant.ROW_TILE], weight)
                     for i in range(0, rows.shape[0], invariant.ROW_TILE)])[:flat.shape[0]]
    return (out if bias is None else out + bias).reshape(*x.shape[:-1], weight.shape[0])


MODES = ("off", "on", "torch-attention", "products", "attention", "walked", "tiles")
# off: the usual kernels; on: the invariant ones; products: the invariant products with the usual attention (SDPA);
# attention: the usual products (F.linear) with the invariant attention; walked: the invariant ones with every key
# block walked one at a time (invariant._blocks, the kernel before `_blocks_at_once`); tiles: the invariant ones with
# the first 8-row tiles; torch-attention: the invariant ones with the attention in torch's operations, attend.c off
# (the mode as it was before it, main at a29a10f). Side by side in one run, they take the cost apart.


def usual_attention(q, keys, values, mask, scaling):
    """SDPA as the forward calls it without the invariant kernels (engine.core.lean.LeanStep._attention)."""
    if mask is None and q.shape[2] > 1 and keys.shape[2] != q.shape[2]:
        mask = causal_mask(torch.ones(q.shape[0], keys.shape[2], dtype=torch.bool), q.shape[2])
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scaling,
                                          is_causal=mask is None and q.shape[2] > 1,
                                          enable_gqa=q.shape[1] != keys.shape[1])


def one_mode(lean: LeanStep, mode: str, fn) -> float:
    """`fn()` timed with the kernels `mode` names (MODES), the module's kernels put back after."""
    lean.invariant, kept = mode != "off", (invariant.linear, invariant.attention, invariant.AT_ONCE)
    swap = {"tiles": {"linear": tiled_linear}, "products": {"attention": usual_attention},
            "attention": {"linear": F.linear}, "walked": {"AT_ONCE": -1}}.get(mode, {})
    for name, value in swap.items():
        setattr(invariant, name, value)
    attend.use(mode not in ("torch-attention", "walked"))            # walked: torch's key blocks, one at a time
    try:
        return timed(fn)
    finally:
        invariant.linear, invariant.attention, invariant.AT_ONCE = kept
        attend.use(True)


def cost(lean: LeanStep, rounds: int, prefill_tokens: int, modes: tuple[str, ...] = MODES) -> dict:
    """Off against each of `modes`, alternating round by round: a lone decode step, a 20-row decode step, a
    prefill in one chunk, and the same prompt in the server's chunks of PREFILL_CHUNK tokens (as `python -m engine
    serve` prefills it, a step per chunk)."""
    vocab = lean.config.vocab_size
    rows = ("lone decode step", "20-row decode step", "prefill", "prefill in the server's chunks")
    times: dict = {k: {m: [] for m in modes} for k in rows}
    long_ids = ids_of(prefill_tokens, 9, vocab)
    warm = DynamicCache()
    prefill(lean, warm, ids_of(20, 3, vocab))
    for mode in modes:          # not timed: each shape's one-time probe (invariant.one_call_holds, blocks_hold)
        one_mode(lean, mode, lambda: decode_batch(lean, [copy.deepcopy(warm)], [5]))
    for _ in range(rounds):
        for mode in modes:
            lean.invariant = False
            cache = DynamicCache()
            prefill(lean, cache, ids_of(200, 3, vocab))
            times["lone decode step"][mode].append(one_mode(lean, mode, lambda: decode_batch(lean, [cache], [5])))
            caches = [DynamicCache() for _ in range(20)]
            for b, c in enumerate(caches):
                prefill(lean, c, ids_of(20 + 5 * b, 20 + b, vocab))
            times["20-row decode step"][mode].append(one_mode(lean, mode, lambda: decode_batch(lean, caches, [5] * 20)))
            times["prefill"][mode].append(one_mode(lean, mode, lambda: prefill(lean, DynamicCache(), long_ids)))
            times["prefill in the server's chunks"][mode].append(
                one_mode(lean, mode, lambda: prefill(lean, DynamicCache(), long_ids, chunk=PREFILL_CHUNK)))
    med = {k: {m: statistics.median(v[m]) for m in modes} for k, v in times.items()}
    return {k: {**{f"{m}_s": med[k][m] for m in modes},
                **{f"{m}_over_off": med[k][m] / med[k]["off"] for m in modes if m != "off"}, "rounds": v}
            for k, v in times.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--prompt", type=int, default=300)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--prefill", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", default=None)
    parser.add_argument("--cost-only", action="store_true", help="skip the bitwise checks; time off against on")
    parser.add_argument("--modes", nargs="+", choices=MODES,
                        default=["off", "on", "torch-attention", "products", "attention"],
                        help="the kernels timed side by side (off is always one)")
    parser.add_argument("--products", choices=("forward", "server"), default="server",
                        help="server: each step's products as the server hands them to the forward (LeanDecode."
                             "products: the packed ones for 2 to 128 rows, with the mode on for any); forward: "
                             "F.linear, the forward's default (the runs before the panels)")
    parser.add_argument("--lesson", action="store_true", help="only the room page's lesson, each run timed")
    parser.add_argument("--lesson-prompt", default=lesson.DEFAULT_PROMPT)
    args = parser.parse_args(argv)
    run = provenance.start("invariance", argv)
    lm = load_model(args.model, device="cpu", dtype="float32")
    if args.lesson:
        torch.set_num_threads(2)
        print(run.save({"model": args.model, "threads": torch.get_num_threads(),
                        "lesson": lesson_runs(lm, args.lesson_prompt)}, out=args.out))
        return
    lean = LeanStep(lm)
    torch.set_num_threads(2)
    if args.products == "server":
        global products
        decoder = LeanDecode(lean)
        products = lambda rows: (decoder.linear, None) if rows == 1 else decoder.products(rows, pack=True)  # noqa: E731
    report = {"model": args.model, "dtype": "float32", "threads": torch.get_num_threads(), "products": args.products,
              "row_tile": invariant.ROW_TILE, "key_block": invariant.KEY_BLOCK}
    if not args.cost_only:
        checks(lean, report, args.prompt, args.steps)
    report["cost"] = cost(lean, args.rounds, args.prefill, tuple(dict.fromkeys(["off", *args.modes])))
    print({k: {m: round(r, 2) for m, r in v.items() if m.endswith("_over_off")} for k, v in report["cost"].items()})
    print(run.save(report, out=args.out))


def lesson_runs(lm, prompt: str) -> dict:
    """The room page's comparison, run by run as its jobs run them: per setting, each run's seconds, the largest
    |difference| in log-probability between alone and in the batch, where the answers part; one sum in two orders."""
    ids, out = lesson.lesson_ids(lm, prompt), {"prompt": prompt, "new_tokens": lesson.NEW_TOKENS, "settings": {}}
    for dtype in ("float32", "bfloat16"):
        for on in (False, True):
            alone = lesson.answer(lm, dtype, on, ids)
            batch = lesson.answer(lm, dtype, on, ids, in_batch=True)
            c = lesson.comparison(dtype, on, alone, batch)
            out["settings"][f"{dtype} {'on' if on else 'off'}"] = {
                "alone_s": alone.seconds, "in_batch_s": batch.seconds, "max_gap": max(c.gaps), "gaps": c.gaps,
                "parted_at_token": None if c.parted is None else c.parted + 1,
                "alone": lm.tokenizer.decode(c.alone), "in_batch": lm.tokenizer.decode(c.in_batch)}
            print(dtype, on, {k: v for k, v in out["settings"][f"{dtype} {'on' if on else 'off'}"].items()
                              if k.endswith("_s") or k in ("max_gap", "parted_at_token")}, flush=True)
    text_ids = lm.tokenizer(prompt, add_special_tokens=False)["input_ids"]    # as the page's job: the text's last
    out["two_orders"] = dataclasses.asdict(lesson.two_orders(lm, text_ids))
    return out


def checks(lean: LeanStep, report: dict, prompt: int, steps: int) -> None:
    """The kernels alone, then the whole forward off and on, into `report`."""
    report["kernels"] = kernels(lean)
    print("kernels", {k: v.get("equal", v) for k, v in report["kernels"].items()}, flush=True)
    for mode in ("off", "on"):
        lean.invariant = mode == "on"
        report[f"forward_{mode}"] = forward_checks(lean, prompt, steps)
        print(mode, {k: v["equal"] for k, v in report[f"forward_{mode}"].items()}, flush=True)


if __name__ == "__main__":
    main()
