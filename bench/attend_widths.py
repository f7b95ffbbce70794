"""The invariant mode's attention (attend.c) before and after a change, against SDPA, side by side in one run
(issue 51): SmolLM2's heads (9 query heads, 3 kv heads, D 64), a prefill of T = S = 2,048 (causal), the server's
last chunk of it (T = 256 queries after 1,792 keys: engine.serving.batch.PREFILL_CHUNK) and a decode step of T = 1
against S = 512 keys.

    python bench/attend_widths.py                              # attend.c of main against this tree's, 5 rounds
    python bench/attend_widths.py --old main~3 --rounds 7 --threads 1 2

Four ways (three where T != S) taking turns round by round: `sdpa` (F.scaled_dot_product_attention with the causal
mask as a tensor, as the tests compare, and what the mode off runs for a chunk after its keys), `sdpa_causal` (the
same with is_causal=True and no mask, T = S only: what the mode off runs for a prompt's first chunk,
engine/core/lean.py), `old` (attend.c as it is at the git revision --old, built with the kernel's flags into the
cache folder and loaded beside the new one through AttendKernel(path)) and `new` (this tree's attend.c, as the mode
loads it). Per case and thread count: each way's median and fastest seconds, old and new over sdpa and over
sdpa_causal, new over old (medians), and whether old and new give the same bits (they need not: main's attend.c left
the running sum's multiply-add to gcc, which did not fuse it in an AVX2 build). Random q, k, v: a sum's order and
speed do not depend on the values. Writes bench/results/attend_widths/<UTC time>-<commit>.json.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.provenance import server_wait  # noqa: E402 (torch-free)

server_wait()                        # before torch loads OpenMP: its threads wait as the server's do

import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from bench import provenance  # noqa: E402
from engine.core import kernels  # noqa: E402
from engine.core.kernels import attend  # noqa: E402

HEADS, KV_HEADS, D = 9, 3, 64                              # SmolLM2-135M's attention
CASES = {"prefill": (2048, 2048), "chunk": (256, 2048), "decode": (1, 512)}      # (T, S)
SCALE = D ** -0.5


def old_kernel(rev: str) -> attend.AttendKernel:
    """attend.c as it is at git revision `rev`, built as the kernel is built (the cache folder, named by its hash)."""
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:engine/core/kernels/attend.c"],
                          capture_output=True, text=True, check=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "attend.c"
        source.write_text(text)
        return attend.AttendKernel(kernels.build(source))


def inputs(t: int, s: int):
    """q [1, H, T, D], keys, values [1, KVH, S, D]: the scores of a real model's spread (as the tests make them)."""
    g = torch.Generator().manual_seed(t * 10_000 + s)
    return (torch.randn(1, HEADS, t, D, generator=g) * 2, torch.randn(1, KV_HEADS, s, D, generator=g) * 2,
            torch.randn(1, KV_HEADS, s, D, generator=g))


def ways(old: attend.AttendKernel, new: attend.AttendKernel, t: int, s: int) -> dict:
    """Each way as fn(q, keys, values) -> [1, H, T, D]; causal over the last T keys (None: attend.c's causal)."""
    mask = torch.ones(t, s, dtype=torch.bool).tril(s - t)                        # [T, S]
    made = {"sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=SCALE,
                                                                   enable_gqa=True),
            "sdpa_causal": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=t > 1, scale=SCALE,
                                                                          enable_gqa=True),
            "old": lambda q, k, v: old.attention(q, k, v, None, SCALE),
            "new": lambda q, k, v: new.attention(q, k, v, None, SCALE)}
    if t != s:                  # is_causal aligns the mask top left: another sum than a chunk after its keys
        del made["sdpa_causal"]
    return made


def one_case(old: attend.AttendKernel, new: attend.AttendKernel, t: int, s: int, rounds: int) -> dict:
    """Each way's seconds over `rounds` rounds, the ways taking turns (the current thread count)."""
    q, k, v = inputs(t, s)
    made = ways(old, new, t, s)
    times = {name: [] for name in made}
    for fn in made.values():
        fn(q, k, v)                                                               # not timed: a first touch
    for _ in range(rounds):
        for name, fn in made.items():
            start = time.perf_counter()
            fn(q, k, v)
            times[name].append(time.perf_counter() - start)
    med = {name: statistics.median(x) for name, x in times.items()}
    return {**{f"{name}_s": med[name] for name in made}, **{f"{name}_fastest_s": min(x) for name, x in times.items()},
            "old_over_sdpa": med["old"] / med["sdpa"], "new_over_sdpa": med["new"] / med["sdpa"],
            **({"old_over_sdpa_causal": med["old"] / med["sdpa_causal"],
                "new_over_sdpa_causal": med["new"] / med["sdpa_causal"]} if "sdpa_causal" in med else {}),
            "new_over_old": med["new"] / med["old"],
            "same_bits": bool(torch.equal(made["old"](q, k, v), made["new"](q, k, v))), "rounds": times}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", default="main", help="git revision whose attend.c is `old`")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--threads", type=int, nargs="+", default=[2])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    run = provenance.start("attend_widths", argv)
    new = attend.attend_kernel()
    if new is None:
        sys.exit(f"the attention kernel is not built: {attend.why_off()}")
    old = old_kernel(args.old)
    old_commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", args.old], capture_output=True, text=True,
                                check=True).stdout.strip()
    results = []
    with torch.inference_mode():
        for threads in args.threads:
            torch.set_num_threads(threads)
            for case in args.cases:
                t, s = CASES[case]
                one = one_case(old, new, t, s, args.rounds)
                results.append({"case": case, "t": t, "s": s, "threads": threads, **one})
                causal = (f"; {one['new_over_sdpa_causal']:.2f}x is_causal's {one['sdpa_causal_s'] * 1e3:.2f} ms"
                          if "sdpa_causal_s" in one else "")
                print(f"{case:8s} {threads} thr: sdpa {one['sdpa_s'] * 1e3:8.2f} ms  old {one['old_s'] * 1e3:8.2f} ms "
                      f"({one['old_over_sdpa']:.2f}x)  new {one['new_s'] * 1e3:8.2f} ms ({one['new_over_sdpa']:.2f}x"
                      f"{causal})  new/old {one['new_over_old']:.2f}{'' if one['same_bits'] else '  BITS DIFFER'}",
                      flush=True)
    print(run.save({"results": results, "old": {"rev": args.old, "commit": old_commit},
                    "shape": {"heads": HEADS, "kv_heads": KV_HEADS, "d": D}, "rounds_each": args.rounds},
                   out=args.out))


if __name__ == "__main__":
    main()
