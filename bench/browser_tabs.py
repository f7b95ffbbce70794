"""A page load in a new browser context against one in a warm tab (tests/browsers.py lends the browser tests warm
tabs), side by side in one run, in headless Chromium on the app as `make run` starts it.

    python bench/browser_tabs.py                   # 3 rounds over 6 pages
    python bench/browser_tabs.py --rounds 5 --out /tmp/tabs.json

Each round opens the same pages twice, in turns: each in a new context (a new person in a cold browser: its first
load compiles Streamlit's and plotly's scripts), and each in one tab kept across the round, its cookies cleared
first (a new person in a warm browser: the scripts stay compiled in its renderer). Per load: the renderer's task
time and script time (Chrome's Performance metrics) and the wall time until the page has drawn; per way: the CPU
seconds every Chromium process used. Reported: the medians, and warm over cold for each. Writes a new
bench/results/browser_tabs/<UTC time>-<commit>.json (bench/provenance.py).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402
from room_browser import ARGS, CHROMIUM, start_app  # noqa: E402

PAGES = (("journey", "The journey of a request"), ("attention", "Attention"), ("kv-cache", "The KV cache"),
         ("batching", "Batching"), ("speed-cost", "Speed and cost on GPUs"), ("", "Inference Playground"))
VIEWPORT = {"width": 1400, "height": 900}
DRAWN = """() => !document.querySelector('[data-testid="stStatusWidget"]') &&
                 !document.querySelector('[data-testid="stSkeleton"]') &&
                 [...document.querySelectorAll('[data-testid="stPlotlyChart"]')].every(c => c.querySelector('.main-svg'))"""


def chromium_cpu() -> float:
    """CPU seconds of every Chromium process now (user + system)."""
    import psutil

    total = 0.0
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if "chrom" in " ".join(proc.info["cmdline"] or []):
                times = proc.cpu_times()
                total += times.user + times.system
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


def load(page, url: str, path: str, title: str) -> dict:
    """One page load until its heading and charts are drawn: wall seconds, the renderer's task and script seconds."""
    page.goto("about:blank")                            # counters from a page of no work (it keeps the tab warm)
    cdp = page.context.new_cdp_session(page)
    cdp.send("Performance.enable")
    before = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
    start = time.perf_counter()
    page.goto(f"{url}/{path}")
    page.get_by_role("heading", name=title).first.wait_for(timeout=120_000)
    page.wait_for_timeout(300)                          # a page's charts arrive in the run after its heading
    page.wait_for_function(DRAWN, timeout=120_000)
    wall = time.perf_counter() - start
    after = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
    cdp.detach()
    # the counters belong to the document or to the session (both start here, from a blank page's near zero)
    task, script = (after[k] - min(before.get(k, 0.0), after[k]) for k in ("TaskDuration", "ScriptDuration"))
    return {"page": path or "home", "wall_s": round(wall, 3), "task_s": round(task, 3), "script_s": round(script, 3)}


def cold_round(browser, url: str) -> tuple[list[dict], float]:
    cpu = chromium_cpu()
    loads = []
    for path, title in PAGES:
        context = browser.new_context(viewport=VIEWPORT)
        loads.append(load(context.new_page(), url, path, title))
        spent = chromium_cpu()
        context.close()
        cpu -= spent - chromium_cpu()                   # the closed context's processes took their seconds along
    return loads, chromium_cpu() - cpu


def warm_round(tab, url: str) -> tuple[list[dict], float]:
    cpu = chromium_cpu()
    loads = []
    for path, title in PAGES:
        tab.context.clear_cookies()                     # a new person, as tests/browsers.py lends the tab
        loads.append(load(tab, url, path, title))
    return loads, chromium_cpu() - cpu


def median(loads: list[dict], key: str) -> float:
    return round(statistics.median(x[key] for x in loads), 3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    run = provenance.start("browser_tabs", argv)
    from playwright.sync_api import sync_playwright

    server, url = start_app({}, [])
    rounds = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            tab = browser.new_context(viewport=VIEWPORT).new_page()
            warm_round(tab, url)                        # the tab warmed once, as a worker's pool is by its first test
            for _ in range(args.rounds):
                cold, cold_cpu = cold_round(browser, url)
                warm, warm_cpu = warm_round(tab, url)
                rounds.append({"cold": cold, "warm": warm, "cold_cpu_s": round(cold_cpu, 2),
                               "warm_cpu_s": round(warm_cpu, 2)})
                print(f"cold {cold_cpu:.1f} s CPU, warm {warm_cpu:.1f} s CPU for {len(PAGES)} pages", flush=True)
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=60)
    cold = [x for r in rounds for x in r["cold"]]
    warm = [x for r in rounds for x in r["warm"]]
    report = {"pages": [p for p, _ in PAGES], "viewport": VIEWPORT, "rounds_n": args.rounds}
    for key in ("task_s", "script_s", "wall_s"):
        report[f"cold_{key}"], report[f"warm_{key}"] = median(cold, key), median(warm, key)
        report[f"warm_over_cold_{key}"] = round(report[f"warm_{key}"] / report[f"cold_{key}"], 2)
    report["cold_cpu_s_per_load"] = round(sum(r["cold_cpu_s"] for r in rounds) / len(cold), 2)
    report["warm_cpu_s_per_load"] = round(sum(r["warm_cpu_s"] for r in rounds) / len(warm), 2)
    report["warm_over_cold_cpu"] = round(report["warm_cpu_s_per_load"] / report["cold_cpu_s_per_load"], 2)
    print({k: v for k, v in report.items() if k != "pages"})
    run.save(report, out=args.out, rounds=rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
