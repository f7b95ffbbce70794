"""The hardware a projection runs on, as the speed, cost, KV and explainer pages choose it: model, GPU,
precision, batch, context and layout pickers, and this device's measured peaks (cached once per process).

Measured figures are always introduced by `app.ui.format.MEASURED`; projected ones by `projected_label(...)`.
"""
from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from app.ui.format import fmt_bytes, fmt_tokens, projected_label
from engine.service.client import ModelClient
from engine.projection.cost import (DEFAULT_BANDWIDTH_EFFICIENCY, DEFAULT_DOLLARS_PER_HOUR, DEFAULT_FLOPS_EFFICIENCY,
                                    GPU_COUNTS, Layout, Projection, project, standard_layout)
from engine.projection.specs import GPU_PRESETS, MODEL_PRESETS, GPUSpec, ModelSpec
from engine.lab.speed import DeviceRoof

WEIGHTS = {"FP32": "fp32", "BF16": "bf16", "FP8": "fp8", "INT8": "int8", "INT4": "int4"}
KV = {"BF16": "bf16", "FP8": "fp8"}
LOADED = "loaded"
DEFAULT_MODEL, DEFAULT_GPU = "llama-3.1-8b", "h100-sxm"


# --- the projection controls -----------------------------------------------------------------------

@dataclass(frozen=True)
class HardwareChoice:
    """What the projection runs: a model on a GPU, in a precision, at a batch and context."""

    spec: ModelSpec
    gpu: GPUSpec
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    batch: int = 1
    context: int = 1024
    output_tokens: int = 128
    flops_efficiency: float = DEFAULT_FLOPS_EFFICIENCY
    bandwidth_efficiency: float = DEFAULT_BANDWIDTH_EFFICIENCY
    dollars_per_hour: float = DEFAULT_DOLLARS_PER_HOUR
    layout: Layout = Layout()

    @property
    def label(self) -> str:
        gpus = f"{self.layout.per_replica} × {self.gpu.name}" if self.layout.per_replica > 1 else self.gpu.name
        return projected_label(self.spec.name, gpus)

    def project(self, **overrides) -> Projection:
        kw = dict(weight_dtype=self.weight_dtype, kv_dtype=self.kv_dtype, batch=self.batch, context=self.context,
                  output_tokens=self.output_tokens, flops_efficiency=self.flops_efficiency,
                  bandwidth_efficiency=self.bandwidth_efficiency, dollars_per_hour=self.dollars_per_hour,
                  layout=self.layout)
        return project(self.spec, self.gpu, **{**kw, **overrides})


def model_options(lm: ModelClient | None) -> dict[str, ModelSpec]:
    loaded = {LOADED: lm.spec} if lm is not None else {}
    return {**{k: v for k, v in MODEL_PRESETS.items()}, **loaded}


def model_picker(ns: str, lm: ModelClient | None, parent=None) -> ModelSpec:
    specs = model_options(lm)
    names = {k: (f"{lm.label} (loaded)" if k == LOADED else s.name) for k, s in specs.items()}
    key = (parent or st).selectbox("Model", list(specs), index=list(specs).index(DEFAULT_MODEL),
                                   format_func=names.get, key=f"{ns}.model")
    return specs[key]


def gpu_picker(ns: str, parent=None) -> GPUSpec:
    key = (parent or st).selectbox("GPU", list(GPU_PRESETS), index=list(GPU_PRESETS).index(DEFAULT_GPU),
                                   format_func=lambda k: GPU_PRESETS[k].name, key=f"{ns}.gpu")
    return GPU_PRESETS[key]


def precision_pickers(ns: str, cols) -> tuple[str, str]:
    weights = cols[0].segmented_control("Weights", list(WEIGHTS), default="BF16", key=f"{ns}.weights", required=True)
    kv = cols[1].segmented_control("KV cache", list(KV), default="BF16", key=f"{ns}.kv", required=True)
    return WEIGHTS[weights or "BF16"], KV[kv or "BF16"]


def layout_label(n: int) -> str:
    layout = standard_layout(n)
    return f"{n}" if layout.pipeline == 1 else f"{n} ({layout.pipeline} nodes)"


def layout_controls(ns: str, cols) -> Layout:
    """GPUs per replica (tensor parallel inside a node of 8, pipeline stages across nodes) and replicas."""
    n = cols[0].select_slider("GPUs per replica", GPU_COUNTS, value=1, format_func=layout_label,
                              key=f"{ns}.gpus", help="Up to 8: tensor parallel inside one node (NVLink). Beyond: "
                              "8-GPU nodes in a pipeline, each holding consecutive layers.")
    replicas = cols[1].number_input("Replicas (data parallel)", 1, 64, 1, key=f"{ns}.replicas",
                                    help="Independent copies of the model, each serving its own batch of users.")
    return standard_layout(int(n), int(replicas))


def hardware_controls(ns: str, lm: ModelClient | None, full: bool = True) -> HardwareChoice:
    """Model, GPU and precisions; with `full`, also GPUs, batch, context, output length, efficiencies and price."""
    top = st.columns(2)
    spec, gpu = model_picker(ns, lm, top[0]), gpu_picker(ns, top[1])
    weights, kv = precision_pickers(ns, st.columns([3, 2]))
    if not full:
        return HardwareChoice(spec, gpu, weights, kv)
    layout = layout_controls(ns, st.columns([3, 2]))
    mid = st.columns(4)
    batch = mid[0].select_slider("Batch size (users at once, per replica)", [1, 2, 4, 8, 16, 32, 64, 128, 256, 512],
                                 value=1, key=f"{ns}.batch")
    context = mid[1].select_slider("Context per user (tokens)", [128, 256, 512, 1024, 2048, 4096, 8192, 16384,
                                   32768, 65536, 131072, 262144], value=1024, format_func=fmt_tokens, key=f"{ns}.context")
    output = mid[2].number_input("Output tokens per request", 1, 8192, 128, key=f"{ns}.output")
    price = mid[3].number_input("$ per GPU-hour", 0.1, 100.0, DEFAULT_DOLLARS_PER_HOUR, 0.1, key=f"{ns}.price")
    low = st.columns(2)
    flops_eff = low[0].slider("Share of peak FLOP/s reached (prefill)", 0.1, 1.0, DEFAULT_FLOPS_EFFICIENCY, 0.05,
                              key=f"{ns}.flops_eff")
    bw_eff = low[1].slider("Share of peak bandwidth reached (decode)", 0.1, 1.0, DEFAULT_BANDWIDTH_EFFICIENCY, 0.05,
                           key=f"{ns}.bw_eff")
    return HardwareChoice(spec, gpu, weights, kv, int(batch), int(context), int(output), float(flops_eff),
                          float(bw_eff), float(price), layout)


def memory_line(p: Projection) -> str:
    """Per GPU: what it holds against what a server may fill; users with that headroom and with all of the card."""
    verdict = "fits" if p.fits else "does NOT fit"
    share = " per GPU" if p.gpus_per_replica > 1 else ""
    return (f"Weights {fmt_bytes(p.weight_bytes / p.gpus_per_replica)} + KV cache "
            f"{fmt_bytes(p.memory_needed_bytes - p.weight_bytes / p.gpus_per_replica)} ({p.batch} × "
            f"{fmt_bytes(p.kv_bytes_per_user)}{' shared out' if share else ''}) = {fmt_bytes(p.memory_needed_bytes)}"
            f"{share}, against the {fmt_bytes(p.memory_bytes)} a server fills ({p.utilization:.0%} of "
            f"{fmt_bytes(p.memory_card_bytes)}, less {fmt_bytes(p.reserve_bytes)} of CUDA context and activation "
            f"workspace): {verdict}. {p.users_that_fit:,} users of {fmt_tokens(p.context)} tokens fit per replica "
            f"({p.users_that_fit_ideal:,} if weights and cache had all of the card).")


# --- this device -----------------------------------------------------------------------------------------

AGAIN_KEY = "hardware.measure_again"


@st.cache_resource(show_spinner=False)
def _device_roof(_lm: ModelClient, where: str, again: bool) -> DeviceRoof:
    return _lm.quick("device.roof", {"again": again})


def remeasure_roof() -> None:
    _device_roof.clear()
    st.session_state[AGAIN_KEY] = True


def device_roof(lm: ModelClient) -> DeviceRoof:
    """The peaks of the device the model runs on: a copy and a matmul benchmark there the first time (about a
    second), then kept (by the model server, and by this web process)."""
    where = f"{getattr(lm, 'url', 'local')}:{lm.device}:{lm.dtype_name}"
    with st.spinner("Measuring this device's memory bandwidth and FLOP/s (once per server)…"):
        return _device_roof(lm, where, bool(st.session_state.pop(AGAIN_KEY, False)))


