"""Gzip bombs against the recording loader: seconds and extra peak memory to refuse each, in a fresh process.

    python bench/bomb.py                        # this checkout's engine; a new file in bench/results/bomb/
    python bench/bomb.py --root /tmp/before     # another checkout's engine (e.g. `git archive` of an older commit)
    python bench/bomb.py --device cuda          # the loader under the GPU server's default limits

Each file is built here, written to a temporary folder, and opened by a child process that imports
`engine.serving.recording` from `--root` and calls `loads_recording` on the bytes, as an upload does. The child
reports the wall time of that call and how far it raised the process's peak resident memory
(`ru_maxrss` after the call minus before it, the file already read). A shipped recording is timed the
same way for comparison. The files:

- `plain`: 500 MB of JSON `[0,0,0,...]`, gzip level 6 (0.5 MB): the file of issue 14.
- `headed`: the same zeros behind a valid recording header, `{"format": ..., "version": 1, "records": [0,0,...`.
- `string`: a valid header, then one 500 MB string of `A`s.
- `headed-liar`, `string-liar`: the same files with a gzip trailer that claims 250 MiB (just under the
  2-core CPU default cap of 259 MiB), so that only decompressing and counting can tell: the worst case
  of a refusal.
- `under-cap`: a valid header and one 250 MB string, honestly within the cap: it passes every cheap check
  and is refused only once parsed, so it costs what parsing a real recording of that size costs.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import provenance  # noqa: E402

SHIPPED = ROOT / "assets" / "recordings" / "capital-of-france.run.zip"   # read as the .json.gz it was (old_format)
HEADER = b'{"format":"inference-playground/recording","version":1,"records":['
MB = 10**6
LIAR_CLAIM = 250 * 2**20
UNDER_CAP = 250 * 10**6          # 238 MiB: below the 2-core CPU default cap of 259 MiB

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
from engine.serving.recording import loads_recording
from engine.errors import EngineError
data = open(sys.argv[2], "rb").read()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
try:
    loads_recording(data, name="upload")
    outcome = "loaded"
except EngineError as err:
    outcome = str(err)
seconds = time.perf_counter() - t
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": seconds, "extra_peak_mb": (after - before) * 1024 / 1e6,
                  "peak_rss_mb": after * 1024 / 1e6, "outcome": outcome}))
"""


def gzip_of(parts: list[tuple[bytes, int]]) -> bytes:
    """gzip (level 6) of each (piece, times) repeated, without holding the whole text in memory."""
    packer = zlib.compressobj(6, zlib.DEFLATED, 31)
    out = []
    for piece, times in parts:
        block = piece * max(1, 2**20 // len(piece))
        full, rest = divmod(times, max(1, 2**20 // len(piece)))
        out += [packer.compress(block) for _ in range(full)] + [packer.compress(piece * rest)]
    return b"".join(out) + packer.flush()


def bombs(expanded: int) -> dict[str, bytes]:
    zeros = expanded // 2
    return {
        "plain": gzip_of([(b"[", 1), (b"0,", zeros), (b"0]", 1)]),
        "headed": gzip_of([(HEADER, 1), (b"0,", zeros), (b"0]}", 1)]),
        "string": gzip_of([(HEADER + b'"', 1), (b"A", expanded), (b'"]}', 1)]),
        "under-cap": gzip_of([(HEADER + b'"', 1), (b"A", UNDER_CAP), (b'"]}', 1)]),
        "shipped": old_format(SHIPPED),
    }


def old_format(path: Path) -> bytes:
    """A shipped run file as the .json.gz the old reader reads (the recording's own bytes until it became a run
    file), made by the base commit's writer, frozen with the tests."""
    sys.path.insert(0, str(ROOT / "tests"))
    from base_recording import dumps_recording      # here: the old format's writer lives with the tests only

    from engine.runs import load                     # here: torch, only when the bombs are built

    return dumps_recording(load(path).recording)


def liar(data: bytes, claim: int = LIAR_CLAIM) -> bytes:
    """The same gzip file with a trailer that states `claim` bytes (its CRC no longer matches either)."""
    return data[:-4] + (claim % 2**32).to_bytes(4, "little")


def measure(root: Path, path: Path, env: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, str(root), str(path)], capture_output=True, text=True,
                          env=env, timeout=900)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="checkout whose engine/ is measured")
    parser.add_argument("--expanded-mb", type=int, default=500, help="decompressed size of each bomb")
    parser.add_argument("--device", default="cpu", help="whose default limits apply: cpu or cuda")
    parser.add_argument("--label", default=None, help="name of this run in the results (default: the root)")
    parser.add_argument("--out", type=Path, help="default: a new file under bench/results/bomb/")
    args = parser.parse_args(argv)
    run = provenance.start("bomb", argv)
    env = {**os.environ, "PLAYGROUND_DEVICE": args.device, "OMP_NUM_THREADS": "1"}
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        files = bombs(args.expanded_mb * MB)
        files.update({f"{name}-liar": liar(files[name]) for name in ("headed", "string")})
        for name, data in files.items():
            path = Path(tmp) / f"{name}.json.gz"
            path.write_bytes(data)
            rows[name] = {"file_mb": round(len(data) / MB, 3), **measure(args.root.resolve(), path, env)}
            row = rows[name]
            print(f"{name:12} {row['file_mb']:8.3f} MB  {row.get('seconds', 0):7.3f} s  "
                  f"+{row.get('extra_peak_mb', 0):8.1f} MB peak  {str(row.get('outcome', row.get('error')))[:110]}")
    label = args.label or str(args.root.resolve())
    results = {}                                   # one run, one file: a comparison of two roots is two runs
    results[label] = {"device_limits": args.device, "expanded_mb": args.expanded_mb, "files": rows,
                      "machine": {"cpu_count": os.cpu_count(), "load_average": list(os.getloadavg()),
                                  "python": platform.python_version()}}
    run.save(results, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
