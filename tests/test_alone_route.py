"""A request alone runs the one forward with one row (issue 50), as every other step does: through the batch runner,
eagerly on a CPU (its keys read in place, its own products) and on CUDA as the graphed step at row bucket 1
(engine/serving/graphed.py, ROW_BUCKETS). The single-request fast path (a static cache and its own loop) is gone;
`generate --static` says so in one line."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from conftest import tiny_prompt
from engine.core.generate import GenerationRequest
from engine.core.hooks import CAPTURE_OFF, CapturePolicy
from engine.core.loader import cache_dir, load_model
from engine.serving import lean as serving_lean
from engine.serving.batch import BatchRunner
from engine.serving.graphed import MIN_WIDTH, ROW_BUCKETS, GraphedDecode
from test_batch import Sink, alone, assert_same_run

ROWS = CapturePolicy(stats=False)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


@pytest.fixture(scope="module")
def lm(tiny_model_dir):
    """A private copy: a runner of one place packs no small-batch kernels."""
    return load_model(str(tiny_model_dir), device="cpu", dtype="float32")


def request(n: int = 10, **kw) -> GenerationRequest:
    return GenerationRequest(tiny_prompt(9, seed=3), max_new_tokens=n, chat=False, **kw)


def run_alone(lm, req, policy=CAPTURE_OFF, graphs=None, max_batch=32) -> Sink:
    """One request through the batch runner, nothing beside it (how the server runs a lone API request)."""
    runner, sink = BatchRunner(lm, max_batch=max_batch, graphs=graphs), Sink()
    runner.add(sink.slot(lm, req, policy))
    for _ in range(1000):
        if runner.idle:
            break
        runner.step()
    assert sink.error is None
    return sink


@pytest.mark.parametrize("policy", [CAPTURE_OFF, ROWS], ids=["off", "rows"])
def test_a_request_alone_takes_the_one_row_step_and_equals_generate(lm, policy, monkeypatch):
    rows = []
    real = serving_lean.one_row
    monkeypatch.setattr(serving_lean, "one_row", lambda batch, slot: rows.append(slot) or real(batch, slot))
    req = request(8)
    sink = run_alone(lm, req, policy)
    assert len(rows) == 7 and len({id(s) for s in rows}) == 1      # every decode step after the first token: one row
    assert_same_run(sink, alone(lm, req, policy))


def test_on_the_graphed_step_a_request_alone_replays_row_bucket_1_traced_as_one_graph(lm):
    """compile="eager": dynamo traces the one-row step with fullgraph=True on this CPU (a graph break fails here);
    the request's records and residual equal it alone, and the only shape run is one row wide. Dynamo's caches
    emptied first: the step's code is the one every GraphedDecode compiles, and the shapes tests/test_graphed.py
    traced before it in the same process count toward its recompile limit (a hard failure under fullgraph)."""
    torch._dynamo.reset()
    graphs = GraphedDecode(lm, n_blocks=64, compile="eager", max_rows=8, row_buckets=ROW_BUCKETS)
    assert graphs.rows == (1, 8)
    req = request(6)
    sink = run_alone(lm, req, ROWS, graphs, max_batch=8)
    assert graphs.error is None and graphs.shapes == {(1, MIN_WIDTH)}
    assert_same_run(sink, alone(lm, req, ROWS))


def test_the_static_flag_says_in_one_line_that_it_is_gone(tiny_model_dir):
    done = subprocess.run([sys.executable, "-m", "engine", "generate", "--model", str(tiny_model_dir), "--prompt",
                           "hi", "--static"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr          # a usage error, as every other
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and "--static is gone" in done.stderr


# --- on a GPU: the one-row CUDA graph ----------------------------------------------------------------------

def graphed_alone(lm, req, replays: int = 3) -> tuple[Sink, GraphedDecode]:
    graphs = GraphedDecode(lm, n_blocks=64, max_rows=8, row_buckets=ROW_BUCKETS)       # auto: CUDA graphs
    assert graphs.graphs
    graphs.warm_up((MIN_WIDTH,))
    for _ in range(replays):                                                          # record, replay
        sink = run_alone(lm, req, CAPTURE_OFF, graphs, max_batch=8)
    assert graphs.error is None and (1, MIN_WIDTH) in graphs.shapes
    return sink, graphs


@needs_cuda
def test_cuda_one_row_graph_greedy_equals_model_generate_in_float32(tiny_model_dir):
    cuda = load_model(str(tiny_model_dir), device="cuda", dtype="float32")
    req = request(20)
    sink, _ = graphed_alone(cuda, req)
    prompt = [p.id for p in sink.records[0].prompt]
    with torch.no_grad():
        ref = cuda.model.generate(torch.tensor([prompt], device="cuda"), do_sample=False, max_new_tokens=20)
    got = [r.token.id for r in sink.records[:-1]]
    assert got == ref[0, len(prompt):len(prompt) + len(got)].tolist()
    assert_same_run(sink.records, alone(cuda, req))


@needs_cuda
@pytest.mark.slow
def test_cuda_one_row_graph_smollm2_greedy_equals_model_generate():
    if not (cache_dir() / "smollm2-135m-instruct" / "config.json").exists():
        pytest.skip("the embedded SmolLM2 is not provisioned here")
    cuda = load_model("default", device="cuda", dtype="float32")
    sink, _ = graphed_alone(cuda, GenerationRequest("What is the capital of France?", max_new_tokens=24))
    prompt = [p.id for p in sink.records[0].prompt]
    with torch.no_grad():
        ref = cuda.model.generate(torch.tensor([prompt], device="cuda"), do_sample=False, max_new_tokens=24)
    got = [r.token.id for r in sink.records[:-1]]
    assert got == ref[0, len(prompt):len(prompt) + len(got)].tolist()
    assert "Paris" in sink.records[-1].text


@needs_cuda
@pytest.mark.parametrize("model", ["tiny", "smollm2"])
def test_greedy_on_cuda_in_float32_equals_greedy_on_the_cpu(model, tiny_model_dir):
    """A request alone through the runner on both devices (no graphs): the same tokens and text. SmolLM2 where it
    is provisioned (on a lent GPU machine, `bash bench/gpu_session.sh smollm2` converts a carried GGUF)."""
    if model == "smollm2" and not (cache_dir() / "smollm2-135m-instruct" / "config.json").exists():
        pytest.skip("the embedded SmolLM2 is not provisioned here")
    name = str(tiny_model_dir) if model == "tiny" else "default"
    runs = {d: run_alone(load_model(name, device=d, dtype="float32"), request(24)).records for d in ("cpu", "cuda")}
    assert [r.token.id for r in runs["cuda"][:-1]] == [r.token.id for r in runs["cpu"][:-1]]
    assert runs["cuda"][-1].text == runs["cpu"][-1].text
