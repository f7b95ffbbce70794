"""A press of Generate whose run of the page meets a model server that is away by one look and back by the next.

    python bench/away_press.py --model /path/to/tiny --tries 10

Found as the hosted soak's "the page ended without a new run's link or a message" (tests/test_soak_hosted.py, the
fresh-clone CI of a29a10f: two presses 0.3 s after the model server was back). What happens in the page
(app/main.py, app/hosting/model.py): a run that finds the server away draws the restart line and the retry
fragment; the fragment, called inline by that same run, looked at the server again at once and, finding it back,
called `st.rerun(scope="app")`. Streamlit resets a button's trigger at the end of every run and `st.rerun` carries
no widget states, so the press went with that run; and the restart line, queued but not yet sent, was cleared from
the browser's queue when the rerun started. The rerun drew the run from before the press: a press lost without a
word. Two ways into such a run in the room: the look is the process-wide one, up to a second old (another
session's, while the server was still down), or this session's own call failed on a connection the restart broke.

This driver makes it happen on purpose, the same way every try: the model server (`python -m engine serve`) behind
a relay (`HealthGate`) that answers the next GET /health with 503 and passes everything else through, and a web
process (`playground --engine-url` the relay). A person (bench/st_client.py's Person, Streamlit's own protocol) on
the journey page waits past the process's health look (HEALTH_SECONDS), the gate is armed for one look, and the
person presses Generate. The first whole run of the page that finishes after the press must show a new run's link
("served") or say the restart line ("said"); "lost" is a run that shows neither (the run from before the press).

`--stale` instead lets another session's page find the server away (the gate refusing every look), opens the gate
and presses at once: the soak's case, where the press's run reads that session's look from the cache. Whether the
press comes within the cache's second depends on the machine's speed, so this mode is a benchmark, never a test.

Writes a new bench/results/away_press/<UTC time>-<commit>.json (bench/provenance.py). Exits 1 when a press was lost.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from st_client import Person  # noqa: E402
from bench import provenance  # noqa: E402

RUN_LINK = re.compile(r"\?run=(run-[0-9a-f]+)")
HEALTH_SECONDS = 1.0          # app/hosting/model.py's: a process-wide look is reused this long (imported there
#                               with Streamlit; restated here so the driver imports no app module)
PAGE_SECONDS = 180.0          # the longest a page is waited for (a loaded 2-core machine)
PROMPT = "w5 w17 w3 w42 w8"   # words of the tests' tiny tokenizer (tests/conftest.py); any model reads them


class HealthGate:
    """A TCP relay on a loopback port in front of the model server: the next `arm(n)` GET /health requests are
    answered 503 (as a server still loading answers), everything else goes through byte for byte."""

    def __init__(self, target_port: int):
        self.target = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.refuse = 0
        self.looks, self.refused = 0, 0          # GET /health seen, and answered 503
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, n: int) -> None:
        with self.lock:
            self.refuse = n

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        head = b""
        while b"\r\n" not in head and len(head) < 8192:
            part = conn.recv(8192)
            if not part:
                conn.close()
                return
            head += part
        if head.startswith(b"GET /health") and self._refused_now():
            conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            conn.close()
            return
        up = socket.create_connection(("127.0.0.1", self.target))
        up.sendall(head)
        threading.Thread(target=pipe, args=(up, conn), daemon=True).start()
        pipe(conn, up)

    def _refused_now(self) -> bool:
        with self.lock:
            self.looks += 1
            if self.refuse > 0:
                self.refuse -= 1
                self.refused += 1
                return True
            return False


def pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, log: Path, seconds: float = 600) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:4]} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer within {seconds:.0f} s:\n{log.read_text()[-3000:]}")


@contextmanager
def room(model: str, work: Path) -> Iterator[tuple[str, HealthGate]]:
    """The model server, the gate in front of it and one web process using the gate: (the web url, the gate)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PLAYGROUND_RUNS_DIR": str(work / "runs")}
    api, web = free_port(), free_port()
    model_args = ["--model", model, "--device", "cpu", "--dtype", "float32"]
    procs = []
    try:
        procs.append(start([sys.executable, "-m", "engine", "serve", "--port", str(api), *model_args], env,
                           work / "serve.log"))
        wait_http(f"http://127.0.0.1:{api}/health", procs[0], work / "serve.log")
        gate = HealthGate(api)
        procs.append(start([sys.executable, "-m", "app.launch", "--port", str(web), "--engine-url",
                            f"http://127.0.0.1:{gate.port}"], env, work / "web.log"))
        wait_http(f"http://127.0.0.1:{web}/_stcore/health", procs[1], work / "web.log")
        yield f"http://127.0.0.1:{web}", gate
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def start(cmd: list[str], env: dict, log: Path) -> subprocess.Popen:
    with open(log, "a") as out:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


# --- a person pressing Generate -------------------------------------------------------------------------------------

def link_shown(p: Person) -> str | None:
    """The run the page's status line links to (its Done line), if any."""
    found = [m for t in p.texts if t.startswith("Done:") for m in RUN_LINK.findall(t)]
    return found[0] if found else None


def restart_said(texts: list[str]) -> bool:
    return any("restarting" in t or "not answering" in t for t in texts)


def ready(p: Person) -> bool:
    """The journey page drawn whole, with Generate, and not saying the model is away."""
    return p.runs >= 1 and "journey.generate" in p.widgets and not restart_said(p.texts)


async def journey(p: Person) -> None:
    await p.open("journey")
    if not await p.until(ready, PAGE_SECONDS):
        raise RuntimeError(f"the journey page did not load: {p.texts[-5:]} {p.exceptions}")


async def press(p: Person) -> dict:
    """Press Generate; what the first whole run that finished after the press showed."""
    runs, alerts, before = p.runs, len(p.alerts), link_shown(p)
    await p.press("journey.generate", **{"journey.prompt": PROMPT, "journey.max_new": 4})
    if not await p.until(lambda q: q.runs > runs, PAGE_SECONDS):
        return {"outcome": "no run", "texts": p.texts[-5:]}
    link = link_shown(p)
    outcome = ("served" if link not in (None, before) else "said" if restart_said(p.texts)
               else "error" if p.errors else "lost")
    return {"outcome": outcome, "link": link, "before": before, "line_reached_the_browser":
            restart_said(p.alerts[alerts:]), "errors": p.errors[:1], "exceptions": p.exceptions[:1]}


async def one_failed_look(p: Person, gate: HealthGate) -> dict:
    """Past the process's cached look, the next look fails and the one after answers; press."""
    await asyncio.sleep(HEALTH_SECONDS * 1.5)        # only ever longer than the cache's second: a fresh look
    looks = gate.looks
    gate.arm(1)
    result = await press(p)
    gate.arm(0)
    result["refused_looks"] = gate.refused
    result["looks"] = gate.looks - looks
    return result


async def stale_look(p: Person, other: Person, gate: HealthGate) -> dict:
    """Another session's page finds the server away (its look is the process's for a second); open the gate;
    press at once."""
    gate.arm(10**6)
    await other.open("attention")                    # a page that draws without the model: it says the line
    await other.until(lambda q: q.runs >= 1, PAGE_SECONDS)
    gate.arm(0)
    result = await press(p)
    await other.close()
    return result


async def drive(url: str, gate: HealthGate, tries: int, stale: bool) -> list[dict]:
    p = Person(url)
    await journey(p)
    first = await press(p)                           # a run to show before the presses
    if first["outcome"] != "served":
        raise RuntimeError(f"the first Generate was not served: {first}")
    rounds = []
    for i in range(tries):
        await p.until(ready, PAGE_SECONDS)          # the page back by itself (its retry) after a said line
        result = await (stale_look(p, Person(url), gate) if stale else one_failed_look(p, gate))
        rounds.append({"try": i, **result})
        print(i, result["outcome"], flush=True)
    await p.close()
    return rounds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a model folder (the tests' tiny Llama is enough)")
    parser.add_argument("--tries", type=int, default=10)
    parser.add_argument("--stale", action="store_true", help="another session's look, then a press at once")
    parser.add_argument("--out", type=Path, help="default: a new file under bench/results/away_press/")
    args = parser.parse_args()
    run = provenance.start("away_press")
    with tempfile.TemporaryDirectory(prefix="away-press-") as tmp, room(args.model, Path(tmp)) as (url, gate):
        rounds = asyncio.run(drive(url, gate, args.tries, args.stale))
    counts = Counter(r["outcome"] for r in rounds)
    report = {"mode": "stale look" if args.stale else "one failed look", "tries": args.tries,
              "outcomes": dict(counts), "line_reached_the_browser": sum(r.get("line_reached_the_browser", False)
                                                                       for r in rounds)}
    run.save(report, out=args.out, rounds=rounds)
    print(report, flush=True)
    return 1 if counts.get("lost") or counts.get("no run") else 0


if __name__ == "__main__":
    sys.exit(main())
