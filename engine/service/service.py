"""The engine core as a service: the loaded model, its scheduler, the runs it made, the room and the presenter's
board, behind the one typed interface every client uses (`ModelClient`, engine/service/client.py).

In-process it is that client itself (the default: `make run` is one process); `python -m engine serve` puts it
behind HTTP (engine/server/), and `RemoteModel` speaks to it from another process.

    service = EngineService(load_model("default"))
    handle = service.submit(GenerationRequest("Why is the sky blue?"), session="a1b2")
    for record in handle.records(): ...
    service.run_slice(handle.run_id)                # the same run, by id, for anyone
"""
from __future__ import annotations

import gc
import os
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import psutil
import torch

from engine import settings
from engine.core.generate import GenerationRequest
from engine.core.hooks import CAPTURE_OFF, CapturePolicy
from engine.core.kept import KeptInputs, kept_for
from engine.core.loader import LoadedModel, load_model
from engine.core.openmp import in_passing_thread, passing
from engine.errors import EngineError, InvalidRequestError
from engine.projection.specs import ModelSpec
from engine.service import jobs as job_registry
from engine.service.board import PresenterBoard
from engine.service.join import room_gate
from engine.service.metrics import ServiceMetrics
from engine.service.ondisk import WAIT_SECONDS, RunWriter, info_of_row, open_disk, slice_from_disk
from engine.service.replicas import ReplicaSnapshot, ReplicaView
from engine.service.runs import RunInfo, RunNotFoundError, RunSlice, LiveRuns, new_run_id
from engine.serving.limits import Limits
from engine.serving.prefix import PrefixStats
from engine.serving.scheduler import (CheckedRequest, Handle, JobProgress, RoomState, SchedulerStats, Span,
                                      scheduler_for)
from engine.speculative.decode import draft_from_spec
from engine.speculative.drafts import Draft
from engine.speculative.options import DraftModelOption, draft_model_options, is_model_spec
from engine.store import RunDisk, StoreError, open_store
from engine import runs as run_files

PRESENCE_STALE_SECONDS = 30.0     # a web process that has not reported its sessions this long is gone
RUN_STORE_SHARE = 2               # the run store keeps this many requests' worth of the capture limit...
RUN_STORE_MIN = 256 * 2**20       # ...and at least this much
KEPT_GUESS = 256                  # prompt positions a run's kept inputs make room for before its prompt is counted
DISK_SLICES = 16                  # runs read back from their files, kept parsed (a room of followers reads one run)


def freeze_heap() -> int:
    """Once a server's model is loaded and warmed up: every object alive now (the model's modules, the libraries'
    code and tables, several hundred thousand) moved out of the garbage collector's reach, garbage collected first,
    as vLLM does after its start-up (vllm/utils/gc_utils.py, `freeze_gc_heap`). The step loop makes objects every
    token (records, tensors' wrappers); each full collection then went through all of them with the GIL held: in a
    process holding SmolLM2, one pass of 176 ms in ten answers of 96 tokens, a pause in someone's stream; frozen,
    none over 3 ms (docs/serving.md, "The start-up heap is frozen"). Objects made later are still collected.
    Returns how many were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


@dataclass(frozen=True)
class ModelInfo:
    """What a client needs to know about the served model, without its weights."""

    name: str
    label: str
    source: str                   # the folder the weights came from, on the server's disk
    spec: ModelSpec
    dtype_name: str
    device: str
    has_chat_template: bool
    weight_bytes: int
    load_seconds: float
    limits: Limits
    presenter_mode: bool = False
    launched_draft: str | None = None


@dataclass(frozen=True)
class MemoryRow:
    name: str
    bytes: int


class Presence:
    """Which browser sessions are still connected, as each web process last reported them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._where: dict[str, str] = {}                       # session -> the web process that holds it
        self._reports: dict[str, tuple[float, frozenset[str]]] = {}

    def report(self, process: str, sessions: Iterable[str]) -> None:
        now, held = time.monotonic(), frozenset(sessions)
        with self._lock:
            self._reports[process] = (now, held)
            for s in held:
                self._where[s] = process

    def __call__(self, session: str) -> bool:
        """True while its process says so; unknown sessions (no process reported them) count as present."""
        with self._lock:
            process = self._where.get(session)
            if process is None:
                return True
            at, held = self._reports[process]
            present = session in held and time.monotonic() - at < PRESENCE_STALE_SECONDS
            if not present:
                del self._where[session]
            return present


@dataclass
class DraftModels:
    """Draft models loaded for speculative decoding, once each, shared by every request."""

    loaded: dict[str, LoadedModel] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def load(self, name: str, device: str | None = None, dtype: Any = None,
             progress: Callable[[float, str], None] | None = None) -> LoadedModel:
        with self.lock:
            if name not in self.loaded:        # in a passing thread: no OpenMP team left on a request's thread
                self.loaded[name] = in_passing_thread(lambda: load_model(name, device=device, dtype=dtype,
                                                                         progress=progress))
            return self.loaded[name]


def run_store_bytes(limits: Limits, environ: Mapping[str, str] | None = None) -> int:
    """The run store's budget: PLAYGROUND_RUN_STORE_MB, else twice a request's capture limit (256 MiB at least)."""
    mb = settings.of(environ).run_store_mb
    if mb is not None and mb >= 0:
        return mb * 2**20
    return max(RUN_STORE_MIN, RUN_STORE_SHARE * limits.max_capture_bytes)


def _of_model(name: str) -> Any:
    """A read-only attribute of the loaded model, as the service's own (what a page reads of "the model")."""
    return property(lambda self: getattr(self.lm, name))


class EngineService:
    """One model served: submit requests and jobs, watch the room, look up any run by id. Thread-safe."""

    transport = "in-process"

    def __init__(self, lm: LoadedModel, limits: Limits | None = None, presenter_token: str | None = None,
                 launched_draft: str | None = None, disk: RunDisk | None = None):
        self.lm = lm
        self.scheduler = scheduler_for(lm, limits)
        self.runs = LiveRuns(max_bytes=run_store_bytes(self.scheduler.limits))
        self.disk, self.disk_note = (disk, None) if disk is not None else open_disk(open_store)
        self.writer = RunWriter(self.runs, self.disk, self._file_of) if self.disk is not None else None
        self.runs.on_disk = self._on_disk
        self._read_back: OrderedDict[str, RunSlice] = OrderedDict()
        self._read_lock = threading.Lock()
        self.board = PresenterBoard(presenter_token)
        self.gate = room_gate()                      # the hosted room's join code (PLAYGROUND_JOIN_CODE)
        self.presence = Presence()
        self.scheduler.presence = self.presence
        self.metrics = ServiceMetrics(self.scheduler)
        self.launched_draft = launched_draft
        self._drafts = DraftModels()
        self._tokenizer_files: dict[str, bytes] | None = None

    # --- what the model is (read by pages and by the pure lab functions alike) --------------------------------

    spec: ModelSpec = _of_model("spec")
    label: str = _of_model("label")
    name: str = _of_model("name")
    source: Path = _of_model("source")
    device: torch.device = _of_model("device")
    dtype: torch.dtype = _of_model("dtype")
    dtype_name: str = _of_model("dtype_name")
    tokenizer: Any = _of_model("tokenizer")
    has_chat_template: bool = _of_model("has_chat_template")
    weight_bytes: int = _of_model("weight_bytes")
    load_seconds: float = _of_model("load_seconds")

    @property
    def limits(self) -> Limits:
        return self.scheduler.limits

    def info(self) -> ModelInfo:
        lm = self.lm
        return ModelInfo(lm.name, lm.label, str(lm.source), lm.spec, lm.dtype_name, str(lm.device),
                         lm.has_chat_template, lm.weight_bytes, lm.load_seconds, self.limits, self.board.enabled,
                         self.launched_draft)

    # --- requests -----------------------------------------------------------------------------------------------

    def check(self, request: GenerationRequest, policy: CapturePolicy = CAPTURE_OFF) -> CheckedRequest:
        """Every check of the door, without queueing (raises an EngineError); the ids the model will read."""
        return self.scheduler.check(request, policy)

    def submit(self, request: GenerationRequest | CheckedRequest, policy: CapturePolicy | None = None,
               session: str | None = None, draft: str | None = None, k: int = 4, source: str = "page",
               parent: str | None = None, listeners: tuple[Callable[[Handle, Any], None], ...] = ()) -> Handle:
        """Queue a generation (speculative with a `draft` spec: "ngram", "early-exit:N", a draft model's name) and
        keep its run under `handle.run_id`. Raises an EngineError subclass when refused."""
        built = self._draft(draft) if draft else None
        base = request.request if isinstance(request, CheckedRequest) else request
        info = RunInfo(new_run_id(), "speculative" if draft else "generation", source, self.label, session, base,
                       policy if policy is not None else getattr(request, "policy", CAPTURE_OFF),
                       draft=draft, k=k if draft else 0, label=built.label if built is not None else "", parent=parent)
        kept = self._kept(info, request)
        extra = {"draft": built, "k": k, "kept": kept} if built is not None else {"kept": kept}
        return self._queue(info, lambda ls: self.scheduler.submit(request, policy, session=session, run_id=info.id,
                                                                   listeners=ls, **extra), listeners, kept)

    def _kept(self, info: RunInfo, request: GenerationRequest | CheckedRequest) -> KeptInputs | None:
        """Where a plain run's kept layer inputs go, when its policy keeps some."""
        base = request.request if isinstance(request, CheckedRequest) else request
        n_prompt = request.n_prompt if isinstance(request, CheckedRequest) else KEPT_GUESS
        return kept_for(self.lm, info.policy, n_prompt + base.max_new_tokens)

    def submit_job(self, name: str, params: Mapping[str, Any] | None = None, session: str | None = None,
                   source: str = "page", listeners: tuple[Callable[[Handle, Any], None], ...] = ()) -> Handle:
        """Queue a named measurement (engine/service/jobs.py) to run alone, in its turn, with progress."""
        found = job_registry.find(name)
        if found.quick:
            raise InvalidRequestError(f"{name} runs at once: ask for it with quick()")
        checked = found.check(params or {}, self.lm)
        if found.runs:
            checked["runs"] = self.runs
        info = RunInfo(new_run_id(), "job", source, self.label, session, label=name)
        work = lambda progress: found.fn(self.lm, progress, **checked)  # noqa: E731
        return self._queue(info, lambda ls: self.scheduler.submit_job(work, found.what, session=session,
                                                                       run_id=info.id, listeners=ls), listeners)

    @passing                      # torch work beside the step loop (engine.core.openmp)
    def quick(self, name: str, params: Mapping[str, Any] | None = None) -> Any:
        """A named quick computation (reads weights or files), at once, beside the running batch (in a thread of
        its own: its torch work leaves no OpenMP team on the caller's thread, engine.core.openmp)."""
        return job_registry.run_quick(self.lm, name, params or {}, self.runs)

    def _queue(self, info: RunInfo, submit: Callable[[tuple], Handle],
               listeners: tuple[Callable[[Handle, Any], None], ...], kept: KeptInputs | None = None) -> Handle:
        self.runs.open(info)
        if kept is not None:                       # counted in the run store from the start, room for every token
            self.runs.attach(info.id, kept, kept.bytes_per_position * kept.capacity)
        try:
            return submit((self._keep, self.metrics.meter(), *listeners))
        except EngineError as err:
            self.runs.close(info.id, "failed", str(err))
            raise

    def _keep(self, handle: Handle, record: Any) -> None:
        """Every record of every run goes to the run store; a job keeps its progress, not its result."""
        if record is Handle.END:
            error = str(handle.error) if handle.error is not None else None
            written = self.writer is not None and handle.job is None
            # Held before it closes: closing a captured run settles its kept inputs and may evict, and with memory
            # full of runs waiting for a full disk it went before its file was written (the hosted hour lost 138);
            # and a reader woken by the close (run_wait) waits for the file.
            if written:
                self.writer.ending(handle.run_id)
            self.runs.close(handle.run_id, handle.state, error, handle.story)
            if written:
                self.writer.finished(handle.run_id)          # its run file, written in the writer's thread
        elif handle.job is None or isinstance(record, JobProgress):
            self.runs.append(handle.run_id, record)

    def draft_options(self) -> list[DraftModelOption]:
        """Draft models this server offers (the launcher's and every installed extra), judged against its model."""
        return draft_model_options(self.lm, self.launched_draft)

    @passing                      # torch work beside the step loop (engine.core.openmp)
    def load_draft(self, spec: str, progress: Callable[[float, str], None] | None = None) -> str:
        """Load (once) the draft a spec names, so that the first speculative request does not wait for it; its label."""
        return self._draft(spec, progress).label

    def _draft(self, spec: str, progress: Callable[[float, str], None] | None = None) -> Draft:
        if not isinstance(spec, str) or not spec.strip():
            raise InvalidRequestError("the draft must be 'ngram', 'early-exit:N' or the name of a draft model")
        if is_model_spec(spec) and spec not in {o.name for o in self.draft_options() if o.usable}:
            raise InvalidRequestError(f"{spec[:80]!r} is not a draft model this server offers")
        load = lambda name, device=None, dtype=None: self._drafts.load(name, device, dtype, progress)  # noqa: E731
        return draft_from_spec(spec, self.lm, load=load)

    # --- the room -----------------------------------------------------------------------------------------------

    def stats(self) -> SchedulerStats:
        return self.scheduler.stats()

    def room(self) -> RoomState:
        return self.scheduler.room()

    def timeline(self) -> list[Span]:
        return self.scheduler.timeline()

    def prefix_stats(self) -> PrefixStats:
        return self.scheduler.prefix.stats

    def memory(self) -> list[MemoryRow]:
        """Weights as loaded, the server process, the runs held in memory (as the run store counts them), and the GPU
        allocator when there is one (measured)."""
        rows = [MemoryRow("Weights", self.lm.weight_bytes),
                MemoryRow("Process memory", psutil.Process(os.getpid()).memory_info().rss),
                MemoryRow("Runs held in memory", self.runs.bytes)]   # the rest are on disk (engine/store)
        if self.lm.device.type == "cuda":
            rows.append(MemoryRow("GPU allocated", torch.cuda.memory_allocated(self.lm.device)))
        return rows

    def replicas_view(self) -> list[ReplicaView]:
        """This server as the one replica of its room (a cluster has N: engine/cluster/service.py)."""
        snapshot = ReplicaSnapshot("this server", "this machine", self.label, self.room(), self.stats(),
                                   self.prefix_stats(), (), tuple(self.memory()), os.getpid())
        return [ReplicaView(snapshot, 0.0)]

    def join(self, session: str, person: str | None = None) -> None:
        """Count a person (SessionLimitError when the room is full)."""
        self.scheduler.join(session, person)

    def leave(self, session: str) -> None:
        self.scheduler.leave(session)

    def report_presence(self, process: str, sessions: Iterable[str]) -> None:
        """A web process's connected browser sessions: the ones it no longer lists leave the room."""
        self.presence.report(process, sessions)

    # --- runs, by id --------------------------------------------------------------------------------------------

    def run_slice(self, run_id: str, since: int = 0) -> RunSlice:
        """A run by id: from memory while it is there, else from its run file on disk."""
        try:
            return self.runs.slice(run_id, since)
        except RunNotFoundError:
            return self._from_disk(run_id, since)

    def run_wait(self, run_id: str, since: int, timeout: float) -> RunSlice:
        """The records after `since`, waiting up to `timeout` for one; a run that has ended comes back once its
        file is on disk (a page that stopped a run asks this before it shows the run's link)."""
        deadline = time.monotonic() + timeout
        try:
            part = self.runs.wait(run_id, since, timeout)
        except RunNotFoundError:
            return self._from_disk(run_id, since)            # finished: nothing more will come
        if not part.info.live:
            self.written(run_id, max(0.0, deadline - time.monotonic()))     # within the wait the caller asked for
        return part

    def run_list(self, limit: int = 50) -> list[RunInfo]:
        """The newest runs, those in memory and those only on disk."""
        runs = self.runs.list(limit)
        if self.disk is not None:
            seen = {info.id for info in runs}
            runs += [replace(info_of_row(row), timeline=self.runs.story(row.id)) for row in self.disk.rows(limit)
                     if row.id not in seen]
        return sorted(runs, key=lambda info: info.created, reverse=True)[:limit]

    def written(self, run_id: str, timeout: float = WAIT_SECONDS) -> None:
        """Return once a finished run's file is on disk (engine/server/streams.py holds its end back until then)."""
        if self.writer is not None:
            self.writer.written(run_id, timeout)

    @passing                      # torch work beside the step loop (engine.core.openmp)
    def run_file(self, run_id: str) -> bytes:
        """A finished run's run file: with its views while its residual is held here, else the one on disk, else
        built from the records in memory."""
        if self._holds_residual(run_id):
            return self._file_of(self.runs.slice(run_id), views=True)
        if self.disk is not None:
            try:
                return self.disk.read(run_id)
            except StoreError as err:
                if run_id not in self.runs:
                    raise RunNotFoundError(str(err)) from None
        return self._file_of(self.runs.slice(run_id))

    def _holds_residual(self, run_id: str) -> bool:
        try:
            self.runs.kept(run_id)
        except EngineError:
            return False
        return not self.runs.info(run_id).live

    def _on_disk(self, run_id: str) -> bool:
        try:
            return self.disk is not None and self.disk.row(run_id) is not None
        except StoreError:
            return False

    def _file_of(self, part: RunSlice, views: bool = False) -> bytes:
        """The run file from its records; with `views`, those its policy names derived from the residual it kept
        (a download while the residual is in memory). The file the run store keeps has none: deriving every view of
        every run as it ends cost the room a third of its speed through the API (bench/before_after.py)."""
        return run_files.file_of(run_files.recording_of(part, self), self, run_id=part.info.id if views else None)

    def _from_disk(self, run_id: str, since: int) -> RunSlice:
        """A run read back from its file (the last DISK_SLICES kept parsed); RunNotFoundError when there is none."""
        if self.disk is None:
            raise RunNotFoundError(f"no run {str(run_id)[:40]!r} on this server: it was never made here, or it was "
                                   "dropped to make room for newer runs (and this server keeps none on disk)")
        with self._read_lock:
            part = self._read_back.get(run_id)
        if part is None:
            part = slice_from_disk(self.disk, run_id, self.limits)
            with self._read_lock:
                self._read_back[run_id] = part
                while len(self._read_back) > DISK_SLICES:
                    self._read_back.popitem(last=False)
        since = min(max(since, 0), len(part.records))
        return RunSlice(part.info, since, part.records[since:])

    # --- for remote clients --------------------------------------------------------------------------------------

    def tokenizer_files(self) -> dict[str, bytes]:
        """The tokenizer as the files `save_pretrained` writes: a remote client loads the same tokenizer from them."""
        if self._tokenizer_files is None:
            with tempfile.TemporaryDirectory() as folder:
                self.lm.tokenizer.save_pretrained(folder)
                self._tokenizer_files = {p.name: p.read_bytes() for p in Path(folder).iterdir() if p.is_file()}
        return self._tokenizer_files

    def close(self) -> None:
        self.scheduler.close()
        if self.writer is not None:
            self.writer.close()
