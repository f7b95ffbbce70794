"""The host's work for a lone request's token, before and after issue 54's cut, side by side in one run.

    python bench/lone_host.py                     # SmolLM2, two torch threads, 3 rounds of 48 tokens
    python bench/lone_host.py --rounds 5 --tokens 64

Before is the code of commit 66389f9, kept below (`before_pick_tokens`): a softmax over the vocabulary, a top-10 of
the probabilities and a top-256 of the logits, the log-sum-exp of the rest over a copy of the logits with the kept
ones at -inf, torch's argmax, every parallel region on the step's threads; and the lone step's side-by-side check
listing the weights afresh every step (`before_fused`). After is the code as it is now (engine.core.generate's
`pick_tokens`: one top-k of the logits serves the kept logits, the candidates and the rest's shift; the rest
summed in one pass; numpy's argmax; all of it on the calling thread alone; engine.core.lone's check over the list
made with the products).

Four measurements, the ways taking turns in each:
- **the numbers**: the real logits of a greedy answer's decode steps (recorded first), each picked and described
  both ways, for a greedy request, a sampled one (temperature 1) and a filtered one (temperature 0.7, top-k 40,
  top-p 0.9): the tokens, candidates (all ten, and those of probability above 0: past them any token of
  probability 0 may be listed) and kept ids compared, and the largest differences of every probability, kept
  logit and the rest's log-sum-exp;
- **picking alone**: the same calls timed (wall and the thread's CPU time), call by call in turn; and the choice
  alone on one thread: torch's argmax, numpy's, torch.multinomial's draw;
- **in the step**: lone greedy requests through the batch runner (engine.serving.batch, as the scheduler runs
  one), their decode steps taking the ways in turn step by step; the host's work is the runner's step less the
  forward (picking and describing, the record, the cache's bookkeeping), in wall and in the thread's CPU time,
  and the picking within it (wall).
- **the row's inputs and the pick's outputs** (`inputs_in_steps`): the same lone requests, their decode steps taking
  in turn the way of commit 5fd0cd7 ("made each step": the row's token, position and slot as three new tensors,
  the pick's outputs in four allocations addressed through numpy's `.ctypes`, kept below) and the code as it is
  ("made once": `LeanDecode.row`'s tensors filled through numpy, one allocation); the host's work of each.
Medians; the first three decode steps of each request left out. OpenMP's threads wait as `python -m engine serve`
sets them to (bench/provenance.py's `server_wait`), unless set by hand. Writes a new bench/results/lone_host/<UTC time>-<commit>.json (bench/provenance.py);
docs/engine.md, "A lone request", reads it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.provenance import server_wait  # noqa: E402 (torch-free)

server_wait()                        # before torch loads OpenMP: its threads wait as the server's do

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench import provenance  # noqa: E402
from bench.lone_step import PROMPT  # noqa: E402
from engine.core import generate as gen  # noqa: E402
from engine.core.generate import (KEEP_LOGITS, TOP_CANDIDATES, GenerationRequest, TextStream,  # noqa: E402
                                  encode_prompt, facts_to_host, tokens_from)
from engine.core.hooks import CAPTURE_OFF  # noqa: E402
from engine.core.loader import load_model  # noqa: E402
from engine.serving import batch as batch_module  # noqa: E402
from engine.serving.batch import BatchRunner, Slot  # noqa: E402

KINDS = {"greedy": {}, "sampled": {"temperature": 1.0}, "filtered": {"temperature": 0.7, "top_k": 40, "top_p": 0.9}}


# --- before: engine/core/generate.py and engine/core/sampling.py at commit 66389f9 ---------------------------------

def before_logits_to_probs(logits, temperature=1.0, top_k=0, top_p=1.0):
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / max(temperature, 1e-5)
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        drop = sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p
        drop[..., 0] = False
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs.masked_fill(drop, 0.0))
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def before_pick_tokens(lm, logits, requests, generators, streams):
    probs = torch.empty(logits.shape, dtype=torch.promote_types(logits.dtype, torch.float32), device=logits.device)
    groups = {}
    for b, r in enumerate(requests):
        groups.setdefault((r.temperature if r.temperature > 0 else 1.0, r.top_k, r.top_p), []).append(b)
    for (temperature, top_k, top_p), rows in groups.items():
        index = torch.tensor(rows, device=logits.device)
        probs[index] = before_logits_to_probs(logits[index], temperature, top_k, top_p)
    greedy = torch.argmax(logits, dim=-1).tolist()
    ids = [greedy[b] if r.temperature <= 0 else int(torch.multinomial(probs[b], 1, generator=generators[b]))
           for b, r in enumerate(requests)]
    chosen = torch.tensor(ids, device=logits.device)
    texts = [stream.push(i) for stream, i in zip(streams, ids)]
    return tokens_from(lm, facts_to_host(before_token_facts(logits, probs, chosen)), texts)


def before_token_facts(logits, probs, chosen):
    top = torch.topk(probs, min(TOP_CANDIDATES, probs.shape[-1]), dim=-1)
    kept = torch.topk(logits.float(), min(KEEP_LOGITS, logits.shape[-1]), dim=-1)
    facts = {"ids": chosen, "top_ids": top.indices, "top_probs": top.values, "kept_ids": kept.indices,
             "kept_values": kept.values, "chosen_probs": probs.gather(-1, chosen[:, None])[:, 0],
             "chosen_logits": logits.gather(-1, chosen[:, None])[:, 0].float()}
    if logits.shape[-1] > kept.indices.shape[-1]:
        facts["rest"] = torch.logsumexp(logits.float().scatter(-1, kept.indices, float("-inf")), dim=-1)
    facts["vocab"] = torch.tensor(logits.shape[-1])
    return facts


def before_fused(grouped):
    """engine/core/lone.py's SideBySide.fused at 66389f9: the weights listed afresh every step."""
    where, fused = grouped._made[0], grouped._made[1]
    return fused if where and [w.data_ptr() for w in grouped.weights()] == where else None


WAYS = {"before": before_pick_tokens, "after": gen.pick_tokens}

# --- the numbers -----------------------------------------------------------------------------------------------


def recorded_logits(runner: BatchRunner, lm, tokens: int) -> list[torch.Tensor]:
    """The logits (1, V) of every decode step of one greedy lone request, as the runner hands them to pick_tokens."""
    seen, real = [], batch_module.pick_tokens

    def keep(lm_, logits, *args):
        seen.append(logits.clone())
        return real(lm_, logits, *args)
    batch_module.pick_tokens = keep
    try:
        request = GenerationRequest(PROMPT, max_new_tokens=tokens)
        runner.add(Slot(request, encode_prompt(lm, request), CAPTURE_OFF, lambda r: None, print))
        while not runner.idle:
            runner.step()
    finally:
        batch_module.pick_tokens = real
    return seen


def pick(way: str, lm, logits: torch.Tensor, kind: str, seed: int):
    request = GenerationRequest(PROMPT, seed=seed, **KINDS[kind])
    generator = torch.Generator().manual_seed(seed)
    return WAYS[way](lm, logits, [request], [generator], [TextStream(lm.tokenizer)])[0]


def differences(a, b) -> dict:
    """How token b (after) differs from token a (before): what must be equal, and the largest numeric gaps."""
    top_a, top_b = [c.id for c in a.top], [c.id for c in b.top]
    live = [c.id for c in a.top if c.prob > 0]             # past them, any token of probability 0 will do
    return {"same_id": a.id == b.id, "same_top_ids": top_a == top_b, "same_live_top_ids": live == top_b[:len(live)],
            "same_kept_ids": np.array_equal(a.logit_ids, b.logit_ids),
            "prob": abs(a.prob - b.prob), "top_probs": max(abs(x.prob - y.prob) for x, y in zip(a.top, b.top)),
            "kept_logits": float(np.abs(a.logits - b.logits).max()), "logit": abs(a.logit - b.logit),
            "rest": abs(a.rest_logsumexp - b.rest_logsumexp), "rest_rel": abs(a.rest_logsumexp - b.rest_logsumexp)
            / abs(a.rest_logsumexp), "same_rest_count": a.rest_count == b.rest_count}


def compare(lm, rows: list[torch.Tensor]) -> dict:
    """Every recorded row picked both ways, for each kind of request: the worst case of each difference."""
    out = {}
    for kind in KINDS:
        diffs = [differences(pick("before", lm, x, kind, s), pick("after", lm, x, kind, s)) for s, x in enumerate(rows)]
        out[kind] = {k: all(d[k] for d in diffs) if isinstance(diffs[0][k], bool) else max(d[k] for d in diffs)
                     for k in diffs[0]}
        print(f"{kind}: " + ", ".join(f"{k} {v}" for k, v in out[kind].items()), flush=True)
    return out

# --- the time --------------------------------------------------------------------------------------------------


def alone(lm, rows: list[torch.Tensor], rounds: int) -> dict:
    """Each way's pick of every recorded row, the ways in turn call by call: per way and kind, the median wall and
    thread CPU ms."""
    times = {(w, k): [] for w in WAYS for k in KINDS}
    with torch.inference_mode():
        for r in range(rounds):
            for s, x in enumerate(rows):
                for kind in KINDS:
                    for way in (list(WAYS) if (r + s) % 2 == 0 else list(WAYS)[::-1]):
                        w, c = time.perf_counter(), time.thread_time()
                        pick(way, lm, x, kind, s)
                        times[way, kind].append((time.perf_counter() - w, time.thread_time() - c))
    return {way: {kind: {"wall_ms": 1e3 * statistics.median(t for t, _ in times[way, kind]),
                         "cpu_ms": 1e3 * statistics.median(c for _, c in times[way, kind]),
                         "calls": len(times[way, kind])} for kind in KINDS} for way in WAYS}


def draws(rows: list[torch.Tensor], rounds: int) -> dict:
    """What a token's choice costs alone over the recorded rows, one thread (median wall ms): torch's argmax against
    numpy's (`greedy_ids`), and torch.multinomial's draw from a row's probabilities (a sampled request's)."""
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    ways = {"torch_argmax": lambda x, p, g: torch.argmax(x, dim=-1).tolist(), "numpy_argmax": lambda x, p, g:
            gen.greedy_ids(x), "multinomial": lambda x, p, g: int(torch.multinomial(p[0], 1, generator=g))}
    times = {k: [] for k in ways}
    try:
        for _ in range(rounds):
            for s, x in enumerate(rows):
                probs, g = torch.softmax(x, dim=-1), torch.Generator().manual_seed(s)
                for name, fn in ways.items():
                    t = time.perf_counter()
                    fn(x, probs, g)
                    times[name].append(time.perf_counter() - t)
    finally:
        torch.set_num_threads(torch_threads)
    return {f"{k}_ms": 1e3 * statistics.median(v) for k, v in times.items()}


def clocked(forward, clock: dict):
    """forward, each call's wall and CPU seconds in clock["wall"] and clock["cpu"]."""
    def timed_forward(*args, **kwargs):
        w, c = time.perf_counter(), time.thread_time()
        try:
            return forward(*args, **kwargs)
        finally:
            clock["wall"], clock["cpu"] = time.perf_counter() - w, time.thread_time() - c
    return timed_forward


def step_times(wall: float, cpu: float, clock: dict) -> dict:
    """A step's wall and CPU seconds, its forward's (`clocked`) and the host's work: the step less the forward."""
    return {"step_wall": wall, "step_cpu": cpu, "forward_wall": clock["wall"], "forward_cpu": clock["cpu"],
            "host_wall": wall - clock["wall"], "host_cpu": cpu - clock["cpu"]}


def in_steps(runner: BatchRunner, lm, tokens: int, rounds: int) -> dict:
    """Lone greedy requests whose decode steps take the ways in turn (each way leads a round in turn): per way, the
    median of the step, the forward and the host's work (the step less the forward), wall and CPU ms."""
    step_lean, forward = runner.lean.lean, runner.lean.lean.forward
    clock: dict[str, float] = {}
    step_lean.forward = clocked(forward, clock)
    steps = {w: [] for w in WAYS}
    texts = set()
    try:
        for r in range(rounds):
            order = list(WAYS) if r % 2 == 0 else list(WAYS)[::-1]
            texts.add(one_request(runner, lm, tokens, order, clock, steps))
    finally:
        step_lean.forward = forward
        batch_module.pick_tokens = gen.pick_tokens
        use_fused(runner.lean.side_by_side, "after")
    return {"same_text": len(texts) == 1, **{w: summary(s) for w, s in steps.items()}}


def one_request(runner, lm, tokens, order, clock, steps) -> str:
    request = GenerationRequest(PROMPT, max_new_tokens=tokens)
    out = []
    runner.add(Slot(request, encode_prompt(lm, request), CAPTURE_OFF, out.append, print))
    n = 0
    while not runner.idle:
        way = order[n % len(order)]
        batch_module.pick_tokens = timed(WAYS[way], clock)
        use_fused(runner.lean.side_by_side, way)
        clock.clear()
        w, c = time.perf_counter(), time.thread_time()
        runner.step()
        wall, cpu = time.perf_counter() - w, time.thread_time() - c
        if n > 3 and "wall" in clock:                                     # step 0 is the prompt's
            steps[way].append({**step_times(wall, cpu, clock), "pick_wall": clock["pick"]})
        n += 1
    return out[-1].text


def timed(pick, clock: dict):
    """pick, its wall seconds of this step in clock["pick"]."""
    def run(*args):
        t = time.perf_counter()
        try:
            return pick(*args)
        finally:
            clock["pick"] = time.perf_counter() - t
    return run


def use_fused(grouped, way: str) -> None:
    """The side-by-side check of `way` (an attribute of the instance stands in for the method before)."""
    grouped.fused()                                       # made once, the same products both ways
    if way == "before":
        grouped.fused = lambda: before_fused(grouped)
    else:
        grouped.__dict__.pop("fused", None)


# --- the lone row's inputs and the pick's outputs as at commit 5fd0cd7 (the "made each step" way) ------------------

def made_each_step_of(device):
    """LeanDecode.row.of as at 5fd0cd7: three new tensors a step (its token, position and new slot)."""
    def of(token, position, write):
        return (torch.tensor([[token]], device=device), torch.tensor([[position]], device=device),
                torch.tensor([write], device=device))
    return of


def made_each_step_pick(self, logits, k):
    """GlueKernel.pick as at 5fd0cd7: four allocations, their addresses through numpy's .ctypes."""
    b, v = logits.shape
    ids, vals, stats = np.empty((b, k), np.int64), np.empty((b, k), np.float32), np.full((b, 3), np.nan)
    scratch = np.empty(2 * (k + 1), np.int64)
    x, row = logits.data_ptr(), 4 * logits.stride(0)
    at = [a.ctypes.data for a in (ids, vals, stats, scratch)]
    for r in range(b):
        self._pick(x + r * row, v, k, at[0] + 8 * k * r, at[1] + 4 * k * r, at[2] + 24 * r, at[3])
    return ids, vals, stats


INPUT_WAYS = ("made each step", "made once")


def inputs_steps(runner: BatchRunner, lm, tokens: int, rounds: int) -> dict:
    """Lone greedy requests whose decode steps take the two ways of the row's inputs and the pick's outputs in turn
    (each way leads a round in turn): per way, the medians of the step, the forward and the host's work."""
    from engine.core.kernels.glue import GlueKernel
    step_lean, forward, pick, row = runner.lean.lean, runner.lean.lean.forward, GlueKernel.pick, runner.lean.row
    clock: dict[str, float] = {}

    def use(way: str) -> None:
        GlueKernel.pick = made_each_step_pick if way == INPUT_WAYS[0] else pick
        if way == INPUT_WAYS[0]:
            row.of = made_each_step_of(lm.device)
        else:
            row.__dict__.pop("of", None)
    step_lean.forward, steps, texts = clocked(forward, clock), {w: [] for w in INPUT_WAYS}, set()
    try:
        for r in range(rounds):
            request, out, n = GenerationRequest(PROMPT, max_new_tokens=tokens), [], 0
            runner.add(Slot(request, encode_prompt(lm, request), CAPTURE_OFF, out.append, print))
            while not runner.idle:
                way = INPUT_WAYS[(n + r) % 2]
                use(way)
                clock.clear()
                w, c = time.perf_counter(), time.thread_time()
                runner.step()
                wall, cpu = time.perf_counter() - w, time.thread_time() - c
                if n > 3 and "wall" in clock:
                    steps[way].append(step_times(wall, cpu, clock))
                n += 1
            texts.add(out[-1].text)
    finally:
        step_lean.forward = forward
        use(INPUT_WAYS[1])
    return {"same_text": len(texts) == 1, **{w: summary(s) for w, s in steps.items()}}


def summary(steps: list[dict]) -> dict:
    return {**{f"{k}_ms": 1e3 * statistics.median(s[k] for s in steps) for k in steps[0]}, "steps": len(steps)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--out", help="default: a new file under bench/results/lone_host/")
    args = parser.parse_args(argv)
    record = provenance.start("lone_host", argv)
    torch.set_num_threads(args.threads)
    lm = load_model(args.model, device="cpu", dtype="float32")
    runner = BatchRunner(lm, max_batch=32, prefix=None)
    rows = recorded_logits(runner, lm, args.tokens)[3:]
    report = {"threads": args.threads, "tokens": args.tokens, "rounds": args.rounds, "rows": len(rows),
              "vocab": int(rows[0].shape[-1]), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
              "numbers": compare(lm, rows), "alone": alone(lm, rows, args.rounds), "draws": draws(rows, args.rounds),
              "in_steps": in_steps(runner, lm, args.tokens, args.rounds),
              "inputs_in_steps": inputs_steps(runner, lm, args.tokens, args.rounds)}
    for way in WAYS:
        a, s = report["alone"][way], report["in_steps"][way]
        print(f"{way}: picking alone " + ", ".join(f"{k} {v['wall_ms']:.3f} ms wall {v['cpu_ms']:.3f} CPU"
                                                  for k, v in a.items())
              + f"; in the step: host {s['host_wall_ms']:.3f} ms wall {s['host_cpu_ms']:.3f} CPU of a "
              f"{s['step_wall_ms']:.1f} ms step", flush=True)
    for way in INPUT_WAYS:
        s = report["inputs_in_steps"][way]
        print(f"the row's inputs and the pick's outputs {way}: host {s['host_wall_ms']:.3f} ms wall "
              f"{s['host_cpu_ms']:.3f} CPU of a {s['step_wall_ms']:.1f} ms step", flush=True)
    good = (report["inputs_in_steps"]["same_text"] and report["in_steps"]["same_text"]
            and all(v["same_id"] for v in report["numbers"].values()))
    record.save(report, out=args.out)
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
