"""Serving limits set at launch: how long a prompt, how many tokens, how many people, how much capture.

    limits = Limits.for_device(torch.device("cpu")).with_env()   # defaults, then PLAYGROUND_MAX_... variables
    check_request(limits, spec, "float32", n_prompt=40, max_new_tokens=64, policy=CAPTURE_ALL)

Defaults come in two sizes: a 2-core CPU (a laptop or a small VM running the 135M default model)
and a GPU server (an H100 running an 8B model). The launcher (`playground --max-new-tokens ...`)
writes the environment variables; the scheduler checks every request against the limits, so a
browser cannot get past them by editing a widget.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Mapping

import torch

from engine import settings
from engine.projection.card import kv_bytes_per_token
from engine.errors import ContextLengthError, EngineError, InsufficientMemoryError, InvalidRequestError
from engine.core.hooks import CapturePolicy
from engine.projection.specs import ModelSpec, dtype_bytes
from engine.projection.units import fmt_bytes
from engine.serving.flags import LIMIT_FLAGS

MiB = 2**20
CAPTURED_BYTES = 4           # attention probabilities leave the engine as float32
MEMORY_SHARE = 0.9           # a request may take at most this share of what is free


@dataclass(frozen=True)
class Limits:
    """What one request, and the room as a whole, may ask of the server."""

    max_prompt_tokens: int = 2048        # after the chat template
    max_new_tokens: int = 256
    max_queue: int = 32                  # requests waiting for a place in the batch (running ones not counted)
    max_batch: int = 32                  # requests decoded together in one forward pass
    prefix_cache_mb: int = 64            # prompt K/V kept for later prompts that start alike (0: off)
    max_sessions: int = 40               # browser sessions served at once
    max_capture_mb: int = 256            # attention probabilities one request may capture
    max_capture_layers: int = 64         # layers one request may capture (64: every layer of any model here)
    request_seconds: float = 120.0       # wall time of one running request before it is stopped
    reserve_mb: int = 1024               # memory kept free for everything else (OS, activations, allocator)
    max_saved_per_session: int = 5       # runs listed per person: their newest, and as many kept (0: none)
    max_saved_mb: int = 1024             # a web process's memory for recent runs the run store cannot take, MiB

    @classmethod
    def for_device(cls, device: str | object = "cpu") -> "Limits":
        """Defaults for a 2-core CPU, or for a GPU server when `device` is CUDA."""
        return GPU_LIMITS if str(device).startswith("cuda") else CPU_LIMITS

    def with_env(self, environ: Mapping[str, str] | None = None) -> "Limits":
        """These limits with every PLAYGROUND_MAX_... variable that is set applied on top."""
        try:
            changes = settings.of(environ).limits_given()
        except settings.SettingsError as err:
            raise EngineError(str(err)) from None
        return validated(replace(self, **changes))

    def to_env(self) -> dict[str, str]:
        """The environment variables that reproduce these limits in another process."""
        return {var: str(getattr(self, name)) for name, var in ENV_VARS.items()}

    @property
    def max_capture_bytes(self) -> int:
        return self.max_capture_mb * MiB

    def to_dict(self) -> dict:
        return asdict(self)


CPU_LIMITS = Limits()
GPU_LIMITS = Limits(max_prompt_tokens=32768, max_new_tokens=1024, max_queue=128, max_batch=32, prefix_cache_mb=4096,
                    max_sessions=100, max_capture_mb=512, request_seconds=180.0, reserve_mb=4096, max_saved_mb=4096)

# the limits' PLAYGROUND_MAX_... variables, by Limits field name (the settings' own)
ENV_VARS: dict[str, str] = {spec.name: spec.env for spec in settings.SPECS if spec.group == "limits"}
def limits_from_flags(args: Any, base: Limits) -> Limits:
    """`base` with the limits given as flags applied on top, checked."""
    given = {name: getattr(args, name) for name, _, _ in LIMIT_FLAGS if getattr(args, name, None) is not None}
    return validated(replace(base, **given))


ZERO_OK = ("max_queue", "reserve_mb", "prefix_cache_mb", "max_saved_per_session", "max_saved_mb")


def validated(limits: Limits) -> Limits:
    """The same limits, or an EngineError naming the first one that cannot work."""
    for f in fields(limits):
        value, whole = getattr(limits, f.name), f.name != "request_seconds"
        if not _acceptable(value, zero_ok=f.name in ZERO_OK, whole=whole):
            raise EngineError(f"{ENV_VARS[f.name]} (the {f.name.replace('_', ' ')} limit) must be a positive "
                              f"{'whole number' if whole else 'number'}, not {value!r}")
    return limits


def _acceptable(value: object, zero_ok: bool, whole: bool) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return (value > 0 or (zero_ok and value == 0)) and (not whole or value == int(value))


# --- checks the scheduler runs before accepting a request ----------------------------------------------

def check_tokens(limits: Limits, n_prompt: int, max_new_tokens: int) -> None:
    if n_prompt > limits.max_prompt_tokens:
        raise ContextLengthError(
            f"the prompt is {n_prompt:,} tokens (with the chat template); this server accepts at most "
            f"{limits.max_prompt_tokens:,}. Shorten it")
    if max_new_tokens > limits.max_new_tokens:
        raise InvalidRequestError(
            f"{max_new_tokens:,} new tokens were asked for; this server allows at most {limits.max_new_tokens:,}")


def capture_bytes(spec: ModelSpec, policy: CapturePolicy, n_prompt: int, max_new_tokens: int,
                  value_bytes: int = CAPTURED_BYTES) -> int:
    """Upper bound of what a policy captures over a whole generation: the residual it keeps (`value_bytes` each: the
    model's dtype), and the attention views its exports derive from it."""
    return (maps_bytes(spec, policy, n_prompt, max_new_tokens)
            + inputs_bytes(spec, policy, n_prompt + max_new_tokens, value_bytes))


def inputs_bytes(spec: ModelSpec, policy: CapturePolicy, positions: int, value_bytes: int = CAPTURED_BYTES) -> int:
    """Bytes of the residual a policy keeps over `positions` positions: hidden states x d_model x positions x bytes."""
    return len(policy.residual_ids(spec.n_layers)) * spec.d_model * positions * value_bytes


def maps_bytes(spec: ModelSpec, policy: CapturePolicy, n_prompt: int, max_new_tokens: int) -> int:
    """Upper bound of the attention probabilities a policy's exports hold over a whole generation."""
    if not policy.views or not policy.attention:
        return 0
    layers = len(policy.layer_ids(spec.n_layers))
    heads = len(policy.head_ids(spec.n_heads))
    cap = policy.max_keys or n_prompt + max_new_tokens
    prefill = (n_prompt if policy.prefill_matrix else 1) * min(n_prompt, cap)     # (T_q, T_k) at prefill
    decode = sum(min(n_prompt + s, cap) for s in range(1, max_new_tokens))        # one row per decode step
    return layers * heads * (prefill + decode) * CAPTURED_BYTES


def check_capture(limits: Limits, spec: ModelSpec, policy: CapturePolicy, n_prompt: int,
                  max_new_tokens: int, value_bytes: int = CAPTURED_BYTES) -> None:
    layers = len(policy.layer_ids(spec.n_layers)) if policy.views else 0
    if layers > limits.max_capture_layers:
        raise InvalidRequestError(
            f"capturing {layers} layers was asked for; this server captures at most {limits.max_capture_layers}")
    size = capture_bytes(spec, policy, n_prompt, max_new_tokens, value_bytes)
    if size > limits.max_capture_bytes:
        raise InvalidRequestError(
            f"the capture would take {fmt_bytes(size)}; this server allows "
            f"{fmt_bytes(limits.max_capture_bytes)} per request. Capture fewer layers, keep only the last row, or use a "
            "shorter prompt")


def kv_bytes(spec: ModelSpec, dtype: str, tokens: int) -> float:
    """Bytes of K and V for `tokens` positions (engine.projection.card's formula)."""
    return kv_bytes_per_token(spec, dtype) * tokens


def check_memory(spec: ModelSpec, dtype: str, tokens: int, free_bytes: float, capture: int = 0,
                 reserve_bytes: float = 0.0) -> None:
    """Refuse a request whose KV cache (and capture) would not fit in what is free, with the numbers."""
    need = kv_bytes(spec, dtype, tokens) + capture
    usable = max(0.0, free_bytes - reserve_bytes)
    if need > MEMORY_SHARE * usable:
        raise InsufficientMemoryError(
            f"this request needs {need / 1e6:,.1f} MB ({tokens:,} tokens x {kv_bytes_per_token(spec, dtype) / 1024:,.1f} "
            f"KiB of KV cache per token{' plus its attention capture' if capture else ''}) but only "
            f"{usable / 1e6:,.1f} MB is free beyond the {reserve_bytes / 1e6:,.0f} MB the server keeps in reserve; "
            "shorten the prompt, ask for fewer tokens or capture less")


def check_request(limits: Limits, spec: ModelSpec, dtype: str, n_prompt: int, max_new_tokens: int,
                  policy: CapturePolicy, free_bytes: float | None = None) -> None:
    """Every launch-time limit a single request must meet; raises an EngineError subclass."""
    check_tokens(limits, n_prompt, max_new_tokens)
    value = int(dtype_bytes(dtype))
    check_capture(limits, spec, policy, n_prompt, max_new_tokens, value)
    if free_bytes is not None:
        check_memory(spec, dtype, n_prompt + max_new_tokens, free_bytes,
                     capture_bytes(spec, policy, n_prompt, max_new_tokens, value), limits.reserve_mb * MiB)


# --- what a browser sends besides a request: the prompt's characters, a recording file ------------------------

CHARS_PER_TOKEN = 16             # a prompt token is rarely longer (English ~4, code ~6; SmolLM2's longest is 81)
RECORD_JSON_BYTES = 16 * 1024    # one step apart from its captures (measured 5.2 KB: 256 logits, 10 candidates)
CAPTURE_JSON_BYTES = 2048        # one layer's capture apart from attention (measured 0.56 KB at 9 heads; ~1.9 KB at 128)
PROMPT_TOKEN_JSON_BYTES = 256    # one prompt token's id and text in the prefill record
HEADER_JSON_BYTES = 64 * 1024    # the model's spec, the request settings, the policy, the title
RECORD_VALUES, CAPTURE_VALUES, PROMPT_TOKEN_VALUES = 512, 320, 8   # JSON values of each (measured 96, 56, 3)
RECORDING_MARGIN = 1.25


def server_limits(environ: Mapping[str, str] | None = None) -> Limits:
    """The limits of the server this process runs for: PLAYGROUND_DEVICE's defaults (else CUDA when present),
    then the PLAYGROUND_MAX_... variables. For what is read without a model at hand (a recording file)."""
    device = settings.of(environ).device or ("cuda" if torch.cuda.is_available() else "cpu")
    return Limits.for_device(device).with_env(environ)


def max_prompt_chars(limits: Limits) -> int:
    """Characters a prompt (and system prompt) may have before it is tokenized at all."""
    return limits.max_prompt_tokens * CHARS_PER_TOKEN


def check_prompt_chars(limits: Limits, prompt: str, system: str | None = None, more: int = 0) -> None:
    """Refuse a prompt far longer than the token limit allows without running the tokenizer (a len() call);
    `more`: characters of earlier turns of a conversation."""
    n, cap = len(prompt) + len(system or "") + more, max_prompt_chars(limits)
    if n > cap:
        raise ContextLengthError(
            f"the prompt is {n:,} characters; this server reads at most {cap:,} (its limit is "
            f"{limits.max_prompt_tokens:,} tokens, and a token is rarely more than {CHARS_PER_TOKEN} characters). "
            "Shorten it")


def max_recording_bytes(limits: Limits) -> int:
    """Largest JSON text of a recording this server can make under its limits, with a margin.

    Attention leaves the engine as float32 (`max_capture_bytes`), is stored as float16 and base64 (x 4/3);
    every step adds its record and one capture per captured layer; the prompt adds its tokens.
    """
    steps = limits.max_new_tokens + 1
    attention = limits.max_capture_bytes // 2 * 4 // 3
    rest = (steps * (RECORD_JSON_BYTES + limits.max_capture_layers * CAPTURE_JSON_BYTES)
            + limits.max_prompt_tokens * PROMPT_TOKEN_JSON_BYTES + max_prompt_chars(limits) * 6 + HEADER_JSON_BYTES)
    return int((attention + rest) * RECORDING_MARGIN)


def max_recording_values(limits: Limits) -> int:
    """Most JSON values (numbers, strings, lists, objects) such a recording holds, with the same margin."""
    steps = limits.max_new_tokens + 1
    values = (steps * (RECORD_VALUES + limits.max_capture_layers * CAPTURE_VALUES)
              + limits.max_prompt_tokens * PROMPT_TOKEN_VALUES + 4096)
    return int(values * RECORDING_MARGIN)
