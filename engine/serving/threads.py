"""Torch's CPU threads for the step loop, chosen by measuring the live load rather than guessed.

    tuner = ThreadTuner.for_device(lm.device)    # on a CPU: every core against every core but one, measured
    tuner.before_step(prefill)                   # in the step loop's thread: the count this step runs with
    tuner.after_step(seconds, rows, prefill)     # what the step cost
    tuner.choice()                               # what the room page and the start-up line say

Why measure: a parallel region waits for its slowest thread. Alone on a machine, a step is fastest on every core
(vLLM's CPU build takes them all too); beside a browser and the web app on the same cores a thread often waits
for its core, and one thread fewer was faster (docs/serving.md: with two Chromium pages and Streamlit on 2 cores,
8-row decode steps took about 1 s with two threads and 0.21 s with one). Which case a server is in changes while it
runs: a room fills, browsers open and close. So the step loop tries each candidate on a few steps, alternating
step by step (so both see the same batch and the same neighbours), keeps the faster, and tries again later,
less and less often while the answer stays the same:

- a trial: up to `TRIAL_STEPS` decode steps on each candidate, alternating (the current count first), compared
  as the median time of steps with the same number of rows and no prefill (a prefill chunk makes a step slower
  whatever the threads). A trial ends after its first pair where one candidate is `DECISIVE` times slower: on a
  busy machine the wrong count can take three or four times as long, and one such step is enough to know;
- the faster wins by more than `MARGIN` when it is every core, by more than `LEAVE_MARGIN` when it is fewer;
  otherwise the current choice stays. Every core is right on a machine of its own, and the loads that make fewer
  faster make them much faster (2 to 4 times above); a lone request's 1-row steps differ by 4-7% between the two
  counts here, as much as steps differ among themselves, and a 3% rule flipped it to one thread for 32 steps at a
  time (2 to 4 changes in a run of bench/vs_vllm.py, where one alone got its tokens 7% slower than with every core
  fixed);
- the next trial after `hold` decode steps: `FIRST_HOLD` after a change, doubling up to `MAX_HOLD` while the
  same choice keeps winning. A trial's slower steps are at most TRIAL_STEPS in MAX_HOLD + 2 x TRIAL_STEPS;
- and at once when the batch has grown or shrunk `RESIZE` times from the rows the last trial compared: a room
  pressing Generate together is a new load (six browsers rendering beside it, on the same cores), and the count
  that was right for the presenter alone must not be held for hundreds of steps into it (six browser sessions:
  21.5 s for the last of six against 19.1 s with one thread fixed, when trials came only with the hold).

`PLAYGROUND_THREADS=N` (or `python -m engine serve --threads N`, or OMP_NUM_THREADS set by hand) fixes the count;
`auto` (the default) measures. On a GPU nothing is tuned.
"""
from __future__ import annotations

import os
import statistics
import threading
from collections import defaultdict
from dataclasses import dataclass, field

import torch

from engine import settings

ENV = "PLAYGROUND_THREADS"
TRIAL_STEPS = 3          # decode steps per candidate in one trial, at most
DECISIVE = 1.5           # one candidate this many times slower than the other on a pair of steps ends the trial
MARGIN = 0.03            # every core must be this much faster to win back
LEAVE_MARGIN = 0.10      # fewer threads than every core must be this much faster to win
FIRST_HOLD = 32          # decode steps before the next trial, after a change
MAX_HOLD = 1024          # at most this many
RESIZE = 2               # a batch this many times larger or smaller than the last trial's is a trial at once


@dataclass(frozen=True)
class ThreadChoice:
    """What the step loop runs with, and why (for the room page and the start-up line)."""

    threads: int                       # torch threads now
    cores: int                         # cores this process may use
    auto: bool                         # measured (True) or fixed by a flag or a variable (False)
    measured: tuple[tuple[int, float, int], ...] = ()   # last trial: (threads, median step seconds, rows)
    trials: int = 0                    # trials run so far
    changes: int = 0                   # times a trial changed the count

    def describe(self) -> str:
        if not self.auto:
            return f"{self.threads} torch thread{'s' * (self.threads != 1)} of {self.cores} cores (fixed)"
        text = f"{self.threads} torch thread{'s' * (self.threads != 1)} of {self.cores} cores, measured"
        if self.measured:
            parts = ", ".join(f"{t} thread{'s' * (t != 1)} {s * 1e3:.0f} ms" for t, s, _ in self.measured)
            rows = self.measured[0][2]
            text += f" (last trial, steps of {rows} row{'s' * (rows != 1)}: {parts}; {self.trials} trials)"
        else:
            text += " (no trial yet: every core until the first steps are timed)"
        return text


@dataclass
class _Trial:
    order: list[int]                                   # the thread count of each step in the trial
    steps: dict[int, list[tuple[int, float]]] = field(default_factory=lambda: defaultdict(list))  # t -> (rows, s)


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def fixed_threads(environ: dict[str, str] | None = None) -> int | None:
    """The thread count fixed by PLAYGROUND_THREADS=N or OMP_NUM_THREADS, or None to measure."""
    env = os.environ if environ is None else environ
    asked = settings.of(env).threads                       # None when unset or 'auto'
    if asked is not None:
        return max(1, asked)
    omp = env.get("OMP_NUM_THREADS", "").strip()
    return max(1, int(omp)) if omp.isdigit() else None


class ThreadTuner:
    """Chooses between every core and every core but one from the steps' own times."""

    def __init__(self, n_cores: int, fixed: int | None = None):
        self.cores = n_cores
        self.candidates = (n_cores,) if fixed or n_cores < 2 else (n_cores, n_cores - 1)
        self.current = fixed or n_cores
        self.auto = fixed is None and n_cores >= 2
        self.hold, self.countdown = FIRST_HOLD, 0           # the first steps are a trial
        self.trial: _Trial | None = None
        self.applied: int | None = None
        self.trial_rows: int | None = None                  # the rows the last trial compared
        self._choice = ThreadChoice(self.current, n_cores, self.auto)
        self._lock = threading.Lock()

    @classmethod
    def for_device(cls, device: torch.device, environ: dict[str, str] | None = None) -> "ThreadTuner | None":
        """A tuner for a model on the CPU (None on a GPU)."""
        if torch.device(device).type != "cpu":
            return None
        return cls(cores(), fixed_threads(environ))

    def choice(self) -> ThreadChoice:
        with self._lock:
            return self._choice

    def before_step(self, prefill: bool = False) -> int:
        """Set torch's threads for the next step (in the thread that runs it); returns the count. A step that will
        prefill runs on the chosen count, never a trial's other one: it does not count for the trial, and a trial
        left half done when a batch drained would otherwise hold a whole long prompt on the slower count (a
        2,048-token prefill took 15 s against 9 s with two threads fixed, in bench/vs_vllm.py)."""
        want = self.current
        if self.auto and self.trial is None and self.countdown <= 0:
            order = (self.current,) + tuple(t for t in self.candidates if t != self.current)
            self.trial = _Trial([t for _ in range(TRIAL_STEPS) for t in order])
        if self.trial is not None and self.trial.order and not prefill:
            want = self.trial.order[0]
        if want != self.applied:
            torch.set_num_threads(want)
            self.applied = want
        return want

    def after_step(self, seconds: float, rows: int, prefill_tokens: int) -> None:
        """Count a step that ran with the count `before_step` set."""
        if not self.auto or rows == 0:
            return
        if self.trial is None:
            self.countdown -= 1
            last = self.trial_rows
            if last and prefill_tokens == 0 and not last / RESIZE < rows < last * RESIZE:
                self.countdown = 0                             # a new load: try both counts now
            return
        if prefill_tokens == 0:
            self.trial.steps[self.trial.order.pop(0)].append((rows, seconds))
        if not self.trial.order or _decisive(self.trial.steps):
            self._decide(self.trial)

    def _decide(self, trial: _Trial) -> None:
        medians = _matched_medians(trial.steps)
        if medians is None:                                    # the rows never matched: try again soon
            self.trial, self.countdown = None, TRIAL_STEPS
            return
        rows, times = medians
        other = min(times, key=times.get)
        margin = MARGIN if other > self.current else LEAVE_MARGIN
        changed = other != self.current and times[other] < times[self.current] * (1 - margin)
        if changed:
            self.current, self.hold = other, FIRST_HOLD
        else:
            self.hold = min(2 * self.hold, MAX_HOLD)
        self.trial, self.countdown, self.trial_rows = None, self.hold, rows
        with self._lock:
            old = self._choice
            self._choice = ThreadChoice(self.current, self.cores, True,
                                        tuple((t, times[t], rows) for t in sorted(times, reverse=True)),
                                        old.trials + 1, old.changes + changed)


def _decisive(steps: dict[int, list[tuple[int, float]]]) -> bool:
    """Whether one candidate is already DECISIVE times slower than the other at a row count both ran."""
    found = _matched_medians(steps)
    return found is not None and max(found[1].values()) > DECISIVE * min(found[1].values())


def _matched_medians(steps: dict[int, list[tuple[int, float]]]) -> tuple[int, dict[int, float]] | None:
    """The row count most steps of every candidate share, and each candidate's median time at it."""
    common = set.intersection(*(set(r for r, _ in v) for v in steps.values())) if len(steps) > 1 else set()
    if not common:
        return None
    rows = max(common, key=lambda r: min(sum(1 for x, _ in v if x == r) for v in steps.values()))
    return rows, {t: statistics.median(s for r, s in v if r == rows) for t, v in steps.items()}

