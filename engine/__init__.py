"""Inference Playground engine: a real Llama-family model, instrumented, one step record at a time.

The engine knows models, tokens and tensors; it never imports a UI library.
"""
from engine.projection.card import forward_shapes, kv_bytes_per_token, model_card, param_counts, weight_bytes
from engine.errors import EngineError
from engine.core.generate import GenerationRequest, generate
from engine.core.hooks import CAPTURE_ALL, CAPTURE_OFF, CapturePolicy, LayerCapture, count_hooks, hook_points
from engine.models.loader import LoadedModel, load_model
from engine.core.records import DecodeRecord, DoneRecord, PrefillRecord, Record, to_json
from engine.projection.specs import GPU_PRESETS, MODEL_PRESETS, GPUSpec, ModelSpec

__all__ = [
    "CAPTURE_ALL", "CAPTURE_OFF", "CapturePolicy", "DecodeRecord", "DoneRecord", "EngineError",
    "GPU_PRESETS", "GPUSpec", "GenerationRequest", "LayerCapture", "LoadedModel", "MODEL_PRESETS",
    "ModelSpec", "PrefillRecord", "Record", "count_hooks", "forward_shapes", "generate", "hook_points",
    "kv_bytes_per_token", "load_model", "model_card", "param_counts", "to_json", "weight_bytes",
]
