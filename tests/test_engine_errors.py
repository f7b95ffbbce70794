"""Every user-fixable problem is a typed EngineError with a specific message, and the engine stays usable."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import tiny_prompt
from engine import errors
from engine.core.generate import GenerationRequest, generate
from engine.core.loader import convert_gguf, load_model

ROOT = Path(__file__).resolve().parents[1]


def first(lm, **kw):
    return next(generate(lm, GenerationRequest(**{"prompt": tiny_prompt(), **kw})))


def test_missing_folder(tmp_path):
    with pytest.raises(errors.ModelNotFoundError, match="no model called"):
        load_model(str(tmp_path / "nope"))


def test_folder_without_weights_and_pickled_weights_refused(tmp_path, tiny_model_dir):
    (tmp_path / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    with pytest.raises(errors.NoWeightsError, match="no .safetensors"):
        load_model(str(tmp_path))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not unpickled")
    with pytest.raises(errors.NoWeightsError, match="pickled"):
        load_model(str(tmp_path))


def test_non_llama_architecture_is_refused(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50)).save_pretrained(tmp_path)
    with pytest.raises(errors.UnsupportedModelError, match="GPT2LMHeadModel"):
        load_model(str(tmp_path))


def test_unreadable_gguf(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(errors.GGUFError, match="cannot read GGUF"):
        convert_gguf(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_hub_id_without_a_hub_says_how_to_use_a_folder(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(errors.HubUnavailableError, match="local folder"):
        load_model("meta-llama/Llama-3.1-8B-Instruct")


def test_context_limits(tiny_lm):
    limit = tiny_lm.spec.max_context
    with pytest.raises(errors.ContextLengthError, match="reads at most"):
        first(tiny_lm, prompt=tiny_prompt(limit + 5))
    with pytest.raises(errors.ContextLengthError, match="ask for at most"):
        first(tiny_lm, prompt=tiny_prompt(limit - 10), max_new_tokens=20)
    assert first(tiny_lm).kind == "prefill"  # still usable


@pytest.mark.parametrize("settings, message", [
    ({"prompt": "   "}, "empty"),
    ({"prompt": "x" * 300_000}, "limit"),
    ({"prompt": "bad \ud800 surrogate"}, "Unicode"),
    ({"max_new_tokens": 0}, "max new tokens"),
    ({"temperature": -1.0}, "temperature"),
    ({"top_p": 0.0}, "top-p"),
    ({"top_k": -3}, "top-k"),
])
def test_invalid_requests_name_the_setting(tiny_lm, settings, message):
    with pytest.raises(errors.InvalidRequestError, match=message):
        first(tiny_lm, **settings)
    assert first(tiny_lm).kind == "prefill"


def test_insufficient_memory_is_refused_with_numbers(monkeypatch, tiny_model_dir):
    from engine.core import loader

    monkeypatch.setattr(loader, "free_memory", lambda device: 1000.0)
    with pytest.raises(errors.InsufficientMemoryError, match=r"need .* GB but only"):
        load_model(str(tiny_model_dir))


def cli(*args):
    return subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


def test_cli_generate_writes_one_json_record_per_line(tiny_model_dir, tmp_path):
    out = cli("generate", "--model", str(tiny_model_dir), "--prompt", tiny_prompt(), "--max-new-tokens", "4",
              "--capture-layers", "0-1", "--capture-out", str(tmp_path / "run.safetensors"))
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [line["kind"] for line in lines][0] == "prefill" and lines[-1]["kind"] == "done"
    assert lines[0]["captures_file"] == str(tmp_path / "run.safetensors") and "cache" in lines[1]
    assert "captures" not in lines[1]                                    # tensors go to the file, not JSON floats
    assert lines[-1]["generated_tokens"] == len(lines) - 1


def test_cli_card_and_errors(tmp_path):
    out = cli("card", "--preset", "llama-3.1-8b")
    card = json.loads(out.stdout)
    assert card["kv_bytes_per_token"]["bf16"] == 131072
    bad = cli("generate", "--model", str(tmp_path / "missing"), "--prompt", "hi")
    assert bad.returncode == 2 and "error:" in bad.stderr and "Traceback" not in bad.stderr
