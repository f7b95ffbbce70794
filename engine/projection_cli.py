"""`python -m engine project ...`: the projected plane on the command line.

    python -m engine project --model llama-3.1-8b --gpu h100-sxm --weights bf16 --kv bf16 \\
        --batch 1 --context 1024 [--tp T --pp P --replicas R --utilization U | --ideal] \\
        [--prompt-tokens P --output-tokens O --efficiency E --bandwidth-efficiency E \\
        --dollars-per-hour D] [--json]

Errors the user can fix (unknown model, GPU or precision, a missing, malformed or unsupported
config, an impossible layout) print one line on stderr and exit with status 2. A configuration
that does not fit is not an error: it prints why and what would make it fit, and no speeds.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from engine.errors import ConfigError
from engine.projection.cost import (DEFAULT_BANDWIDTH_EFFICIENCY, DEFAULT_DOLLARS_PER_HOUR, DEFAULT_FLOPS_EFFICIENCY,
                                    DEFAULT_UTILIZATION, IDEAL, Headroom, Layout, Projection, project)
from engine.projection.specs import DTYPE_BYTES, GPU_PRESETS, MODEL_PRESETS, GPUSpec, ModelSpec, dtype_bytes
from engine.projection.units import fmt_bytes


class UsageError(Exception):
    """Something the user typed that we cannot use; its message is the one line we print."""


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the `project` subcommand to an argparse subparsers object."""
    p = subparsers.add_parser("project", help="project memory, speed and cost of a model on GPUs")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help=f"a preset: {', '.join(MODEL_PRESETS)}")
    source.add_argument("--config", help="a Hugging Face config.json (or a folder holding one)")
    p.add_argument("--gpu", default="h100-sxm", help=f"one of: {', '.join(GPU_PRESETS)}")
    p.add_argument("--weights", default="bf16", help="weight precision: fp32, bf16, fp8, int8, int4")
    p.add_argument("--kv", default="bf16", help="KV-cache precision: bf16, fp8, int4, ...")
    p.add_argument("--batch", type=int, default=1, help="users decoded together by one replica")
    p.add_argument("--context", type=int, default=1024, help="cached tokens per user")
    p.add_argument("--prompt-tokens", type=int, default=None, help="default: --context")
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--tp", type=int, default=1, help="tensor parallel GPUs per replica (1, 2, 4, 8)")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages per replica")
    p.add_argument("--replicas", type=int, default=1, help="data-parallel replicas")
    p.add_argument("--utilization", type=float, default=DEFAULT_UTILIZATION,
                   help="share of each GPU the server fills (vLLM's gpu_memory_utilization)")
    p.add_argument("--ideal", action="store_true", help="give weights + KV all of each card, no workspace")
    p.add_argument("--efficiency", type=float, default=DEFAULT_FLOPS_EFFICIENCY,
                   help="share of peak FLOP/s reached (compute-bound work)")
    p.add_argument("--bandwidth-efficiency", type=float, default=DEFAULT_BANDWIDTH_EFFICIENCY,
                   help="share of peak memory bandwidth reached (bandwidth-bound work)")
    p.add_argument("--dollars-per-hour", type=float, default=DEFAULT_DOLLARS_PER_HOUR, help="per GPU")
    p.add_argument("--json", action="store_true", help="print the projection as JSON")
    p.set_defaults(func=handle)
    return p


def _model(args: argparse.Namespace) -> ModelSpec:
    if args.config:
        try:
            return ModelSpec.from_json(args.config)
        except ConfigError as err:
            from engine.cli import named

            raise UsageError(named(args.config, err)) from None
        except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError) as err:
            from engine.cli import config_problem

            raise UsageError(f"cannot read model config {args.config!r}: {config_problem(err)}") from None
    if args.model not in MODEL_PRESETS:
        raise UsageError(f"unknown model {args.model!r}; known: {', '.join(MODEL_PRESETS)}")
    return MODEL_PRESETS[args.model]


def _gpu(name: str) -> GPUSpec:
    if name not in GPU_PRESETS:
        raise UsageError(f"unknown GPU {name!r}; known: {', '.join(GPU_PRESETS)}")
    return GPU_PRESETS[name]


def _precision(name: str, what: str) -> str:
    try:
        dtype_bytes(name)
    except ValueError:
        raise UsageError(f"unknown {what} precision {name!r}; known: {', '.join(sorted(set(DTYPE_BYTES)))}") from None
    return name


def _headroom(args: argparse.Namespace) -> Headroom:
    if args.ideal:
        return IDEAL
    if not 0 < args.utilization <= 1:
        raise UsageError(f"--utilization must be in (0, 1], not {args.utilization}")
    return Headroom(args.utilization)


def _projection(args: argparse.Namespace) -> Projection:
    spec, gpu = _model(args), _gpu(args.gpu)
    weights, kv = _precision(args.weights, "weight"), _precision(args.kv, "KV")
    try:
        return project(spec, gpu, weights, kv, args.batch, args.context, args.prompt_tokens,
                       args.output_tokens, args.efficiency, args.bandwidth_efficiency, args.dollars_per_hour,
                       Layout(args.tp, args.pp, args.replicas), _headroom(args))
    except ValueError as err:
        raise UsageError(str(err)) from None


def _memory_rows(p: Projection) -> list[tuple[str, str]]:
    moe = f", {p.active_params / 1e9:.2f} B active per token" if p.n_experts else ""
    rows = [("GPUs", f"{p.gpus} × {p.gpu}: {p.replicas} replica(s) of {p.gpus_per_replica} "
                     f"(tensor {p.tensor_parallel} × pipeline {p.pipeline_parallel})"),
            ("weights", f"{fmt_bytes(p.weight_bytes)} ({p.params / 1e9:.2f} B params{moe}, {p.weight_dtype})"),
            ("KV per user", f"{fmt_bytes(p.kv_bytes_per_user)} at {p.context:,} tokens ({p.kv_dtype})"),
            ("KV total", f"{fmt_bytes(p.kv_bytes_total)} for batch {p.batch} per replica"),
            ("fits", f"{'yes' if p.fits else 'NO'}: {fmt_bytes(p.memory_needed_bytes)} of {fmt_bytes(p.memory_bytes)} "
                     f"per GPU ({p.utilization:.0%} of {fmt_bytes(p.memory_card_bytes)}, less "
                     f"{fmt_bytes(p.reserve_bytes)} of CUDA context and workspace)"),
            ("users that fit", f"{p.users_that_fit:,} per replica at {p.context:,} tokens each "
                               f"(all of the card, no workspace: {p.users_that_fit_ideal:,})")]
    if p.n_experts:
        rows.append(("experts read", f"{p.experts_touched:.1f} of {p.n_experts} per MoE layer per decode step "
                                     f"({p.weight_bytes_read / 1e9:.1f} GB of weights read)"))
    return rows


def _speed_rows(p: Projection) -> list[tuple[str, str]]:
    comm = f", of which {p.comm_decode_ms:.2f} ms between GPUs" if p.gpus_per_replica > 1 else ""
    return [
        ("prefill", f"{p.prefill_ms:,.1f} ms ({p.prompt_tokens:,} prompt tokens x {p.batch})"),
        ("TTFT", f"{p.ttft_ms:,.1f} ms (queueing: none, the batch arrives together; + prefill)"),
        ("decode step", f"{p.decode_step_ms:.2f} ms ({p.decode_bound}-bound{comm}; ceiling {p.ceiling_step_ms:.2f} ms)"),
        ("per user", f"{p.per_user_tok_s:,.1f} tok/s (ceiling {p.ceiling_tok_s_per_user:,.1f})"),
        ("total", f"{p.total_tok_s:,.0f} tok/s over {p.replicas} replica(s)"),
        ("request", f"{p.request_ms:,.0f} ms for {p.output_tokens:,} output tokens"),
        ("cost", f"${p.cost_per_million_tokens:,.3f} per 1M output tokens at ${p.dollars_per_hour}/GPU-hour"),
    ]


def format_table(p: Projection) -> str:
    """A short human-readable summary; a configuration that does not fit says why instead of timing it."""
    rows = _memory_rows(p)
    if p.fits:
        rows += _speed_rows(p)
    else:
        rows += [("does not fit", why) for why in p.problems] + [("would fit with", fix) for fix in p.to_fit]
    width = max(len(k) for k, _ in rows)
    head = f"{p.model} on {p.gpu}"
    return "\n".join([head, "-" * len(head)] + [f"{k:<{width}}  {v}" for k, v in rows])


def handle(args: argparse.Namespace) -> int:
    """Print the projection; 2 with a one-line error for bad input."""
    try:
        p = _projection(args)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(p.to_dict(), indent=2) if args.json else format_table(p))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry: `python -m engine.projection_cli project ...`."""
    parser = argparse.ArgumentParser(prog="python -m engine")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except Exception as err:  # noqa: BLE001 - the user gets one line, never a traceback
        from engine.cli import unexpected

        return unexpected(err)


if __name__ == "__main__":
    sys.exit(main())
