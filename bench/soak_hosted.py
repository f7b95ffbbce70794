"""The hosted room soaked through its real path, with faults: browser protocol -> nginx -> web process -> HTTP ->
model server, and the API beside it.

    python bench/soak_hosted.py                               # 30 sessions + 10 API clients, 60 minutes
    python bench/soak_hosted.py --seconds 75 --sessions 6 --api-clients 3 --model /path/to/tiny   # the test's

It starts `playground --web-processes 2 --host 0.0.0.0` with a join code, the run store on a disk of its own with a
quota (a tmpfs of --quota-mb, mounted here when this process may: as root, or in a user namespace), then:

- `--sessions` people, each a browser without the browser (bench/st_client.py's Person, Streamlit's own websocket
  protocol through nginx), joined by the link and keeping their cookies: between pauses they generate on the
  journey page (a quarter with the page's capture), stop an answer mid-way, reload, or open one of their runs on
  the Recordings page;
- `--api-clients` `openai` clients streaming completions through nginx's /v1/ with the room's key.

Faults: SIGKILL a web process at a quarter of the time, the model server at half, fill the run store's disk at
three quarters (a file takes all its free space; it is removed again at seven eighths, as an operator would). Each
fault waits for the process killed before it to be back, and the soak runs on past --seconds until the last one is:
on a loaded machine it lasts longer, it never ends with a process down.

Reported (a new bench/results/soak_hosted/<UTC time>-<commit>.json, bench/provenance.py): asked / served /
refused (with each message) / failed (with each message) / lost for each kind and each fault window, p95 time to
first token of the API clients in the span before
and after each fault, how long each process took to come back, and the resident memory of every process at start
and end (sampled every 30 s). **Lost** is a run that finished for its client (an API stream that ended, a page that
showed its Done or Stopped line with its link) and cannot be opened by its id at the end: it must be 0. A failure
must be an answer that was streaming when a fault struck. Exits 1 when a check fails.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import openai
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from st_client import Person  # noqa: E402
from engine.store import open_store  # noqa: E402
from app.runs.widgets import STOPPED_IN_LINE  # noqa: E402
from bench import provenance  # noqa: E402

CODE = "soak-room-2026"
PROMPTS = ("What is the capital of France?", "Why is the sky blue?", "Write a haiku about autumn.",
           "Name three prime numbers.", "What does a GPU do?", "Give me a tip for learning to cook.",
           "Translate 'good morning' into Spanish.", "What is a transformer in machine learning?")
ACTIONS = {"generate": 50, "stop": 10, "reload": 20, "open_recording": 20}
RUN_LINK = re.compile(r"\?run=(run-[0-9a-f]+)")
STREAM_SECONDS = 240.0        # the longest a page or a client waits for one answer
FAULTS = (("kill a web process", 0.25), ("kill the model server", 0.5), ("fill the run store's disk", 0.75))
FREE_AT = 0.875
JOIN_FORM = "Join the room"
KILLED = {"kill a web process": "web-1", "kill the model server": "model-server"}


@dataclass
class Outcome:
    kind: str                 # generate, stop, reload, open_recording (pages); api
    who: str
    start: float              # seconds since the soak began
    end: float
    result: str               # served, refused, failed
    message: str = ""
    run_id: str | None = None
    ttft: float | None = None


@dataclass
class Soak:
    args: argparse.Namespace
    url: str = ""
    key: str = ""
    room_dir: Path | None = None
    store: Path | None = None
    t0: float = 0.0
    outcomes: list[Outcome] = field(default_factory=list)
    faults: dict[str, float] = field(default_factory=dict)
    memory: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stopping: bool = False
    join_forms: int = 0           # page loads of a member that showed the join form (must stay 0)

    def now(self) -> float:
        return time.monotonic() - self.t0

    # --- the room -------------------------------------------------------------------------------------------------

    def status(self) -> dict:
        try:
            return json.loads((self.room_dir / "status.json").read_text())
        except (OSError, ValueError):
            return {}

    def rss(self) -> dict[str, float]:
        out = {}
        for name, info in self.status().items():
            try:
                out[name] = round(psutil.Process(info["pid"]).memory_info().rss / 2**20, 1)
            except (psutil.Error, TypeError):
                out[name] = None
        return out


def mount_quota(folder: Path, mb: int) -> str:
    """The run store's own disk: a tmpfs of `mb` MiB at `folder` (root, or the user namespace this ran in)."""
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mb}m", "tmpfs", str(folder)], capture_output=True,
                          text=True)
    return "" if done.returncode == 0 else done.stderr.strip() or "mount failed"


def start_room(soak: Soak, log: Path) -> subprocess.Popen:
    a = soak.args
    cmd = [sys.executable, "-m", "app.launch", "--web-processes", "2", "--host", "0.0.0.0", "--port", str(a.port),
           "--join-code", CODE, "--public-url", f"http://127.0.0.1:{a.port}", "--runs-dir", str(soak.store / "runs"),
           "--runs-mb", str(a.runs_mb), "--max-sessions", str(max(64, 2 * a.sessions)), "--model", a.model]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        text = log.read_text()
        found, key = re.search(r"logs in (\S+)", text), re.search(r"/v1 with the key (\S+)", text)
        if found and key:
            soak.room_dir, soak.key, soak.url = Path(found.group(1)), key.group(1), f"http://127.0.0.1:{a.port}"
            return proc
        if proc.poll() is not None:
            raise SystemExit(f"the room did not start:\n{text[-3000:]}")
        time.sleep(0.5)
    raise SystemExit("the room did not start within 15 minutes")


# --- people on the pages ------------------------------------------------------------------------------------------

async def person(soak: Soak, i: int) -> None:
    p, rng = Person(soak.url), random.Random(1000 + i)
    await connect(soak, p, "journey", f"join={CODE}")                  # joined by the link
    await asyncio.sleep(rng.uniform(0, soak.args.pause))
    while not soak.stopping:
        kind = rng.choices(list(ACTIONS), weights=list(ACTIONS.values()))[0]
        start = soak.now()
        try:
            outcome = await ACTION_FUNCS[kind](soak, p, rng)
        except Exception as err:  # noqa: BLE001 - whatever broke is a failure with its message, never a crash
            outcome = ("failed", f"{type(err).__name__}: {err}"[:200], None)
        result, message, run_id = outcome
        soak.outcomes.append(Outcome(kind, f"person-{i}", start, soak.now(), result, message, run_id))
        if p.closed_reason is not None or result == "failed":
            await connect(soak, p, "journey")                           # a reload, as a person would
        await asyncio.sleep(rng.uniform(0.5, 1.5) * soak.args.pause)
    await p.close()


async def connect(soak: Soak, p: Person, page: str, query: str = "", seconds: float = 120.0) -> bool:
    """Load a page, trying again for a while when the room cannot be reached (a web process restarting)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not soak.stopping:
        try:
            await p.open(page, query)
            if await p.until(lambda q: q.runs >= 1, 120):
                if not query and p.shows(JOIN_FORM):     # a member sent to the join form: the cookie did not hold
                    soak.join_forms += 1
                return True
        except Exception:  # noqa: BLE001 - refused or dropped while a process restarts: try again shortly
            pass
        await asyncio.sleep(2)
    return False


async def on_page(soak: Soak, p: Person, page: str) -> bool:
    if p.closed_reason is None and p.page_hash and page_of(p) == page:
        return True
    return await connect(soak, p, page, seconds=60)


def page_of(p: Person) -> str:
    return "journey" if "journey.generate" in p.widgets else "recordings" if p.shows("Your last runs") else ""


def finished_line(p: Person) -> str | None:
    return next((t for t in p.texts if (t.startswith("Done:") or t.startswith("Stopped after")) and "?run=" in t),
                None)


async def generate(soak: Soak, p: Person, rng: random.Random, stop_after: int = 0) -> tuple:
    """Press Generate (and Stop after `stop_after` tokens): served with the run's link, refused or failed with what
    the page said."""
    if not await on_page(soak, p, "journey"):
        return "failed", "the journey page did not load", None
    if not p.widgets.get("journey.generate"):
        return "refused", said(p, "the page showed no Generate button"), None
    runs_before, starts_before, alerts_before = p.runs, p.starts, len(p.alerts)
    shown_before = link_of(finished_line(p))                             # the run the page showed before (if any)
    values = {"journey.prompt": rng.choice(PROMPTS), "journey.capture": rng.random() < soak.args.capture_share,
              "journey.max_new": rng.randint(*soak.args.tokens) if not stop_after else 64}
    await p.press("journey.generate", **values)
    if stop_after:                          # Stop once this run (not the page before it) shows its tokens
        await p.until(lambda q: q.starts > starts_before and (tokens_shown(q) >= stop_after or q.runs > runs_before),
                      STREAM_SECONDS)
        await p.press("journey.stop")
    await p.until(lambda q: q.runs > runs_before or q.closed_reason is not None, STREAM_SECONDS)
    await p.until(lambda q: link_of(finished_line(q)) not in (None, shown_before) or q.errors
                  or q.closed_reason is not None, 5)
    return judged(p, shown_before, p.alerts[alerts_before:])


def said(p: Person, otherwise: str) -> str:
    """Why the page offered no button: its error, its restart notice, or `otherwise`."""
    return (p.errors or restart_lines(p.texts) or [otherwise])[0][:200]


def restart_lines(texts: list[str]) -> list[str]:
    """The lines a page shows while the model server restarts or does not answer."""
    return [t for t in texts if "restarting" in t or "not answering" in t]


def judged(p: Person, shown_before: str | None, alerts: list[str]) -> tuple:
    """Served with a new run's link; refused or failed with what the page said (its error, or the restart line when
    the model server went away between the page's look and the press: shown by any run of the page since the press,
    since the page reruns itself as soon as the model server answers again and the line goes with it)."""
    run_id = link_of(finished_line(p))
    if p.closed_reason is not None:
        return "failed", f"the page lost its connection: {p.closed_reason}", None
    if p.errors:
        failed = "lost" in p.errors[0] or "went away" in p.errors[0]
        return ("failed" if failed else "refused"), p.errors[0][:200], None
    if run_id is not None and run_id != shown_before:
        return "served", "", run_id
    unkept = next((t for t in p.texts if t.startswith("Stopped after") and "did not confirm" in t), None)
    if unkept is not None:
        return "failed", unkept[:200], None        # stopped as the model server went away: said, and no link
    if any(t.startswith(STOPPED_IN_LINE) for t in p.texts):
        return "served", "", None          # Stop pressed while it waited in line (app/runs/widgets.py): nothing to open
    restart = said(p, "") or next(iter(restart_lines(alerts)), "")
    if restart:
        return "refused", restart[:200], None
    status = next((t for t in p.texts if t.startswith(("Done:", "Stopped", "Generating with"))), "no status line")
    return "failed", (f"the page ended without a new run's link or a message; its status line: {status[:160]}; "
                      "it showed last: " + " | ".join(t[:80] for t in p.texts[-6:])), None


def link_of(line: str | None) -> str | None:
    found = RUN_LINK.search(line) if line else None
    return found.group(1) if found else None


def tokens_shown(p: Person) -> int:
    counts = [int(t.split(":")[1].replace(",", "")) for t in p.texts if t.startswith("Generated tokens:")]
    return max(counts, default=0)


async def stop(soak: Soak, p: Person, rng: random.Random) -> tuple:
    return await generate(soak, p, rng, stop_after=2)


async def reload(soak: Soak, p: Person, rng: random.Random) -> tuple:
    page = rng.choice(("journey", "recordings", "attention"))
    if not await connect(soak, p, page, seconds=60):
        return "failed", f"the {page} page did not load", None
    return ("failed", p.exceptions[0], None) if p.exceptions else ("served", "", None)


async def open_recording(soak: Soak, p: Person, rng: random.Random) -> tuple:
    """One of this person's runs (or a shipped recording) opened from the Recordings page."""
    if not await connect(soak, p, "recordings", seconds=60):
        return "failed", "the Recordings page did not load", None
    keys = [k for k in p.widgets if k.startswith("recordings.recent.")] or ["recordings.open.0"]
    key, runs_before = rng.choice(keys), p.runs
    if not await p.press(key):
        return "refused", said(p, "the page showed no Open button"), None
    await p.until(lambda q: q.runs > runs_before or q.closed_reason is not None, 60)
    if p.closed_reason is not None:
        return "failed", f"the page lost its connection: {p.closed_reason}", None
    if p.errors:
        return "refused", p.errors[0][:200], None
    return "served", "", None


ACTION_FUNCS = {"generate": generate, "stop": stop, "reload": reload, "open_recording": open_recording}


# --- API clients ----------------------------------------------------------------------------------------------------

async def api_client(soak: Soak, i: int, model: str) -> None:
    rng = random.Random(2000 + i)
    client = openai.AsyncOpenAI(base_url=soak.url + "/v1", api_key=soak.key, max_retries=0, timeout=STREAM_SECONDS)
    while not soak.stopping:
        start = soak.now()
        result, message, run_id, ttft, wait = await api_call(client, model, rng, soak)
        soak.outcomes.append(Outcome("api", f"api-{i}", start, soak.now(), result, message, run_id, ttft))
        await asyncio.sleep(wait or rng.uniform(0.5, 1.5) * soak.args.api_pause)
    await client.close()


async def api_call(client: openai.AsyncOpenAI, model: str, rng: random.Random, soak: Soak) -> tuple:
    """One streamed completion: (result, message, run id, TTFT, seconds to wait before the next)."""
    t0, first, run_id, finished = time.monotonic(), None, None, False
    try:
        stream = await client.completions.create(model=model, prompt=rng.choice(PROMPTS), stream=True,
                                                 max_tokens=rng.randint(*soak.args.tokens), temperature=0)
        async for chunk in stream:
            run_id = run_id or "run-" + chunk.id.split("-", 1)[-1]
            if first is None and chunk.choices and chunk.choices[0].text:
                first = time.monotonic() - t0
            finished = finished or bool(chunk.choices and chunk.choices[0].finish_reason)
        if not finished:
            return "failed", "the stream ended without a finish", None, first, 0
        return "served", "", run_id, first, 0
    except openai.APIStatusError as err:
        retry = float(err.response.headers.get("retry-after") or 1)
        kind = "refused" if err.status_code in (429, 503) else "failed"
        said_ = (err.body or {}).get("message") if isinstance(err.body, dict) else None
        return kind, f"{err.status_code}: {said_ or err.message}"[:200], None, None, retry
    except (openai.APIConnectionError, openai.APITimeoutError, httpx.HTTPError) as err:
        return "failed", f"{type(err).__name__}: {err}"[:200], None, first, 1.0


# --- faults and the clock --------------------------------------------------------------------------------------------

async def inject(soak: Soak) -> None:
    """The three faults at their times, and the run store's disk freed again. A fault waits for the process the one
    before it killed to be back, and the soak ends only once the last one killed is back (soak_for): on a loaded
    machine a restart takes longer, and the run then lasts longer instead of ending with a process still down."""
    total, killed = soak.args.seconds, Counter()
    for (name, at) in FAULTS:
        await asyncio.sleep(max(0.0, at * total - soak.now()))
        await everyone_back(soak, killed)
        soak.faults[name] = round(soak.now(), 2)
        if name in KILLED:
            os.kill(soak.status()[KILLED[name]]["pid"], signal.SIGKILL)
            killed[KILLED[name]] += 1
        else:
            fill(soak)
    await asyncio.sleep(max(0.0, FREE_AT * total - soak.now()))
    (soak.store / "filler").unlink(missing_ok=True)
    soak.faults["the disk freed"] = round(soak.now(), 2)
    await everyone_back(soak, killed)


async def everyone_back(soak: Soak, killed: Counter, seconds: float = 900.0) -> None:
    """Until every process the soak killed has come back as often as it was killed (`seconds`: a guard against a
    room that never restarts it, as long as start_room's; the report then shows it still down)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        status = soak.status()
        if all(len(status.get(name, {}).get("back_seconds") or []) >= n and not status.get(name, {}).get("down_since")
               for name, n in killed.items()):
            return
        await asyncio.sleep(0.5)
    soak.notes.append(f"not back after {seconds:.0f} s: {sorted(killed)}")


def fill(soak: Soak) -> None:
    """Take every free byte of the run store's disk (its quota), as another program filling it would."""
    if not soak.args.quota_mb:
        soak.notes.append("the run store's disk was not filled: no quota could be mounted")
        return
    free = shutil.disk_usage(soak.store).free
    with open(soak.store / "filler", "wb") as f:
        try:
            f.write(b"\0" * free)
        except OSError:
            pass
    soak.notes.append(f"filled the run store's disk: {free / 2**20:.0f} MiB, {shutil.disk_usage(soak.store).free} "
                      "bytes left")


async def sample_memory(soak: Soak) -> None:
    while not soak.stopping:
        soak.memory.append({"t": round(soak.now(), 1), **soak.rss()})
        await asyncio.sleep(30)


async def soak_for(soak: Soak) -> None:
    model = (await asyncio.to_thread(httpx.get, soak.url + "/v1/models",
                                     headers={"Authorization": f"Bearer {soak.key}"})).json()["data"][0]["id"]
    soak.t0 = time.monotonic()
    tasks = [asyncio.ensure_future(person(soak, i)) for i in range(soak.args.sessions)]
    tasks += [asyncio.ensure_future(api_client(soak, i, model)) for i in range(soak.args.api_clients)]
    helpers = [asyncio.ensure_future(inject(soak)), asyncio.ensure_future(sample_memory(soak))]
    await asyncio.sleep(soak.args.seconds)
    await helpers[0]                                        # every fault made and every killed process back
    soak.stopping = True
    await asyncio.wait(tasks, timeout=STREAM_SECONDS)       # an answer in flight is read to its end
    for task in tasks + helpers:
        task.cancel()
    soak.memory.append({"t": round(soak.now(), 1), **soak.rss()})


# --- what is reported -------------------------------------------------------------------------------------------------

def lost_runs(soak: Soak, workers: int = 4) -> list[str]:
    """Runs that finished for their client and cannot be opened by id now (through nginx, as a client would), read
    by a few clients at once (an hour's ~5,000 runs one by one took 16 minutes)."""
    ids = sorted({o.run_id for o in soak.outcomes if o.result == "served" and o.run_id})
    t0 = time.monotonic()
    with httpx.Client(base_url=soak.url, headers={"Authorization": f"Bearer {soak.key}"}, timeout=60,
                      limits=httpx.Limits(max_connections=workers)) as http:
        def opened(run_id: str) -> bool:
            return http.get(f"/v1/playground/runs/{run_id}").status_code == 200
        with ThreadPoolExecutor(workers) as pool:
            lost = [run_id for run_id, ok in zip(ids, pool.map(opened, ids)) if not ok]
    print(f"opened {len(ids) - len(lost)} of {len(ids)} finished runs by id in {time.monotonic() - t0:.0f} s",
          flush=True)
    return lost


def lost_detail(soak: Soak, lost: list[str]) -> list[dict]:
    """What each lost run was: the action that made it, who, when it started and ended for its client."""
    gone = set(lost)
    return [{"run_id": o.run_id, "kind": o.kind, "who": o.who, "start": round(o.start, 1), "end": round(o.end, 1)}
            for o in soak.outcomes if o.run_id in gone]


def window_of(soak: Soak, t: float) -> str:
    marks = sorted(soak.faults.items(), key=lambda kv: kv[1])
    names = ["before the faults"] + [f"after: {name}" for name, _ in marks]
    return names[sum(1 for _, at in marks if t >= at)]


def struck(soak: Soak, o: Outcome) -> bool:
    """Was this answer in flight when a fault struck (the only failures allowed)?"""
    return any(o.start - 1 <= at <= o.end + 1 for at in soak.faults.values())


def tally(outcomes: list[Outcome]) -> dict:
    out: dict = {"asked": len(outcomes), **Counter(o.result for o in outcomes)}
    for kind in ("refused", "failed"):
        messages = Counter(o.message for o in outcomes if o.result == kind)
        if messages:
            out[f"{kind}_messages"] = dict(messages.most_common(8))
    return out


def p95(values: list[float]) -> float | None:
    values = sorted(v for v in values if v is not None)
    return round(values[min(len(values) - 1, int(0.95 * len(values)))], 3) if values else None


def ttft_around(soak: Soak) -> dict:
    """p95 TTFT of the API's answers in the span before each fault and the span after it (after the process it
    killed was back, for the two kills)."""
    span, status = min(300.0, soak.args.seconds / 8), soak.status()
    api = [o for o in soak.outcomes if o.kind == "api" and o.result == "served"]
    out = {}
    for name, at in soak.faults.items():
        if name == "the disk freed":
            continue
        back = (status.get(KILLED.get(name, ""), {}).get("back_seconds") or [0.0])[0]
        out[name] = {"before": p95([o.ttft for o in api if at - span <= o.start < at]),
                     "after": p95([o.ttft for o in api if at + back <= o.start < at + back + span]),
                     "span_s": span, "back_after_s": back}
    return out


def rss_summary(soak: Soak) -> dict:
    """Every process's resident memory (MiB): when the room was ready, after warm-up (every session has loaded
    its pages, the model has served a while: the first sample past a tenth of the time), and at the end."""
    warm = next((m for m in soak.memory if m["t"] >= min(120.0, soak.args.seconds / 10)), soak.memory[-1])
    return {"ready": soak.memory[0], "warm": warm, "end": soak.memory[-1], "samples": soak.memory}


def report(soak: Soak, lost: list[str]) -> dict:
    by_kind = defaultdict(list)
    by_window = defaultdict(lambda: defaultdict(list))
    for o in soak.outcomes:
        by_kind[o.kind].append(o)
        by_window[window_of(soak, o.start)][o.kind].append(o)
    unexplained = [asdict(o) for o in soak.outcomes if o.result == "failed" and not struck(soak, o)]
    status = soak.status()
    checks = ([f"{len(lost)} runs lost"] if lost else []) + \
             ([f"{len(unexplained)} failures while no fault struck"] if unexplained else []) + \
             ([f"{soak.join_forms} page loads of members showed the join form"] if soak.join_forms else [])
    return {"seconds": soak.args.seconds, "sessions": soak.args.sessions, "api_clients": soak.args.api_clients,
            "model": soak.args.model, "faults_at_s": soak.faults, "notes": soak.notes,
            "kinds": {k: tally(v) for k, v in by_kind.items()},
            "windows": {w: {k: tally(v) for k, v in kinds.items()} for w, kinds in by_window.items()},
            "lost": len(lost), "lost_ids": lost[:50], "lost_runs": lost_detail(soak, lost)[:50],
            "join_forms_shown_to_members": soak.join_forms,
            "finished_runs": len({o.run_id for o in soak.outcomes if o.run_id}),
            "failures_without_a_fault": unexplained[:20],
            "p95_ttft_api_s": ttft_around(soak),
            "p95_page_answer_s": p95([o.end - o.start for o in by_kind["generate"] if o.result == "served"]),
            "back_after_s": {name: info.get("back_seconds") for name, info in status.items()},
            "restarts": {name: info.get("restarts") for name, info in status.items()},
            "rss_mb": rss_summary(soak),
            "load_average": os.getloadavg(), "checks": checks}


def store_use(soak: Soak) -> dict:
    """What the run store held at the end: runs, bytes, its budget, what it evicted and skipped."""
    try:
        use = open_store(soak.store / "runs", soak.args.runs_mb * 2**20).usage()
    except Exception as err:  # noqa: BLE001 - the report says why instead
        return {"error": str(err)}
    return {"runs": use.runs, "mb": round(use.bytes / 2**20, 1), "budget_mb": soak.args.runs_mb,
            "evicted_runs": use.evicted_runs, "problems": [what for _, what in use.problems]}


# --- running it -------------------------------------------------------------------------------------------------------

def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3600)
    parser.add_argument("--sessions", type=int, default=30)
    parser.add_argument("--api-clients", type=int, default=10)
    parser.add_argument("--port", type=int, default=8910)
    parser.add_argument("--model", default="default")
    parser.add_argument("--tokens", type=int, nargs=2, default=(8, 24), help="new tokens per answer: from, to")
    parser.add_argument("--pause", type=float, default=20.0, help="a person's mean pause between actions (s)")
    parser.add_argument("--api-pause", type=float, default=3.0, help="an API client's mean pause (s)")
    parser.add_argument("--capture-share", type=float, default=0.25, help="answers with the pages' capture")
    parser.add_argument("--quota-mb", type=int, default=2560, help="the run store's disk (a tmpfs); 0: none")
    parser.add_argument("--runs-mb", type=int, default=2048, help="the run store's budget (the default's)")
    parser.add_argument("--out", type=Path, help="default: a new file under bench/results/soak_hosted/")
    return parser.parse_args()


def main() -> int:
    args = parse()
    run = provenance.start("soak_hosted")
    soak = Soak(args)
    work = Path(tempfile.mkdtemp(prefix="soak-hosted-"))
    soak.store = work / "store"
    problem = mount_quota(soak.store, args.quota_mb) if args.quota_mb else "no quota asked"
    if problem:
        soak.notes.append(f"no disk quota for the run store ({problem}): the third fault is not injected")
        args.quota_mb = 0
    proc = start_room(soak, work / "room.log")
    try:
        asyncio.run(soak_for(soak))
        lost = lost_runs(soak)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
        store = store_use(soak)
        if args.quota_mb:
            subprocess.run(["umount", str(soak.store)], capture_output=True)
    result = {**report(soak, lost), "store": store}
    run.save(result, out=args.out)
    print(json.dumps({k: result[k] for k in ("kinds", "lost", "faults_at_s", "p95_ttft_api_s", "back_after_s",
                                             "checks")}, indent=1, default=str))
    return 1 if result["checks"] else 0


if __name__ == "__main__":
    sys.exit(main())
