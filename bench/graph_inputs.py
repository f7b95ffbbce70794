"""The graphed decode step's host work per step on this CPU, before and after its static inputs (issue 50), side by
side in one run, beside the eager routes the CPU serves with.

    .venv/bin/python bench/graph_inputs.py                    # the tiny Llama-shaped model, 3 rounds of 64 tokens
    .venv/bin/python bench/graph_inputs.py --model default    # SmolLM2 (its products weigh more than the host)

Before is the code of commit 5ce1c6b, kept below (`Before`): each step `PagedBatch.plan` builds the step's index
tensors on the host and copies them, ids, positions and the mask are new tensors, and the compiled function is
handed the batch's bound `write_and_gather` (dynamo guards the batch and its attributes). After is
engine/serving/graphed.py as it is now: one index buffer per shape, made once, filled in place from numpy
(`PagedBatch.plan_into`), the compiled function of that one tensor. Each graphed way runs uncompiled ("off", what
the function costs) and through dynamo with its eager backend ("eager": the same plus dynamo's guards and frame,
what a GPU's compiled step pays on the host before inductor's code runs). The eager routes (no graphs: the one-row
step with its own products for a request alone, the packed rows for the room) are the CPU's own and did not change;
they run as the control.

Two measurements, the ways taking turns in a rotated order each round:
- **the forward alone** ("forward"): one decode step's forward (graphed: `GraphedDecode.forward`, its plan, the
  hand-over to the graphs' thread and the step; eager: `LeanDecode.decode`) called again and again on a batch held
  still (1 row, or 8 rows, of 30 to 79 positions; the same K/V slot rewritten), the process's CPU time per call
  (all its threads; the least of 3 repeats of 100 calls, microseconds): the least noisy figure a shared machine
  gives; before and after back to back (which first alternating by round), and per round the ratio after / before;
- **end to end** ("runs"): a request alone (64 new tokens) and a room of 8 (16 each) through
  engine.serving.batch.BatchRunner (max_batch 8, the graphs' row buckets 1 and 8, keys padded to 256); per decode
  step the forward (`BatchRunner._batch_forward`) and the whole runner step, medians over the steps after each
  run's third; every way's tokens must equal the eager route's (the file says whether they did).
Other processes share the 2 cores: compare within this run only.
Writes a new bench/results/graph_inputs/<UTC time>-<commit>.json (bench/provenance.py).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")        # before torch loads OpenMP: as the server runs
ROOT = Path(__file__).resolve().parent.parent
SKIP = 3                                                     # decode steps left out at each run's start
CALLS = 100                                                  # forward calls per repeat (the fastest of 3 repeats)


def before_class():
    """The graphed step as 5ce1c6b ran it (its forward, replay and warm-up), over the same pool and forward."""
    import torch  # noqa: F401 - after provenance (main): its bandwidth is measured before torch loads

    from engine.core.lean import causal_mask
    from engine.serving.graphed import GraphedDecode
    from engine.serving.lean import step
    from engine.serving.paged import NULL, SCRATCH, PagedBatch

    class Before(GraphedDecode):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.step = step if self.mode == "off" else torch.compile(step, fullgraph=True, dynamic=False,
                                                                      backend="eager")

        def forward(self, batch, shape):
            ids, positions = [s.token.id for s in batch.slots], [s.length for s in batch.slots]
            rows, width = shape
            device, n = self.lm.device, len(ids)
            mask = causal_mask(batch.plan([1] * n, rows, width), 1)                          # [R, 1, 1, W]
            ids_t = torch.tensor(ids + ids[:1] * (rows - n), device=device)[:, None]
            pos_t = torch.tensor(positions + [0] * (rows - n), device=device)[:, None]
            self.shapes.add(shape)
            resid_slots = batch.residual_slots if self.pool.resid is not None else None
            return self.on_own_thread(self._replay, ids_t, pos_t, batch.write_and_gather, mask, resid_slots)[:n, -1]

        def _replay(self, ids, positions, write_and_gather, mask, resid_slots):
            with torch.no_grad():
                return self.step(self.lean, ids, positions, write_and_gather, mask, self.pool.resid, resid_slots)

        def warm_up(self, widths=(256,)):
            batch, device = PagedBatch(pool=self.pool), self.lm.device
            for width in widths:
                for rows in self.rows:
                    batch._gather = torch.full((rows, width), NULL, device=device)
                    batch._write = torch.full((rows, 1), SCRATCH, device=device)
                    batch._resid_write = torch.full((rows,), SCRATCH, device=device)
                    mask = causal_mask(torch.zeros(rows, width, dtype=torch.bool, device=device), 1)
                    zeros = torch.zeros(rows, 1, dtype=torch.long, device=device)
                    for _ in range(3):
                        self.on_own_thread(self._replay, zeros, zeros, batch.write_and_gather, mask,
                                           batch._resid_write if self.pool.resid is not None else None)
            self.warmed = True
            return 0.0
    return Before


def timed_run(lm, graphs, requests) -> dict:
    """The requests through one runner (all joining at once); per decode step the forward's and the step's time."""
    from engine.core.generate import admit
    from engine.core.hooks import CAPTURE_OFF
    from engine.serving.batch import BatchRunner, Slot

    runner = BatchRunner(lm, max_batch=8, graphs=graphs)
    inner, forward = runner._batch_forward, []

    def timed(slots):
        start = time.perf_counter()
        out = inner(slots)
        forward.append(time.perf_counter() - start)
        return out
    runner._batch_forward = timed
    records, steps = [[] for _ in requests], []
    for request, sink in zip(requests, records):
        runner.add(Slot(request, admit(lm, request), CAPTURE_OFF, sink.append, print))
    runner.step()                                          # the prefill (and its first decode step)
    forward.clear()
    while not runner.idle:
        start = time.perf_counter()
        runner.step()
        steps.append(time.perf_counter() - start)
    return {"forward_ms": statistics.median(forward[SKIP:]) * 1e3, "step_ms": statistics.median(steps[SKIP:]) * 1e3,
            "steps": len(steps), "tokens": [[r.token.id for r in rs if hasattr(r, "token")] for rs in records]}


def still_batch(lm, graphs, rows: int):
    """A batch of `rows` stand-in requests of 30, 37, ... positions on the graphs' pool (or a pool of its own), their
    blocks held: a decode step of it rewrites the same slots however often it runs."""
    from types import SimpleNamespace

    from engine.serving.paged import BlockPool, PagedBatch

    class Row(SimpleNamespace):
        __hash__ = object.__hash__             # a slot is a key of the batch's tables

    spec = lm.spec
    batch = graphs.new_batch() if graphs is not None else PagedBatch(
        pool=BlockPool(spec.n_layers, spec.n_kv_heads, spec.head_dim, lm.dtype, lm.device))
    for i in range(rows):
        slot = Row(length=30 + 7 * i, token=SimpleNamespace(id=5 + i), kept=None)
        batch.tables[slot] = [batch.pool.allocate() for _ in range(-(-(slot.length + 1) // batch.block))]
        batch.join(slot)
    return batch


def forward_us(lm, graphs, batch, lean) -> float:
    """The least of 3 repeats of CALLS calls of one decode step's forward on `batch`: the process's CPU time per
    call, microseconds (every thread's: the graphs' own included; time the process waited for the cores, which
    other processes share, left out)."""
    import timeit
    if graphs is not None:
        shape = graphs.fits(batch)
        call = lambda: graphs.forward(batch, shape)          # noqa: E731
    else:
        call = lambda: lean.decode(batch, list(batch.slots))  # noqa: E731
    call()
    return min(timeit.repeat(call, number=CALLS, repeat=3, timer=time.process_time)) / CALLS * 1e6


def ways(lm) -> dict:
    """name -> graphs (None: the eager routes), each made and warmed once."""
    from engine.serving.graphed import GraphedDecode
    Before = before_class()
    made = {"eager routes (no graphs)": None}
    for mode in ("off", "eager"):
        for label, cls in (("before", Before), ("after", GraphedDecode)):
            graphs = cls(lm, 64, mode, max_rows=8, row_buckets=(1,))
            graphs.warm_up((256,))
            made[f"graphed {label}, {mode}"] = graphs
    return made


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny", help="'tiny' (the tiny Llama-shaped checkpoint) or a loader name")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--new", type=int, default=64, help="new tokens of the lone request (the room's: a quarter)")
    p.add_argument("--out", help="default: a new file under bench/results/graph_inputs/")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    from bench import provenance  # after the project root is on sys.path (run as a script)

    run = provenance.start("graph_inputs")
    import torch  # noqa: F401 - after provenance: its bandwidth is measured before the model loads
    from engine.core.generate import GenerationRequest
    from engine.core.loader import cache_dir, load_model
    from engine.models.shaped import write_shaped

    name = str(write_shaped("tiny", cache_dir() / "shaped")) if args.model == "tiny" else args.model
    lm = load_model(name, device="cpu", dtype="float32")
    words = "the sky is blue because light scatters in the air".split()
    lone = [GenerationRequest(" ".join(words * 2), max_new_tokens=args.new, temperature=0.0, chat=False)]
    room = [GenerationRequest(" ".join(words[i:] + words[:i]), max_new_tokens=max(args.new // 4, 8), temperature=0.0,
                              chat=False) for i in range(8)]
    made = ways(lm)
    names = list(made)
    for graphs in made.values():                        # warm: packing, first allocations, the first-step recompiles
        timed_run(lm, graphs, lone), timed_run(lm, graphs, room)
    report = {"what": __doc__.split("\n\n")[0], "model": name,
              "new_tokens": {"lone": args.new, "room": room[0].max_new_tokens}, "room_rows": len(room),
              "skip_first_steps": SKIP, "forward_calls": CALLS, "ways": {}, "machine_shared": True}
    from engine.serving.lean import LeanDecode
    lean = LeanDecode.for_model(lm)
    still = {n: {r: still_batch(lm, made[n], r) for r in (1, 8)} for n in names}
    fwd = {n: {"lone": [], "room": []} for n in names}
    for r in range(args.rounds):
        for what, rows in (("lone", 1), ("room", 8)):
            fwd[names[0]][what].append(forward_us(lm, None, still[names[0]][rows], lean))
            for mode in ("off", "eager"):              # before and after back to back, which first alternating
                pair = [f"graphed before, {mode}", f"graphed after, {mode}"][::1 if r % 2 == 0 else -1]
                for n in pair:
                    fwd[n][what].append(forward_us(lm, made[n], still[n][rows], lean))
        print(f"round {r + 1} forward alone, lone/room us: " + ", ".join(
            f"{n}: {fwd[n]['lone'][-1]:.0f}/{fwd[n]['room'][-1]:.0f}" for n in names), flush=True)
    seen = {n: {"lone": [], "room": []} for n in names}
    for r in range(args.rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            for what, requests in (("lone", lone), ("room", room)):
                seen[n][what].append(timed_run(lm, made[n], requests))
            print(f"round {r + 1} {n}: lone forward {seen[n]['lone'][-1]['forward_ms']:.2f} ms, room forward "
                  f"{seen[n]['room'][-1]['forward_ms']:.2f} ms", flush=True)
    reference = {what: seen[names[0]][what][0]["tokens"] for what in ("lone", "room")}
    for n in names:
        report["ways"][n] = {what: {"forward_ms": statistics.median(x["forward_ms"] for x in rows),
                                    "step_ms": statistics.median(x["step_ms"] for x in rows),
                                    "rounds": [{k: v for k, v in x.items() if k != "tokens"} for x in rows],
                                    "same_tokens_as_eager": all(x["tokens"] == reference[what] for x in rows)}
                             for what, rows in seen[n].items()}
    report["forward_us"] = {n: {what: {"median": statistics.median(v), "rounds": v} for what, v in rows.items()}
                            for n, rows in fwd.items()}
    report["forward_after_over_before"] = {
        mode: {what: statistics.median(a / b for a, b in zip(fwd[f"graphed after, {mode}"][what],
                                                            fwd[f"graphed before, {mode}"][what]))
               for what in ("lone", "room")} for mode in ("off", "eager")}
    report["runs_after_over_before"] = {
        mode: {what: {k: report["ways"][f"graphed after, {mode}"][what][k]
                      / report["ways"][f"graphed before, {mode}"][what][k] for k in ("forward_ms", "step_ms")}
               for what in ("lone", "room")} for mode in ("off", "eager")}
    for n, row in report["ways"].items():
        print(f"{n:28} lone: forward {row['lone']['forward_ms']:6.2f} ms, step {row['lone']['step_ms']:6.2f} ms; "
              f"room: forward {row['room']['forward_ms']:6.2f} ms, step {row['room']['step_ms']:6.2f} ms; same tokens "
              f"{row['lone']['same_tokens_as_eager'] and row['room']['same_tokens_as_eager']}")
    for n, row in report["forward_us"].items():
        print(f"{n:28} forward alone: lone {row['lone']['median']:7.0f} us, room {row['room']['median']:7.0f} us")
    print("forward alone, after / before (median of the rounds' ratios):", report["forward_after_over_before"])
    print("runs, after / before:", report["runs_after_over_before"])
    run.save(report, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
