"""The room in a browser: one session alone, then N sessions pressing Generate together, in headless Chromium.

    python bench/room_browser.py                 # 6 sessions, 48 new tokens, batched and one at a time
    python bench/room_browser.py --sessions 6 --tokens 48 --modes batched remote "remote, 2 web processes"
    python bench/room_browser.py --modes batched --threads auto 1 2 --rounds 2 --out /tmp/threads.json

For each mode the app is started as `make run` starts it (one at a time is PLAYGROUND_MAX_BATCH=1, how the
server worked before continuous batching; "remote" is `playground --web-processes 1`: the model in its own server
process, the app a client of it, nginx in front; "remote, 2 web processes" splits the sessions over two). After one warm-up run, one browser session on the journey page
generates alone, three times; then N sessions press Generate at the same moment, three times.
Reported: the median time alone, the median time until the last of the N is done, and their ratio (the issue's
target: <= 3x for 6 sessions), each run's times, and the CPU seconds the app server and
the Chromium processes used meanwhile (on one machine the browsers compete with the model for its cores; in a room
they run on the students' laptops). Writes a new bench/results/room_browser/<UTC time>-<commit>.json
(bench/provenance.py).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run"]
PROMPTS = ("Write a short story about a lighthouse keeper.", "Write a short story about a robot who learns to paint.",
           "Write a short story about a dragon and a baker.", "Write a short story about a lost cat in Paris.",
           "Write a short story about a girl who builds a boat.", "Write a short story about a clock that runs backwards.",
           "Write a short story about a snowman in summer.", "Write a short story about a library at night.")
# answers that run to the token limit, so the one alone and the N together do the same work
LAUNCH = {"remote": ["--web-processes", "1"], "remote, 2 web processes": ["--web-processes", "2"]}   # `playground` args


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(env: dict[str, str], args: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [str(ROOT / ".venv" / "bin" / "python"), "-m", "app.launch", "--port", str(port), *args]  # as `make run` does
    log = open(os.environ.get("BENCH_SERVER_LOG", os.devnull), "ab")     # the server's output, when asked for
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.read().strip() == b"ok":
                    return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("the app did not start")


def prepare(browser, url: str, prompt: str, tokens: int):
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    page.goto(f"{url}/journey")
    page.get_by_role("heading", name="The journey of a request").first.wait_for(timeout=120_000)
    box = page.get_by_role("spinbutton", name="Max new tokens").first
    box.fill(str(tokens))
    box.press("Enter")
    prompt_box = page.get_by_role("textbox", name="Prompt").first
    prompt_box.fill(prompt)
    prompt_box.press("Control+Enter")
    page.wait_for_timeout(1500)
    return context, page


def generate_button(page):
    return page.get_by_test_id("stMainBlockContainer").get_by_role("button", name="Generate")


def wait_done(page, timeout_s: float = 900) -> float:
    page.get_by_text("Done:", exact=False).first.wait_for(timeout=timeout_s * 1000)
    return time.perf_counter()


def cpu_seconds(server: subprocess.Popen) -> dict[str, float]:
    """CPU seconds used so far by the app server (with its children) and by this run's Chromium processes."""
    import psutil

    def used(procs) -> float:
        total = 0.0
        for proc in procs:
            try:
                t = proc.cpu_times()
                total += t.user + t.system
            except psutil.Error:               # a renderer that exited meanwhile
                pass
        return total

    app = psutil.Process(server.pid)             # the launcher: in-process, the app; remote, every process it started
    mine = psutil.Process().children(recursive=True)
    return {"server": used([app, *app.children(recursive=True)]),
            "chromium": used([p for p in mine if "chrom" in p.name().lower()])}


def spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: round(after[k] - before[k], 1) for k in before}


def press(pages) -> float:
    """Press Generate on every page at the same moment: each page is told to click its own button at one
    shared time (the pages read the same clock), so the presses are not spread over the seconds Playwright
    takes to reach six busy pages one by one. Returns that moment on this process's perf_counter clock."""
    buttons = [generate_button(pg) for pg in pages]
    for b in buttons:
        b.wait_for(timeout=60_000)
    at = time.time() + 0.5 + 0.1 * len(buttons)                     # time enough to tell every page
    for b in buttons:
        b.evaluate("(button, at) => setTimeout(() => button.click(), Math.max(0, at - Date.now()))", at * 1000)
    t0 = time.perf_counter() + (at - time.time())
    time.sleep(max(0.0, t0 - time.perf_counter()))
    return t0


def alone_run(browser, url: str, server: subprocess.Popen, tokens: int) -> tuple[float, dict]:
    context, page = prepare(browser, url, PROMPTS[0], tokens)
    cpu0 = cpu_seconds(server)
    t0 = press([page])
    seconds = wait_done(page) - t0
    cpu = spent(cpu0, cpu_seconds(server))
    context.close()
    return seconds, cpu


def together_run(browser, url: str, server: subprocess.Popen, sessions: int, tokens: int) -> dict:
    prepared = [prepare(browser, url, PROMPTS[i % len(PROMPTS)], tokens) for i in range(sessions)]
    cpu0 = cpu_seconds(server)
    t0 = press([pg for _, pg in prepared])
    done = [wait_done(pg) - t0 for _, pg in prepared]
    cpu = spent(cpu0, cpu_seconds(server))
    for ctx, _ in prepared:
        ctx.close()
    return {"last_done_s": max(done), "first_done_s": min(done), "cpu_s": cpu}


def measure(browser, url: str, server: subprocess.Popen, sessions: int, tokens: int, repeats: int) -> dict:
    """A warm-up run (not counted: the server's first generation), then `repeats` runs alone and `repeats` runs
    of N together; the ratio is of the medians (one run of each swings by a third on a shared machine)."""
    alone_run(browser, url, server, tokens)
    alone = [alone_run(browser, url, server, tokens) for _ in range(repeats)]
    together = [together_run(browser, url, server, sessions, tokens) for _ in range(repeats)]
    alone_s = statistics.median(s for s, _ in alone)
    last_s = statistics.median(t["last_done_s"] for t in together)
    return {"alone_s": alone_s, "last_done_s": last_s, "ratio_last_to_alone": last_s / alone_s,
            "alone_runs_s": [round(s, 2) for s, _ in alone], "together_runs": together,
            "cpu_s_alone": alone[0][1], "cpu_s_together": together[0]["cpu_s"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--modes", nargs="+", default=["one at a time", "batched"])
    parser.add_argument("--repeats", type=int, default=3, help="runs alone and runs together, each (medians)")
    parser.add_argument("--threads", nargs="+", metavar="N", help="PLAYGROUND_THREADS settings to compare (e.g. "
                        "auto 1 2): each mode once per setting, in alternating rounds (--rounds)")
    parser.add_argument("--rounds", type=int, default=2, help="with --threads: rounds over the settings")
    parser.add_argument("--out", type=Path, help="default: a new file under bench/results/room_browser/ "
                        "(with --threads: room_browser_threads/)")
    args = parser.parse_args(argv)
    run = provenance.start("room_browser_threads" if args.threads else "room_browser", argv)
    if args.threads:
        return compare_threads(args, run)
    from playwright.sync_api import sync_playwright

    env = {"one at a time": {"PLAYGROUND_MAX_BATCH": "1"}, "batched": {}, "remote": {}, "remote, 2 web processes": {}}
    report = {"what": f"{args.sessions} browser sessions press Generate together on the journey page "
                      f"({args.tokens} new tokens, capture on), against one session alone",
              "load_average": os.getloadavg(), "modes": {}}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        for mode in args.modes:
            proc, url = start_app(env[mode], LAUNCH.get(mode, []))
            try:
                report["modes"][mode] = result = measure(browser, url, proc, args.sessions, args.tokens, args.repeats)
            finally:
                proc.terminate()
                proc.wait(timeout=30)
            lasts = [round(t["last_done_s"], 1) for t in result["together_runs"]]
            print(f"{mode:>14}: alone {result['alone_s']:.1f} s (median of {result['alone_runs_s']}), last of "
                  f"{args.sessions} done after {result['last_done_s']:.1f} s (median of {lasts}): "
                  f"{result['ratio_last_to_alone']:.2f}x; CPU seconds alone {result['cpu_s_alone']}, together "
                  f"{result['cpu_s_together']}", flush=True)
        browser.close()
    report["load_average_after"] = os.getloadavg()
    return write_report(report, run, args.out)


def compare_threads(args: argparse.Namespace, run: provenance.Run) -> int:
    """Each mode under each PLAYGROUND_THREADS setting, the settings alternating round by round (so the machine's
    other users weigh on each alike); the medians over the rounds, and each setting against the best fixed one."""
    from playwright.sync_api import sync_playwright

    runs: dict[str, dict[str, list[dict]]] = {m: {t: [] for t in args.threads} for m in args.modes}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        for r in range(args.rounds):
            for mode in args.modes:
                for threads in args.threads:
                    proc, url = start_app({"PLAYGROUND_THREADS": threads}, LAUNCH.get(mode, []))
                    try:
                        result = measure(browser, url, proc, args.sessions, args.tokens, args.repeats)
                    finally:
                        proc.terminate()
                        proc.wait(timeout=30)
                    runs[mode][threads].append(result)
                    print(f"round {r + 1}, {mode}, threads {threads}: alone {result['alone_s']:.1f} s, last of "
                          f"{args.sessions} {result['last_done_s']:.1f} s", flush=True)
        browser.close()
    table = {mode: {t: {k: statistics.median(x[k] for x in rs) for k in ("alone_s", "last_done_s")}
                    for t, rs in by.items()} for mode, by in runs.items()}
    for mode, by in table.items():
        fixed = [t for t in by if t != "auto"]
        for key in ("alone_s", "last_done_s"):
            best = min((by[t][key] for t in fixed), default=None)
            for t in by:
                by[t][key.replace("_s", "_over_best_fixed")] = by[t][key] / best if best else None
    report = {"what": f"{args.sessions} browser sessions press Generate together on the journey page ({args.tokens} "
                      f"new tokens, capture on), and one alone, under PLAYGROUND_THREADS = {', '.join(args.threads)}, "
                      f"{args.rounds} alternating rounds, medians", "load_average": os.getloadavg(),
              "table": table, "runs": runs}
    print(json.dumps(table, indent=1))
    return write_report(report, run, args.out)


def write_report(report: dict, run: provenance.Run, out: Path | None = None) -> int:
    """The benchmark's JSON report written with its provenance (bench/provenance.py); the exit status."""
    run.save(report, out=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
