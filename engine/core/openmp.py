"""Torch's CPU threads (OpenMP) and the threads of this program: keep one-off parallel work off long-lived threads.

    packed = in_passing_thread(lambda: pack_every_weight(model))   # done in a thread that ends with it
    @passing                                                       # a method that does torch work off the step
    def run_file(self, run_id): ...                                #   loop, called from any thread
    with one_thread(logits.device): ...                            # small work between steps: no parallel regions

OpenMP (libgomp, behind torch's CPU ops) keeps a team of worker threads for every thread that ever ran a parallel
region, for as long as that thread lives. With more of them than cores, libgomp stops spinning at its barriers
(its "throttled" spin count), and every parallel region of the step loop then waits on a futex instead. Measured on
this 2-core machine with two torch threads: while the main thread, which had packed the small-batch weights, still
held its team, the scheduler's batched decode steps took 1.5x as long (20 sessions, 64 tokens: 60 against 97 tok/s).
So work that runs once (packing weights, loading a model in a benchmark) runs in a passing thread, and the
step loop's thread stays the only one with a team. So does torch work a server does for a caller beside the step loop
(`passing`): an HTTP route's blocking call runs in one of the server's pooled threads, which live on. After one run
file with its views (attention derived from the kept residual) was read through the API, a lone request's decode
steps took 1.46x as long as before, for the rest of the server's life (docs/serving.md, "Torch work beside the step
loop").
"""
from __future__ import annotations

import functools
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch


def in_passing_thread(fn: Callable[[], Any]) -> Any:
    """fn() in a thread of its own that ends with it, so that the OpenMP team fn's parallel work makes ends too
    (this module's docstring says why); fn's exception is raised here."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as err:  # noqa: BLE001 - raised again in the caller's thread
            box["error"] = err

    thread = threading.Thread(target=run, name="playground-once")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def passing(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` (a function or method) run in a passing thread (`in_passing_thread`) whichever thread calls it: for
    torch work that a long-lived thread other than the step loop's calls (an HTTP server's pooled threads)."""
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        return in_passing_thread(lambda: fn(*args, **kwargs))
    return run


@contextmanager
def one_thread(device: torch.device) -> Iterator[None]:
    """Torch's CPU ops in this block on the calling thread alone (the count it had is put back after).

    For small work between steps, such as picking and describing a token over one row of 49,152 logits: torch
    splits an elementwise op or a reduction over that many values into a parallel region, and each region wakes
    the team's other threads and waits for them. With a passive wait policy (engine/__main__.py) a wake is a futex
    call, and on a busy machine the woken thread may wait for its core for longer than the work takes. On a GPU,
    or with one thread already, nothing changes."""
    threads = torch.get_num_threads()
    if torch.device(device).type != "cpu" or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
