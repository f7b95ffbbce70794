"""Prometheus metrics of the model server, named as vLLM names them where the meaning is the same
(`vllm:num_requests_running` is `playground:num_requests_running` here), with prometheus-client.

Counted where they happen: every request's records pass `RequestMeter` in the scheduler's worker thread (time to
first token, inter-token latency, tokens, finished requests; at its end, its queue, prefill and decode time as its
response's `timings` give them); the queue, the batch, the KV blocks and the prefix
cache are read from the scheduler when Prometheus scrapes. Each service has its own registry.

    metrics = ServiceMetrics(scheduler)
    listener = metrics.meter()                   # one per request: a scheduler listener
    text = metrics.exposition()                  # GET /metrics
"""
from __future__ import annotations

import time
from typing import Any, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from engine.core.records import DecodeRecord, DoneRecord, PrefillRecord, SpecRoundRecord
from engine.serving.scheduler import Handle

PREFIX = "playground:"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# vLLM's buckets (vllm/v1/metrics/loggers.py), trimmed at the short end for a CPU
TTFT_BUCKETS = (0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0)


class ServiceMetrics:
    """The server's metrics: histograms and counters fed per request, gauges read from the scheduler."""

    def __init__(self, scheduler: Any):
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram(PREFIX + "time_to_first_token_seconds", "Time to first token: queueing plus prefill.",
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram(PREFIX + "inter_token_latency_seconds", "Time between two tokens of one request.",
                             buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram(PREFIX + "e2e_request_latency_seconds", "Submission to the last token.",
                             buckets=E2E_BUCKETS, registry=r)
        self.queue_time = Histogram(PREFIX + "request_queue_time_seconds", "Submitted until admitted to the batch.",
                                    buckets=E2E_BUCKETS, registry=r)
        self.prefill_time = Histogram(PREFIX + "request_prefill_time_seconds", "Admitted until the first token.",
                                      buckets=E2E_BUCKETS, registry=r)
        self.decode_time = Histogram(PREFIX + "request_decode_time_seconds", "The first token until the request ended.",
                                     buckets=E2E_BUCKETS, registry=r)
        self.generation_tokens = Counter(PREFIX + "generation_tokens", "Tokens generated.", registry=r)
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "Prompt tokens read (prefilled or reused).", registry=r)
        self.success = Counter(PREFIX + "request_success", "Requests that finished, by why they finished.",
                               ["finished_reason"], registry=r)
        r.register(SchedulerCollector(scheduler))

    def meter(self) -> "RequestMeter":
        return RequestMeter(self)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class RequestMeter:
    """One request's timings, fed by its records as the worker makes them (a scheduler listener)."""

    def __init__(self, metrics: ServiceMetrics):
        self.m = metrics
        self.submitted = self.last = time.perf_counter()

    def __call__(self, handle: Any, record: Any) -> None:
        now = time.perf_counter()
        if isinstance(record, PrefillRecord):
            self.m.ttft.observe(now - handle.submitted)
            self.m.prompt_tokens.inc(len(record.prompt))
            self._tokens(1, now, first=True)
        elif isinstance(record, DecodeRecord):
            self._tokens(1, now)
        elif isinstance(record, SpecRoundRecord):
            self._tokens(len(record.emitted), now)
        elif isinstance(record, DoneRecord):
            self.m.e2e.observe(now - handle.submitted)
            self.m.success.labels(record.finish_reason).inc()
        elif record is Handle.END and getattr(handle, "timings", None) is not None:
            self._phases(handle.timings)

    def _phases(self, timings: Any) -> None:
        """The request's queue, prefill and decode time, as its response's `timings` give them
        (engine.serving.timeline)."""
        self.m.queue_time.observe(timings.request_queue_time_seconds)
        if timings.request_prefill_time_seconds is not None:
            self.m.prefill_time.observe(timings.request_prefill_time_seconds)
        if timings.request_decode_time_seconds is not None:
            self.m.decode_time.observe(timings.request_decode_time_seconds)

    def _tokens(self, n: int, now: float, first: bool = False) -> None:
        self.m.generation_tokens.inc(n)
        if not first and n > 0:
            for _ in range(n):
                self.m.itl.observe((now - self.last) / n)
        self.last = now


class SchedulerCollector(Collector):
    """Gauges and counters read from the scheduler at scrape time."""

    def __init__(self, scheduler: Any):
        self.scheduler = scheduler

    def collect(self) -> Iterator[Any]:
        stats, room, prefix = self.scheduler.stats(), self.scheduler.room(), self.scheduler.prefix.stats
        yield _gauge("num_requests_running", "Requests in the batch (or the one job running alone).", stats.running)
        yield _gauge("num_requests_waiting", "Requests queued for a place in the batch.", stats.queued)
        yield _gauge("num_sessions", "People (browsers) counted against the room's limit.", stats.sessions)
        yield _gauge("kv_cache_usage_perc", "Share of the paged KV cache's allocated blocks in use (0 to 1).",
                     kv_usage(room))
        yield _counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", prefix.queried_tokens)
        yield _counter("prefix_cache_hits", "Prompt tokens whose K/V the prefix cache supplied.", prefix.reused_tokens)
        yield _counter("request_refused", "Requests refused at the door (invalid, over a limit, queue full).",
                       stats.refused)


def kv_usage(room: Any) -> float:
    """Used blocks over the blocks the paged cache holds now, after the latest step (0 when idle)."""
    table = next((s.blocks for s in reversed(room.steps) if s.blocks is not None), None)
    if table is None or not table.n_blocks or not room.members:
        return 0.0
    return table.used / table.n_blocks


def _gauge(name: str, text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, text, value=value)


def _counter(name: str, text: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, text, value=value)
