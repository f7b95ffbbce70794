"""The host's check before each graphed step (dynamo's guards), with a guard on every weight and without, side by
side in one run, at 2 layers and at Llama 3.1 8B's 32 (issue 50).

    .venv/bin/python bench/step_guards.py                  # tiny Llama-shaped checkpoints of 2 and 32 layers
    .venv/bin/python bench/step_guards.py --layers 2 16 32 --calls 5000

Before each call of a compiled function, dynamo checks that what it traced still holds (its guards); on a GPU this
runs on the host before every replay of the graphed step (engine/serving/graphed.py), and the step's guards held one
tensor check per weight the forward closes over. Each layer count gets a checkpoint of its own (engine.models.shaped:
the tiny shape's widths, that many layers, float32, random weights), and the step is compiled both ways with dynamo's
eager backend at one width (the guards do not depend on the backend): "every weight guarded" (the filter keeps every
guard, as torch.compile does by default) and "weights unguarded" (engine.serving.graphed.unguarded_weights, as the
step is now compiled). Per way: the guards (each guard line of the one-row graph's guard tree, and its tensor
matches) and the time of its check (the guard manager's `check` on the step's own arguments, the least of 3 repeats
of `--calls` calls, microseconds). The ways take turns. Writes a new bench/results/step_guards/<UTC time>-<commit>.json
(bench/provenance.py); docs/engine.md, "The graphed step's guards", reads it.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))                # the project's `engine` ahead of this folder's engine.py

from bench import provenance  # noqa: E402

WAYS = ("every weight guarded", "weights unguarded")


def checkpoint(layers: int) -> Path:
    """The tiny Llama shape with `layers` layers, written once under the cache (float32: a CPU's)."""
    import torch

    from engine.core.loader import cache_dir
    from engine.models import shaped
    key = f"tiny-{layers}-layers"
    shaped.SHAPES.setdefault(key, dataclasses.replace(shaped.SHAPES["tiny"], key=key, n_layers=layers,
                                                      label=f"tiny-{layers}-layers-Llama-shaped"))
    return shaped.write_shaped(key, cache_dir() / "shaped", dtype=torch.float32)


def compiled(lm, way: str):
    """The graphed step compiled (dynamo's eager backend, warmed at one width) with `way`'s guard filter. Both ways'
    graphs are entries of one code object's cache (the step's), each guarded by its own pool and buffer."""
    from engine.serving import graphed
    keep_all = way == "every weight guarded"
    filter_fn = graphed.unguarded_weights
    if keep_all:
        graphed.unguarded_weights = lambda entries: [True] * len(entries)      # torch.compile's default
    try:
        graphs = graphed.GraphedDecode(lm, 64, "eager", max_rows=8, row_buckets=(1,))
        graphs.warm_up((graphed.MIN_WIDTH,))
    finally:
        graphed.unguarded_weights = filter_fn
    return graphs


def one_row_guards(graphs):
    """(the guard manager of the one-row graph, the step's arguments as its frame holds them)."""
    import torch
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    from engine.serving.graphed import MIN_WIDTH
    fn = graphs.step._torchdynamo_orig_callable
    frame = {"index": graphs.inputs_for((1, MIN_WIDTH)).index,
             **{name: cell.cell_contents for name, cell in zip(fn.__code__.co_freevars, fn.__closure__)}}
    with torch.no_grad():                  # as the step is called (a guard checks the grad mode)
        for entry in _debug_get_cache_entry_list(fn):
            if entry.guard_manager.check(frame):
                return entry.guard_manager, frame
    raise RuntimeError("no compiled graph of one row passes its guards")


def check_us(manager, frame, calls: int) -> float:
    import torch
    with torch.no_grad():
        assert manager.check(frame)        # timed on the frame it passes, every guard checked
        return min(timeit.repeat(lambda: manager.check(frame), number=calls, repeat=3)) / calls * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, nargs="+", default=[2, 32])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--out", help="default: a new file under bench/results/step_guards/")
    args = p.parse_args(argv)
    run = provenance.start("step_guards", argv)
    import torch

    from engine.core.loader import load_model
    report = {"what": __doc__.split("\n\n")[0], "calls": args.calls, "rounds": args.rounds, "layers": {}}
    for layers in args.layers:
        lm = load_model(str(checkpoint(layers)), device="cpu", dtype="float32")
        torch._dynamo.reset()
        made = {way: one_row_guards(compiled(lm, way)) for way in WAYS}
        times = {way: [] for way in WAYS}
        for r in range(args.rounds):
            for way in WAYS[r % 2:] + WAYS[:r % 2]:
                times[way].append(check_us(*made[way], args.calls))
        row = {}
        for way, (manager, _) in made.items():
            text = str(manager)
            row[way] = {"check_us": min(times[way]), "rounds_us": times[way],
                        "guards": sum("+- " in line and "GuardManager" not in line for line in text.splitlines()),
                        "tensor_matches": text.count("TENSOR_MATCH"),
                        "weight_guards": text.count("L['lean'].layers") + text.count("L['lean'].head[")}
        row["unguarded_over_guarded"] = row[WAYS[1]]["check_us"] / row[WAYS[0]]["check_us"]
        report["layers"][str(layers)] = row
        print(f"{layers} layers: " + "; ".join(f"{way} {row[way]['check_us']:.1f} us ({row[way]['guards']} guards, "
                                              f"{row[way]['tensor_matches']} tensor matches)" for way in WAYS)
              + f"; {row['unguarded_over_guarded']:.2f}x", flush=True)
    print(run.save(report, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
