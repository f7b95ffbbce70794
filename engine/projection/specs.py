"""Model shapes and GPU spec sheets: the numbers every projection starts from.

A `ModelSpec` is a flat record of the architecture figures that decide memory and speed: the
attention (grouped-query or multi-head latent), the MLP or mixture of experts, and which layers
see only a window of recent tokens. It is built from a transformers config (`from_hf_config`):
a `config.json` dict goes through transformers' own `AutoConfig` offline, so each model type's
defaults (tied embeddings, a nested `text_config`, sliding-window layouts) come from the library
that defines the model, not from keys read by hand. Named presets (`MODEL_PRESETS`) are built the
same way from the public configs in `engine.projection.public_configs`.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Iterator, Mapping

from engine.errors import ConfigError
from engine.projection.public_configs import PUBLIC_CONFIGS
from engine.projection.units import card_bytes

# Bytes one stored value takes in each precision the playground talks about.
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0, "float32": 4.0,
    "bf16": 2.0, "bfloat16": 2.0,
    "fp16": 2.0, "float16": 2.0,
    "fp8": 1.0, "int8": 1.0,
    "int4": 0.5, "nf4": 0.5,
}


def dtype_bytes(name: str) -> float:
    """Bytes per value for a precision name such as 'bf16' or 'torch.bfloat16'."""
    key = str(name).lower().removeprefix("torch.")
    if key not in DTYPE_BYTES:
        raise ValueError(f"unknown precision {name!r}; known: {sorted(set(DTYPE_BYTES))}")
    return DTYPE_BYTES[key]


@dataclass(frozen=True)
class ModelSpec:
    """Architecture figures of a decoder-only transformer (Llama family and its relatives)."""

    name: str
    n_layers: int
    d_model: int
    n_heads: int            # query heads
    n_kv_heads: int         # key/value heads (grouped-query attention when < n_heads)
    head_dim: int           # query/key width per head (MLA: the no-RoPE plus the RoPE part)
    intermediate_size: int  # width of a dense layer's SwiGLU MLP (gate, up and down projections)
    vocab_size: int
    max_context: int
    rope_theta: float = 10_000.0
    tie_embeddings: bool = False
    attention_bias: bool = False  # biases on Q, K and V (Qwen2)
    architecture: str = "LlamaForCausalLM"
    model_type: str = "llama"
    norms_per_layer: int = 2      # RMSNorms per layer (Gemma 2/3 also norm after attention and MLP: 4)
    qk_norm: bool = False         # learned RMSNorms over head_dim on queries and keys (Qwen3, Gemma 3)
    # Mixture of experts: `moe_layers` layers replace their MLP by `n_experts` experts of width
    # `expert_intermediate_size` (`experts_per_token` routed per token) plus always-on shared
    # experts of total width `shared_intermediate_size`; the other layers keep a dense MLP.
    n_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    shared_intermediate_size: int = 0
    moe_layers: int = 0
    # Multi-head latent attention (DeepSeek-V2/V3): each layer caches one latent of `kv_lora_rank`
    # values plus a shared RoPE key of `qk_rope_head_dim`, and rebuilds K and V from it.
    kv_lora_rank: int = 0
    q_lora_rank: int = 0          # 0: queries come from a full-rank projection
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0           # 0: the same as head_dim
    # Windowed layers: `windowed_layers` layers attend to (and cache) at most `window` tokens:
    # a sliding window (Mistral, Gemma 2/3) or a chunk (Llama 4's chunked attention).
    window: int = 0
    windowed_layers: int = 0
    window_kind: str = "sliding"

    @property
    def group_size(self) -> int:
        """Query heads that share one K/V head."""
        return self.n_heads // self.n_kv_heads

    @property
    def value_dim(self) -> int:
        return self.v_head_dim or self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0 and self.moe_layers > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def dense_layers(self) -> int:
        return self.n_layers - self.moe_layers

    @property
    def full_layers(self) -> int:
        """Layers that attend to (and cache) every token."""
        return self.n_layers - self.windowed_layers

    @classmethod
    def from_hf_config(cls, config: Any, name: str | None = None) -> "ModelSpec":
        """A spec from a transformers config object or a `config.json` dict (read through AutoConfig)."""
        outer = read_config(config) if isinstance(config, Mapping) else config
        text = outer.get_text_config(decoder=True)
        model_type = str(getattr(text, "model_type", "") or "llama")
        family = _family(model_type, outer)
        if isinstance(config, Mapping):
            _check_shape_keys(config)
        try:
            fields = {**family, **_core_fields(text), **_moe_fields(text, model_type), **_mla_fields(text),
                      **_window_fields(text)}
            arch = (getattr(outer, "architectures", None) or [_ARCH.get(model_type, model_type)])[0]
            return cls(name=name or getattr(outer, "_name_or_path", "") or model_type, architecture=str(arch),
                       model_type=model_type, **fields)
        except (TypeError, ValueError, AttributeError) as err:
            raise ConfigError(f"the {model_type} config is incomplete or malformed: {err}") from None

    @classmethod
    def from_json(cls, path: str | Path) -> "ModelSpec":
        """A spec from a Hugging Face `config.json` file; a `ConfigError` names what is wrong with it."""
        data = load_config_json(path)
        folder = Path(path) if Path(path).is_dir() else Path(path).parent
        return cls.from_hf_config(data, name=data.get("_name_or_path") or folder.name or None)

    def with_full_mha(self) -> "ModelSpec":
        """The same model with one K/V head per query head (no grouped-query attention)."""
        return replace(self, name=f"{self.name} (full MHA)", n_kv_heads=self.n_heads)

    def without_window(self) -> "ModelSpec":
        """The same model with every layer attending to (and caching) the whole context."""
        return replace(self, name=f"{self.name} (no window)", window=0, windowed_layers=0)

    def without_mla(self) -> "ModelSpec":
        """The same attention as plain multi-head attention: full K and V cached per head."""
        return replace(self, name=f"{self.name} (plain MHA)", kv_lora_rank=0, q_lora_rank=0,
                       n_kv_heads=self.n_heads)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- reading a config.json offline through transformers ------------------------------------------

# model_type -> norms per layer, learned q/k norms, Q/K/V biases: what the projection models.
FAMILIES: dict[str, tuple[int, bool, bool]] = {
    "llama": (2, False, False), "mistral": (2, False, False), "mixtral": (2, False, False),
    "qwen2": (2, False, True), "qwen3": (2, True, False), "qwen3_moe": (2, True, False),
    "gemma": (2, False, False), "gemma2": (4, False, False), "gemma3_text": (4, True, False),
    "llama4_text": (2, False, False), "deepseek_v2": (2, False, False), "deepseek_v3": (2, False, False),
}
_ARCH = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
_ARCH_TYPES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2"}


def load_config_json(path: str | Path) -> dict[str, Any]:
    """The dict in a `config.json` (a folder holding one also works); one-line errors."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ConfigError(f"no model config at {str(path)!r}")
    try:
        data = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read {str(path)!r}: {err}") from None
    except json.JSONDecodeError as err:
        raise ConfigError(f"{str(path)!r} is not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{str(path)!r} holds a JSON {type(data).__name__}, not a config object")
    return data


def read_config(data: Mapping[str, Any]) -> Any:
    """A transformers config object from a config.json dict, offline, with its model type's defaults.

    A dict without `model_type` is read by its architecture name, else as Llama (the playground's family).
    """
    # lazy: transformers (and torch behind it) stay out of the torch-free projection plane until a config is read
    from transformers import AutoConfig
    from transformers.utils import logging as transformers_logging

    archs = data.get("architectures") or []
    model_type = data.get("model_type") or next((_ARCH_TYPES[a] for a in archs if a in _ARCH_TYPES), "llama")
    kwargs = {k: v for k, v in data.items() if k != "model_type"}
    quiet = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()   # the library's notes on a public config are not our errors
    try:
        return AutoConfig.for_model(str(model_type), **kwargs)
    except ValueError as err:
        if "Unrecognized model identifier" in str(err):
            raise ConfigError(f"model type {model_type!r} is unknown to transformers; the projection models "
                              f"{', '.join(FAMILIES)}") from None
        raise ConfigError(f"transformers cannot read this {model_type} config: {_first_line(err)}") from None
    except Exception as err:  # noqa: BLE001 - transformers raises several validation error types
        raise ConfigError(f"transformers cannot read this {model_type} config: {_first_line(err)}") from None
    finally:
        transformers_logging.set_verbosity(quiet)


SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads")


def _check_shape_keys(data: Mapping[str, Any]) -> None:
    """Every real config.json states the decoder's shape; without it transformers would silently
    fill in its defaults for another model (Llama 2 7B's for a bare llama config)."""
    text = data.get("text_config") if isinstance(data.get("text_config"), Mapping) else data
    missing = [k for k in SHAPE_KEYS if k not in text and k not in data]
    if missing:
        raise ConfigError(f"the config does not state {', '.join(missing)}: it does not describe a model's shape")


def _first_line(err: Exception) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return " ".join(lines[:2])[:200] or type(err).__name__


def _family(model_type: str, outer: Any) -> dict[str, Any]:
    if model_type not in FAMILIES:
        arch = (getattr(outer, "architectures", None) or [model_type])[0]
        raise ConfigError(f"{arch} (model type {model_type!r}) is not an architecture the projection models; "
                          f"it models {', '.join(FAMILIES)}")
    norms, qk_norm, qkv_bias = FAMILIES[model_type]
    return dict(norms_per_layer=norms, qk_norm=qk_norm)


def _required(config: Any, key: str) -> int:
    value = getattr(config, key, None)
    if value is None:
        raise ConfigError(f"the config has no {key}")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key} must be a positive whole number, not {value!r}")
    return value


def _rope_theta(text: Any) -> float:
    """transformers v5 keeps RoPE under rope_parameters (Gemma 3: one entry per layer type)."""
    params = getattr(text, "rope_parameters", None) or {}
    if "full_attention" in params:
        params = params["full_attention"]
    return float(params.get("rope_theta") or getattr(text, "rope_theta", None) or 10_000.0)


def _core_fields(text: Any) -> dict[str, Any]:
    n_heads, d_model = _required(text, "num_attention_heads"), _required(text, "hidden_size")
    model_type = getattr(text, "model_type", "llama")
    return dict(
        n_layers=_required(text, "num_hidden_layers"), d_model=d_model, n_heads=n_heads,
        n_kv_heads=int(getattr(text, "num_key_value_heads", None) or n_heads),
        head_dim=int(getattr(text, "head_dim", None) or d_model // n_heads),
        intermediate_size=int(getattr(text, "intermediate_size_mlp", None) or _required(text, "intermediate_size")),
        vocab_size=_required(text, "vocab_size"), max_context=_required(text, "max_position_embeddings"),
        rope_theta=_rope_theta(text), tie_embeddings=bool(getattr(text, "tie_word_embeddings", False)),
        attention_bias=FAMILIES[model_type][2] or bool(getattr(text, "attention_bias", False)),
    )


def _moe_layer_count(text: Any, model_type: str, n_experts: int) -> int:
    """Layers whose MLP is a mixture of experts, by each model's own rule in transformers."""
    layers = text.num_hidden_layers
    if model_type == "qwen3_moe":
        return sum(1 for i in range(layers)
                   if i not in (text.mlp_only_layers or []) and (i + 1) % text.decoder_sparse_step == 0)
    if model_type.startswith("deepseek"):
        return layers - int(text.first_k_dense_replace or 0)
    if model_type == "llama4_text":
        return len(text.moe_layers)
    return layers if n_experts else 0


def _moe_fields(text: Any, model_type: str) -> dict[str, Any]:
    n_experts = int(getattr(text, "n_routed_experts", None) or getattr(text, "num_local_experts", None)
                    or getattr(text, "num_experts", None) or 0)
    if not n_experts:
        return {}
    width = int(getattr(text, "moe_intermediate_size", None) or text.intermediate_size)
    shared = 0
    if model_type.startswith("deepseek"):
        shared = int(text.n_shared_experts or 0) * width
    elif model_type == "llama4_text":
        shared = width                     # one shared expert as wide as a routed one
    return dict(n_experts=n_experts, experts_per_token=int(text.num_experts_per_tok), expert_intermediate_size=width,
                shared_intermediate_size=shared, moe_layers=_moe_layer_count(text, model_type, n_experts))


def _mla_fields(text: Any) -> dict[str, Any]:
    rank = int(getattr(text, "kv_lora_rank", None) or 0)
    if not rank:
        return {}
    rope, nope = int(text.qk_rope_head_dim), int(text.qk_nope_head_dim)
    return dict(kv_lora_rank=rank, q_lora_rank=int(getattr(text, "q_lora_rank", None) or 0), qk_rope_head_dim=rope,
                head_dim=nope + rope, v_head_dim=int(text.v_head_dim))


def _window_fields(text: Any) -> dict[str, Any]:
    """Which layers see a window: transformers' `layer_types` where the config has them, else a
    `sliding_window` on every layer (Mistral)."""
    types = list(getattr(text, "layer_types", None) or [])
    if types.count("chunked_attention"):
        return dict(window=int(text.attention_chunk_size), windowed_layers=types.count("chunked_attention"),
                    window_kind="chunked")
    if types.count("sliding_attention"):
        return dict(window=int(text.sliding_window), windowed_layers=types.count("sliding_attention"))
    window = getattr(text, "sliding_window", None)
    if not types and window and getattr(text, "use_sliding_window", True):
        return dict(window=int(window), windowed_layers=int(text.num_hidden_layers))
    return {}


# --- presets ------------------------------------------------------------------------------------

class Presets(Mapping[str, ModelSpec]):
    """Named model specs. A public config is read (through transformers, and torch behind it) on first use,
    so importing the projection plane loads neither."""

    def __init__(self, entries: dict[str, ModelSpec | tuple[str, str]]):
        self._entries = dict(entries)      # a spec, or (public config key, display name) not read yet

    def __getitem__(self, key: str) -> ModelSpec:
        entry = self._entries[key]
        if isinstance(entry, tuple):
            entry = self._entries[key] = ModelSpec.from_hf_config(PUBLIC_CONFIGS[entry[0]], name=entry[1])
        return entry

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


MODEL_PRESETS: Presets = Presets({
    "llama-3.1-8b": ("llama-3.1-8b", "Llama 3.1 8B"),
    "llama-3.1-70b": ("llama-3.1-70b", "Llama 3.1 70B"),
    "llama-3.1-405b": ("llama-3.1-405b", "Llama 3.1 405B"),
    "llama-3.2-1b": ModelSpec("Llama 3.2 1B", 16, 2048, 32, 8, 64, 8192, 128_256, 131_072, 500_000.0, True),
    "llama-3.2-3b": ModelSpec("Llama 3.2 3B", 28, 3072, 24, 8, 128, 8192, 128_256, 131_072, 500_000.0, True),
    "smollm2-135m": ModelSpec("SmolLM2-135M", 30, 576, 9, 3, 64, 1536, 49_152, 8192, 100_000.0, True),
    "qwen2.5-coder-0.5b": ModelSpec("Qwen2.5-Coder 0.5B", 24, 896, 14, 2, 64, 4864, 151_936, 32_768,
                                    1_000_000.0, True, True, "Qwen2ForCausalLM", "qwen2"),
    "qwen2.5-coder-1.5b": ModelSpec("Qwen2.5-Coder 1.5B", 28, 1536, 12, 2, 128, 8960, 151_936, 32_768,
                                    1_000_000.0, True, True, "Qwen2ForCausalLM", "qwen2"),
    "mistral-7b-v0.1": ("mistral-7b-v0.1", "Mistral 7B v0.1"),
    "mixtral-8x7b": ("mixtral-8x7b", "Mixtral 8x7B"),
    "qwen3-30b-a3b": ("qwen3-30b-a3b", "Qwen3 30B-A3B"),
    "deepseek-v3": ("deepseek-v3", "DeepSeek-V3"),
    "gemma-2-9b": ("gemma-2-9b", "Gemma 2 9B"),
    "gemma-3-27b": ("gemma-3-27b", "Gemma 3 27B"),
    "llama-4-scout": ("llama-4-scout", "Llama 4 Scout 17B-16E"),
})


@dataclass(frozen=True)
class GPUSpec:
    """Spec-sheet figures of one accelerator (dense tensor throughput, no sparsity)."""

    name: str
    memory_gb: float          # as on the spec sheet ("80 GB"), which is GiB of HBM: see engine/projection/units.py
    bandwidth_tbs: float      # TB/s
    bf16_tflops: float
    fp8_tflops: float | None  # None: no FP8 tensor cores
    interconnect_gbs: float = 64.0  # GPU-to-GPU link inside a node, GB/s both directions together
    link: str = "PCIe Gen4"

    @property
    def memory_bytes(self) -> float:
        """The card's memory in bytes: the spec sheet's "80 GB" is 80 GiB."""
        return card_bytes(self.memory_gb)

    @property
    def bandwidth_bytes_s(self) -> float:
        return self.bandwidth_tbs * 1e12

    def peak_flops(self, precision: str = "bf16") -> float:
        """Peak FLOP/s for matmuls in this precision (FP8/INT8 use the 8-bit rate when present)."""
        if dtype_bytes(precision) <= 1 and self.fp8_tflops:
            return self.fp8_tflops * 1e12
        return self.bf16_tflops * 1e12


GPU_PRESETS: dict[str, GPUSpec] = {
    "h100-sxm": GPUSpec("H100 SXM", 80, 3.35, 989, 1979, 900, "NVLink 4"),
    "h100-pcie": GPUSpec("H100 PCIe", 80, 2.0, 756, 1513, 128, "PCIe Gen5"),
    "h200": GPUSpec("H200", 141, 4.8, 989, 1979, 900, "NVLink 4"),
    "a100-80gb": GPUSpec("A100 SXM 80GB", 80, 2.04, 312, None, 600, "NVLink 3"),
    "l40s": GPUSpec("L40S", 48, 0.864, 362, 733, 64, "PCIe Gen4"),
    "rtx-4090": GPUSpec("RTX 4090", 24, 1.0, 165, 330, 64, "PCIe Gen4"),
    "b200": GPUSpec("B200", 180, 8.0, 2250, 4500, 1800, "NVLink 5"),
}


def model_preset(key: str) -> ModelSpec:
    try:
        return MODEL_PRESETS[key]
    except KeyError:
        raise KeyError(f"unknown model preset {key!r}; known: {', '.join(MODEL_PRESETS)}") from None


def gpu_preset(key: str) -> GPUSpec:
    try:
        return GPU_PRESETS[key]
    except KeyError:
        raise KeyError(f"unknown GPU {key!r}; known: {', '.join(GPU_PRESETS)}") from None
