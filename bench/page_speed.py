"""The journey page's live generation against the engine alone, side by side, same prompt and capture.

    python bench/page_speed.py                   # 48 new tokens, 3 interleaved rounds
    python bench/page_speed.py --tokens 96 --rounds 5

Each round runs the request through the engine's service in this process (`EngineService`, as `make run`'s one
process serves the pages: the scheduler's lone step, the run store, the capture policy the page would choose for
this prompt: every layer's residual and attention, the lens), then the same request through the app in headless
Chromium (started as `make run` starts it), pressing Generate on the journey page. Reported per round and as
medians: decode tokens/s (the engine's from its records; the page's from its own "Decode speed" metric, which the
server measures the same way, around the same steps) and the time from Generate to the last token (engine: submit
to the last record; page: click to "Done:"). The ratios page / engine are the result: what the page costs the
model's steps, its drawing in the process that runs the model and the browser's on the same cores. A third
request each round goes through the page with the browser's processes paused while it streams (SIGSTOP, then
let go to draw the end): the server's share of that cost alone, as where the browsers are on other machines.
Writes a new bench/results/page_speed/<UTC time>-<commit>.json (bench/provenance.py).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.provenance import server_wait  # noqa: E402 (torch-free)

server_wait()                        # before torch loads OpenMP: its threads wait as the app's do

from bench import provenance  # noqa: E402
from bench.room_browser import ARGS, CHROMIUM, generate_button, prepare, start_app, write_report  # noqa: E402

sys.path.insert(0, str(ROOT))        # again: room_browser put bench/ first, whose engine.py is not the project's

from app.runs.run import capture_policy  # noqa: E402
from engine.core.generate import GenerationRequest, encode_prompt  # noqa: E402
from engine.core.loader import load_model  # noqa: E402
from engine.core.openmp import in_passing_thread  # noqa: E402
from engine.service.service import EngineService  # noqa: E402
from engine.serving.limits import Limits  # noqa: E402
from engine.core.records import DecodeRecord, DoneRecord  # noqa: E402

PROMPT = "Write a short story about a lighthouse keeper."


def engine_round(svc, tokens: int) -> dict:
    request = GenerationRequest(PROMPT, max_new_tokens=tokens, temperature=0.0)
    ids = encode_prompt(svc.lm, request)
    limits = svc.limits
    policy, _ = capture_policy(svc.spec, len(ids), tokens, True, limits.max_capture_bytes, limits.max_capture_layers,
                               svc.dtype.itemsize)
    t0 = time.perf_counter()
    records = list(svc.submit(request, policy).records())
    wall = time.perf_counter() - t0
    steps = [r.seconds for r in records if isinstance(r, DecodeRecord)]
    done = records[-1]
    assert isinstance(done, DoneRecord), done
    return {"decode_tok_s": len(steps) / sum(steps), "wall_s": wall, "tokens": done.generated_tokens}


def engine_service():
    """The model loaded as the server loads it (in a passing thread, engine.core.openmp), served in this process
    with the device's limits, its run store in a folder of its own (not the user's)."""
    os.environ.setdefault("PLAYGROUND_RUNS_DIR", tempfile.mkdtemp(prefix="page-speed-runs-"))
    lm = in_passing_thread(lambda: load_model("default"))
    return EngineService(lm, Limits.for_device(lm.device).with_env())


def page_round(browser, url: str, tokens: int, paused: float = 0.0) -> dict:
    """Generate on the journey page; `paused` > 0: the browser's processes stopped (SIGSTOP) from half a second
    after the click for that many seconds, so the server streams to a browser that draws nothing meanwhile (as
    when the browser is on another machine), then let go to draw the end (its wall time is then not a reading)."""
    context, page = prepare(browser, url, PROMPT, tokens)
    try:
        generate_button(page).click()
        t0 = time.perf_counter()
        if paused:
            time.sleep(0.5)
            with stopped(browser_processes()):
                time.sleep(paused)
        page.get_by_text("Done:", exact=False).first.wait_for(timeout=600_000)
        wall = time.perf_counter() - t0
        rate = page.get_by_test_id("stMetric").filter(has_text="Decode speed").get_by_test_id("stMetricValue")
        text = rate.first.inner_text()                                       # e.g. "14.2 tok/s"
        generated = page.get_by_test_id("stMetric").filter(has_text="Generated tokens")
        return {"decode_tok_s": float(text.split()[0].replace(",", "")), "wall_s": wall,
                "tokens": int(generated.get_by_test_id("stMetricValue").first.inner_text().replace(",", ""))}
    finally:
        context.close()


def browser_processes() -> list:
    """This bench's Chromium processes (descendants of this process through Playwright's driver)."""
    import psutil

    return [p for p in psutil.Process().children(recursive=True) if "chrom" in p.name().lower()]


@contextlib.contextmanager
def stopped(processes: list):
    for p in processes:
        p.suspend()
    try:
        yield
    finally:
        for p in processes:
            try:
                p.resume()
            except Exception:  # noqa: BLE001 - gone meanwhile
                pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    run = provenance.start("page_speed", argv)
    from playwright.sync_api import sync_playwright

    svc = engine_service()
    engine_round(svc, 4)                                                      # warm-up
    rounds = []
    proc, url = start_app({}, [])                                              # as `make run` starts it
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page_round(browser, url, 4)                                       # warm-up: the server loads the model
            for r in range(args.rounds):
                e = engine_round(svc, args.tokens)
                rounds.append({"engine": e, "page": page_round(browser, url, args.tokens),
                               "page, browser paused": page_round(browser, url, args.tokens,
                                                                  paused=max(4.0, 3 * e["wall_s"]))})
                pg, still = rounds[-1]["page"], rounds[-1]["page, browser paused"]
                print(f"round {r + 1}: engine {e['decode_tok_s']:.1f} tok/s, {e['wall_s']:.1f} s; page "
                      f"{pg['decode_tok_s']:.1f} tok/s, {pg['wall_s']:.1f} s; page with the browser paused "
                      f"{still['decode_tok_s']:.1f} tok/s", flush=True)
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        svc.close()
    med = {side: {k: statistics.median(r[side][k] for r in rounds) for k in ("decode_tok_s", "wall_s")}
           for side in ("engine", "page", "page, browser paused")}
    report = {"what": f"journey page vs engine, {args.tokens} new tokens, the page's capture policy, "
                      f"{args.rounds} interleaved rounds (medians)", "load_average": os.getloadavg(),
              "rounds": rounds, "median": med,
              "decode_ratio_page_to_engine": med["page"]["decode_tok_s"] / med["engine"]["decode_tok_s"],
              "wall_ratio_engine_to_page": med["engine"]["wall_s"] / med["page"]["wall_s"],
              "decode_ratio_paused_page_to_engine": med["page, browser paused"]["decode_tok_s"]
              / med["engine"]["decode_tok_s"]}
    print(f"decode: page {report['decode_ratio_page_to_engine']:.2f}x the engine, with the browser paused while it "
          f"streams {report['decode_ratio_paused_page_to_engine']:.2f}x; end to end: the page takes "
          f"{1 / report['wall_ratio_engine_to_page']:.2f}x the engine's time")
    return write_report(report, run)


if __name__ == "__main__":
    sys.exit(main())
