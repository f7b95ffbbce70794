"""A run and a recording, one into the other: what the Recordings page, the notebook download and a person's recent
runs (app/runs/recent.py, read back from the run store) all convert with. No widgets here.

    run = run_from_recording(recording)        # RecordingError when it holds no prefill record
    recording = recording_from_run(run)        # a finished run (a speculative one with its baseline)
"""
from __future__ import annotations

from app.runs.run import Run, Speculation, compact
from engine.core.records import PrefillRecord, SpecDoneRecord, SpecRoundRecord
from engine.serving.recording import RecordedSpeculation, Recording, RecordingError


def run_from_recording(rec: Recording) -> Run:
    """The run a recording holds, as the pages draw it (a speculative run with its Speculation, baseline included)."""
    if not any(isinstance(r, PrefillRecord) for r in rec.records):
        raise RecordingError("this recording holds no prefill record (the prompt and the first token), so no page "
                             "can draw it")
    run = Run(model=rec.model, spec=rec.spec, request=rec.request, policy=rec.policy, live=False,
              dtype=rec.dtype, device=rec.device, source=rec.title or rec.request.prompt[:60],
              speculation=recorded_speculation(rec), recorded=rec.created, machine=rec.machine,
              timeline=rec.timeline)
    layers = rec.policy.layers
    if layers is not None and len(layers) < rec.spec.n_layers:
        run.capture_note = (f"This recording kept the attention of {len(layers)} of {rec.spec.n_layers} layers "
                            f"({', '.join(map(str, layers))}).")
    for record in rec.records:
        run.add(compact(record))          # rounds recorded straight from the engine become decode steps here
    return run


def recorded_speculation(rec: Recording) -> Speculation | None:
    """The speculative part of a recorded run; for records straight from the engine (rounds among them, no
    baseline) what their final record says."""
    saved = rec.speculation
    if saved is not None:
        baseline = Run(model=rec.model, spec=rec.spec, request=rec.request, policy=rec.policy, live=False,
                       dtype=rec.dtype, device=rec.device) if saved.baseline else None
        for record in saved.baseline:
            baseline.add(record)
        return Speculation(saved.draft, saved.draft_kind, saved.k, list(saved.rounds), baseline)
    done = rec.done
    if any(isinstance(r, SpecRoundRecord) for r in rec.records) and isinstance(done, SpecDoneRecord):
        return Speculation(done.draft, "", done.k)
    return None


def recording_from_run(run: Run) -> Recording:
    """A finished run as a recording (a speculative one with its rounds and baseline); RecordingError while it has
    no final record."""
    if run.prefill is None or run.done is None:
        raise RecordingError("only a finished run can be saved (this one has no final record)")
    records = [run.prefill, *run.steps, run.done]
    made = {"created": run.recorded} if run.recorded else {}       # a recording saved again keeps its origin
    return Recording(run.model, run.spec, run.request, run.policy, records, run.dtype, run.device,
                     title=run.source or run.request.prompt[:60], speculation=speculation_record(run.speculation),
                     machine=run.machine, timeline=run.timeline, **made)


def speculation_record(spec: Speculation | None) -> RecordedSpeculation | None:
    if spec is None:
        return None
    base = spec.baseline
    baseline = [base.prefill, *base.steps, base.done] if base is not None and base.done and base.prefill else []
    return RecordedSpeculation(spec.draft, spec.draft_kind, spec.k, list(spec.rounds), baseline)
