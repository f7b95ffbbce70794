"""What a lone request paid for the server's housekeeping, side by side in one process (issue 54): a new K/V pool at
each request against the kept one, and the garbage collector's full passes over the start-up heap against a frozen
heap.

    python bench/idle_costs.py                    # SmolLM2 float32, two torch threads
    python bench/idle_costs.py --rounds 9 --answers 20

Two measurements, in one process with the server's OpenMP wait (engine.launch.OPENMP_WAIT), the model loaded in a
passing thread and every step in a worker thread of its own, as the scheduler runs them:
- **the pool**: a lone prompt of about 16 tokens with the pages' capture (every hidden state kept), its first step
  (the prefill and its token) timed around `BatchRunner.step`, the batch's pool either dropped when the batch is idle
  (as `PagedBatch` does: the next request makes a new one, 46 MB of K/V and 73 MB of residual, zeroed) or kept (its
  `_maybe_empty` skipped), the two ways taking turns request by request; medians of `--rounds` each;
- **the heap**: `--answers` greedy answers of 96 tokens, their records kept (as the run store keeps them), first with
  the start-up heap as the garbage collector found it, then after `engine.service.service.freeze_heap` (as a server
  does once warmed up): every collection timed (`gc.callbacks`) by generation, the longest pause, and the steps' wall
  time.
Writes a new bench/results/idle_costs/<UTC time>-<commit>.json (bench/provenance.py); docs/serving.md, "One person
alone behind the server", reads it.
"""
from __future__ import annotations

import argparse
import gc
import queue
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.provenance import server_wait  # noqa: E402 (torch-free)

server_wait()                        # before torch loads OpenMP: its threads wait as the server's do

from bench import provenance  # noqa: E402

WORDS = "the quick brown fox jumps over a lazy dog while the sky is blue and grass is green".split()


def worker():
    """call(fn, *args): fn(*args) in one long-lived worker thread (the scheduler's way: one thread with an OpenMP
    team, however many calls), its result or exception here."""
    jobs: queue.Queue = queue.Queue()
    out: queue.Queue = queue.Queue()

    def work() -> None:
        while True:
            job = jobs.get()
            try:
                out.put((True, job()))
            except Exception as err:  # noqa: BLE001 - raised again in the caller
                out.put((False, err))

    threading.Thread(target=work, name="bench-steps", daemon=True).start()

    def call(fn, *args):
        jobs.put(lambda: fn(*args))
        ok, value = out.get()
        if not ok:
            raise value
        return value
    return call


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--answers", type=int, default=10)
    parser.add_argument("--out", help="default: a new file under bench/results/idle_costs/")
    args = parser.parse_args(argv)
    record = provenance.start("idle_costs", argv)
    from engine.core.generate import GenerationRequest, admit
    from engine.core.hooks import CAPTURE_OFF, CapturePolicy
    from engine.core.loader import load_model
    from engine.core.openmp import in_passing_thread
    from engine.service.service import freeze_heap
    from engine.serving import paged
    from engine.serving.batch import BatchRunner, Slot

    lm = in_passing_thread(lambda: load_model("default", device="cpu", dtype="float32"))
    runner: list[BatchRunner] = []

    drop = paged.PagedBatch._maybe_empty

    def first_step(keep_pool: bool) -> float:
        """A lone short prompt with the pages' capture: its first step (ms); the pool kept or dropped after."""
        if not runner:
            runner.append(BatchRunner(lm, max_batch=32))
        paged.PagedBatch._maybe_empty = (lambda batch: None) if keep_pool else drop
        request = GenerationRequest(" ".join(WORDS[:14]), max_new_tokens=2, temperature=0.0, chat=False)
        slot = Slot(request, admit(lm, request), CapturePolicy(), lambda record: None, lambda err: None)
        runner[0].add(slot)
        t = time.perf_counter()
        runner[0].step()
        seconds = time.perf_counter() - t
        while not runner[0].idle:
            runner[0].step()
        paged.PagedBatch._maybe_empty = drop
        return 1e3 * seconds

    def answers(n: int) -> dict:
        """n greedy answers of 96 tokens: the collector's passes by generation, and the steps' wall time."""
        spent: dict[int, list[float]] = {0: [], 1: [], 2: []}
        start: list[float] = []

        def timed(phase: str, info: dict) -> None:
            if phase == "start":
                start.append(time.perf_counter())
            else:
                spent[info["generation"]].append(1e3 * (time.perf_counter() - start.pop()))

        steps: list[float] = []
        kept: list = []                                                 # every record, as the run store keeps them
        gc.callbacks.append(timed)
        try:
            for i in range(n):
                request = GenerationRequest(f"Write a long story about animal number {i}.", max_new_tokens=96,
                                            temperature=0.0)
                runner[0].add(Slot(request, admit(lm, request), CAPTURE_OFF, kept.append, lambda err: None))
                while not runner[0].idle:
                    t = time.perf_counter()
                    runner[0].step()
                    steps.append(1e3 * (time.perf_counter() - t))
        finally:
            gc.callbacks.remove(timed)
        return {"collections": {g: len(v) for g, v in spent.items()},
                "ms_by_generation": {g: sum(v) for g, v in spent.items()},
                "longest_pause_ms": max((x for v in spent.values() for x in v), default=0.0),
                "gc_ms_per_token": sum(map(sum, spent.values())) / max(len(steps), 1),
                "steps": len(steps), "step_ms_median": statistics.median(steps), "step_ms_max": max(steps)}

    call = worker()
    for keep in (True, False, True, False):                            # warm both ways
        call(first_step, keep)
    pool = {"kept": [], "new": []}
    for r in range(args.rounds):
        for keep in ((True, False) if r % 2 == 0 else (False, True)):
            pool["kept" if keep else "new"].append(call(first_step, keep))
    pool_table = {k: statistics.median(v) for k, v in pool.items()}
    print("first step, pages' capture: " + ", ".join(f"{k} pool {v:.1f} ms" for k, v in pool_table.items()),
          flush=True)
    heap = {"as found": call(answers, args.answers)}
    heap["objects_frozen"] = freeze_heap()
    heap["frozen"] = call(answers, args.answers)
    gc.unfreeze()
    for name in ("as found", "frozen"):
        h = heap[name]
        print(f"heap {name}: collections {h['collections']}, longest pause {h['longest_pause_ms']:.1f} ms, "
              f"{h['gc_ms_per_token']:.3f} ms a token, steps median {h['step_ms_median']:.2f} ms", flush=True)
    record.save({"rounds": args.rounds, "answers": args.answers, "pool_first_step_ms": pool_table,
                 "pool_rounds_ms": pool, "heap": heap}, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
