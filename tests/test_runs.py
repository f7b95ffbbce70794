"""Run files (engine/runs): written from a real generation of the tiny model, read back by standard tools and by
`engine.runs.load`; old recordings still open; every kind of bad file refused with one line; the generated notebook
executed headlessly (nbclient) against a fresh run and transformers' own output_attentions."""
from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load as load_tensors
from safetensors.numpy import save as save_tensors
from transformers import AutoModelForCausalLM

from conftest import tiny_prompt
from engine.core.generate import GenerationRequest, generate_captured
from engine.core.hooks import CapturePolicy
from engine.runs import (RUN_JSON, TENSORS, RunFileError, attention_differences, dumps, load, loads, texts_with,
                         unpacked_cap)
from engine.serving.limits import server_limits
from engine.runs.notebook import bundle
from base_recording import dumps_recording
from engine.serving.recording import MAX_FILE_BYTES, new_recording


def make_recording(lm, prompt: str, chat: bool = False, new: int = 4):
    request = GenerationRequest(prompt, max_new_tokens=new, chat=chat)
    policy = CapturePolicy(logit_lens=3)
    return new_recording(lm, request, policy, generate_captured(lm, request, policy), title="a test run")


def fresh_threads() -> int:
    """torch's thread count in a fresh process here: what a notebook's kernel starts with."""
    done = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], capture_output=True,
                          text=True, timeout=120)
    return int(done.stdout.strip() or 1)


NOTEBOOK_THREADS = fresh_threads()   # the notebook's kernel's threads (its kernelspec's OMP_NUM_THREADS too), and here


@pytest.fixture(scope="module")
def tiny_run(tiny_lm):
    """A run of the tiny model, recorded on the thread count the notebook's kernel runs on: MKL sums a prefill in
    another order on another count (7e-9 apart here), and the notebook compares its rerun with the file bitwise. The
    count this process has depends on the tests that ran before in it (a room's thread tuner sets it)."""
    before = torch.get_num_threads()
    torch.set_num_threads(NOTEBOOK_THREADS)
    try:
        rec = make_recording(tiny_lm, tiny_prompt())
    finally:
        torch.set_num_threads(before)
    return rec, dumps(rec, str(tiny_lm.source), tiny_lm.name, texts_with(rec, tiny_lm.tokenizer.decode))


def unpack(data: bytes) -> tuple[dict, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return json.loads(z.read(RUN_JSON)), z.read(TENSORS)


def repack(doc: dict, blob: bytes, fix_hash: bool = True) -> bytes:
    if fix_hash:
        doc["tensors"]["sha256"] = hashlib.sha256(blob).hexdigest()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(RUN_JSON, json.dumps(doc))
        z.writestr(TENSORS, blob)
    return out.getvalue()


def test_round_trip_gives_the_same_records_and_arrays(tiny_run, tiny_lm):
    rec, data = tiny_run
    run = loads(data)
    assert run.version == 1 and run.source == str(tiny_lm.source) and run.dtype == "float32"
    assert run.prompt_ids == tiny_lm.tokenizer(rec.request.prompt)["input_ids"]
    assert run.token_ids == [rec.records[0].token.id] + [r.token.id for r in rec.records[1:-1]]
    assert run.layers == list(range(tiny_lm.spec.n_layers))
    for old, new in zip(rec.records, run.recording.records):
        assert type(old) is type(new)
        for layer, cap in getattr(old, "captures", {}).items():
            np.testing.assert_array_equal(new.captures[layer].attention, cap.attention)   # float32 kept exactly
            assert new.captures[layer].attention.dtype == np.float32
    assert run.timings["ttft_s"] == rec.done.ttft
    assert run.as_torch("records.0.captures.1.attention").shape == rec.records[0].captures[1].attention.shape
    lens = run.logit_lens()
    assert [row["layer"] for row in lens] == run.layers and all(row["token"] == tiny_lm.tokenizer.decode([row["id"]])
                                                                 for row in lens)


def test_the_same_run_saved_twice_gives_the_same_bytes(tiny_run):
    """A run file is a function of the run (but for when it was exported): saved eight times, one tensors blob.
    (Two metadata keys came out of safetensors in a random order, so half the saves differed.)"""
    run = loads(tiny_run[1])
    blobs = {unpack(dumps(run.recording))[1] for _ in range(8)}
    assert len(blobs) == 1


def test_standard_tools_read_the_file(tiny_run):
    """zipfile, json and safetensors alone: the prefill map of layer 1 is a (heads, T, T) float32 causal map."""
    rec, data = tiny_run
    doc, blob = unpack(data)
    assert doc["format"] == "inference-playground/run" and doc["version"] == 1
    tensors = load_tensors(blob)
    name = doc["recording"]["records"][0]["captures"]["1"]["attention"]["__tensor__"]
    assert name == "records.0.captures.1.attention"
    attn = tensors[name]
    n = len(rec.records[0].prompt)
    assert attn.shape == (4, n, n) and attn.dtype == np.float32
    np.testing.assert_allclose(attn.sum(-1), 1.0, atol=1e-5)
    assert np.all(np.triu(attn, 1) == 0)


def test_an_old_recording_still_opens(tiny_run):
    rec, _ = tiny_run
    run = loads(dumps_recording(rec), "old.json.gz")
    assert run.version == 0 and run.token_ids == loads(tiny_run[1]).token_ids
    np.testing.assert_allclose(run.head_map(1, 0), rec.records[0].captures[1].attention[0], atol=1e-3)   # float16


def test_load_reads_a_path(tiny_run, tmp_path):
    path = tmp_path / "x.run.zip"
    path.write_bytes(tiny_run[1])
    assert load(path).token_ids == loads(tiny_run[1]).token_ids


def bad_files(data: bytes) -> dict[str, bytes]:
    doc, blob = unpack(data)
    newer = json.loads(json.dumps(doc)) | {"version": 2}
    shape = json.loads(json.dumps(doc))
    shape["tensors"]["index"]["records.0.captures.1.attention"]["shape"] = [4, 3, 3]
    heads = json.loads(json.dumps(doc))
    heads["recording"]["records"][0]["captures"]["1"]["heads"] = [0, 1]
    heads["recording"]["records"][0]["captures"]["1"]["kv_heads"] = [0, 0]
    tensors = load_tensors(blob)
    tensors["records.0.captures.1.attention"] = np.ones((4, 30, 30), np.float32)
    bigger = json.loads(json.dumps(doc))
    bigger["tensors"]["index"]["records.0.captures.1.attention"]["shape"] = [4, 30, 30]
    headless = json.loads(json.dumps(doc))
    headless["recording"]["records"] = headless["recording"]["records"][-1:]
    flipped = bytearray(blob)
    flipped[-8] ^= 0xFF
    return {"truncated": data[: len(data) // 2], "tampered": repack(doc, bytes(flipped), fix_hash=False),
            "newer": repack(newer, blob), "index contradicts": repack(shape, blob),
            "heads contradict": repack(heads, blob), "positions contradict": repack(bigger, save_tensors(tensors)),
            "not a run": b"hello", "foreign zip": _zip({"a.txt": b"x"}), "no prefill": repack(headless, blob)}


def _zip(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for k, v in members.items():
            z.writestr(k, v)
    return out.getvalue()


EXPECTED = {"truncated": "damaged or truncated zip", "tampered": "checksum", "newer": "version 2 run file",
            "index contradicts": "but run.json says", "heads contradict": "contradicts run.json",
            "positions contradict": "contradicts run.json", "not a run": "not a run file",
            "foreign zip": "zip without run.json", "no prefill": "holds no prefill record"}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_a_bad_file_is_one_clear_line(tiny_run, kind):
    with pytest.raises(RunFileError) as err:
        loads(bad_files(tiny_run[1])[kind], "bad.run.zip")
    message = str(err.value)
    assert EXPECTED[kind] in message and "\n" not in message and message.startswith("bad.run.zip")


def test_an_oversized_file_and_a_zip_bomb_are_refused(tiny_run, tmp_path, monkeypatch):
    big = tmp_path / "big.run.zip"
    with open(big, "wb") as f:                      # on disk: up to the largest run the server can make
        f.truncate(unpacked_cap(server_limits()) + 1)
    with pytest.raises(RunFileError, match="run files are at most"):
        load(big)
    with pytest.raises(RunFileError, match="run files are at most 67.11 MB"):     # an upload: the upload cap
        loads(tiny_run[1] + bytes(MAX_FILE_BYTES), "big.run.zip")
    doc, _ = unpack(tiny_run[1])
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(RUN_JSON, json.dumps(doc))
        z.writestr(TENSORS, bytes(2**26))               # 64 MiB of zeros: 64 KB once deflated
    bomb = out.getvalue()
    assert len(bomb) < 2**20
    import engine.runs.format

    monkeypatch.setattr(engine.runs.format, "unpacked_cap", lambda limits: 2**25)      # a server that makes runs of 32 MiB
    with pytest.raises(RunFileError, match="bomb.run.zip unpacks to 67.1. MB, more than the 33.5. MB"):
        loads(bomb, "bomb.run.zip")


def test_fresh_run_matches_the_file(tiny_run, tiny_lm):
    """The notebook's check, here directly: the same request again gives the file's maps to float32 rounding."""
    rec, data = tiny_run
    run = loads(data)
    worst = attention_differences(run, generate_captured(tiny_lm, run.request, run.policy))
    assert len(worst) == tiny_lm.spec.n_layers * len(run.token_ids) and max(worst.values()) <= 1e-5


# --- the notebook, executed -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """A kernelspec for this interpreter (its ipykernel), found by nbclient through JUPYTER_PATH."""
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "kernels" / "playground-test"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({"argv": [sys.executable, "-m", "ipykernel_launcher", "-f",
                                                           "{connection_file}"],
                                                  "display_name": "playground test", "language": "python",
                                                  "env": {"OMP_NUM_THREADS": str(NOTEBOOK_THREADS)}}))
    return root


def execute(data: bytes, folder: Path, kernel: Path, page: str, layer: int, head: int, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    with zipfile.ZipFile(io.BytesIO(bundle(data, "run", page, layer, head))) as z:
        z.extractall(folder)
    monkeypatch.setenv("JUPYTER_PATH", str(kernel))
    nb = nbformat.read(folder / "run" / "run.ipynb", as_version=4)
    NotebookClient(nb, kernel_name="playground-test", timeout=300,
                   resources={"metadata": {"path": str(folder / "run")}}).execute()
    return nb


def outputs(nb) -> tuple[str, list[str]]:
    text, kinds = "", []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            text += out.get("text", "")
            kinds += list(out.get("data", {}))
    return text, kinds


def test_notebook_runs_top_to_bottom_on_the_tiny_model(tiny_run, tiny_lm, kernel, tmp_path, monkeypatch):
    """Made on a machine whose weights folder is not here: the notebook falls back to what the playground was started
    with (here the tiny model's folder)."""
    rec, _ = tiny_run
    moved = dumps(rec, "/no/such/folder", str(tiny_lm.source), texts_with(rec, tiny_lm.tokenizer.decode))
    nb = execute(moved, tmp_path, kernel, "attention", 1, 2, monkeypatch)
    text, kinds = outputs(nb)
    assert kinds.count("application/vnd.plotly.v1+json") == 2               # the heatmap and the logit-lens table
    maps = len(loads(tiny_run[1]).token_ids) * 3                             # every pass, every layer
    assert f"{maps} captured maps compared; the largest difference is 0.00e+00" in text
    diff = float(text.split("layer 1 head 2: max |difference| from the playground = ")[1].split()[0])
    assert diff <= 1e-5                                                      # transformers' own output_attentions
    assert_nnsight(text, "layer 1 head 2")


def assert_nnsight(text: str, where: str) -> None:
    """nnsight's cell: skipped with its message where nnsight is not installed, else the same head within 1e-5."""
    if "nnsight is not installed here" in text:
        return
    assert float(text.split(f"nnsight, {where}: max |difference| from the playground = ")[1].split()[0]) <= 1e-5


@pytest.mark.slow
def test_notebook_runs_on_smollm2(smol_lm, kernel, tmp_path, monkeypatch):
    rec = make_recording(smol_lm, "The capital of France is", chat=True, new=3)
    data = dumps(rec, str(smol_lm.source), smol_lm.name, texts_with(rec, smol_lm.tokenizer.decode))
    nb = execute(data, tmp_path, kernel, "journey", 12, 3, monkeypatch)
    text, kinds = outputs(nb)
    assert kinds.count("application/vnd.plotly.v1+json") == 2
    assert "the largest difference is" in text
    diff = float(text.split("layer 12 head 3: max |difference| from the playground = ")[1].split()[0])
    assert diff <= 1e-5
    assert_nnsight(text, "layer 12 head 3")


def test_the_command_line_writes_the_notebook_beside_a_run_file(tiny_run, tmp_path, capsys):
    """`python -m engine notebook FILE`: for a file from the API (or an old recording); a bad file is one line."""
    import nbformat

    from engine.cli import main

    path = tmp_path / "api.run.zip"
    path.write_bytes(tiny_run[1])
    args = ["notebook", str(path), "--page", "attention", "--layer", "2", "--head", "1"]
    assert main(args) == 0
    nb = nbformat.read(tmp_path / "api.ipynb", as_version=4)
    assert "RUN_FILE = 'api.run.zip'" in nb.cells[1].source and "LAYER, HEAD = 2, 1" in nb.cells[1].source
    path.write_bytes(tiny_run[1][:100])
    capsys.readouterr()
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "truncated zip" in err


def test_the_services_run_file_carries_views_derived_from_the_kept_residual_and_refuses_a_job(tiny_lm, tiny_model_dir):
    """file_of on the in-process service: the run keeps only its residual; the file's maps and lens are derived from
    it on the server, equal to HF eager's attention and to the lens derived from the same run alone. A measurement
    job has no run file: one line."""
    from engine.runs import file_of, recording_of
    from engine.service.service import EngineService

    svc = EngineService(tiny_lm)
    try:
        request = GenerationRequest(tiny_prompt(7, seed=3), max_new_tokens=2, chat=False)
        handle = svc.submit(request, CapturePolicy(logit_lens=5), source="api")
        records = handle.result(timeout=60)
        assert all(getattr(r, "captures", {}) == {} for r in svc.run_slice(handle.run_id).records)
        run = loads(file_of(recording_of(svc.run_slice(handle.run_id), svc), svc, run_id=handle.run_id))
        direct = generate_captured(tiny_lm, request, CapturePolicy(logit_lens=5))[0].captures
        assert [row["id"] for row in run.logit_lens()] == [direct[i].lens[0][0] for i in sorted(direct)]
        eager = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="eager").eval()
        with torch.no_grad():
            reference = eager(torch.tensor([run.prompt_ids]), output_attentions=True).attentions
        assert run.layers == [0, 1, 2] and len(run.steps) == 1
        for layer in run.layers:
            np.testing.assert_allclose(run.head_map(layer, 2), reference[layer][0, 2].numpy(), atol=1e-5)
        job = svc.submit_job("speed.context", {"lengths": [8], "repeats": 1})
        job.value(timeout=120)
        with pytest.raises(RunFileError, match="is a measurement, not a generation"):
            recording_of(svc.run_slice(job.run_id), svc)
    finally:
        svc.close()
