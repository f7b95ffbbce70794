"""Load test: N sessions press Generate at the same moment; the scheduler serves them on one model.

    python bench/load.py                                  # the embedded model, N = 1, 5, 10, 20, 30, plus an overload
    python bench/load.py --sessions 1 5 --tokens 16 --capture off --model /models/llama --device cuda

Each N runs twice, side by side in the same process: one request at a time (max_batch 1, how the
scheduler served before continuous batching) and batched (max_batch from the limits), so the ratio
of the two is measured under the same load on the machine.

Each session is a thread that submits its request through `engine.serving.scheduler` (as a page does) and
reads its records to the end. Checks: every request finishes or is refused with a message, none is
lost, no exception escapes, each answer equals the same prompt run alone (greedy) or leaves it only at a
tie (a token whose raw logit, in the alone run, was within rounding of the chosen one's: in bf16 another batch
shape sums in another order; counted apart as tie_divergences), and the process's memory stays bounded. Reports p50/p95 of the wait before running, the time to first token and the
completion time (all from the moment of submitting), and the throughput. Writes a new bench/results/load/<UTC
time>-<commit>.json
(bench/provenance.py).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.errors import EngineError  # noqa: E402
from engine.core.generate import GenerationRequest, generate  # noqa: E402
from engine.core.hooks import CAPTURE_OFF, CapturePolicy, count_hooks  # noqa: E402
from engine.serving.limits import Limits  # noqa: E402
from engine.serving.graphed import cudagraph_counts  # noqa: E402
from engine.serving.capture import LOGIT_LENS_TOP  # noqa: E402
from engine.core.kept import kept_for  # noqa: E402
from engine.core.loader import LoadedModel, load_model  # noqa: E402
from engine.core.openmp import in_passing_thread  # noqa: E402
from engine.core.records import DoneRecord  # noqa: E402
from engine.lab.memory import cuda  # noqa: E402
from engine.projection.card import kv_cache_bytes, weight_bytes  # noqa: E402
from engine.serving.scheduler import Scheduler  # noqa: E402
from engine.service.service import KEPT_GUESS  # noqa: E402
from bench import provenance  # noqa: E402

PROMPTS = (
    "What is the capital of France?",
    "Explain in one sentence why the sky is blue.",
    "Write a haiku about autumn.",
    "What does a GPU do?",
    "Name three prime numbers.",
    "Translate 'good morning' into Spanish.",
    "Why do we need sleep?",
    "Write a Python one-liner that reverses a string.",
    "What is a transformer in machine learning?",
    "Give me a tip for learning to cook.",
)
# "full": what a page (and an API request asking for captures) keeps: the residual stream of every layer (a session
# keeps it as a page's run does, engine.core.kept.kept_for)
CAPTURES = {"off": CAPTURE_OFF,
            "full": CapturePolicy(logit_lens=LOGIT_LENS_TOP, inputs=None)}   # for short prompts (capture_policy's)


@dataclass
class Outcome:
    """What one session saw."""

    prompt: str
    submitted: float
    refused: str | None = None      # the message, when the scheduler said no
    error: str | None = None        # anything else (must stay None)
    first: float | None = None      # first record arrived
    finished: float | None = None
    started: float | None = None    # the scheduler started running it
    text: str | None = None
    tokens: int = 0
    records: int = 0
    ids: list[int] = field(default_factory=list)    # the answer's token ids


@dataclass
class Reference:
    """A prompt's greedy answer run alone: its text, its ids, and each step's kept raw logits (ids, values)."""

    text: str
    ids: list[int]
    logits: list[tuple[Any, Any]]
    eps: float                    # the model's dtype's machine epsilon

    def verdict(self, ids: list[int], text: str | None) -> str:
        """'same'; 'tie' when the answer first leaves the reference at a token whose raw logit, in the reference's
        own step, is within rounding of the reference's choice (another batch shape sums in another order; in
        bf16 with nearly flat logits that flips argmaxes, and everything after differs legitimately); else 'wrong'.
        Without ids (an API client reads text only) any difference is 'wrong'."""
        if text == self.text:
            return "same"
        k = next((i for i, (a, b) in enumerate(zip(ids, self.ids)) if a != b), None)
        if k is None or k >= len(self.logits):
            return "wrong"
        kept_ids, kept = self.logits[k]
        where = [j for j, i in enumerate(kept_ids) if i == ids[k]]
        if not where:
            return "wrong"
        best = float(kept.max())
        return "tie" if best - float(kept[where[0]]) <= TIE_EPS * self.eps * max(1.0, abs(best)) else "wrong"


TIE_EPS = 8     # a tie: two raw logits closer than 8 machine epsilons of their size (bf16: 6%; float32: 1e-6)


class MemoryWatch:
    """Samples this process's resident memory every 50 ms."""

    def __init__(self):
        self.proc, self._stop = psutil.Process(os.getpid()), threading.Event()
        self.start_rss = self.peak = self.proc.memory_info().rss
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __enter__(self) -> "MemoryWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.end_rss = self.proc.memory_info().rss
        self.peak = max(self.peak, self.end_rss)


def session(scheduler: Scheduler, request: GenerationRequest, policy: CapturePolicy, name: str,
            gate: threading.Barrier, out: Outcome) -> None:
    """One browser session: submit, then read every record (as a page streaming the answer does)."""
    kept = kept_for(scheduler.lm, policy, KEPT_GUESS + request.max_new_tokens)   # as a page's run keeps them
    gate.wait()
    out.submitted = time.perf_counter()
    try:
        handle = scheduler.submit(request, policy, session=name, kept=kept)
    except EngineError as err:
        out.refused = str(err)
        return
    try:
        for record in handle.records(poll=0.1):
            out.first = out.first or time.perf_counter()
            out.records += 1
            if getattr(record, "token", None) is not None:
                out.ids.append(record.token.id)
            if isinstance(record, DoneRecord):
                out.text, out.tokens = record.text, record.generated_tokens
    except Exception as err:  # noqa: BLE001 - reported, and it fails the run
        out.error = f"{type(err).__name__}: {err}"
    out.finished, out.started = time.perf_counter(), handle.started


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summarize(n: int, outcomes: list[Outcome], expected: dict[str, Reference], t0: float, mem: MemoryWatch,
              limits: Limits) -> dict:
    served = [o for o in outcomes if o.finished is not None and o.error is None]
    refused = [o for o in outcomes if o.refused]
    waits = [o.started - o.submitted for o in served]
    ttft = [o.first - o.submitted for o in served]
    done = [o.finished - o.submitted for o in served]
    makespan = max((o.finished for o in served), default=t0) - t0
    tokens = sum(o.tokens for o in served)
    verdicts = [expected[o.prompt].verdict(o.ids, o.text) for o in served]
    answers = [{"prompt": PROMPTS.index(o.prompt), "equal": o.ids == expected[o.prompt].ids,
                "first_diff": first_diff(o.ids, expected[o.prompt].ids), "verdict": v} for o, v in zip(served, verdicts)]
    return {
        "sessions": n, "max_queue": limits.max_queue, "max_batch": limits.max_batch, "served": len(served), "refused": len(refused),
        "errors": [o.error for o in outcomes if o.error], "lost": n - len(served) - len(refused),
        "refusal_messages": sorted({o.refused for o in refused}),
        "wrong_answers": verdicts.count("wrong"), "tie_divergences": verdicts.count("tie"),
        "equal_alone": sum(a["equal"] for a in answers), "answers": answers,
        "wait_p50_s": pct(waits, 0.5), "wait_p95_s": pct(waits, 0.95),
        "ttft_p50_s": pct(ttft, 0.5), "ttft_p95_s": pct(ttft, 0.95),
        "completion_p50_s": pct(done, 0.5), "completion_p95_s": pct(done, 0.95),
        "makespan_s": makespan, "tokens": tokens,
        "throughput_tok_s": tokens / makespan if makespan > 0 else None,
        "requests_per_min": 60 * len(served) / makespan if makespan > 0 else None,
        "rss_start_mb": mem.start_rss / 2**20, "rss_peak_mb": mem.peak / 2**20, "rss_end_mb": mem.end_rss / 2**20,
    }


def scenario(lm: LoadedModel, n: int, tokens: int, policy: CapturePolicy, limits: Limits,
             expected: dict[str, Reference]) -> dict:
    scheduler = Scheduler(lm, limits)
    requests = [GenerationRequest(PROMPTS[i % len(PROMPTS)], max_new_tokens=tokens) for i in range(n)]
    outcomes = [Outcome(r.prompt, 0.0) for r in requests]
    if cuda(lm.device):
        torch.cuda.synchronize(lm.device)
        torch.cuda.reset_peak_memory_stats(lm.device)
    with MemoryWatch() as mem:
        t0 = burst([lambda gate, r=r, o=o, i=i: session(scheduler, r, policy, f"user{i}", gate, o)
                    for i, (r, o) in enumerate(zip(requests, outcomes))])
    scheduler.close()
    result = summarize(n, outcomes, expected, t0, mem, limits)
    result.update(gpu_memory(lm, requests[:limits.max_batch], tokens))
    result["hooks_left"] = count_hooks(lm.model)
    return result


def gpu_memory(lm: LoadedModel, running: list[GenerationRequest], tokens: int) -> dict:
    """CUDA: the allocator's high-water marks during the burst beside the ledger's formula for the same moment,
    weights plus the K/V of one full batch at its longest (each prompt with its chat template, plus every new
    token). What the peak holds beyond that is workspace: activations, logits, the paged pool's spare blocks."""
    if not cuda(lm.device):
        return {}
    prompt_tokens = [len(lm.tokenizer.apply_chat_template([{"role": "user", "content": r.prompt}], tokenize=True,
                                                          add_generation_prompt=True, return_dict=True)["input_ids"])
                     for r in running]
    kv = sum(kv_cache_bytes(lm.spec, p + tokens, lm.dtype_name) for p in prompt_tokens)
    return {"gpu_peak_allocated_gb": torch.cuda.max_memory_allocated(lm.device) / 1e9,
            "gpu_peak_reserved_gb": torch.cuda.max_memory_reserved(lm.device) / 1e9,
            "ledger_weights_gb": weight_bytes(lm.spec, lm.dtype_name) / 1e9, "ledger_kv_gb": kv / 1e9}


def burst(sessions: list) -> float:
    """Run each `session(gate)` in a thread of its own, all released at one moment (the gate); wait for all of
    them. Returns that moment (perf_counter)."""
    gate = threading.Barrier(len(sessions) + 1)
    threads = [threading.Thread(target=s, args=(gate,)) for s in sessions]
    for t in threads:
        t.start()
    gate.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return t0


def first_diff(ids: list[int], reference: list[int]) -> int | None:
    """The index of the first token where an answer leaves the reference (its length when one is the other's
    start); None when they are equal."""
    if ids == reference:
        return None
    return next((i for i, (a, b) in enumerate(zip(ids, reference)) if a != b), min(len(ids), len(reference)))


def alone_against(expected: dict[str, Reference], path: Path, tokens: int) -> dict:
    """This device's answers alone against another device's (the file --alone-out wrote there, e.g. the CPU's in
    float32): per prompt equal or not, and the first token where it differs."""
    theirs = json.loads(path.read_text())
    longer = sorted(int(k) for k in theirs["alone"] if int(k) >= tokens)
    if not longer:
        raise SystemExit(f"{path} holds answers alone of {sorted(theirs['alone'])} tokens, none of {tokens} or more")
    ids = [i[:tokens] for i in theirs["alone"][str(longer[0])]]   # greedy: a shorter answer is a longer one's start
    answers = [{"prompt": i, "equal": expected[p].ids == ids[i], "first_diff": first_diff(expected[p].ids, ids[i])}
               for i, p in enumerate(PROMPTS)]
    return {"file": path.name, "their_machine": theirs.get("machine"), "tokens": tokens,
            "equal": sum(a["equal"] for a in answers), "of": len(answers), "answers": answers}


def references(lm: LoadedModel, tokens: int) -> dict[str, Reference]:
    """Each prompt's greedy answer when it runs alone: what every session must receive (or leave at a tie)."""
    out = {}
    for p in PROMPTS:
        records = list(generate(lm, GenerationRequest(p, max_new_tokens=tokens)))
        steps = [r.token for r in records if getattr(r, "token", None) is not None]
        out[p] = Reference(records[-1].text, [t.id for t in steps], [(t.logit_ids, t.logits) for t in steps],
                           torch.finfo(lm.dtype).eps)
    return out


def ok(result: dict, rss_bound_mb: float) -> bool:
    return (not result["errors"] and result["lost"] == 0 and result["wrong_answers"] == 0
            and result["hooks_left"] == 0 and result["rss_peak_mb"] - result["rss_start_mb"] < rss_bound_mb)


def machine(lm: LoadedModel) -> dict:
    info = {"model": lm.label, "device": str(lm.device), "dtype": lm.dtype_name, "torch_threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(), "platform": platform.platform(), "load_average": os.getloadavg()}
    if lm.device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(lm.device)
    return info


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--device")
    parser.add_argument("--dtype")
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 5, 10, 20, 30])
    parser.add_argument("--tokens", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--batch", type=int, help="the batched run's max_batch (default: the device's limit)")
    parser.add_argument("--capture", choices=sorted(CAPTURES), nargs="+", default=["full"],
                        help="one or more: each runs every scenario (the references are computed once)")
    parser.add_argument("--batched-only", action="store_true", help="leave out the one-at-a-time runs")
    parser.add_argument("--overload", type=int, default=30, help="one more burst this large against a short queue "
                                                                 "(0: skip)")
    parser.add_argument("--overload-queue", type=int, default=10)
    parser.add_argument("--rss-bound-mb", type=float, default=1024.0)
    parser.add_argument("--out", help="default: a new file under bench/results/load/")
    parser.add_argument("--alone-out", type=Path, help="write each prompt's answer alone (token ids) here, for "
                        "--alone-against on another device")
    parser.add_argument("--alone-against", type=Path, help="compare each prompt's answer alone with this file's "
                        "(--alone-out on another device): equal or not, first differing token")
    parser.add_argument("--alone-only", action="store_true", help="only the answers alone (with --alone-out or "
                        "--alone-against): no sessions")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = provenance.start("load", argv)
    lm = in_passing_thread(lambda: load_model(args.model, device=args.device, dtype=args.dtype))   # as the app does
    base = Limits.for_device(lm.device).with_env()
    batched = replace(base, max_batch=args.batch or base.max_batch, max_queue=max(base.max_queue, max(args.sessions)))
    single = replace(batched, max_batch=1)
    results, alone, against = [], {}, []
    for tokens in args.tokens:
        expected = in_passing_thread(lambda: references(lm, tokens))
        alone[str(tokens)] = [expected[p].ids for p in PROMPTS]
        if args.alone_against:
            against.append(alone_against(expected, args.alone_against, tokens))
            print(f"{tokens} tokens alone against {args.alone_against.name}: {against[-1]['equal']} of "
                  f"{against[-1]['of']} equal", flush=True)
        if args.alone_only:
            continue
        modes = (("batched", batched),) if args.batched_only else (("one at a time", single), ("batched", batched))
        runs = [(n, mode, limits) for n in args.sessions for mode, limits in modes]
        if args.overload:
            runs.append((args.overload, "batched, short queue", replace(batched, max_queue=args.overload_queue)))
        for capture in args.capture:
            for n, mode, limits in runs:
                result = scenario(lm, n, tokens, CAPTURES[capture], limits, expected)
                result.update(ok=ok(result, args.rss_bound_mb), mode=mode, tokens_per_request=tokens, capture=capture)
                results.append(result)
                print(line(result, limits), flush=True)
    report = {"what": "N sessions submit at once through engine.serving.scheduler; greedy, chat template, "
                      f"capture {', '.join(args.capture)}; one at a time and batched side by side",
              "machine": machine(lm), "capture": args.capture if len(args.capture) > 1 else args.capture[0],
              "units": {"rss_start_mb, rss_peak_mb, rss_end_mb": "MiB (2**20 bytes)"},
              "limits": batched.to_dict(), "scenarios": results, "batch_graphs": graphs_report(lm),
              "ratios": ratios(results), "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    if args.alone_out:
        provenance.start("load-alone", argv, measure_bandwidth=False).save(
            {"machine": machine(lm), "prompts": PROMPTS, "alone": alone}, out=args.alone_out)
    if args.alone_against:
        report["alone_against"] = against
    run.save(report, out=args.out)
    for r in report["ratios"]:
        print(f"N={r['sessions']:3d} {r['tokens']:3d} tokens, capture {r['capture']}: p95 completion batched / one at a time "
              f"{r['completion_p95_ratio']:.2f}, total tok/s {r['throughput_ratio']:.2f}x")
    return 0 if all(r["ok"] for r in results) and all(a["equal"] == a["of"] for a in against) else 1


def line(result: dict, limits: Limits) -> str:
    r = {k: ("–" if v is None else f"{v:.2f}") for k, v in result.items() if k.endswith("_s")}   # None: none served
    return (f"N={result['sessions']:3d} {result['tokens_per_request']:3d} tok {result['capture']:>4} "
            f"{result['mode']:>20}: "
            f"served {result['served']:3d} refused {result['refused']:3d} lost {result['lost']}  "
            f"{ties(result)}wait p50/p95 {r['wait_p50_s']}/{r['wait_p95_s']} s  ttft p95 {r['ttft_p95_s']} s  "
            f"done p50/p95 {r['completion_p50_s']}/{r['completion_p95_s']} s  "
            f"{result['throughput_tok_s'] or 0:.1f} tok/s  peak RSS {result['rss_peak_mb']:.0f} MiB{gpu_line(result)}  "
            f"{'ok' if result['ok'] else 'FAILED'}{first_error(result)}")


def ties(result: dict) -> str:
    wrong, tied = result.get("wrong_answers", 0), result.get("tie_divergences", 0)
    return (f"wrong {wrong} " if wrong else "") + (f"left at a tie {tied}  " if tied else "")


def first_error(result: dict) -> str:
    return f"\n    first error: {result['errors'][0]}" if result["errors"] else ""


def graphs_report(lm: LoadedModel) -> dict | None:
    """Whether the batched steps ran as CUDA graphs (engine/serving/graphed.py), on which shapes, on what pool."""
    graphs = lm.batch_graphs
    if graphs is None:
        return None
    pool = sum(t.numel() * t.element_size() for t in (*graphs.pool.keys, *graphs.pool.values))
    return {"mode": graphs.mode, "error": graphs.error, "shapes": sorted(graphs.shapes), "pool_gb": pool / 1e9,
            "warmed": graphs.warmed, "cudagraph_counts": cudagraph_counts()}


def gpu_line(result: dict) -> str:
    if "gpu_peak_allocated_gb" not in result:
        return ""
    return (f"  GPU peak {result['gpu_peak_allocated_gb']:.2f} GB allocated / {result['gpu_peak_reserved_gb']:.2f} "
            f"reserved, ledger {result['ledger_weights_gb']:.2f} + KV {result['ledger_kv_gb']:.3f} GB")


def ratios(results: list[dict]) -> list[dict]:
    """Batched against one at a time, per N and token count, from the same run."""
    pairs = {}
    for r in results:
        pairs.setdefault((r["sessions"], r["tokens_per_request"], r["capture"]), {})[r["mode"]] = r
    out = []
    for (n, tokens, capture), modes in sorted(pairs.items()):
        one, many = modes.get("one at a time"), modes.get("batched")
        if one and many and one["completion_p95_s"] and one["throughput_tok_s"]:
            out.append({"sessions": n, "tokens": tokens, "capture": capture,
                        "completion_p95_ratio": many["completion_p95_s"] / one["completion_p95_s"],
                        "throughput_ratio": many["throughput_tok_s"] / one["throughput_tok_s"]})
    return out


if __name__ == "__main__":
    sys.exit(main())
