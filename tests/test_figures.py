"""Every measured figure the README and docs quote is read here from the results file it names: the suite fails when
the text and the file disagree (issue 49). One entry per sentence or table row: the document, the results file, the
text as the document words it with a format field where each figure goes, and the figures as the file holds them.
Whitespace is compared loosely (paragraphs wrap); everything else must match to the last character."""
from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any, Callable

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
README, SERVING, PROJECTION, ENGINE_DOC = "README.md", "docs/serving.md", "docs/projection.md", "docs/engine.md"
MIB = 2**20


@cache
def doc(name: str) -> str:
    return squash((ROOT / name).read_text())


@cache
def result(name: str) -> Any:
    return json.loads((RESULTS / name).read_text())


def squash(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def one(rows: list[dict], **match: Any) -> dict:
    found = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    assert len(found) == 1, (match, len(found))
    return found[0]


def span(values: list[float]) -> tuple[float, float]:
    return min(values), max(values)


# --- the getters: each reads one file's figures in the order its sentence quotes them ----------------------------

def spec(d: dict, draft: str, prompts: tuple[str, ...], key: str) -> list[float]:
    return [r[key] for r in d["runs"] if r["draft"] == draft and r["prompt"] in prompts]


def spec_ngram_copy(d: dict) -> tuple:
    rows = [one(d["runs"], draft="ngram", prompt="copy", k=k) for k in (2, 4, 6)]
    return (*[100 * r["acceptance"] for r in rows], *[r["tokens_per_pass"] for r in rows],
            *[r["speedup"] for r in rows])


def spec_ngram_other(d: dict) -> tuple:
    both = ("code", "question")
    return (*[100 * v for v in span(spec(d, "ngram", both, "acceptance"))],
            max(spec(d, "ngram", both, "tokens_per_pass")), *span(spec(d, "ngram", both, "speedup")))


def spec_early_exit(d: dict) -> tuple:
    every = ("code", "copy", "question")
    eight, twenty = "early-exit:8", "early-exit:20"
    return (*[100 * v for v in span(spec(d, eight, every, "acceptance"))],
            *[100 * v for v in span(spec(d, twenty, every, "acceptance"))],
            max(spec(d, eight, every, "tokens_per_pass")), max(spec(d, twenty, every, "tokens_per_pass")),
            *span(spec(d, eight, every, "speedup") + spec(d, twenty, every, "speedup")))


def spec_qwen(d: dict) -> tuple:
    rows = [one(d["qwen"]["runs"], k=k) for k in (2, 4, 6)]
    return (*[100 * r["acceptance"] for r in rows], *[r["tokens_per_pass"] for r in rows],
            *[r["speedup"] for r in rows])


def soak_counts(d: dict) -> tuple:
    k = d["kinds"]
    return (d["lost"], d["finished_runs"] - d["lost"], d["finished_runs"], k["api"]["asked"], k["api"]["served"],
            k["api"]["refused"], k["api"]["failed"], k["generate"]["asked"], k["generate"]["served"],
            k["generate"]["refused"], k["generate"]["failed"], k["stop"]["asked"], k["stop"]["served"],
            k["stop"]["refused"], k["stop"]["failed"], k["reload"]["asked"], k["open_recording"]["asked"])


def soak_back(d: dict) -> tuple:
    p95 = [v[w] for v in d["p95_ttft_api_s"].values() for w in ("before", "after")]
    return (d["back_after_s"]["web-1"][0], d["back_after_s"]["model-server"][0], *span(p95))


def soak_memory(d: dict) -> tuple:
    rss = d["rss_mb"]
    web = [rss[t][w] for t in ("ready", "end") for w in ("web-1", "web-2")]
    return (rss["ready"]["model-server"] * MIB / 1e9, rss["end"]["model-server"] * MIB / 1e9,
            rss["ready"]["model-server"], rss["end"]["model-server"], min(web) * MIB / 1e6, max(web) * MIB / 1e6)


def load_row(tokens: int) -> Callable[[dict], tuple]:
    def get(d: dict) -> tuple:
        one_, many = (one(d["scenarios"], mode=m, sessions=20, tokens_per_request=tokens)
                      for m in ("one at a time", "batched"))
        ratio = one(d["ratios"], sessions=20, tokens=tokens)
        return (one_["completion_p95_s"], many["completion_p95_s"], ratio["completion_p95_ratio"],
                one_["throughput_tok_s"], many["throughput_tok_s"], ratio["throughput_ratio"])
    return get


def load_peak(d: dict) -> tuple:
    peak = max(s["rss_peak_mb"] for s in d["scenarios"])
    return peak * MIB / 1e9, peak


def serving_load_row(tokens: int, mode: str) -> Callable[[dict], tuple]:
    """docs/serving.md's load table: 20 sessions, peak RSS from MiB to decimal GB."""
    def get(d: dict) -> tuple:
        r = one(d["scenarios"], mode=mode, sessions=20, tokens_per_request=tokens)
        return (tokens, mode, r["wait_p95_s"], r["ttft_p95_s"], r["completion_p50_s"], r["completion_p95_s"],
                r["throughput_tok_s"], r["rss_peak_mb"] * MIB / 1e9)
    return get


def serving_load_ratios(d: dict) -> tuple:
    rows = [one(d["ratios"], sessions=20, tokens=t) for t in (16, 64)]
    return (*[r["completion_p95_ratio"] for r in rows], *[r["throughput_ratio"] for r in rows])


def before_after_row(tokens: int, mode: str) -> Callable[[dict], tuple]:
    def get(d: dict) -> tuple:
        r = one(d["ratios"], tokens=tokens)
        a, b = r["after"], r["before"]
        return (a["off"][mode], a["full"][mode], a["capture_vs_off"][mode], b["capture_vs_off"][mode],
                b["full"][mode], b["off"][mode], r["off_after_vs_before"][mode])
    return get


def before_after_spread(d: dict) -> tuple:
    rounds = [d["medians"][side]["64/off"]["rounds_tok_s"]["in_process"] for side in ("before", "after")]
    return (*span(rounds[0]), *span(rounds[1]))


def api_row(tokens: int, capture: str) -> Callable[[dict], dict]:
    return lambda d: one(d["rows"], tokens=tokens, capture=capture)


def api_headline(d: dict) -> tuple:
    r16, r64 = api_row(16, "off")(d), api_row(64, "off")(d)
    return (r16["api"]["throughput_tok_s"], r16["api"]["completion_p95_s"], r64["api"]["throughput_tok_s"],
            r64["api"]["completion_p95_s"], r16["throughput_ratio"], r64["throughput_ratio"], r16["p95_ratio"],
            r64["p95_ratio"])


def api_capture(d: dict) -> tuple:
    r16, r64 = api_row(16, "full")(d), api_row(64, "full")(d)
    return r16["throughput_ratio"], r64["throughput_ratio"], r16["p95_ratio"], r64["p95_ratio"]


def api_64(d: dict) -> tuple:
    r = api_row(64, "off")(d)
    rounds = [x["throughput_tok_s"] for x in r["rounds"]["api"]]
    return r["api"]["throughput_tok_s"], r["api"]["completion_p95_s"], len(rounds), *span(rounds), \
        r["throughput_ratio"]


def scale_rows(d: dict) -> tuple:
    rows = d["measured"]["rows"]
    return tuple(one(rows, setup=s, tokens=t)["throughput_tok_s"] for s in ("one server", "1 replica", "2 replicas")
                 for t in (16, 64))


def scale_fault(d: dict) -> tuple:
    f = d["measured"]["fault"]
    return f["request_failed_s"], f["shown_missing_s"], f["replacement_s"]


def scale_projected(d: dict) -> tuple:
    n = d["projected"]["fewest_replicas_meeting_targets"]
    return n, one(d["projected"]["rows"], replicas=n)["dollars_per_hour"]


def room_modes(d: dict) -> tuple:
    return tuple(d["modes"][m]["ratio_last_to_alone"] for m in ("batched", "remote", "remote, 2 web processes"))


def room_lean(d: dict) -> tuple:
    ratios = lambda side: [r["modes"]["batched"]["ratio_last_to_alone"] for r in d[side]]  # noqa: E731
    return (*ratios("after"), *ratios("before"))


def watch(d: dict) -> tuple:
    return (d["followers"], d["browser_followers"], d["presenter_done_s"], d["stream_lag_p95_s"],
            d["counts_not_shown"], d["page_lag_max_s"])


def serving_watch(d: dict) -> tuple:
    return (d["presenter_done_s"], d["stream_lag_p95_s"], d["lag_p50_p95_chromium_followers_s"][1],
            d["lag_p50_p95_browserless_followers_s"][1], d["stream_lag_max_s"],
            d["page_never_drawn_in_120_s"] + d["never_done_in_120_s"], d["followers"], d["done_lag_max_s"],
            d["page_lag_p50_s"], d["page_lag_max_s"], d["cpu_seconds"]["server"])


def gpu_eager_steps(d: dict) -> tuple:
    """The eager decode step on the H200: (median completion - median TTFT) / the steps after the first token, at
    1 and 30 sessions with capture off."""
    def step(n: int) -> float:
        r = one(d["scenarios"], sessions=n, capture="off")
        return 1e3 * (r["completion_p50_s"] - r["ttft_p50_s"]) / (r["tokens"] / n - 1)
    return step(1), step(30)


def vs_row(key: str, scale: float = 1.0) -> Callable[[dict], tuple]:
    def get(d: dict) -> tuple:
        t = d["table"]
        return tuple(scale * t[s][key] for s in ("vllm", "ours")) + (t["ours_over_vllm"][key],) + \
            (scale * t["before"][key],)
    return get


def vs_alone(d: dict) -> tuple:
    t = d["table"]
    pair = lambda s: (t[s]["alone_itl_ms"], t[s]["alone_gap_median_ms"])  # noqa: E731
    r = t["ours_over_vllm"]
    return (*pair("vllm"), *pair("ours"), r["alone_itl_ms"], r["alone_gap_median_ms"], *pair("before"))


def vs_room(tokens: int) -> Callable[[dict], tuple]:
    def get(d: dict) -> tuple:
        t, tok, p95 = d["table"], f"room_{tokens}_throughput_tok_s", f"room_{tokens}_completion_p95_s"
        return (t["vllm"][tok], t["vllm"][p95], t["ours"][tok], t["ours"][p95], t["ours_over_vllm"][tok],
                t["ours_over_vllm"][p95], t["before"][tok], t["before"][p95])
    return get


def vs_by_round(d: dict) -> tuple:
    return tuple(r["ours"]["room_64"]["throughput_tok_s"] / r["vllm"]["room_64"]["throughput_tok_s"]
                 for r in d["rounds"])


def vs_agree(d: dict) -> tuple:
    return d["vllm_answers_equal_ours"]["16"], d["vllm_answers_equal_ours"]["64"]


def vs_earlier(d: dict) -> tuple:
    r = d["table"]["ours_over_vllm"]
    return r["alone_itl_ms"], r["room_16_throughput_tok_s"], r["room_64_throughput_tok_s"], r["prefill_s"]


def vs_fair_answers(d: dict) -> tuple:
    ours, vllm = d["answers"]["ours"], d["answers"]["vllm"]
    rounds = len(d["rounds"])
    return (ours["16"]["wrong"], ours["16"]["answers"], ours["64"]["wrong"], ours["64"]["answers"],
            len(d["prompts"]["room"]), len(set(d["prompts"]["room"])), rounds, vllm["16"]["equal_ours"],
            vllm["16"]["answers"], vllm["64"]["equal_ours"], vllm["64"]["answers"])


def threads_room(d: dict) -> tuple:
    t = d["table"]["batched"]
    return t["auto"]["last_done_s"], t["1"]["last_done_s"]


def long_row(tokens: int) -> Callable[[dict], tuple]:
    def get(d: dict) -> tuple:
        r = one(d["rows"], tokens=tokens)
        hf = r["hf_output_attentions"]
        return (r["prefill_off_seconds"], r["prefill_on_seconds"], r["on_vs_off"], r["capture_bytes"] / 1e6,
                r["capture_bytes_per_token"] / 1e3, r["map_seconds"], r["row_seconds"], r["summaries_seconds"],
                hf["seconds"], hf["bytes"] / 1e9)
    return get


def long_8192(d: dict) -> tuple:
    r = one(d["rows"], tokens=8192)
    return (r["prefill_off_seconds"], r["prefill_on_seconds"], r["on_vs_off"], r["capture_bytes"] / 1e6,
            r["capture_bytes_per_token"] / 1e3, r["map_seconds"], r["rebuilt_map_seconds"], r["row_seconds"],
            r["summaries_seconds"], r["hf_output_attentions"]["bytes_needed"] / 1e9)


def gpu_row(*names: str) -> Callable[[dict], tuple]:
    def get(d: dict) -> tuple:
        runs = [d["runs"][n] for n in names]
        return (*[r["decode_tok_s"] for r in runs], *[100 * r["of_projected_ceiling"] for r in runs])
    return get


def gpu_rows_ratio(d: dict) -> tuple:
    rows, off = d["runs"]["fast-rows"], d["runs"]["fast-off"]
    return rows["decode_tok_s"], rows["decode_tok_s"] / off["decode_tok_s"], 100 * rows["of_projected_ceiling"]


def gpu_rest(d: dict) -> tuple:
    p, c = d["prefill"], d["ceilings"]
    return (p["fast_s"] * 1e3, c["projected_prefill_s"] * 1e3, p["fast_s"] / c["projected_prefill_s"],
            d["batch"]["total_tok_s"], d["memory"]["weights"] / 1e9)


def gpu_measured_share(d: dict) -> tuple:
    return (100 * d["runs"]["fast-off"]["of_measured_ceiling"],)


def gpu_projection_decode(d: dict) -> tuple:
    off, roof = d["runs"]["fast-off"], d["ceilings"]["measured_roof"]
    return (off["decode_tok_s"], 100 * off["of_measured_ceiling"], roof["bandwidth"] / 1e12,
            100 * off["of_projected_ceiling"], roof["peak_flops"] / 1e12)


def gpu_load(d: dict) -> tuple:
    rows = lambda capture: [one(d["scenarios"], sessions=n, capture=capture) for n in (1, 10, 30)]  # noqa: E731
    return tuple(r["throughput_tok_s"] for c in ("off", "full") for r in rows(c))


def gpu_wrong(d: dict) -> tuple:
    at = lambda n: one(d["scenarios"], sessions=n, capture="off")  # noqa: E731
    return at(10)["wrong_answers"], at(10)["served"], at(30)["wrong_answers"], at(30)["served"]


def engine_row(name: str, ratio: str | None) -> Callable[[dict], tuple]:
    def get(d: dict) -> tuple:
        r = d["runs"][name]
        head = (r["decode_tok_s"],) + ((d["ratios"][ratio],) if ratio else ())
        return head + (r["prefill_tok_s"], r["ttft_s"] * 1e3, r["effective_bandwidth_gb_s"])
    return get


# --- the table: (document, results file, the text with its format fields, the figures) ---------------------------

def timings_memory(d: dict) -> tuple:
    """A timeline's memory (per step, rounded as the text rounds it; per answer) and the bookkeeping's share, in %."""
    mem = {m["tokens"]: m for m in d["memory"]}
    share = {s["tokens"]: s["bookkeeping_share_of_step_time"] for s in d["share"]}
    per_step = round(sum(m["record_bytes_per_step"] for m in mem.values()) / len(mem), -2)
    story_step = round(sum(m["story_json_bytes_per_step"] for m in mem.values()) / len(mem), -1)
    return (per_step, mem[16]["record_bytes_max"] / 1e3, mem[64]["record_bytes_max"] / 1e3, story_step,
            mem[16]["story_json_bytes_max"] / 1e3, mem[64]["story_json_bytes_max"] / 1e3, 100 * share[16],
            100 * share[64])


def timings_api(d: dict) -> tuple:
    """Kept against not kept through the API: the tok/s and p95 ratios, the load, the rounds' range."""
    rows = {r["tokens"]: r for r in d["rows"]}
    rounds = [x["throughput_tok_s"] for r in rows.values() for side in r["rounds"].values() for x in side]
    load = d["machine"]["load_average"]
    return (rows[16]["throughput_ratio"], rows[64]["throughput_ratio"], rows[16]["p95_ratio"], rows[64]["p95_ratio"],
            min(load), max(load), *span(rounds))


FIGURES: list[tuple[str, str, str, Callable[[Any], Any]]] = [
    (README, "speculative.json", "| n-gram lookup, k = 2 / 4 / 6 | copies a passage | {:.0f} / {:.0f} / {:.0f}% | "
     "{:.2f} / {:.2f} / {:.2f} | {:.2f}x / {:.2f}x / {:.2f}x |", spec_ngram_copy),
    (README, "speculative.json", "| n-gram lookup | code / open question | {:.0f}-{:.0f}% | up to {:.1f} | "
     "{:.1f}x-{:.1f}x |", spec_ngram_other),
    (README, "speculative.json", "| early exit after 8 / 20 of 30 layers | all | {:.0f}-{:.0f}% / {:.0f}-{:.0f}% | "
     "~{:.1f} / up to {:.1f} | {:.1f}x-{:.1f}x (slower) |", spec_early_exit),
    (README, "speculative.json", "| Qwen2.5-Coder 0.5B for 1.5B, k = 2 / 4 / 6 | code | {:.0f} / {:.0f} / {:.0f}% | "
     "{:.2f} / {:.2f} / {:.2f} | {:.2f}x / {:.2f}x / {:.2f}x |", spec_qwen),
    (README, "soak_hosted.json", "**lost {}** ({:,} of {:,} finished runs opened by id at the end), **no failure "
     "outside a fault**. {:,} API answers ({:,} served, {} refused with a 503 and Retry-After, {} cut off by the model "
     "server's kill), {:,} generations on the pages ({:,} served, {} refused with the restart line, {} cut off at the "
     "kills, each with its line), {} Stops ({} served, {} refused with the restart line, {} cut off at the kills), {} "
     "reloads and {} recordings opened, all served", soak_counts),
    (README, "soak_hosted.json", "back after {:.1f} s (web process) and {:.1f} s (model server); p95 API time to first "
     "token {:.2f}-{:.2f} s before and after every fault", soak_back),
    (README, "soak_hosted.json", "disk-full window served all {:,} of its requests",
     lambda d: (sum(k.get("served", 0) for k in d["windows"]["after: fill the run store's disk"].values()),)),
    (README, "soak_hosted.json", "The model server's memory: {:.2f} GB ready, {:.2f} GB at the end ({:,.1f} and "
     "{:,.1f} MiB; restarted once); web processes {:.0f} -> {:.0f} MB", soak_memory),
    (README, "load.json", "| 16 new tokens | {:.1f} s | {:.1f} s | {:.2f} | {:.1f} | {:.1f} | {:.1f}x |",
     load_row(16)),
    (README, "load.json", "| 64 new tokens | {:.1f} s | {:.1f} s | {:.2f} | {:.1f} | {:.1f} | {:.1f}x |",
     load_row(64)),
    (README, "load.json", "peak memory was {:.2f} GB ({:,.1f} MiB", load_peak),
    (README, "page_speed.json", "The journey page decodes at {:.2f}x the engine",
     lambda d: (d["decode_ratio_page_to_engine"],)),
    (README, "room_browser-2026-11-27-lean.json", "the last of six finished {:.2f}x and {:.2f}x after one alone "
     "(before the lean batch step: {:.2f}x and {:.2f}x", room_lean),
    (README, "watch.json", "watched live by {} followers ({} of them Chromium tabs, the rest browserless protocol "
     "clients) finished in {:.1f} s, the stream {:.2f} s behind at p95 (target under 1 s), {} counts never shown; "
     "the finished run's whole page reached every follower within {:.1f} s", watch),
    *[(README, "before_after.json", f"| {t} new tokens, {label} | {{:.1f}} | {{:.1f}} | **{{:.2f}}x** | {{:.2f}}x "
       "({:.1f} against {:.1f}) | {:.2f}x |", before_after_row(t, mode))
      for t in (16, 64) for mode, label in (("in_process", "in-process"), ("api", "through the API"))],
    (README, "before_after.json", "(64 tokens in-process: before {:.1f}-{:.1f}, after {:.1f}-{:.1f} tok/s;",
     before_after_spread),
    (README, "api.json", "**{:.1f} tok/s at 16 new tokens (p95 {:.2f} s)** and at 64 tokens **{:.1f} tok/s (p95 "
     "{:.2f} s)**; the API keeps {:.2f}x / {:.2f}x of the same load in-process (p95 {:.2f}x / {:.2f}x)",
     api_headline),
    (README, "api.json", "with the pages' capture **{:.2f}x / {:.2f}x (p95 {:.2f}x / {:.2f}x)**", api_capture),
    (README, "api-64-off.json", "a second run at 64 tokens, captures off, made {:.1f} tok/s (p95 {:.2f} s; median of "
     "{} rounds, {:.1f} to {:.1f}), {:.2f}x of in-process", api_64),
    (README, "scale.json", "one server {:.1f} / {:.1f} tok/s, one replica {:.1f} / {:.1f}, two replicas {:.1f} / "
     "{:.1f}", scale_rows),
    (README, "scale.json", "fails its request in {:.2f} s, is shown missing at {:.1f} s and replaced at {:.1f} s",
     scale_fault),
    (README, "scale.json", "need {} H100 replicas for a p95 first token under 1 s (${:.0f}/h", scale_projected),
    (README, "room_browser.json", "last of six finished {:.2f}x after one alone in-process, {:.2f}x with the app a "
     "client of the model server, {:.2f}x with two web processes", room_modes),
    (README, "vs_vllm-2026-11-27-lean.json", "| one person alone, 96 tokens: inter-token latency (mean / median gap) | "
     "{:.1f} / {:.1f} ms | **{:.1f} / {:.1f} ms** | **{:.2f}x / {:.2f}x** | {:.1f} / {:.1f} ms |", vs_alone),
    (README, "vs_vllm-2026-11-27-lean.json", "| one person alone: time to first token | {:.2f} s | **{:.2f} s** | "
     "**{:.2f}x** | {:.2f} s |", vs_row("alone_ttft_s")),
    *[(README, "vs_vllm-2026-11-27-lean.json", f"| 20 sessions, {t} new tokens: total tok/s (p95 completion) | "
       "{:.1f} ({:.2f} s) | **{:.1f} ({:.2f} s)** | **{:.2f}x** ({:.2f}x) | {:.1f} ({:.2f} s) |", vs_room(t))
      for t in (16, 64)],
    (README, "vs_vllm-2026-11-27-lean.json", "| a 2,048-token prompt: prefill | {:.1f} s | **{:.1f} s** | **{:.2f}x** "
     "| {:.1f} s |", vs_row("prefill_s")),
    (README, "vs_vllm-2026-11-27-lean.json", "By round the 64-token room read {:.2f}x, {:.2f}x and {:.2f}x of vLLM",
     vs_by_round),
    (README, "vs_vllm-2026-11-27-lean.json", "{} of 30 at 16 tokens and {} of 30 at 64", vs_agree),
    (README, "room_browser_threads.json", "six browser sessions pressing Generate together finished in {:.1f} s "
     "against {:.1f} s with one thread fixed", threads_room),
    (README, "room_browser_threads-d3d922d.json", "and {:.1f} s with two, the day's run before",
     lambda d: (d["table"]["batched"]["2"]["last_done_s"],)),
    (README, "vs_vllm-2026-11-27-tuner.json", "one alone through the API got its tokens at {:.2f}x the time of two "
     "threads fixed", lambda d: (d["table"]["ours_over_threads-2"]["alone_itl_ms"],)),
    (README, "vs_vllm-2026-11-27.json", "alone {:.2f}x ITL, rooms {:.2f}x / {:.2f}x, prefill {:.2f}x;", vs_earlier),
    (README, "vs_vllm-2026-11-26.json", "alone {:.2f}x, rooms {:.2f}x / {:.2f}x, prefill {:.2f}x.", vs_earlier),
    (README, "vs_vllm/20261127T174213Z-65aea69.json", "every answer of ours equalled the same prompt alone ({} wrong of "
     "{} at 16 tokens and {} of {} at 64: {} sessions with {} prompts, {} rounds), and {} of {} of vLLM's room answers "
     "at 16 tokens and {} of {} at 64 equalled ours alone", vs_fair_answers),
    (README, "vs_vllm/20261127T174213Z-65aea69.json", "load average {:.1f} at its start",
     lambda d: (d["provenance"]["machine"]["load_avg"][0],)),
    (README, "vs_vllm/20261127T174213Z-65aea69.json", "vLLM's compute worker could run on core {} only, ours on both",
     lambda d: (*one(d["settings"]["vllm"]["processes"], name="VLLM::Worker")["cores"],)),
    (README, "vs_vllm/20261127T174213Z-65aea69.json", "ours made {:.2f}x / {:.2f}x of its room's tok/s at 16 / 64 "
     "tokens and took {:.2f}x its inter-token latency alone on new prompts ({:.2f}x on the repeated prompt)",
     lambda d: tuple(d["table"]["ours_over_vllm"][k] for k in ("room_16_throughput_tok_s", "room_64_throughput_tok_s",
                                                               "alone_itl_ms", "alone_repeated_itl_ms"))),
    (README, "long_context.json", "| 512 | {:.2f} / {:.2f} s | {:.2f}x | {:.1f} MB ({:.0f} KB) | {:.2f} s | - | "
     "{:.3f} s | {:.1f} s | {:.1f} s, {:.2f} GB |", long_row(512)),
    (README, "long_context.json", "| 2,048 | {:.2f} / {:.2f} s | {:.2f}x | {:.1f} MB ({:.0f} KB) | {:.2f} s | - | "
     "{:.3f} s | {:.1f} s | {:.1f} s, {:.2f} GB |", long_row(2048)),
    (README, "long_context.json", "| 8,192 | {:.1f} / {:.1f} s | **{:.2f}x** (target 1.5x) | **{:.0f} MB** ({:.0f} "
     "KB; target 1 GB) | **{:.2f} s** (target 1 s) | {:.1f} s (2 layers) | {:.2f} s | {:.0f} s | does not fit "
     "({:.1f} GB of maps) |", long_8192),
    (README, "gpu.json", "| of the H200's projected ceiling ({:.1f} tok/s) |",
     lambda d: (d["ceilings"]["projected_decode_tok_s"],)),
    (README, "gpu.json", "| HF `generate`, dynamic cache | {:.1f} | {:.0f}% |", gpu_row("hf")),
    (README, "gpu.json", "| engine, capture off / every layer's attention row | {:.1f} / {:.1f} | {:.0f}% / {:.0f}% |",
     gpu_row("engine-off", "engine-rows")),
    (README, "gpu.json", "| fast path (CUDA graph), capture off | **{:.1f}** (target 150) | **{:.0f}%** (target "
     "70%) |", gpu_row("fast-off")),
    (README, "gpu.json", "| fast path, attention rows | {:.1f} (**{:.2f}x** of off; target 0.8x) | {:.0f}% |",
     gpu_rows_ratio),
    (README, "gpu.json", "A 2,048-token prefill took {:.1f} ms against a projected compute-bound {:.1f} ms ({:.2f}x; "
     "target 1.5x); the eager batch of 30 in `engine/lab/batching.py` made {:.0f} tok/s. `torch.cuda` counted the "
     "weights at {:.3f} GB", gpu_rest),
    (README, "gpu.json", "{:.0f}% of the ceiling its own copy benchmark measured", gpu_measured_share),
    (README, "gpu-load.json", "**{:.1f} / {:.1f} / {:.1f} tok/s** at 1 / 10 / 30 sessions with captures off ({:.1f} / "
     "{:.1f} / {:.1f} with the page's capture)", gpu_load),
    (README, "gpu-load.json", "`wrong_answers` {} of {} at 10 sessions and {} of {} at 30", gpu_wrong),
    (PROJECTION, "gpu.json", "decoded at {:.1f} tok/s, {:.0f}% of the ceiling its own copy benchmark measured on "
     "that card ({:.2f} TB/s) and {:.0f}% of the spec sheet's 4.8 TB/s; its largest bf16 matmul reached {:.0f} TFLOP/s",
     gpu_projection_decode),
    (PROJECTION, "gpu.json", "a 2,048-token prefill took {:.1f} ms against {:.1f} ms at the full peak ({:.2f} of it)",
     lambda d: (d["prefill"]["fast_s"] * 1e3, d["ceilings"]["projected_prefill_s"] * 1e3,
                d["ceilings"]["projected_prefill_s"] / d["prefill"]["fast_s"])),
    (SERVING, "before_after-664a7cc.json", "| 16 | in-process | {:.1f} | {:.1f} | **{:.2f}x** | {:.1f}, {:.1f}, "
     "{:.2f}x |", lambda d: before_after_row(16, "in_process")(d)[:3] + _before(d, 16, "in_process")),
    (SERVING, "before_after-664a7cc.json", "| 16 | API | {:.1f} | {:.1f} | **{:.2f}x** | {:.1f}, {:.1f}, {:.2f}x |",
     lambda d: before_after_row(16, "api")(d)[:3] + _before(d, 16, "api")),
    (SERVING, "before_after-664a7cc.json", "| 64 | in-process | {:.1f} | {:.1f} | **{:.2f}x** | {:.1f}, {:.1f}, "
     "{:.2f}x |", lambda d: before_after_row(64, "in_process")(d)[:3] + _before(d, 64, "in_process")),
    (SERVING, "before_after-664a7cc.json", "| 64 | API | {:.1f} | {:.1f} | **{:.2f}x** | {:.1f}, {:.1f}, {:.2f}x |",
     lambda d: before_after_row(64, "api")(d)[:3] + _before(d, 64, "api")),
    (SERVING, "before_after-f71789f.json", "the first measurement gave {:.2f}x and {:.2f}x at 16 tokens (in-process, "
     "API) and {:.2f}x and {:.2f}x at 64", lambda d: _capture_ratios(d)),
    (SERVING, "before_after-f3f6051.json", "main f3f6051 measured {:.2f}x, {:.2f}x, {:.2f}x and {:.2f}x",
     lambda d: _capture_ratios(d)),
    (SERVING, "before_after.json", "Three rounds on main d3d922d (2026-11-27) gave {:.2f}x, {:.2f}x, {:.2f}x and "
     "{:.2f}x", lambda d: _capture_ratios(d)),
    *[(SERVING, "load.json", "| {} | {} | {:.1f} s | {:.1f} s | {:.1f} / {:.1f} s | {:.1f} | {:.1f} GB |",
       serving_load_row(t, m)) for t in (16, 64) for m in ("one at a time", "batched")],
    (SERVING, "load.json", "Batched against one at a time: p95 completion {:.2f}x (16 tokens) and {:.2f}x (64 "
     "tokens), total tok/s {:.1f}x and {:.1f}x", serving_load_ratios),
    (SERVING, "watch.json", "| the presenter's run | {:.1f} s | | stream lag p95 (Chromium / browserless) | {:.2f} s "
     "({:.2f} / {:.2f} s) | | stream lag max | {:.2f} s | | followers whose page went blank or never drew | {} of {} | "
     "| \"Done\" shown after the presenter's | {:.2f} s at most | | the finished run's whole page drawn | {:.1f} s p50, "
     "{:.1f} s max | | server CPU-s over the run | {:.1f} |", serving_watch),
    (SERVING, "gpu-load.json", "the runner's eager decode step took {:.0f} ms for one request and {:.0f} ms for thirty",
     gpu_eager_steps),
    (ENGINE_DOC, "gpu-load.json", "{:.0f} ms for one request and {:.0f} ms for thirty", gpu_eager_steps),
    (SERVING, "api.json", "**{:.1f} tok/s, p95 {:.2f} s at 16 tokens** and at 64 tokens **{:.1f} tok/s, p95 {:.2f} s**;",
     lambda d: api_headline(d)[:4]),
    (SERVING, "timings-share.json", "**about {:.0f} bytes per step** in a batch of 20 (the row ids dominate), {:.1f} kB "
     "for a 16-token answer and **{:.1f} kB for a 64-token one**; its story, about {:.0f} bytes of JSON per step, "
     "{:.1f} kB and {:.1f} kB. The bookkeeping's own time (recording each step into the timelines, taking each request "
     "apart at its end, building its story) was **{:.3f}% and {:.3f}% of the steps' time**", timings_memory),
    (SERVING, "timings/20261127T203911Z-8775728.json", "a timeline at most {:.1f} kB and {:.1f} kB, its story {:.1f} kB "
     "and {:.1f} kB, the bookkeeping **{:.3f}% and {:.3f}% of the steps' time**",
     lambda d: (*timings_memory(d)[1:3], *timings_memory(d)[4:])),
    (SERVING, "timings/20261127T202516Z-b836e70.json", "took {:.3f}% and {:.3f}%", lambda d: timings_memory(d)[6:]),
    (SERVING, "timings.json", "{:.2f}x tok/s at 16 new tokens and {:.2f}x at 64 (p95 {:.2f}x and {:.2f}x), on a "
     "machine shared with other work (load average {:.0f} to {:.0f} on 2 cores, rounds of {:.0f} to {:.0f} tok/s",
     timings_api),
    (SERVING, "api-64-off.json", "a second run at 64 tokens made {:.1f} tok/s (p95 {:.2f} s, median of {} rounds;",
     lambda d: api_64(d)[:3]),
]


def _before(d: dict, tokens: int, mode: str) -> tuple:
    b = one(d["ratios"], tokens=tokens)["before"]
    return b["off"][mode], b["full"][mode], b["capture_vs_off"][mode]


def _capture_ratios(d: dict) -> tuple:
    return tuple(one(d["ratios"], tokens=t)["after"]["capture_vs_off"][m] for t in (16, 64)
                 for m in ("in_process", "api"))


def invariance(d: dict) -> tuple:
    off, on = d["forward_off"], d["forward_on"]
    return (d["provenance"]["machine"]["load_avg"][0], off["decode alone vs in a batch of 32"]["max_abs_diff"],
            off["prefill whole vs chunks of 64"]["max_abs_diff"], off["prefix K/V reused vs prefilled whole"]["max_abs_diff"],
            sum(v["equal"] for v in on.values()) if all(v["equal"] for v in on.values()) else -1)


def _invariance_cost(d: dict) -> tuple:
    c = d["cost"]
    return (d["provenance"]["machine"]["load_avg"][0], c["lone decode step"]["on_over_off"],
            c["20-row decode step"]["on_over_off"], c["prefill"]["on_over_off"])


FIGURES.append((ENGINE_DOC, "invariance/20261127T215039Z-bd5d8b0.json", "load average {:.0f} at its start; medians "
                "of 5 rounds; `bench/results/invariance/20261127T215039Z-bd5d8b0.json`): a lone decode step {:.2f}x, a "
                "20-row decode step {:.2f}x, a 512-token prefill {:.2f}x the time with the usual kernels.",
                _invariance_cost))
FIGURES.append((README, "invariance/20261127T210847Z-c42722a.json", "load average {:.0f} at its start; "
                "`bench/results/invariance/20261127T210847Z-c42722a.json`): with the usual kernels a request's logits "
                "decoded as one row of a batch of 32 differed from the same request alone by up to {:.1e}, a 300-token "
                "prompt prefilled in chunks of 64 from the same prompt whole by up to {:.1e}, and a prompt after a "
                "reused prefix by up to {:.1e}; with `PLAYGROUND_INVARIANT=on` (docs/engine.md, \"Same question, same "
                "numbers\") all {} of its comparisons were bitwise equal.", invariance))


ENGINE = [  # the engine table, from the file the README names for it
    (README, "engine.json", "| `model.generate` (reference) | {:.1f} | {:.0f} | {:.0f} ms | {:.1f} GB/s |",
     engine_row("model.generate", None)),
    (README, "engine.json", "| engine, capture off | {:.1f} (**{:.2f}x**, target 0.95x) | {:.0f} | {:.0f} ms | "
     "{:.1f} GB/s |", engine_row("engine, capture off", "capture_off_vs_generate")),
    (README, "engine.json", "| engine, every layer's attention row | {:.1f} (**{:.2f}x**, target 0.7x) | {:.0f} | "
     "{:.0f} ms | {:.1f} GB/s |", engine_row("engine, all attention rows", "full_capture_vs_generate")),
    (README, "engine.json", "decode {:.1f} to {:.1f} tok/s for `model.generate` alone):",
     lambda d: span(d["decode_rounds"]["model.generate"])),
    (README, "engine.json", "Peak memory {:.2f} GB", lambda d: (d["peak_memory_bytes"] / 1e9,)),
    (README, "speed.json", "this machine's copy benchmark measured {:.1f} GB/s on a quiet day",
     lambda d: (d["roof"]["bandwidth"] / 1e9,)),
    (README, "engine/20261127T164933Z-4667a94.json", "(load average {:.0f}, host memory read {:.1f} GB/s at its "
     "start; `bench/results/engine/20261127T164933Z-4667a94.json`) decoded at {:.1f} to {:.1f} tok/s",
     lambda d: (d["provenance"]["machine"]["load_avg"][0], d["provenance"]["machine"]["memory_bandwidth"]["read_GBps"],
                *span([v for rounds in d["decode_rounds"].values() for v in rounds]))),
]


ENGINE_DOC = "docs/engine.md"


def lone_threads(d: dict) -> tuple:
    """Two threads over one, the step's wall time: before, after (bench/lone_step.py)."""
    return tuple(d[f"{w}-2"]["wall_ms"] / d[f"{w}-1"]["wall_ms"] for w in ("before", "after"))


def lone_row(key: str) -> Callable[[dict], tuple]:
    ways = ("before-1", "after-1", "before-2", "after-2")
    return lambda d: tuple(d[w][key] for w in ways)


LONE_RUNS = {"20261127T200909Z-57330df": "default: spin", "20261127T201330Z-57330df": "`OMP_WAIT_POLICY=ACTIVE`",
             "20261127T201811Z-dfdf16f": "`GOMP_SPINCOUNT=10000`, a short spin",
             "20261127T201246Z-57330df": "`OMP_WAIT_POLICY=PASSIVE`", "20261127T201905Z-dfdf16f":
             "`OMP_WAIT_POLICY=PASSIVE`", "20261127T202139Z-8048acf": "`OMP_WAIT_POLICY=PASSIVE`"}
LONE_FINAL = "lone_step/20261127T202139Z-8048acf.json"
LONE = [  # docs/engine.md, "Two threads, and why they were ten times slower" and "How near the floor"
    *[(ENGINE_DOC, f"lone_step/{run}.json", f"| {label} (`{run}.json`) | {{:.2f}}x | {{:.2f}}x |", lone_threads)
      for run, label in LONE_RUNS.items()],
    (ENGINE_DOC, "lone_step/20261127T201246Z-57330df.json", "(timed alone: {:.1f} ms with one thread, {:.1f} ms with "
     "two, `bench/results/lone_step/20261127T201246Z-57330df.json`). The split products are one batched product per "
     "matrix whose 4 blocks torch's threads share: {:.1f} and {:.1f} ms in the same run.",
     lambda d: (d["before-1"]["products_ms"], d["before-2"]["products_ms"], d["after-1"]["products_ms"],
                d["after-2"]["products_ms"])),
    (ENGINE_DOC, LONE_FINAL, "threads) was {:.1f} ms ({:.1f} GB/s), and a lone step took:",
     lambda d: (d["floor"]["floor_ms"], d["floor"]["best_gb_s"])),
    (ENGINE_DOC, LONE_FINAL, "| the step, wall time (median) | {:.1f} ms | {:.1f} ms | {:.1f} ms | {:.1f} ms |",
     lone_row("wall_ms")),
    (ENGINE_DOC, LONE_FINAL, "| the step over the floor | {:.2f}x | {:.2f}x | {:.2f}x | {:.2f}x |",
     lone_row("x_floor")),
    (ENGINE_DOC, LONE_FINAL, "| the step, CPU time of its thread | {:.1f} ms | {:.1f} ms | {:.1f} ms | {:.1f} ms |",
     lone_row("cpu_ms")),
    (ENGINE_DOC, LONE_FINAL, "| the products timed alone (wall, fastest of 10) | {:.1f} ms | {:.1f} ms | {:.1f} ms | "
     "{:.1f} ms |", lone_row("products_ms")),
    (ENGINE_DOC, LONE_FINAL, "a lone step took {:.2f}x (one thread) and {:.2f}x (two) its time before",
     lambda d: tuple(d[f"after-{t}"]["wall_ms"] / d[f"before-{t}"]["wall_ms"] for t in (1, 2))),
    (ENGINE_DOC, LONE_FINAL, "The products alone took {:.2f}x (one thread) and {:.2f}x (two) the floor, `F.linear`'s "
     "{:.2f}x and {:.2f}x;", lambda d: tuple(d[w]["products_x_floor"] for w in ("after-1", "after-2", "before-1",
                                                                                "before-2"))),
    (ENGINE_DOC, LONE_FINAL, "{:.1f} to {:.1f} ms in this run",
     lambda d: span([d[w]["rest_ms"] for w in ("before-1", "after-1", "before-2", "after-2")])),
]


LONE.append((ENGINE_DOC, "lone_bits/20261127T211900Z-714cf7d.json", "the logits differed from `F.linear`'s by at "
             "most {:.1e} (the largest logit {:.1f}), the probabilities by at most {:.1e}, and every token was the same.",
             lambda d: (d["max_logit_diff"], d["max_abs_logit"], d["max_prob_diff"]) if d["same_tokens"] else ()))
VS_LCP = "vs_llamacpp/20261127T204932Z-6a4e018.json"


def lcp_row(side: str) -> Callable[[dict], tuple]:
    return lambda d: tuple(d["table"][side][k] for k in ("ms_per_token", "x_floor", "ttft_s"))


LONE += [  # README, "One person alone, against llama.cpp"
    (README, VS_LCP, "load average {:.1f} at its start;", lambda d: (d["provenance"]["machine"]["load_avg"][0],)),
    (README, VS_LCP, "| llama.cpp (llama-cpp-python's server, 2 threads), F32 | {:.1f} | {:.2f}x | {:.2f} s |",
     lcp_row("llama.cpp")),
    (README, VS_LCP, "| ours, `python -m engine serve` defaults | **{:.1f}** | **{:.2f}x** | **{:.2f} s** |",
     lcp_row("ours")),
    (README, VS_LCP, "| the memory floor: {:.3f} GB at {:.1f} GB/s | {:.1f} | | |",
     lambda d: (d["weight_bytes"] / 1e9, max(v for r in d["read_gb_s"] for v in r.values()), d["floor_ms"])),
    (README, VS_LCP, "answers took {:.1f} to {:.1f} ms a token by round,",
     lambda d: span(d["table"]["llama.cpp"]["per_round_ms"])),
    (README, VS_LCP, "time between steps was {:.2f} to {:.2f} ms a token",
     lambda d: span([h["between_steps_ms"] for h in d["host_work"]])),
    (README, VS_LCP, "saw were {:.1f} to {:.1f} ms a token longer than the server's decode time",
     lambda d: span([h["client_gap_ms"] - h["decode_ms"] for h in d["host_work"]])),
    (README, VS_LCP, "The two servers' answers were not the same text ({} of 6)", lambda d: (d["same_answers"],)),
]




PARTS = "lone_parts/20261127T232854Z-949acb9.json"
PARTS_RUNS = ("20261127T232854Z-949acb9", "20261127T232109Z-8e4354e", "20261127T232308Z-8e4354e")


def bare_ratio(way: str, over: str) -> Callable[[dict], tuple]:
    """One way's bare step over another's, wall and CPU (bench/lone_parts.py)."""
    return lambda d: tuple(d[way]["bare"][k] / d[over]["bare"][k] for k in ("wall_ms", "cpu_ms"))


def parts(way: str, *names: str) -> Callable[[dict], tuple]:
    return lambda d: tuple(d[way]["ms"][n] for n in names)


LONE += [  # docs/engine.md, "Where a lone step's time goes, part by part"
    (ENGINE_DOC, PARTS, "(load average {:.1f} at the start; `bench/results/lone_parts/20261127T232854Z-949acb9.json`)",
     lambda d: (d["provenance"]["machine"]["load_avg"][0],)),
    (ENGINE_DOC, PARTS, "| products: q\\|k\\|v, o, gate\\|up, down, the head | {:.2f}, {:.2f}, {:.2f}, {:.2f}, {:.2f} "
     "({:.2f} in all) |", parts("now", "qkv", "o", "gate_up", "down", "head", "products")),
    (ENGINE_DOC, PARTS, "| the 61 norms | {:.2f} |", parts("now", "norms")),
    (ENGINE_DOC, PARTS, "applied to q and k (30 layers) | {:.2f}, {:.2f} |", parts("now", "rotary table", "rotary")),
    (ENGINE_DOC, PARTS, "| attention (SDPA, 30 layers) | {:.2f} |", parts("now", "attention")),
    (ENGINE_DOC, PARTS, "| the cache's writes and reads (`kv`) | {:.2f} |", parts("now", "kv")),
    (ENGINE_DOC, PARTS, "the gated product, Python) | {:.2f} |", parts("now", "rest of the forward")),
    (ENGINE_DOC, PARTS, "| the forward | {:.2f} |", parts("now", "forward")),
    (ENGINE_DOC, PARTS, "| the host's work (the step less the forward), wall and CPU | {:.2f} and {:.2f} |",
     lambda d: (d["now"]["ms"]["host"], d["now"]["cpu"]["ms"]["host"])),
    (ENGINE_DOC, PARTS, "in the same run ({:.1f} GB/s) | {:.2f} |",
     lambda d: (d["floor"]["best_gb_s"], d["floor"]["floor_ms"])),
    (ENGINE_DOC, PARTS, "The step dispatched {:,} operator calls (torch.profiler; {:,} with q, k, v, gate and up apart)",
     lambda d: (d["now"]["operators"]["calls"], d["apart"]["operators"]["calls"])),
    (ENGINE_DOC, "lone_parts/20261128T000256Z-f97fade.json", "(`bench/results/lone_parts/20261128T000256Z-f97fade.json`"
     ", load average {:.1f} at its start): of its {:.2f} ms (wall), picking and describing the token (`pick_tokens`: "
     "the softmax over 49,152 logits,", lambda d: (d["provenance"]["machine"]["load_avg"][0], d["now"]["ms"]["host"])),
    (ENGINE_DOC, "lone_parts/20261128T000256Z-f97fade.json", "the alternatives' text) took {:.2f} ms, the logits' "
     "running sha256 {:.2f} ms and the record and the cache's bookkeeping {:.2f} ms",
     lambda d: tuple(d["now"]["ms"][f"host: {k}"] for k in ("pick and describe", "logits sha256", "the rest"))),
    (ENGINE_DOC, PARTS, "(the same step took {:.1f} ms of its thread's CPU and {:.1f} ms of wall time)",
     lambda d: (d["now"]["bare"]["cpu_ms"], d["now"]["bare"]["wall_ms"])),
    (ENGINE_DOC, PARTS, "the products are about {:.0f}% of the forward, attention (with two threads each SDPA call's "
     "parallel region wakes the second thread) about {:.0f}%, the norms, rotary, cache and the rest together about "
     "{:.0f}%, and the host's work {:.2f} ms of CPU a token",
     lambda d: (100 * d["now"]["ms"]["products"] / d["now"]["ms"]["forward"],
                100 * d["now"]["ms"]["attention"] / d["now"]["ms"]["forward"],
                100 * sum(d["now"]["ms"][k] for k in ("norms", "rotary table", "rotary", "kv", "rest of the forward"))
                / d["now"]["ms"]["forward"], d["now"]["cpu"]["ms"]["host"])),
    (ENGINE_DOC, "vs_llamacpp/20261127T225545Z-b1742df.json", "steps was {:.3f} to {:.3f} ms a token, and the gaps its "
     "streaming client saw were {:.2f} to {:.2f} ms a token longer than the server's own decode time",
     lambda d: (*span([h["between_steps_ms"] for h in d["host_work"]]),
                *span([h["client_gap_ms"] - h["decode_ms"] for h in d["host_work"]]))),
    (ENGINE_DOC, PARTS, "(run) | kept | |---|---|---| | q\\|k\\|v and gate\\|up as one split product each (\"side by "
     "side\", below) | {:.2f}x and {:.2f}x (`20261127T232854Z-949acb9.json`, 2 threads);",
     bare_ratio("now", "apart")),
    (ENGINE_DOC, "lone_parts/20261127T232109Z-8e4354e.json", "2 threads); {:.2f}x and {:.2f}x "
     "(`20261127T232109Z-8e4354e.json`, 2 threads); ", bare_ratio("now", "apart")),
    (ENGINE_DOC, "lone_parts/20261127T232308Z-8e4354e.json", "{:.2f}x and {:.2f}x (`20261127T232308Z-8e4354e.json`, "
     "1 thread) | yes |", bare_ratio("now", "apart")),
    (ENGINE_DOC, PARTS, "key heads) | {:.2f}x and {:.2f}x (`20261127T232854Z-949acb9.json`);",
     bare_ratio("one-query", "now")),
    (ENGINE_DOC, "lone_parts/20261127T232109Z-8e4354e.json", "(`20261127T232854Z-949acb9.json`); {:.2f}x and {:.2f}x "
     "(`20261127T232109Z-8e4354e.json`);", bare_ratio("one-query", "now")),
    (ENGINE_DOC, "lone_parts/20261127T232308Z-8e4354e.json", "(`20261127T232109Z-8e4354e.json`); {:.2f}x and {:.2f}x "
     "(`20261127T232308Z-8e4354e.json`) | no |", bare_ratio("one-query", "now")),
    (ENGINE_DOC, "lone_parts/20261127T235224Z-00c0f83.json", "instead of 4 | {:.2f}x, {:.2f}x, {:.2f}x wall and "
     "{:.2f}x, {:.2f}x, {:.2f}x CPU (`20261127T235224Z-00c0f83.json`, 2 threads) | no: 4 stays |",
     lambda d: tuple(d[f"parts-{n}"]["bare"][k] / d["now"]["bare"][k] for k in ("wall_ms", "cpu_ms") for n in (2, 8, 16))),
    (ENGINE_DOC, PARTS, "of the one-token forward | {:.2f}x and {:.2f}x (`20261127T232854Z-949acb9.json`; compiling took "
     "{:.1f} s) | no |", lambda d: (*bare_ratio("compiled", "now")(d), d["compile_s"])),
    (ENGINE_DOC, PARTS, "(q, k and v {:.2f} ms apart against {:.2f} together, gate and up {:.2f} against {:.2f}, in the "
     "first run above)", lambda d: (sum(d["apart"]["ms"][k] for k in "qkv"), d["now"]["ms"]["qkv"],
                                    d["apart"]["ms"]["gate"] + d["apart"]["ms"]["up"], d["now"]["ms"]["gate_up"])),
    (ENGINE_DOC, PARTS, "moved by less than this machine's noise, between {:.2f}x and {:.2f}x over three runs",
     lambda d: span([bare_ratio("now", "apart")(result(f"lone_parts/{r}.json"))[0] for r in PARTS_RUNS])),
    (ENGINE_DOC, "lone_bits/20261127T231146Z-a5572c4.json", "the logits side by side differed from the same products "
     "apart by {:.1f}, and the split products from `F.linear` by at most {:.1e} (the largest logit {:.1f}), the "
     "probabilities by at most {:.1e}, every token the same.",
     lambda d: (d["side_by_side"]["max_logit_diff"], d["max_logit_diff"], d["max_abs_logit"], d["max_prob_diff"])
     if d["same_tokens"] and d["side_by_side"]["same_tokens"] else ()),
    (ENGINE_DOC, PARTS, "It moved the step by {:.0f}% to +{:.0f}% over three runs",
     lambda d: (100 * (min(min(bare_ratio("one-query", "now")(result(f"lone_parts/{r}.json"))) for r in PARTS_RUNS) - 1),
                100 * (max(max(bare_ratio("one-query", "now")(result(f"lone_parts/{r}.json"))) for r in PARTS_RUNS) - 1))),
    (ENGINE_DOC, PARTS, "it dispatched {:,} operator calls a step and took {:.1f}x the eager step's time",
     lambda d: (d["compiled"]["operators"]["calls"], d["compiled"]["bare"]["wall_ms"] / d["now"]["bare"]["wall_ms"])),
    (ENGINE_DOC, "lone_step/20261127T231827Z-8e4354e.json", "(the floor measured at {:.1f} GB/s, load average {:.1f} at "
     "its start) the step took {:.1f}, {:.1f} and {:.1f} ms with one thread and {:.1f}, {:.1f} and {:.1f} ms with two",
     lambda d: (d["floor"]["best_gb_s"], d["provenance"]["machine"]["load_avg"][0],
                *(d[f"{w}-{t}"]["wall_ms"] for t in (1, 2) for w in ("before", "split", "after")))),
]


ENGINE_MD = "docs/engine.md"
FORWARD = [  # the one forward's round (docs/engine.md, "The one forward")
    (ENGINE_MD, "before_after/20261127T205417Z-63a755b.json", "the pages' capture made {:.2f}x (in-process) and {:.2f}x "
     "(API) of capture off's throughput on this tree, against {:.2f}x and {:.2f}x on the commit before; capture off "
     "made {:.2f}x and {:.2f}x of the commit before's, at {:.1f} tok/s in-process",
     lambda d: (*(one(d["ratios"], tokens=16)[side]["capture_vs_off"][m] for side in ("after", "before")
                  for m in MODES_), *(one(d["ratios"], tokens=16)["off_after_vs_before"][m] for m in MODES_),
                one(d["ratios"], tokens=16)["after"]["off"]["in_process"])),
    (ENGINE_MD, "before_after/20261127T205417Z-63a755b.json", "at a load average of {:.0f} at the start",
     lambda d: (d["provenance"]["machine"]["load_avg"][0],)),
]
MODES_ = ("in_process", "api")
for _run in ("20261127T212212Z-63a755b", "20261127T212522Z-63a755b", "20261127T212954Z-63a755b"):
    FORWARD.append((ENGINE_MD, f"one_forward/{_run}.json", "{:.2f}x, {:.2f}x, {:.2f}x (`" + (
        "bench/results/one_forward/" if _run.startswith("20261127T212212Z") else "") + f"{_run}.json`",
        lambda d: tuple(d["prefill"][n]["forward_vs_modules_speed"] for n in ("128", "512", "2048"))))


@pytest.mark.parametrize("entry", FIGURES + ENGINE + LONE + FORWARD, ids=lambda e: f"{e[0]}:{e[2][:40]}")
def test_the_figure_is_the_one_its_file_holds(entry):
    name, file, template, get = entry
    values = get(result(file))
    text = squash(template.format(*values))
    assert text in doc(name), f"{name} should read, from bench/results/{file}:\n{text}"
    assert Path(file).name in doc(name), f"{name} does not name bench/results/{file}"


def test_every_cited_file_records_its_commit():
    files = {e[1] for e in FIGURES + ENGINE + LONE + FORWARD}
    for file in files:
        p = result(file)["provenance"]
        assert re.fullmatch(r"[0-9a-f]{40}", p["commit"]), file
        assert p.get("reconstructed") or p["machine"]["memory_bandwidth"], file


def test_a_changed_figure_fails():
    """The check can fail: the load table's first row with one figure off by a tenth is not found."""
    name, file, template, get = next(e for e in FIGURES if e[1] == "load.json" and "| 16 new tokens |" in e[2])
    values = list(get(result(file)))
    values[0] += 0.1
    assert squash(template.format(*values)) not in doc(name)


DOCS = ("README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")))
BENCHES = tuple(p.stem for p in (ROOT / "bench").glob("*.py") if not p.stem.startswith("_"))


def cited_results(text: str) -> set[str]:
    """The results files a document names: every bench/results/<path>, and a bare <bench>[-...].json (a file named
    after one of bench/'s scripts, as the docs cite them in a table's caption); a pattern (bench/results/x-<shape>.json)
    is no file."""
    full = {m.rstrip(".,;:)`'") for m in re.findall(r"bench/results/[\w./-]+(?![\w./<-])", text)}
    bare = {m for m in re.findall(r"(?<![\w/.-])([a-z_]+(?:-[\w.-]+)?\.json)\b", text)
            if m.split("-")[0].removesuffix(".json") in BENCHES}
    return {f.removeprefix("bench/results/") for f in full} | bare


@pytest.mark.parametrize("name", DOCS)
def test_every_results_file_a_document_names_exists(name):
    missing = sorted(f for f in cited_results((ROOT / name).read_text()) if not (RESULTS / f).exists())
    assert missing == [], f"{name} names results files that are not in bench/results/: {missing}"


def test_a_document_naming_a_missing_results_file_fails():
    assert cited_results("as `bench/results/load.json` and gpu-load.json show; not france.json") == {
        "load.json", "gpu-load.json"}
    assert not (RESULTS / "load-1999.json").exists() and "load-1999.json" in cited_results("(load-1999.json)")
    assert cited_results("in bench/results/gpu-cpu-<shape>.json") == set()
