"""Model shapes and GPU spec sheets: the numbers every projection starts from.

A `ModelSpec` is a flat record of the architecture figures that decide memory and speed.
It is built either from a loaded Hugging Face config (`ModelSpec.from_hf_config`) or from a
named preset for models that are not loaded (`MODEL_PRESETS`). Nothing here touches torch.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Mapping

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
    """Architecture figures of a decoder-only Llama-family transformer."""

    name: str
    n_layers: int
    d_model: int
    n_heads: int            # query heads
    n_kv_heads: int         # key/value heads (grouped-query attention when < n_heads)
    head_dim: int
    intermediate_size: int  # SwiGLU hidden width (gate, up and down projections)
    vocab_size: int
    max_context: int
    rope_theta: float = 10_000.0
    tie_embeddings: bool = False
    attention_bias: bool = False  # Qwen2 has biases on Q, K and V
    architecture: str = "LlamaForCausalLM"

    @property
    def group_size(self) -> int:
        """Query heads that share one K/V head."""
        return self.n_heads // self.n_kv_heads

    @classmethod
    def from_hf_config(cls, config: Any, name: str | None = None) -> "ModelSpec":
        """Read a transformers config object (or its dict); derive head_dim when absent."""
        get = config.get if isinstance(config, Mapping) else lambda k, d=None: getattr(config, k, d)
        n_heads = int(get("num_attention_heads"))
        d_model = int(get("hidden_size"))
        head_dim = get("head_dim") or d_model // n_heads
        archs = get("architectures") or ["LlamaForCausalLM"]
        rope_theta = get("rope_theta")
        if rope_theta is None:  # transformers v5 keeps it under rope_parameters
            rope_theta = (get("rope_parameters") or {}).get("rope_theta", 10_000.0)
        return cls(
            name=name or get("_name_or_path") or get("model_type") or "model",
            n_layers=int(get("num_hidden_layers")),
            d_model=d_model,
            n_heads=n_heads,
            n_kv_heads=int(get("num_key_value_heads") or n_heads),
            head_dim=int(head_dim),
            intermediate_size=int(get("intermediate_size")),
            vocab_size=int(get("vocab_size")),
            max_context=int(get("max_position_embeddings")),
            rope_theta=float(rope_theta),
            tie_embeddings=bool(get("tie_word_embeddings", False)),
            attention_bias=bool(get("attention_bias", False)) or get("model_type") == "qwen2",
            architecture=str(archs[0]),
        )

    @classmethod
    def from_json(cls, path: str | Path) -> "ModelSpec":
        """A spec from a Hugging Face `config.json` file."""
        data = json.loads(Path(path).read_text())
        return cls.from_hf_config(data, name=data.get("_name_or_path") or Path(path).parent.name)

    def with_full_mha(self) -> "ModelSpec":
        """The same model with one K/V head per query head (no grouped-query attention)."""
        return replace(self, name=f"{self.name} (full MHA)", n_kv_heads=self.n_heads)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


MODEL_PRESETS: dict[str, ModelSpec] = {
    "llama-3.1-8b": ModelSpec("Llama 3.1 8B", 32, 4096, 32, 8, 128, 14336, 128_256, 131_072, 500_000.0),
    "llama-3.1-70b": ModelSpec("Llama 3.1 70B", 80, 8192, 64, 8, 128, 28672, 128_256, 131_072, 500_000.0),
    "llama-3.1-405b": ModelSpec("Llama 3.1 405B", 126, 16384, 128, 8, 128, 53248, 128_256, 131_072, 500_000.0),
    "llama-3.2-1b": ModelSpec("Llama 3.2 1B", 16, 2048, 32, 8, 64, 8192, 128_256, 131_072, 500_000.0, True),
    "llama-3.2-3b": ModelSpec("Llama 3.2 3B", 28, 3072, 24, 8, 128, 8192, 128_256, 131_072, 500_000.0, True),
    "smollm2-135m": ModelSpec("SmolLM2-135M", 30, 576, 9, 3, 64, 1536, 49_152, 8192, 100_000.0, True),
    "qwen2.5-coder-0.5b": ModelSpec("Qwen2.5-Coder 0.5B", 24, 896, 14, 2, 64, 4864, 151_936, 32_768,
                                    1_000_000.0, True, True, "Qwen2ForCausalLM"),
    "qwen2.5-coder-1.5b": ModelSpec("Qwen2.5-Coder 1.5B", 28, 1536, 12, 2, 128, 8960, 151_936, 32_768,
                                    1_000_000.0, True, True, "Qwen2ForCausalLM"),
}


@dataclass(frozen=True)
class GPUSpec:
    """Spec-sheet figures of one accelerator (dense tensor throughput, no sparsity)."""

    name: str
    memory_gb: float          # decimal GB, as on the spec sheet
    bandwidth_tbs: float      # TB/s
    bf16_tflops: float
    fp8_tflops: float | None  # None: no FP8 tensor cores

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * 1e9

    @property
    def bandwidth_bytes_s(self) -> float:
        return self.bandwidth_tbs * 1e12

    def peak_flops(self, precision: str = "bf16") -> float:
        """Peak FLOP/s for matmuls in this precision (FP8/INT8 use the 8-bit rate when present)."""
        if dtype_bytes(precision) <= 1 and self.fp8_tflops:
            return self.fp8_tflops * 1e12
        return self.bf16_tflops * 1e12


GPU_PRESETS: dict[str, GPUSpec] = {
    "h100-sxm": GPUSpec("H100 SXM", 80, 3.35, 989, 1979),
    "h100-pcie": GPUSpec("H100 PCIe", 80, 2.0, 756, 1513),
    "h200": GPUSpec("H200", 141, 4.8, 989, 1979),
    "a100-80gb": GPUSpec("A100 SXM 80GB", 80, 2.04, 312, None),
    "l40s": GPUSpec("L40S", 48, 0.864, 362, 733),
    "rtx-4090": GPUSpec("RTX 4090", 24, 1.0, 165, 330),
    "b200": GPUSpec("B200", 180, 8.0, 2250, 4500),
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
