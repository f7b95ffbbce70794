"""Why was my answer slow: one request's story from the scheduler's own step log, and its time taken apart.

    timeline = handle.timeline                   # a RequestTimeline the scheduler fills as the steps run
    parts = split(timeline, one_row)             # TimeSplit: the parts of its wall time, which add up to it
    timings = timings_of(timeline, rates)        # Timings: the split, to the first token and in all, the batch sizes
                                                 # seen, who else's prefill it waited behind, and the alone estimate
    plain = timeline_dict(timeline)              # every event and step, as JSON-ready values

Every batch step the worker runs is one `StepSeen` (made once, shared by every request that lived through it: a
request's record holds references, not copies). A step is its prefill part (newcomers' prompt chunks) then its
decode pass; both are timed inside the step (engine.serving.batch.StepInfo), so what others' prefills added to a
step is counted there, not estimated. A request's wall time, submission to its end, splits into:

* queue: submitted until admitted to the batch;
* prefill: its own span of the prefill parts it ran in (`prefill_spans`: a step's prefill part laid out as its
  prompts' spans in the order they were computed, each its share of the tokens; a padded pass of several prompts
  is one computation, shared by tokens);
* decode: its rows of the decode passes at one row's pace (the first median one-row decode-only step's worth of
  each pass; a pass of one row is all its own);
* batch: what the batch's size added: its rows above one row's pace, and the others' decode passes while it was
  still prefilling or waiting for its chunk;
* others_prefill: the other newcomers' share of the prefill parts of the steps it lived through;
* between_steps: the worker's own time between those steps (admitting, settling, taking the model's lock).

Every part is a sum of overlaps of those spans with the stretch taken apart, so the split to the first token and
the split of the rest add up to the whole, part by part (the page's two lines). A stopped request's story ends at
its Stop (when the step that dropped it began). Memory: one reference per step lived through plus the shared steps
(each ~200 bytes and 8 bytes per row); see docs/serving.md.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

STOPPED = ("cancelled", "timeout")         # finish reasons that end a story at its Stop
RATE_HISTORY = 50                          # recent steps the one-row pace and the prefill rate are measured over
RESOLUTION = 1e-6                          # seconds: a story keeps its times to the microsecond (`step_dict`)


@dataclass(frozen=True, slots=True)
class StepSeen:
    """One batch step as each request in it saw it (perf_counter times)."""

    index: int                             # the scheduler's step number
    started: float
    seconds: float                         # the whole step
    prefill_seconds: float                 # of which the prefill part (0 when no newcomer prefilled)
    rows: tuple[int, ...]                  # request ids in the decode pass
    prefills: tuple[tuple[int, int], ...]  # (request id, prompt tokens computed in this step)

    @property
    def ended(self) -> float:
        return self.started + self.seconds

    def prefill_tokens(self, rid: int | None = None) -> int:
        return sum(n for r, n in self.prefills if rid is None or r == rid)


@dataclass
class RequestTimeline:
    """One request's record, filled by the scheduler's worker; plain values and shared steps only."""

    id: int
    submitted: float                       # perf_counter
    run_id: str = ""
    prompt_tokens: int = 0
    wait_reason: str = ""                  # why it waited: "" (it did not), the queue ahead, the batch full, ...
    ahead: int = 0                         # requests queued before it when it came
    waited_steps: int = 0                  # batch steps that ran while it waited
    admitted: float | None = None
    first_token: float | None = None
    stop_pressed: float | None = None      # someone (or the time limit) asked it to stop
    stopped: float | None = None           # the Stop took effect: its story ends here
    finished: float | None = None          # its stream ended (after the step it finished in)
    state: str = "queued"
    finish_reason: str = ""
    generated: int = 0
    reused_tokens: int = 0                 # prompt tokens the prefix cache supplied
    alone: bool = False                    # ran exclusively (a speculative request or a job): nobody else's steps
    steps: list[StepSeen] = field(default_factory=list)

    @property
    def end(self) -> float | None:
        """Where its story ends: its Stop, else the end of its stream."""
        return self.stopped if self.stopped is not None else self.finished


@dataclass(frozen=True)
class TimeSplit:
    """A stretch of a request's life taken apart (seconds); `total` is the stretch's length."""

    queue: float = 0.0
    prefill: float = 0.0
    decode: float = 0.0
    batch: float = 0.0
    others_prefill: float = 0.0
    between_steps: float = 0.0
    total: float = 0.0

    @property
    def parts(self) -> float:
        return self.queue + self.prefill + self.decode + self.batch + self.others_prefill + self.between_steps


@dataclass(frozen=True)
class Rates:
    """This server's measured pace: a one-row decode-only step, and prefill as seconds = per_pass + per_token x n."""

    one_row_step: float | None = None
    prefill_per_pass: float | None = None
    prefill_per_token: float | None = None
    chunk: int = 256


@dataclass(frozen=True)
class Behind:
    """Another request whose prefill ran in the steps this one lived through."""

    id: int
    tokens: int                            # its prompt tokens computed in those steps
    seconds: float                         # what they added to this request


@dataclass(frozen=True)
class Timings:
    """What a response carries (`playground.timings`): the names of the Prometheus metrics where they match."""

    run_id: str
    e2e_request_latency_seconds: float
    request_queue_time_seconds: float
    request_prefill_time_seconds: float | None     # admitted to the first token
    request_decode_time_seconds: float | None      # the first token to the end
    time_to_first_token_seconds: float | None
    split: TimeSplit                                # the whole wall time taken apart
    first_token_split: TimeSplit | None             # submission to the first token taken apart
    behind: tuple[Behind, ...]                      # others' prefills it waited behind, most time first
    batch_sizes: dict[int, int]                     # decode rows -> steps it decoded in with that many rows
    steps: int                                      # batch steps it lived through
    wait_reason: str
    alone_seconds: float | None                     # the same request on an idle server (see `alone_estimate`)
    alone_how: str
    one_row_step_seconds: float | None
    stopped: bool = False

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["batch_sizes"] = {str(k): v for k, v in self.batch_sizes.items()}
        out["behind"] = list(out["behind"])          # plain values: the same over JSON and the wire (a tuple stays one)
        return out


# --- taking the time apart -------------------------------------------------------------------------------------------

def split(tl: RequestTimeline, one_row: float | None, until: float | None = None,
          since: float | None = None) -> TimeSplit:
    """The request's life from `since` (default: its submission) to `until` (default: its end) taken apart; the
    parts add up to it. Every part is a sum of overlaps with the stretch, so two adjoining stretches' splits add up
    to the split of both: the split to the first token is a prefix of the whole one, part by part."""
    end = tl.end if until is None else until
    if end is None:
        raise ValueError(f"request {tl.id} has not ended")
    lo = tl.submitted if since is None else min(max(since, tl.submitted), end)
    hi = max(end, lo)
    if tl.admitted is None:                          # cancelled while queued: it only waited
        return TimeSplit(queue=hi - lo, total=hi - lo)
    queue, start = _overlap(tl.submitted, tl.admitted, lo, hi), max(lo, tl.admitted)
    if tl.alone:
        first = tl.first_token if tl.first_token is not None else hi
        return TimeSplit(queue=queue, prefill=_overlap(tl.admitted, first, lo, hi),
                         decode=_overlap(first, hi, max(lo, tl.admitted), hi), total=hi - lo)
    parts = dict.fromkeys(("prefill", "decode", "batch", "others"), 0.0)
    for step in tl.steps:
        for name, seconds in _step_parts(step, tl.id, one_row, start, hi).items():
            parts[name] += seconds
    covered = sum(parts.values())
    return TimeSplit(queue, parts["prefill"], parts["decode"], parts["batch"], parts["others"],
                     max(hi - start, 0.0) - covered, hi - lo)


def _step_parts(step: StepSeen, rid: int, one_row: float | None, lo: float, hi: float) -> dict[str, float]:
    """One step's time within [lo, hi], by whose work it was, as request `rid` saw it. Its prefill part is laid out
    as its prompts' spans (`prefill_spans`); its own decode at one row's pace is the first `one_row` seconds of the
    decode pass, the batch's the rest: every part a sum of overlaps."""
    cut = step.started + step.prefill_seconds
    prefill = _overlap(step.started, cut, lo, hi)
    decode = _overlap(cut, step.ended, lo, hi)
    own = 0.0
    if prefill and any(r == rid for r, _ in step.prefills):          # (most steps: a decode pass alone)
        own = sum(_overlap(a, b, lo, hi) for r, a, b in prefill_spans(step.started, step.prefill_seconds,
                                                                         step.prefills) if r == rid)
    if rid not in step.rows:
        return {"prefill": own, "others": prefill - own, "batch": decode}
    pace = step.ended if len(step.rows) == 1 or one_row is None else min(cut + one_row, step.ended)
    mine = _overlap(cut, pace, lo, hi)
    return {"prefill": own, "others": prefill - own, "decode": mine, "batch": decode - mine}


def prefill_spans(start: float, seconds: float, prefills: Iterable[tuple[int, int]]) -> list[tuple[int, float, float]]:
    """A step's prefill part laid out as (request id, from, to) per prompt, in the order they were computed (the
    oldest newcomer first), each as long as its share of the part's tokens. A prompt computed on its own ends where
    its span ends, give or take the per-token cost; a padded pass of several prompts is one computation, shared by
    tokens. The chart draws the same spans."""
    prefills = list(prefills)
    total, at, out = sum(n for _, n in prefills), start, []
    for rid, n in prefills:
        width = seconds * n / total
        out.append((rid, at, at + width))
        at += width
    return out


def _overlap(a: float, b: float, lo: float, hi: float) -> float:
    return max(min(b, hi) - max(a, lo), 0.0)


def behind(tl: RequestTimeline, until: float | None = None, since: float | None = None) -> tuple[Behind, ...]:
    """Others whose prefill shared this request's steps (between `since` and `until`), by the time they added, most
    first."""
    lo = max(tl.admitted if tl.admitted is not None else tl.submitted, since if since is not None else -math.inf)
    hi = tl.end if until is None else until
    tokens: dict[int, int] = {}
    seconds: dict[int, float] = {}
    for step in (s for s in tl.steps if s.prefills):
        for (rid, n), (_, a, b) in zip(step.prefills, prefill_spans(step.started, step.prefill_seconds, step.prefills)):
            if rid != tl.id and (part := _overlap(a, b, lo, hi)) > RESOLUTION:
                tokens[rid] = tokens.get(rid, 0) + n
                seconds[rid] = seconds.get(rid, 0.0) + part
    return tuple(sorted((Behind(r, tokens[r], seconds[r]) for r in tokens), key=lambda b: -b.seconds))


def batch_sizes(tl: RequestTimeline) -> dict[int, int]:
    """Decode rows -> how many of its decode steps had that many rows."""
    sizes: dict[int, int] = {}
    for step in tl.steps:
        if tl.id in step.rows:
            sizes[len(step.rows)] = sizes.get(len(step.rows), 0) + 1
    return dict(sorted(sizes.items()))


# --- the server's pace, and the request alone -------------------------------------------------------------------------

def rates_of(one_row: Iterable[float], prefills: Iterable[tuple[int, float]], chunk: int) -> Rates:
    """The median one-row decode-only step, and a least-squares line through (tokens, seconds) of recent prefill
    parts (one per step: per pass + per token x tokens); per token alone when every part had the same size."""
    one = list(one_row)
    pairs = [(n, s) for n, s in prefills if n > 0]
    per_pass = per_token = None
    if len({n for n, _ in pairs}) >= 2:
        fit = statistics.linear_regression([float(n) for n, _ in pairs], [s for _, s in pairs])
        per_pass, per_token = max(fit.intercept, 0.0), max(fit.slope, 0.0)
    elif pairs:
        per_pass, per_token = 0.0, sum(s for _, s in pairs) / sum(n for n, _ in pairs)
    return Rates(statistics.median(one) if one else None, per_pass, per_token, chunk)


def alone_estimate(tl: RequestTimeline, rates: Rates) -> tuple[float | None, str]:
    """Seconds the same request would take on an idle server: its prompt's computed tokens at the measured prefill
    rate (one pass per chunk) plus one measured one-row step per token after the first."""
    computed = tl.prompt_tokens - tl.reused_tokens
    if rates.one_row_step is None or rates.prefill_per_token is None:
        return None, "not measured yet on this server (it needs a one-row decode step and a prefill)"
    passes = max(-(-computed // rates.chunk), 1)
    prefill = passes * (rates.prefill_per_pass or 0.0) + computed * rates.prefill_per_token
    decode = max(tl.generated - 1, 0) * rates.one_row_step
    steps = max(tl.generated - 1, 0)
    how = (f"{_count(computed, 'prompt token')} at this server's measured prefill rate ({_count(passes, 'pass')}) + "
           f"{_count(steps, 'one-row step')} of {rates.one_row_step * 1e3:.1f} ms (median of its recent "
           f"one-row decode-only steps)")
    return prefill + decode, how


def _count(n: int, noun: str) -> str:
    """'1 pass', '3 passes', '1,024 prompt tokens'."""
    return f"{n:,} {noun}" + ("" if n == 1 else "es" if noun.endswith("s") else "s")


def timings_of(tl: RequestTimeline, rates: Rates) -> Timings:
    """The response's `timings` for a request that has ended."""
    end, first = tl.end, tl.first_token
    admitted = tl.admitted if tl.admitted is not None else end
    first_in = first is not None and first <= end
    alone, how = alone_estimate(tl, rates)
    return Timings(
        tl.run_id, end - tl.submitted, admitted - tl.submitted, first - admitted if first_in else None,
        end - first if first_in else None, first - tl.submitted if first_in else None,
        split(tl, rates.one_row_step), split(tl, rates.one_row_step, until=first) if first_in else None,
        behind(tl), batch_sizes(tl), sum(1 for s in tl.steps if s.ended <= end), tl.wait_reason, alone, how,
        rates.one_row_step, stopped=tl.stopped is not None)


# --- as plain values -------------------------------------------------------------------------------------------------

def timeline_dict(tl: RequestTimeline) -> dict[str, Any]:
    """Every event and step of the request, in seconds since its submission (JSON-ready)."""
    rel = lambda t: None if t is None else round(t - tl.submitted, 6)  # noqa: E731
    return {
        "id": tl.id, "run_id": tl.run_id, "state": tl.state, "finish_reason": tl.finish_reason,
        "prompt_tokens": tl.prompt_tokens, "reused_tokens": tl.reused_tokens, "generated": tl.generated,
        "wait_reason": tl.wait_reason, "ahead": tl.ahead, "waited_steps": tl.waited_steps,
        "events": {"submitted": 0.0, "admitted": rel(tl.admitted), "first_token": rel(tl.first_token),
                   "stop_pressed": rel(tl.stop_pressed), "stopped": rel(tl.stopped), "finished": rel(tl.finished)},
        "steps": [step_dict(s, tl.submitted) for s in tl.steps],
    }


def story(tl: RequestTimeline | None, timings: Timings | None) -> dict[str, Any] | None:
    """What a run keeps (its info, its run file): the timeline with its `timings`, as plain values; None without."""
    if tl is None or timings is None:
        return None
    return {**timeline_dict(tl), "timings": timings.as_dict()}


def step_dict(step: StepSeen, origin: float) -> dict[str, Any]:
    return {"index": step.index, "start": round(step.started - origin, 6), "seconds": round(step.seconds, 6),
            "prefill_seconds": round(step.prefill_seconds, 6), "rows": list(step.rows),
            "prefills": [list(p) for p in step.prefills]}


# --- a stored story, read back (a run file is untrusted input) ------------------------------------------------------

SPLIT_PARTS = ("queue", "prefill", "decode", "batch", "others_prefill", "between_steps", "total")
_NUMBERS = ("e2e_request_latency_seconds", "request_queue_time_seconds", "request_prefill_time_seconds",
            "request_decode_time_seconds", "time_to_first_token_seconds", "alone_seconds", "one_row_step_seconds")


def story_problem(value: Any) -> str:
    """What is wrong with a stored story (`story`'s shape), in a few words; "" when nothing is."""
    if not isinstance(value, dict) or not isinstance(value.get("timings"), dict):
        return "not a mapping with timings"
    steps, timings = value.get("steps"), value["timings"]
    if not isinstance(steps, list) or not all(_step_ok(s) for s in steps):
        return "a step that is not a step"
    if not all(_number(timings.get(k), none=True) for k in _NUMBERS):
        return "a time that is not a number"
    for name in ("split", "first_token_split"):
        part = timings.get(name)
        if not (part is None and name != "split" or isinstance(part, dict) and all(_number(part.get(k))
                                                                                 for k in SPLIT_PARTS)):
            return f"{name} is not a split"
    behind_ok = isinstance(timings.get("behind"), list) and all(
        isinstance(b, dict) and _whole(b.get("id")) and _whole(b.get("tokens")) and _number(b.get("seconds"))
        for b in timings["behind"])
    sizes = timings.get("batch_sizes")
    if not behind_ok or not isinstance(sizes, dict) or not all(_whole(v) for v in sizes.values()):
        return "the others or the batch sizes are not counts"
    return ""


def _step_ok(step: Any) -> bool:
    return (isinstance(step, dict) and all(_number(step.get(k)) for k in ("start", "seconds", "prefill_seconds"))
            and isinstance(step.get("rows"), list) and all(_whole(r) for r in step["rows"])
            and isinstance(step.get("prefills"), list)
            and all(isinstance(p, list) and len(p) == 2 and all(_whole(x) for x in p) for p in step["prefills"]))


def _number(x: Any, none: bool = False) -> bool:
    return x is None and none or isinstance(x, (int, float)) and not isinstance(x, bool) and x == x


def _whole(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
