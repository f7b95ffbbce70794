"""Attention at the whole context: the command line's capture budget and its safetensors file, what a run keeps and
how the server recomputes from it (in-process; tests/test_remote_pages.py runs the page over HTTP), the long text."""
from __future__ import annotations

import contextlib
import io
import subprocess

import numpy as np
import pytest
import torch

from conftest import tiny_prompt
from engine.core.capture_file import CaptureFileError, read_capture
from engine.core.generate import GenerationRequest, generate
from engine.core.hooks import CapturePolicy, count_hooks
from engine.core.kept import KeptInputs
from engine.errors import ContextLengthError, InvalidRequestError
from engine.projection.specs import MODEL_PRESETS
from engine.serving.capture import capture_policy, kept_plan
from engine.serving.limits import capture_bytes



def cli(*args: str) -> subprocess.CompletedProcess:
    """`python -m engine ARGS`, run in this process (its exit code, stdout and stderr; no interpreter to start:
    tests/test_engine_errors.py runs the command line as a process of its own)."""
    from engine.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return subprocess.CompletedProcess(["python", "-m", "engine", *args], code, out.getvalue(), err.getvalue())


def eager_attentions(lm, ids):
    from transformers import AutoModelForCausalLM

    eager = AutoModelForCausalLM.from_pretrained(lm.source, attn_implementation="eager").eval()
    with torch.no_grad():
        return eager(torch.tensor([ids]), output_attentions=True).attentions


# --- the capture policy ------------------------------------------------------------------------------------------

def test_long_prompts_keep_every_layer_on_demand_within_the_budget():
    spec = MODEL_PRESETS["smollm2-135m"]
    short, note = capture_policy(spec, 60, 32)
    assert short.views and short.layers is None and short.inputs is None and note is None   # maps in its files too
    assert short.residual_ids(30) == tuple(range(31))
    long, note = capture_policy(spec, 2000, 256)
    assert not long.views and long.inputs is None and note is None    # every layer's residual; maps derived on demand
    assert capture_bytes(spec, long, 2000, 256) <= 256 * 2**20
    huge, note = capture_policy(spec, 8000, 192)                                     # 586 MB would not fit 256 MiB
    assert 2 <= len(huge.inputs) < spec.n_layers and huge.inputs[0] == 0 and huge.inputs[-1] == 30
    assert "rebuilt" in note and "would not fit" in note and "of 30 layers" in note
    assert capture_bytes(spec, huge, 8000, 192) <= 256 * 2**20
    plan = kept_plan(MODEL_PRESETS["llama-3.1-8b"], 32768, 512 * 2**20, 2)
    assert plan.per_position == len(plan.layers) * 4096 * 2


# --- the command line -----------------------------------------------------------------------------------------------

def test_cli_refuses_a_capture_over_the_budget_up_front(tiny_model_dir, tmp_path):
    out = cli("generate", "--model", str(tiny_model_dir), "--prompt", tiny_prompt(150), "--max-new-tokens", "4",
              "--capture-layers", "all", "--max-capture-mb", "1", "--capture-out", str(tmp_path / "x.safetensors"))
    assert out.returncode == 2 and out.stdout == "" and "Traceback" not in out.stderr
    assert "over the capture budget of 1.05 MB" in out.stderr and "nothing was run" in out.stderr
    assert "--keep-inputs" in out.stderr and not (tmp_path / "x.safetensors").exists()
    long = cli("generate", "--model", str(tiny_model_dir), "--prompt", tiny_prompt(300), "--raw")
    assert long.returncode == 2 and "reads at most 256" in long.stderr


def test_cli_writes_tensors_that_recompute_attention_exactly(tiny_model_dir, tiny_lm, tmp_path):
    from engine.core.attention_maps import attention_rows
    from engine.core.recompute import layer_qk

    path = tmp_path / "run.safetensors"
    out = cli("generate", "--model", str(tiny_model_dir), "--prompt", tiny_prompt(20), "--max-new-tokens", "5",
              "--capture-layers", "1", "--keep-inputs", "all", "--capture-out", str(path))
    assert out.returncode == 0, out.stderr
    cap = read_capture(path)
    n = cap.meta["n_positions"]
    assert cap.meta["kept_layers"] == [0, 1, 2] and cap.tensors["ids"].shape == (n,)
    assert cap.tensors["layer.2.input"].shape == cap.tensors["norm.input"].shape == (n, 64)
    assert cap.tensors["layer.1.attention.prefill"].shape == (4, cap.meta["n_prompt"], cap.meta["n_prompt"])
    reference = eager_attentions(tiny_lm, cap.tensors["ids"].tolist())
    for layer in range(3):
        qk = layer_qk(tiny_lm.model, layer, cap.tensors[f"layer.{layer}.input"])
        np.testing.assert_allclose(attention_rows(qk, [0, 1, 2, 3], 0, n).numpy(), reference[layer][0].numpy(),
                                   atol=1e-5)
    (tmp_path / "other.safetensors").write_bytes(b"not a capture at all")
    with pytest.raises(CaptureFileError):
        read_capture(tmp_path / "other.safetensors")


# --- what a run keeps ------------------------------------------------------------------------------------------------

def test_kept_inputs_are_linear_and_overwrite_a_pass_run_again(tiny_lm):
    request = GenerationRequest(tiny_prompt(30), max_new_tokens=6)
    policy = CapturePolicy(layers=(), attention=False, stats=False, inputs=None)
    kept = KeptInputs((0, 1, 2), 64, torch.float32, "cpu", capacity=4)            # grows as it fills
    records = list(generate(tiny_lm, request, policy, kept=kept))
    n = len(records[0].prompt) + len(records) - 2                                   # the last token is never fed
    assert kept.length == n and kept.input(1).shape == (n, 64)
    assert count_hooks(tiny_lm.model) == 0
    before = kept.input(2).clone()
    kept.write(2, n - 1, before[n - 1:] * 0 + 7)                                    # a retried pass rewrites in place
    kept.commit()
    assert kept.length == n and torch.all(kept.input(2)[n - 1] == 7)



def kept_run(lm, prompt: str | list[int], new: int):
    """A generation that keeps every layer's input; (ids of every position, the KeptInputs)."""
    request = GenerationRequest(prompt if isinstance(prompt, str) else "ids", max_new_tokens=new, chat=False)
    kept = KeptInputs(tuple(range(lm.spec.n_layers)), lm.spec.d_model, lm.dtype, lm.device)
    ids = None if isinstance(prompt, str) else prompt
    records = list(generate(lm, request, CapturePolicy(attention=False, inputs=None), ids=ids, kept=kept))
    tokens = [records[0].token.id] + [r.token.id for r in records[1:-1]]
    return [p.id for p in records[0].prompt] + tokens[:-1], kept


def assert_maps_equal_eager(lm, ids, kept, layers, atol=1e-5):
    from engine.core.attention_maps import attention_rows
    from engine.core.recompute import layer_qk

    reference = eager_attentions(lm, ids)
    heads = list(range(lm.spec.n_heads))
    for layer in layers:
        mine = attention_rows(layer_qk(lm.model, layer, kept.input(layer)), heads, 0, len(ids))
        np.testing.assert_allclose(mine.numpy(), reference[layer][0].numpy(), atol=atol)


def test_held_out_qwen2_shapes_through_the_engine_equal_hf_eager(tmp_path):
    """Qwen2.5-0.5B's attention shapes (14 query heads over 2 K/V heads, head_dim 64, biased QKV), a sliding window
    on the second layer, random weights, loaded by the engine's loader and generated with kept inputs."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from conftest import write_tiny_tokenizer
    from engine.core.loader import load_model

    torch.manual_seed(3)
    config = Qwen2Config(vocab_size=96, hidden_size=896, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=512,
                         use_sliding_window=True, sliding_window=16, max_window_layers=1, bos_token_id=1,
                         eos_token_id=2, tie_word_embeddings=True)
    Qwen2ForCausalLM(config).save_pretrained(tmp_path, safe_serialization=True)
    write_tiny_tokenizer(tmp_path, 96)
    lm = load_model(str(tmp_path), device="cpu", dtype="float32")
    ids, kept = kept_run(lm, list(range(4, 44)), 4)
    assert_maps_equal_eager(lm, ids, kept, [0, 1])


@pytest.mark.slow
def test_smollm2_recomputed_maps_equal_hf_eager(smol_lm):
    text = ("The lighthouse keeper climbed the stairs every evening, counting each step aloud, because the count "
            "was the only thing that never changed on the island. ") * 8
    ids, kept = kept_run(smol_lm, text, 3)
    assert len(ids) > 200
    assert_maps_equal_eager(smol_lm, ids, kept, [0, 7, 15, 29])


# --- the service: maps, rows, summaries by run id -----------------------------------------------------------------

@pytest.fixture
def service(tiny_lm):
    from engine.service.service import EngineService

    svc = EngineService(tiny_lm)
    yield svc
    svc.close()


def run_with(service, prompt: str, new: int, policy):
    handle = service.submit(GenerationRequest(prompt, max_new_tokens=new), policy)
    return handle.run_id, list(handle.records())


def test_service_maps_rows_and_summaries_equal_eager_and_the_records(service, tiny_lm):
    from engine.service.jobs import position_ids
    from test_recompute import reference_stats

    policy, _ = capture_policy(tiny_lm.spec, 60, 6)
    run, records = run_with(service, tiny_prompt(60), 6, policy)
    ids = position_ids(records)
    reference = eager_attentions(tiny_lm, ids)
    state = service.quick("attention.kept", {"run_id": run})
    assert state.positions == len(ids) and state.bytes == len(ids) * state.bytes_per_position
    maps = service.quick("attention.map", {"run_id": run, "layer": 2, "heads": [0, 3]})
    for m in maps:
        below = np.tril_indices(len(ids))
        np.testing.assert_allclose(m.values[below], reference[2][0, m.head].numpy()[below], atol=1e-5)
    n_prompt = len(records[0].prompt)
    views = service.quick("run.views", {"run_id": run})               # what the run's files carry, derived
    assert records[0].captures == {} and views[0].captures[2].attention.shape == (4, n_prompt, n_prompt)
    np.testing.assert_allclose(maps[0].values[:n_prompt, :n_prompt][np.tril_indices(n_prompt)],
                               views[0].captures[2].attention[0][np.tril_indices(n_prompt)], atol=1e-5)
    for rec in views[1:-1]:
        p = n_prompt + rec.step - 1
        np.testing.assert_allclose(rec.captures[1].attention[:, 0], reference[1][0, :, p, :p + 1].numpy(), atol=1e-5)
        norms = service.quick("run.norms", {"run_id": run, "layer": 2, "position": p})
        for name in ("q", "k", "v"):
            np.testing.assert_allclose(getattr(norms, name), getattr(rec.captures[2], f"{name}_norm"), rtol=1e-5)
    pooled = service.quick("attention.map", {"run_id": run, "layer": 0, "heads": [1], "cells": 16})[0]
    assert pooled.factor == 5 and "5x5" in pooled.how
    row = service.quick("attention.row", {"run_id": run, "layer": 1, "position": 30})
    np.testing.assert_allclose(row.probs, reference[1][0, :, 30, :31].numpy(), atol=1e-5)
    summary = service.submit_job("attention.summary", {"run_id": run, "window": 4}).value()
    for layer in range(3):
        mine = np.stack([summary.entropy[layer], summary.sink[layer], summary.distance[layer], summary.local[layer]])
        np.testing.assert_allclose(mine, reference_stats(reference[layer][0].numpy(), 4), rtol=1e-4, atol=1e-5)


def test_torch_work_beside_the_step_loop_runs_in_threads_that_end_with_it(service, tiny_lm, monkeypatch):
    """A quick computation and a run file with its views, asked from a thread that lives on (as an HTTP server's
    pooled threads do), run in a passing thread (engine.core.openmp.passing): an OpenMP team left on the caller's
    thread made libgomp throttle the step loop's, and a lone step took 28-29 ms against 21-23 after one such file."""
    import threading

    from engine import runs as run_files
    from engine.service import jobs

    policy, _ = capture_policy(tiny_lm.spec, 20, 4)
    run, _ = run_with(service, tiny_prompt(20), 4, policy)
    service.written(run)                                          # the run writer's own file (no views) is done
    seen = []
    real_file_of, real_find = run_files.file_of, jobs.find
    monkeypatch.setattr(run_files, "file_of", lambda *a, **k: seen.append(threading.current_thread()) or
                        real_file_of(*a, **k))
    monkeypatch.setattr(jobs, "find", lambda name: seen.append(threading.current_thread()) or real_find(name))
    got = {}
    caller = threading.Thread(target=lambda: got.update(file=service.run_file(run),
                                                        maps=service.quick("attention.map",
                                                                           {"run_id": run, "layer": 1, "heads": [0]})))
    caller.start()
    caller.join()
    assert got["file"][:2] == b"PK" and len(got["maps"]) == 1        # the real file, the real map
    assert len(seen) >= 2 and all(t is not caller and not t.is_alive() for t in seen)


def test_a_layer_not_kept_is_rebuilt_by_a_job(service, tiny_lm):
    policy = CapturePolicy(layers=(), inputs=(0,))
    run, records = run_with(service, tiny_prompt(50), 3, policy)
    with pytest.raises(InvalidRequestError, match="attention.rebuild"):
        service.quick("attention.map", {"run_id": run, "layer": 2, "heads": [0]})
    state = service.submit_job("attention.rebuild", {"run_id": run, "layer": 2}).value()
    assert state.rebuilt == (2,) and state.layers == (0,)
    from engine.service.jobs import position_ids

    ids = position_ids(records)
    reference = eager_attentions(tiny_lm, ids)
    m = service.quick("attention.map", {"run_id": run, "layer": 2, "heads": [1]})[0]
    below = np.tril_indices(len(ids))
    np.testing.assert_allclose(m.values[below], reference[2][0, 1].numpy()[below], atol=1e-5)


def test_batched_runs_with_a_shared_prefix_keep_their_own_inputs(tiny_lm):
    """Requests batched together, the second reusing the first's prompt start from the prefix cache: each run's kept
    inputs give the maps of that request alone."""
    from engine.service.jobs import position_ids
    from engine.service.service import EngineService

    svc = EngineService(tiny_lm)
    try:
        policy = CapturePolicy(attention=False, inputs=None)
        common = tiny_prompt(30, seed=5)
        first = svc.submit(GenerationRequest(common + " w1 w2", max_new_tokens=4), policy)
        list(first.records())
        handles = [svc.submit(GenerationRequest(common + f" w{i} w9 w7", max_new_tokens=5), policy) for i in (3, 4)]
        results = [(h.run_id, list(h.records())) for h in handles]
        assert any(r[0].reused_tokens > 0 for _, r in results)
        for run, records in results:
            ids = position_ids(records)
            reference = eager_attentions(tiny_lm, ids)
            m = svc.quick("attention.map", {"run_id": run, "layer": 1, "heads": [2]})[0]
            below = np.tril_indices(len(ids))
            np.testing.assert_allclose(m.values[below], reference[1][0, 2].numpy()[below], atol=1e-5)
    finally:
        svc.close()


def test_bad_requests_and_an_evicted_run_get_clear_messages(tiny_lm, monkeypatch):
    from engine.service.runs import RunNotFoundError
    from engine.service.service import EngineService

    monkeypatch.setenv("PLAYGROUND_RUN_STORE_MB", "1")                               # room for about one run
    monkeypatch.setenv("PLAYGROUND_RUNS_MB", "0")          # none on disk (a run read back from disk: test_store_service)
    svc = EngineService(tiny_lm)
    try:
        policy = CapturePolicy(attention=False, inputs=None)
        old, _ = run_with(svc, tiny_prompt(60), 4, policy)
        cases = [({"run_id": old, "layer": 3, "heads": [0]}, "layer 3 is out of range"),
                 ({"run_id": old, "layer": 0, "heads": [4]}, "query heads out of range"),
                 ({"run_id": old, "layer": 0, "heads": [0], "rows": [0, 999]}, "reach past the run")]
        for params, message in cases:
            with pytest.raises(InvalidRequestError, match=message):
                svc.quick("attention.map", params)
        with pytest.raises(InvalidRequestError, match="position 999 is out of range"):
            svc.quick("attention.row", {"run_id": old, "layer": 0, "position": 999})
        off, _ = run_with(svc, tiny_prompt(5), 2, CapturePolicy(layers=()))
        with pytest.raises(InvalidRequestError, match="kept nothing"):
            svc.quick("attention.map", {"run_id": off, "layer": 0, "heads": [0]})
        for _ in range(6):
            run_with(svc, tiny_prompt(200), 40, policy)                              # each ~0.25 MB... until old goes
        with pytest.raises(RunNotFoundError, match="dropped to make room"):
            svc.quick("attention.map", {"run_id": old, "layer": 0, "heads": [0]})
        with pytest.raises(ContextLengthError, match="reads at most"):
            svc.submit_job("attention.context", {"lengths": [128, 4096]})
    finally:
        svc.close()


def test_the_long_text_and_the_slider_job(service, tiny_lm):
    from engine.lab.long_context import lengths_up_to, text_ids

    assert lengths_up_to(1000) == [128, 256, 512, 1000] and lengths_up_to(128) == [128]
    assert len(text_ids(tiny_lm, 200)) == 200
    handle = service.submit_job("attention.context", {"lengths": [32, 64], "window": 8})
    partial = [r.partial for r in handle.records() if getattr(r, "partial", None)]
    points = partial[-1]
    assert [p.n for p in points] == [32, 64] and [len(p) for p in partial] == [1, 2]
    point = points[-1]
    assert point.kv_bytes == 64 * 2 * 3 * 2 * 16 * 4 and point.summaries.entropy.shape == (3, 4)
    assert point.attention_bytes == 3 * 4 * 64 * 64 * 4 and point.prefill_seconds > 0


def test_a_speculative_run_keeps_its_accepted_positions_only(service, tiny_lm):
    """Verify passes write their drafts' positions; rejected ones are overwritten or cut at the end, so the kept
    inputs hold exactly the positions the run read and the maps equal HF's eager attention over them."""
    from engine.service.jobs import position_ids

    policy = CapturePolicy(attention=False, logit_lens=0, inputs=None)
    prompt = " ".join([tiny_prompt(8, seed=1)] * 4)                                 # repeats: n-grams get drafted
    handle = service.submit(GenerationRequest(prompt, max_new_tokens=12), policy, draft="ngram", k=3)
    records = list(handle.records())
    ids = position_ids(records)
    assert service.quick("attention.kept", {"run_id": handle.run_id}).positions == len(ids)
    reference = eager_attentions(tiny_lm, ids)
    m = service.quick("attention.map", {"run_id": handle.run_id, "layer": 2, "heads": [3]})[0]
    below = np.tril_indices(len(ids))
    np.testing.assert_allclose(m.values[below], reference[2][0, 3].numpy()[below], atol=1e-5)
