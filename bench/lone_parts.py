"""Where a lone request's decode step spends its time, part by part, with the memory floor measured in the same run.

    python bench/lone_parts.py                    # SmolLM2, two torch threads, 3 rounds of 64 tokens
    python bench/lone_parts.py --threads 1 --rounds 5

One request at a time through the batch runner (engine.serving.batch), as the scheduler runs a lone request
(LeanDecode.lone), with every part of the step wrapped by a clock that adds up its wall time within the step: each
kind of weight product (q, k, v, o, gate, up, down, the head), the norms, the rotary table (cos/sin of the position)
and its application to q and k, attention, the cache's writes and reads (`kv`), the embedding, the SiLU; the forward
less all of those is "the rest of the forward" (residual adds, views, the gated product, Python); the runner's step
less the forward is the host's work: picking and describing the token (`pick_tokens`), the logits' running sha256
(`hash_rows`, only for a request that asks for it), and the rest (the record, the cache's bookkeeping). A
part's clock is a wall clock (about 0.1 us a read, about 1,500 calls a step); the step and the forward also read
the thread's CPU clock. Per part, the median over the steps of each round, then the median over rounds. Before the
parts, the same rounds with nothing instrumented give each way's whole step (wall and CPU), the ways again in turn
step by step: the before/after of a change is read there. The floor is the weights' bytes over the machine's read bandwidth (bench/lone_step.py's
`floor`). Also the operators a step dispatches (torch.profiler, one step, nested calls counted once).
`--way` picks the lone step's kernels (`WAYS`, LeanDecode's attributes; "now": as it runs) and may be given several times: the ways
alternate step by step within each request (a round), in one process. Writes a new bench/results/lone_parts/<UTC time>-<commit>.json
(bench/provenance.py). docs/engine.md, "A lone request", reads it.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from bench import provenance  # noqa: E402
from bench.lone_step import PROMPT, floor  # noqa: E402
from engine.core import lean as lean_module  # noqa: E402
from engine.core.generate import GenerationRequest, encode_prompt  # noqa: E402
from engine.core.hooks import CAPTURE_OFF  # noqa: E402
from engine.core.loader import load_model  # noqa: E402
from engine.core import generate, kernels, matvec  # noqa: E402
from engine.core.kernels import glue  # noqa: E402
from engine.core.lone import LonePlan  # noqa: E402
from engine.serving import batch as batch_module  # noqa: E402
from engine.serving.batch import BatchRunner, Slot  # noqa: E402

ORDER = ("q", "k", "v", "o", "gate", "up", "down", "qkv", "gate_up", "head", "layer to attention (C)",
         "layer from attention (C)", "norms", "rotary table", "rotary",
         "attention", "kv", "embedding", "silu", "rest of the forward", "forward", "host", "host: pick and describe",
         "host: logits sha256", "host: the rest", "step")


def one_query(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
              scaling: float) -> torch.Tensor:
    """A lone row's attention without SDPA's generic path, tried against it (the `one-query` way): the G = H / KVH
    query heads of each key head as G rows of one matrix, two batched products over the key heads and a softmax
    between them, the keys read where the pool keeps them. q [1, H, 1, D], keys/values [1, KVH, S, D] -> [1, H, 1, D];
    anything else goes to SDPA."""
    b, heads, t, d = q.shape
    kv_heads = keys.shape[1]
    if b != 1 or t != 1 or mask is not None or heads % kv_heads:
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=mask is None and t > 1,
                                              scale=scaling, enable_gqa=heads != kv_heads)
    grouped = q.reshape(kv_heads, heads // kv_heads, d)                             # [KVH, G, D]
    scores = torch.bmm(grouped, keys[0].transpose(1, 2)).mul_(scaling)           # [KVH, G, S]
    return torch.bmm(scores.softmax(-1), values[0]).view(1, heads, 1, d)         # [1, H, 1, D]


# a lone step's kernels, as LeanDecode's attributes ("attention": handed to the forward by `instrument`)
# "compiled": the one-token forward through torch.compile(dynamic=True), timed bare only (its clocks would break
# the graph); its first step, the compilation, is recorded apart
# "parts-N": every split product in N blocks of output rows (engine.core.matvec.PARTS; the weights' rows must divide)
# "split": the row kernel off (engine.core.kernels.use): torch's split products, the lone step before the kernel
# "torch-glue": glue.c off (engine.core.kernels.glue.GLUE.use): the norms, rotary and SiLU in torch's operators
#   (and so no LonePlan: its layers are glue.c's)
# "unplanned": the lone step's layers op by op through the forward (LeanDecode.plan_layers off), not LonePlan's two
#   C calls a layer (whose products, norms, rotary and SiLU are clocked as the two calls they are inside)
# "sdpa": a lone row's attention through SDPA (LeanDecode.attention None), not attend.c
# "no-pick": the token picked and described by torch's operators (generate.PICK_IN_C off), not glue.c's pick_row
# "attention-alone": LonePlan's attention on the step's own thread (LeanDecode.attend_threads 1), not dealt by kv head
#   to torch's team
# "ends-apart": a lone token's embedding, rotary table, final norm and head made from Python around LonePlan's layers
#   (LeanDecode.ends_in_c off), not in the same C call (LonePlan.token)
WAYS = {"now": {}, "attention-alone": {"attend_threads": 1}, "ends-apart": {"ends_in_c": False}, "apart": {"side_by_side": None}, "split": {"kernel": False}, "one-query": {"attention": one_query},
        "f.linear": {"linear": F.linear}, "compiled": {"compiled": True}, "torch-glue": {"glue": False},
        "unplanned": {"plan_layers": False}, "sdpa": {"attention": None}, "no-pick": {"pick": False},
        **{f"parts-{n}": {"parts": n} for n in (2, 8, 16)}}
PRODUCTS = ("q", "k", "v", "o", "gate", "up", "down", "qkv", "gate_up", "head")


class Clocks:
    """Wall seconds per part and thread CPU seconds of the whole step and forward, added up within the current step.
    Only the step and the forward read the thread's CPU clock: on this machine a read of it costs microseconds,
    which a part's clock, read about 1,500 times a step, would add to the step many times over."""

    def __init__(self):
        self.now: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)

    def clear(self) -> None:
        self.now.clear()
        self.cpu.clear()

    def wrap(self, name, fn, cpu: bool = False):
        """fn, its wall time (and with `cpu`, its thread's CPU time) added to part `name` (or to the part a function
        of the call's arguments names)."""
        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.now[name(*args) if callable(name) else name] += time.perf_counter() - t

        def timed_cpu(*args, **kwargs):
            c = time.thread_time()
            try:
                return timed(*args, **kwargs)
            finally:
                self.cpu[name] += time.thread_time() - c
        return timed_cpu if cpu else timed


def weight_names(step) -> dict[int, str]:
    """id of each weight tensor -> its kind (q ... down, head)."""
    names = {id(step.head[0]): "head"}
    for w in step.layers:
        names.update({id(getattr(w, k)[0]): k for k in ("q", "k", "v", "o", "gate", "up", "down")})
    return names


GLUE = tuple((cls, name) for cls in (lean_module.TorchGlue, lean_module.CGlue) for name in ("norm", "rotate", "gated")
             if name in vars(cls))          # the work around the products, in torch's operators or in C
PLAN = {"before": "layer to attention (C)", "after": "layer from attention (C)"}     # LonePlan's two calls a layer
GLOBALS = (*GLUE, *((LonePlan, name) for name in PLAN), (F, "scaled_dot_product_attention"), (F, "embedding"), (batch_module, "pick_tokens"),
           (batch_module, "hash_rows"))
HOST = {"pick_tokens": "host: pick and describe", "hash_rows": "host: logits sha256"}


def instrument(runner: BatchRunner, clocks: Clocks):
    """Wrap every part of the lone step (module globals, the step's own attributes, the forward's arguments);
    returns what puts the module globals back (the runner's own wrappers go with it)."""
    step = runner.lean.lean
    names = weight_names(step)
    originals = [(module, name, vars(module)[name]) for module, name in GLOBALS]
    for name, part in PLAN.items():
        setattr(LonePlan, name, clocks.wrap(part, vars(LonePlan)[name]))
    for cls in (lean_module.TorchGlue, lean_module.CGlue):        # the glue's own (C or torch's operators)
        for name, part in (("norm", "norms"), ("rotate", "rotary"), ("gated", "silu")):
            if name in vars(cls):
                own = vars(cls)[name]
                timed = clocks.wrap(part, own.__func__ if isinstance(own, staticmethod) else own)
                setattr(cls, name, staticmethod(timed) if isinstance(own, staticmethod) else timed)
    step.rotary = clocks.wrap("rotary table", step.rotary)
    F.scaled_dot_product_attention = clocks.wrap("attention", F.scaled_dot_product_attention)
    F.embedding = clocks.wrap("embedding", F.embedding)
    for name, part in HOST.items():                  # the host's work: the token picked and described, the hash
        setattr(batch_module, name, clocks.wrap(part, getattr(batch_module, name)))
    forward = step.forward

    def wrapped(ids, positions, kv, *args, linear=F.linear, fused=None, attention=None, **kwargs):
        linear = clocks.wrap(lambda x, w, b=None: names.get(id(w), "other products"), linear)
        if fused is not None:
            fused = [type(f)(*(clocks.wrap(k, p) if p else None for k, p in zip(("qkv", "gate_up"), (f.qkv, f.gate_up))))
                     for f in fused]
        if attention is None and ids.shape[1] == 1:
            attention = getattr(runner.lean, "attention", None)
        if attention is not None:
            attention = clocks.wrap("attention", attention)
        return forward(ids, positions, clocks.wrap("kv", kv), *args, linear=linear, fused=fused, attention=attention,
                       **kwargs)

    step.forward = clocks.wrap("forward", wrapped, cpu=True)
    runner.step = clocks.wrap("step", runner.step, cpu=True)
    return lambda: [setattr(module, name, value) for module, name, value in originals]


def one_request(runner: BatchRunner, lm, clocks: Clocks, tokens: int, ways: list[str]) -> tuple[dict, str]:
    """One lone request whose decode steps take the ways in turn, step by step (the machine's other users then
    weigh on every way alike); per way, each of its steps' parts in ms (the request's first three decode steps
    left out), and the request's text."""
    request = GenerationRequest(PROMPT, max_new_tokens=tokens)
    out = []
    runner.add(Slot(request, encode_prompt(lm, request), CAPTURE_OFF, out.append, print))
    steps: dict[str, list] = {w: [] for w in ways}
    n = 0
    while not runner.idle:
        way = ways[n % len(ways)]
        use(runner, way)
        clocks.clear()
        runner.step()
        n += 1
        if n > 4 and "forward" in clocks.now:                      # step 1 is the prompt's
            steps[way].append(parts(clocks))
    return steps, out[-1].text


def parts(clocks: Clocks) -> tuple[dict, dict]:
    """This step's parts in ms: wall (with the rest of the forward), and CPU of the step and forward; both with the
    host's work (the step less the forward)."""
    wall, cpu = {k: 1e3 * v for k, v in clocks.now.items()}, {k: 1e3 * v for k, v in clocks.cpu.items()}
    host = [k for k in wall if k.startswith("host: ")]
    wall["rest of the forward"] = wall["forward"] - sum(v for k, v in wall.items()
                                                       if k not in ("forward", "step", *host))
    for s in (wall, cpu):
        s["host"] = s["step"] - s["forward"]
    wall["host: the rest"] = wall["host"] - sum(wall[k] for k in host)
    return wall, cpu


def bare(runner: BatchRunner, lm, tokens: int, ways: list[str]) -> dict[str, list[tuple[float, float]]]:
    """One lone request, nothing instrumented, its decode steps taking the ways in turn: per way, each step's
    (wall ms, thread CPU ms) of the runner's whole step (the first three decode steps left out)."""
    request = GenerationRequest(PROMPT, max_new_tokens=tokens)
    runner.add(Slot(request, encode_prompt(lm, request), CAPTURE_OFF, lambda r: None, print))
    steps: dict[str, list] = {w: [] for w in ways}
    n = 0
    while not runner.idle:
        way = ways[n % len(ways)]
        use(runner, way)
        t, c = time.perf_counter(), time.thread_time()
        runner.step()
        if n > 3:
            steps[way].append((1e3 * (time.perf_counter() - t), 1e3 * (time.thread_time() - c)))
        n += 1
    return steps


def operators(runner: BatchRunner, lm) -> dict:
    """Operator calls one lone decode step dispatches (top-level aten calls under torch.profiler), by name."""
    request = GenerationRequest(PROMPT, max_new_tokens=8)
    runner.add(Slot(request, encode_prompt(lm, request), CAPTURE_OFF, lambda r: None, print))
    for _ in range(4):
        runner.step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        runner.step()
    while not runner.idle:
        runner.step()
    counts: dict[str, int] = defaultdict(int)
    for event in prof.events():
        if event.name.startswith("aten::") and (event.cpu_parent is None
                                                or not event.cpu_parent.name.startswith("aten::")):
            counts[event.name] += 1
    return {"calls": sum(counts.values()), "by_name": dict(sorted(counts.items(), key=lambda kv: -kv[1]))}


def summarize(rounds: list[list[tuple[dict, dict]]], floor_ms: float) -> dict:
    """Wall and CPU: the median per part over each round's steps, then over rounds; ms and x the floor."""
    wall = median_parts([[w for w, _ in r] for r in rounds], floor_ms)
    return {**wall, "cpu": median_parts([[c for _, c in r] for r in rounds], floor_ms)}


def median_parts(rounds: list[list[dict]], floor_ms: float) -> dict:
    """Median per part over each round's steps, then over rounds; ms and x the floor."""
    parts = [k for k in ORDER if any(k in s for r in rounds for s in r)]
    parts += sorted({k for r in rounds for s in r for k in s} - set(parts))
    per_round = [{k: statistics.median(s.get(k, 0.0) for s in r) for k in parts} for r in rounds]
    med = {k: statistics.median(r[k] for r in per_round) for k in parts}
    if any(k in med for k in PRODUCTS):
        med["products"] = sum(med.get(k, 0.0) for k in PRODUCTS)
    return {"ms": med, "x_floor": {k: v / floor_ms for k, v in med.items()}, "rounds_ms": per_round}


def use(runner: BatchRunner, way: str) -> None:
    """Set the lone step's kernels to `way`'s (the ones it does not name as the runner made them)."""
    for name, kernel in {"glue": True, "plan_layers": True, "pick": True, "attend_threads": 0, "ends_in_c": True,
                         **runner.lean.made, **WAYS[way]}.items():
        if name == "pick":
            generate.PICK_IN_C = kernel
        elif name == "parts":
            matvec.PARTS = kernel
        elif name == "kernel":
            kernels.use(kernel)
        elif name == "glue":
            glue.GLUE.use(kernel)
        else:
            setattr(runner.lean, name, kernel)


def hand_attention(runner: BatchRunner, compiled: dict) -> None:
    """The forward of a one-token step gets the way's `attention` (LeanDecode has none of its own: SDPA), or runs
    compiled where the way says so (compiled once; `compiled["seconds"]`: its first call's wall time)."""
    forward = runner.lean.lean.forward

    def with_attention(ids, *args, attention=None, **kwargs):
        if ids.shape[1] == 1 and getattr(runner.lean, "compiled", False):
            if "forward" not in compiled:
                compiled["forward"] = torch.compile(forward, dynamic=True)
                t = time.perf_counter()
                out = compiled["forward"](ids, *args, **kwargs)
                compiled["seconds"] = time.perf_counter() - t
                return out
            return compiled["forward"](ids, *args, **kwargs)
        if attention is None and ids.shape[1] == 1:
            attention = getattr(runner.lean, "attention", None)
        return forward(ids, *args, attention=attention, **kwargs)
    runner.lean.lean.forward = with_attention


def bare_rounds(runner: BatchRunner, lm, args, ways: list[str]) -> dict[str, list[tuple[float, float]]]:
    """`bare` for every round, each way leading one in turn; per way, all its steps."""
    plain: dict[str, list] = {w: [] for w in ways}
    for r in range(args.rounds):
        steps = bare(runner, lm, args.tokens, ways[r % len(ways):] + ways[:r % len(ways)])
        for way in ways:
            plain[way] += steps[way]
    return plain


def part_rounds(runner: BatchRunner, lm, args, timed: list[str]) -> tuple[dict, set[str]]:
    """Every round instrumented (`one_request`); per way, each round's steps; and the rounds' texts. The module
    globals and the split products' blocks are put back afterwards."""
    clocks = Clocks()
    restore = instrument(runner, clocks)
    seen, texts = {w: [] for w in timed}, set()
    try:
        for r in range(args.rounds):
            order = timed[r % len(timed):] + timed[:r % len(timed)]     # each way leads a round in turn
            steps, text = one_request(runner, lm, clocks, args.tokens, order)
            texts.add(text)
            for way in timed:
                seen[way].append(steps[way])
    finally:
        restore()
        matvec.PARTS = runner.lean.made["parts"]
    return seen, texts


def way_report(report: dict, way: str, seen: dict, plain: dict, ops: dict) -> dict:
    """One way's entry: its parts (where timed by parts), its operators, its bare step; printed as it goes."""
    floor_ms = report["floor"]["floor_ms"]
    entry = summarize(seen[way], floor_ms) if way in seen else {"ms": {}, "cpu": {"ms": {}}}
    entry["operators"] = ops[way]
    entry["bare"] = {"wall_ms": statistics.median(w for w, _ in plain[way]),
                     "cpu_ms": statistics.median(c for _, c in plain[way]), "steps": len(plain[way])}
    entry["bare"]["x_floor"] = entry["bare"]["wall_ms"] / floor_ms
    for clock, parts in (("wall", entry), ("cpu", entry["cpu"])):
        print(f"{way} {clock}: " + ", ".join(f"{k} {v:.2f}" for k, v in parts["ms"].items()) + " ms", flush=True)
    print(f"{way}: {ops[way]['calls']} operator calls; bare step {entry['bare']['wall_ms']:.2f} ms wall, "
          f"{entry['bare']['cpu_ms']:.2f} ms CPU", flush=True)
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--way", action="append", choices=sorted(WAYS))
    parser.add_argument("--out", help="default: a new file under bench/results/lone_parts/")
    args = parser.parse_args(argv)
    ways = args.way or ["now"]
    record = provenance.start("lone_parts", argv)
    torch.set_num_threads(args.threads)
    lm = load_model(args.model, device="cpu", dtype="float32")
    runner = BatchRunner(lm, max_batch=32, prefix=None)
    runner.lean.made = {"linear": runner.lean.linear, "side_by_side": runner.lean.side_by_side,
                        "attention": runner.lean.attention,
                        "compiled": False, "parts": matvec.PARTS, "kernel": kernels.row_kernel() is not None}
    compiled: dict = {}
    hand_attention(runner, compiled)
    ops = {}
    for way in ways:
        use(runner, way)
        ops[way] = operators(runner, lm)               # the compiled way compiles here
    plain = bare_rounds(runner, lm, args, ways)
    seen, texts = part_rounds(runner, lm, args, [w for w in ways if not WAYS[w].get("compiled")])
    use(runner, "now")
    report = {"floor": floor(lm, [args.threads]), "threads": args.threads, "tokens": args.tokens,
              "same_text": len(texts) == 1, "ways": ways, "compile_s": compiled.get("seconds")}
    for way in ways:
        report[way] = way_report(report, way, seen, plain, ops)
    print(f"floor {report['floor']['floor_ms']:.1f} ms; the same text every round: {report['same_text']}")
    record.save(report, out=args.out)
    return 0 if report["same_text"] else 1


if __name__ == "__main__":
    sys.exit(main())
