"""A run taken home tells the same story: the run file carries the timeline and its timings, a file whose timeline
was edited into nonsense is one clear line, and the notebook's timeline cell runs and checks the parts add up."""
from __future__ import annotations

import io
import json
import zipfile

import pytest

from conftest import tiny_prompt
from test_runs import execute, kernel, outputs, repack, unpack  # noqa: F401 - `kernel`: the fixture
from engine.core.generate import GenerationRequest
from engine.core.hooks import CapturePolicy
from engine.runs import RunFileError, file_of, loads, recording_of
from engine.service.service import EngineService
from engine.serving.timeline import story


@pytest.fixture(scope="module")
def served(tiny_lm):
    svc = EngineService(tiny_lm)
    closed_with = []                     # at its end marker, after the run store's close: the run info's timeline

    def at_end(handle, record) -> None:
        if record is handle.END:
            closed_with.append(svc.runs.info(handle.run_id).timeline)
    try:
        request = GenerationRequest(tiny_prompt(7, seed=5), max_new_tokens=4, chat=False)
        handle = svc.submit(request, CapturePolicy(logit_lens=3), source="api", listeners=(at_end,))
        handle.result(timeout=60)
        handle.closed_with = closed_with
        yield handle, file_of(recording_of(svc.run_slice(handle.run_id), svc), svc)
    finally:
        svc.close()


def test_the_run_file_carries_the_timeline_the_response_had(served):
    handle, data = served
    run = loads(data)
    assert run.story == json.loads(json.dumps(handle.story))        # exactly what the API and the page got
    assert run.story["timings"]["run_id"] == handle.run_id and len(run.story["steps"]) == run.story["generated"] - 1


def test_the_story_is_built_once_and_shared_by_the_run_and_the_response(served):
    """The run store's close built it; the API's last chunk (and a page) get the same object, not a rebuild."""
    handle, _ = served
    built = handle.story
    assert built is not None and handle.story is built
    assert handle.closed_with == [built]
    assert handle.closed_with[0] is built                                 # the run's info holds that very story
    assert built == story(handle.timeline, handle.timings)              # the same values a fresh build gives


def test_a_timeline_edited_into_nonsense_is_one_line(served):
    _, data = served
    doc, blob = unpack(data)
    doc["recording"]["timeline"]["timings"]["split"]["queue"] = "soon"
    with pytest.raises(RunFileError, match="timeline is not one this playground wrote"):
        loads(repack(doc, blob))


def test_the_notebook_tells_the_same_story(served, kernel, tmp_path, monkeypatch):  # noqa: F811
    handle, data = served
    nb = execute(data, tmp_path, kernel, "journey", None, None, monkeypatch)
    text, kinds = outputs(nb)
    t = handle.timings
    assert f"{t.e2e_request_latency_seconds:.4f} s in all ({t.steps} batch steps)" in text
    assert f"{'others_prefill':>15}: {t.split.others_prefill:.4f} s" in text
    assert kinds.count("application/vnd.plotly.v1+json") >= 1
