"""The command line, one parser for every command: `python -m engine COMMAND ...`.

    generate   generate text, one JSON step record per line (`--draft` for speculative decoding)
    card       a model card (parameters, bytes, KV per token) as JSON
    hooks      the named hook points of a model
    provision  convert the embedded model (and `--extras`) to safetensors once
    project    memory, speed and cost of a model on GPUs, projected from its config (no torch needed)
    record     generate greedily and save the run file;  show  describe a run file (or an old recording)
    serve      serve the model over HTTP: the OpenAI API and the playground's own (engine/server/)

    python -m engine project --model llama-3.1-8b --gpu h100-sxm --weights bf16 --kv bf16 \\
        --batch 1 --context 1024 [--tp T --pp P --replicas R --utilization U | --ideal] \\
        [--prompt-tokens P --output-tokens O --efficiency E --bandwidth-efficiency E \\
        --dollars-per-hour D] [--json]
    python -m engine record "What is the capital of France?" france.run.zip --layers 10
    python -m engine show france.run.zip              # an old france.json.gz too

Output goes to stdout (JSON, or `project`'s table); progress and errors go to stderr. Errors the user
can fix exit with status 2 (1 for `record` and `show`) and one line of explanation, never a traceback.
A `project` configuration that does not fit is not an error: it prints why and what would make it fit.
The parser starts without torch: a command imports it when it runs a model or reads a config through transformers.
"""
from __future__ import annotations

import argparse
from dataclasses import replace
import json
import sys
from pathlib import Path
from typing import Any, Callable

from engine.errors import ConfigError, EngineError, InvalidRequestError
from engine.projection.card import model_card
from engine.projection.cost import (DEFAULT_BANDWIDTH_EFFICIENCY, DEFAULT_DOLLARS_PER_HOUR, DEFAULT_FLOPS_EFFICIENCY,
                                    DEFAULT_UTILIZATION, IDEAL, Headroom, Layout, Projection, project)
from engine.projection.specs import (DTYPE_BYTES, GPU_PRESETS, MODEL_PRESETS, GPUSpec, ModelSpec, dtype_bytes,
                                     model_preset)
from engine.projection.units import fmt_bytes
from engine.launch import add_serve
from engine.settings import SettingsError, current


def _progress(fraction: float, message: str) -> None:
    print(f"[{fraction:4.0%}] {message}", file=sys.stderr, flush=True)


def parse_layers(text: str | None, n_layers: int | None = None) -> tuple[int, ...] | None:
    """'all' -> None (every layer), 'none'/'' -> (), '0,5,10-12' -> (0, 5, 10, 11, 12)."""
    if text is None or text.strip().lower() in ("", "none"):
        return ()
    if text.strip().lower() == "all":
        return None
    layers: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise EngineError(f"cannot read layer list {text!r}; use e.g. all, 0,5,9 or 0-3")
        layers.extend(range(int(lo), int(hi or lo) + 1))
    if n_layers is not None and any(i >= n_layers for i in layers):
        raise EngineError(f"layer index out of range: the model has layers 0..{n_layers - 1}")
    return tuple(layers)


STATIC_GONE = ("--static is gone: a request runs the one forward's one-row step (a CUDA graph on CUDA, through "
               "`python -m engine serve`); see docs/engine.md")


def cmd_generate(args: argparse.Namespace) -> int:
    # lazy (here and in every command below that runs a model): the parser starts without torch
    from engine.core.generate import GenerationRequest, admit
    from engine.core.loader import load_model

    if args.static:
        raise EngineError(STATIC_GONE)
    lm = load_model(args.model, device=args.device, dtype=args.dtype, progress=_progress)
    request = GenerationRequest(args.prompt, args.max_new_tokens, args.temperature, args.top_k, args.top_p,
                                args.seed, tuple(args.stop or ()), chat=not args.raw)
    if args.draft:
        # torch: only for the command that needs it
        from engine.speculative.decode import draft_from_spec, record_to_json, speculative_generate

        records = speculative_generate(lm, request, draft_from_spec(args.draft, lm), args.k)
        for record in records:
            print(json.dumps(record_to_json(record), ensure_ascii=False), flush=True)
        return 0
    ids = admit(lm, request)                       # a prompt over the model's context is refused here, up front
    policy = _cli_policy(args, lm.spec.n_layers)
    _check_cli_capture(args, lm, policy, len(ids), request.max_new_tokens)
    return _generate_and_write(args, lm, request, ids, policy)


def _cli_policy(args: argparse.Namespace, n_layers: int) -> Any:
    from engine.core.hooks import CapturePolicy  # torch: only for the command that needs it

    layers = parse_layers(args.capture_layers, n_layers)
    inputs = parse_layers(args.keep_inputs, n_layers)
    return CapturePolicy(layers=layers, logit_lens=args.logit_lens, max_keys=args.max_keys,
                         prefill_matrix=not args.last_row, inputs=inputs)


def _check_cli_capture(args: argparse.Namespace, lm: Any, policy: Any, n_prompt: int, max_new: int) -> None:
    """The capture budget the server applies (--max-capture-mb, PLAYGROUND_MAX_CAPTURE_MB, the device's default),
    and the memory free: refused before anything runs, with what would fit."""
    from engine.serving.capture import attention_bytes  # torch: only for the command that needs it
    from engine.serving.limits import Limits, capture_bytes, check_memory, inputs_bytes, maps_bytes
    from engine.serving.scheduler import device_free_bytes

    limits = Limits.for_device(lm.device).with_env()
    budget = (args.max_capture_mb or limits.max_capture_mb) * 2**20
    spec, value = lm.spec, lm.dtype.itemsize
    size = capture_bytes(spec, policy, n_prompt, max_new, value)
    if size > budget:
        maps, kept = maps_bytes(spec, policy, n_prompt, max_new), inputs_bytes(spec, policy, n_prompt + max_new, value)
        one_layer = attention_bytes(spec, n_prompt, max_new, matrix=policy.prefill_matrix)
        every_input = spec.n_layers * spec.d_model * value
        raise EngineError(
            f"this capture would take {fmt_bytes(size)} ({fmt_bytes(maps)} of attention maps in the file, "
            f"{fmt_bytes(kept)} of residual stream kept) for {n_prompt:,} prompt tokens and {max_new:,} new ones, over "
            f"the capture budget of {fmt_bytes(budget)} (--max-capture-mb, PLAYGROUND_MAX_CAPTURE_MB); nothing was "
            f"run. Within it: maps of at most {budget // max(one_layer, 1):,} layer(s) (--capture-layers), only each "
            f"step's newest row (--last-row), or --keep-inputs alone, which keeps what recomputes any layer's map "
            f"exactly: {fmt_bytes(every_input)} per token for every layer, "
            f"{fmt_bytes(every_input * (n_prompt + max_new))} here")
    check_memory(spec, lm.dtype_name, n_prompt + max_new, device_free_bytes(lm.device), size,
                 limits.reserve_mb * 2**20)


def _generate_and_write(args: argparse.Namespace, lm: Any, request: Any, ids: list[int], policy: Any) -> int:
    """One JSON line per record as it is made, then the file: the views the flags name, derived from the residual the
    run kept (engine/core/views.py), and the inputs --keep-inputs names."""
    from engine.core.capture_file import write_capture  # torch: only for the command that needs it
    from engine.core.generate import generate
    from engine.core.kept import kept_for
    from engine.core.records import to_json
    from engine.core.views import derive_captures

    kept = kept_for(lm, policy, len(ids) + request.max_new_tokens)
    out = Path(args.capture_out) if policy.enabled else None
    records = []
    for record in generate(lm, request, policy, ids=ids, kept=kept):
        line = to_json(record, with_captures=False)
        if out is not None and record.kind == "prefill":
            line["captures_file"] = str(out)
        print(json.dumps(line, ensure_ascii=False), flush=True)
        records.append(record)
    if out is not None:
        size = write_capture(out, lm, ids, derive_captures(lm.model, kept, records, policy), kept, policy)
        print(f"captures written to {out} ({fmt_bytes(size)}, safetensors, docs/capture_format.md)", file=sys.stderr)
    return 0


def cmd_card(args: argparse.Namespace) -> int:
    if args.config:
        spec = read_config(args.config, ModelSpec.from_json)
    elif args.preset:
        spec = model_preset(args.preset)
    else:
        from engine.core.loader import read_spec, resolve  # lazy: torch, only for a model's own folder

        folder, label = resolve(args.model, _progress)
        spec = read_spec(folder, label)
    print(json.dumps(model_card(spec, args.dtype), indent=2))
    return 0


CONFIG_ERRORS = (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError)


def read_config(path: str, read: Callable[[str], Any]) -> Any:
    """`read(path)`, or an EngineError that names the file and what is wrong with it, in one line."""
    try:
        return read(path)
    except CONFIG_ERRORS as err:
        raise EngineError(f"cannot read model config {path!r}: {config_problem(err)}") from None
    except ConfigError as err:
        raise ConfigError(named(path, err)) from None


def named(path: str, err: Exception) -> str:
    """The message, naming the file unless it already does."""
    return str(err) if path in str(err) else f"cannot read model config {path!r}: {err}"


def config_problem(err: Exception) -> str:
    if isinstance(err, OSError):
        return err.strerror or str(err)
    if isinstance(err, json.JSONDecodeError):
        return f"not valid JSON ({err.msg}, line {err.lineno})"
    if isinstance(err, UnicodeDecodeError):
        return "not a text file"
    return f"not a usable Hugging Face config.json ({type(err).__name__}: {err})"


def cmd_hooks(args: argparse.Namespace) -> int:
    from engine.core.hooks import hook_points  # torch: only for the command that needs it
    from engine.core.loader import load_model

    lm = load_model(args.model, device="cpu", progress=_progress)
    print(json.dumps(hook_points(lm.model), indent=2))
    return 0


def cmd_provision(args: argparse.Namespace) -> int:
    from engine.core.loader import provision, provision_extras  # torch: only for the command that needs it

    print(json.dumps({"default": str(provision("default", _progress))}))
    if args.extras:
        print(json.dumps({k: str(v) for k, v in provision_extras(_progress).items()}))
    print(json.dumps(_row_kernel()))
    print(json.dumps(_attention_kernel()))
    print(json.dumps(_glue_kernel()))
    return 0


def _row_kernel() -> dict:
    """The row kernel built (or found) now, not at the first lone step; where it cannot be, why (the products take
    torch's path: engine/core/kernels)."""
    from engine.core import kernels  # torch: only for the command that needs it

    kernel = kernels.row_kernel()
    return {"row kernel": str(kernel.path)} if kernel else {"row kernel": None, "why": kernels.why_off()}


def _attention_kernel() -> dict:
    """The invariant mode's attention kernel built (or found) now, not at the mode's first step; where it cannot be,
    why (the mode's attention takes torch's path: engine/core/kernels/attend.py)."""
    from engine.core.kernels import attend  # torch: only for the command that needs it

    kernel = attend.attend_kernel()
    return {"attention kernel": str(kernel.path)} if kernel else {"attention kernel": None, "why": attend.why_off()}


def _glue_kernel() -> dict:
    """The forward's norms, rotary and SiLU in C built (or found) now, not at the first step; where they cannot be,
    why (they take torch's operators: engine/core/kernels/glue.py)."""
    from engine.core.kernels import glue  # torch: only for the command that needs it

    kernel = glue.glue_kernel()
    return {"glue kernel": str(kernel.path)} if kernel else {"glue kernel": None, "why": glue.why_off()}


# --- the projected plane: `project` --------------------------------------------------------------------

class UsageError(Exception):
    """Something the user typed that we cannot use; its message is the one line we print."""


def add_project(subparsers: Any) -> argparse.ArgumentParser:
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
    p.set_defaults(func=cmd_project)
    return p


def _model(args: argparse.Namespace) -> ModelSpec:
    if args.config:
        try:
            return ModelSpec.from_json(args.config)
        except ConfigError as err:
            raise UsageError(named(args.config, err)) from None
        except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError) as err:
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


def cmd_project(args: argparse.Namespace) -> int:
    """Print the projection; 2 with a one-line error for bad input."""
    try:
        p = _projection(args)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(p.to_dict(), indent=2) if args.json else format_table(p))
    return 0


# --- recordings: `record` and `show` ------------------------------------------------------------------

def record(prompt: str, out: str | Path, model: str = "default", max_new_tokens: int = 32, layers: int = 10,
           title: str = "", max_keys: int | None = None) -> Any:
    """Generate greedily with the given model and save the run file (`.run.zip`) with attention for `layers` spread
    layers."""
    from dataclasses import replace                  # here and below: only this command needs torch and the model

    from engine.core.generate import GenerationRequest, generate, generate_captured
    from engine.core.hooks import CAPTURE_OFF, CapturePolicy
    from engine.core.loader import load_model
    from engine.runs import SUFFIX, dumps, texts_with
    from engine.serving.recording import new_recording

    if not str(out).endswith(SUFFIX):
        raise InvalidRequestError(f"record writes a run file: give it a name ending in {SUFFIX}, not {Path(out).name}")
    lm = load_model(model)
    n = lm.spec.n_layers
    picked = tuple(sorted({round(i * (n - 1) / max(layers - 1, 1)) for i in range(min(layers, n))}))
    policy = CapturePolicy(layers=picked, logit_lens=5, max_keys=max_keys)
    request = GenerationRequest(prompt, max_new_tokens=max_new_tokens)
    for _ in generate(lm, replace(request, max_new_tokens=2), CAPTURE_OFF):    # untimed: a fresh process's first
        pass                                                                   # pass pays its one-off start-up
    records = generate_captured(lm, request, policy)       # this process's own model: nobody else uses it
    rec = new_recording(lm, request, policy, records, title or prompt[:60])
    Path(out).write_bytes(dumps(rec, str(lm.source), lm.name, texts_with(rec, lm.tokenizer.decode)))
    return rec


def describe(rec: Any) -> str:
    done = rec.done
    captured = sorted({i for r in rec.records for i in getattr(r, "captures", {})})
    return (f"{rec.title!r}: {rec.model} ({rec.dtype} on {rec.device}), {len(rec.records)} records, "
            f"{done.prompt_tokens} prompt + {done.generated_tokens} generated tokens ({done.finish_reason}), "
            f"attention of layers {captured}\n  prompt: {rec.request.prompt!r}\n  answer: {done.text!r}")


def cmd_record(args: argparse.Namespace) -> int:
    return _recording_command(args, lambda: record(args.prompt, args.out, args.model, args.max_new_tokens,
                                                   args.layers, args.title))


def cmd_show(args: argparse.Namespace) -> int:
    from engine.runs import load                     # here: only this command reads run files

    return _recording_command(args, lambda: load(args.path).recording)


def cmd_notebook(args: argparse.Namespace) -> int:
    """Write the notebook that opens a run file (or an old recording), beside it."""
    import nbformat                                   # here: only this command needs it

    from engine.runs import load
    from engine.runs.notebook import notebook

    path = Path(args.path)
    try:
        run = load(path)
    except EngineError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    stem = path.name.removesuffix(".zip").removesuffix(".run").removesuffix(".json.gz")
    out = path.with_name(stem + ".ipynb")
    nbformat.write(notebook(run, path.name, args.page, args.layer, args.head), str(out))
    print(f"wrote {out}: run it from the top (jupyter, or `jupyter-execute {out}`)")
    return 0


def _recording_command(args: argparse.Namespace, run: Callable[[], Any]) -> int:
    """Print what `run` recorded or read; 1 with one line when the file or the request is unusable."""
    try:
        result = run()
    except EngineError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.command == "record":
        print(f"saved {args.out} ({Path(args.out).stat().st_size / 1e6:.2f} MB)")
    print(describe(result))
    return 0


def add_recording(sub: Any) -> None:
    rec = sub.add_parser("record", help="generate and save the run file (.run.zip)")
    rec.add_argument("prompt")
    rec.add_argument("out")
    rec.add_argument("--model", default="default")
    rec.add_argument("--max-new-tokens", type=int, default=32)
    rec.add_argument("--layers", type=int, default=10, help="attention of this many layers, spread over the depth")
    rec.add_argument("--title", default="")
    rec.set_defaults(func=cmd_record)
    show = sub.add_parser("show", help="describe a run file (or an old .json.gz recording)")
    show.add_argument("path")
    show.set_defaults(func=cmd_show)
    nb = sub.add_parser("notebook", help="write the notebook that opens a run file (or a recording), beside it")
    nb.add_argument("path", help="a .run.zip (Open in a notebook, GET /v1/playground/runs/<id>/file) or a .json.gz")
    nb.add_argument("--page", default="journey", choices=["journey", "attention", "speculative"])
    nb.add_argument("--layer", type=int, default=None, help="the layer the notebook opens on (default: the middle one)")
    nb.add_argument("--head", type=int, default=None)
    nb.set_defaults(func=cmd_notebook)


# --- the parser and the one way out -------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    add_generate(sub)
    add_model_commands(sub)
    add_project(sub)
    add_recording(sub)
    add_serve(sub)
    return parser


def add_generate(sub: Any) -> None:
    gen = sub.add_parser("generate", help="generate text, one JSON step record per line")
    _model_args(gen)
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--stop", action="append", help="stop string (repeatable)")
    gen.add_argument("--raw", action="store_true", help="do not apply the chat template")
    gen.add_argument("--capture-layers", default="none", help="all, none, or e.g. 0,5,10-12")
    gen.add_argument("--logit-lens", type=int, default=0, help="top tokens per captured layer (0: off)")
    gen.add_argument("--max-keys", type=int, default=None, help="keep at most this many keys per attention row")
    gen.add_argument("--last-row", action="store_true", help="at prefill keep only the last query row, not the full map")
    gen.add_argument("--keep-inputs", default="none",
                     help="all, none or e.g. 0,10,20: write these layers' inputs (the residual stream, every position) "
                          "to the file, from which any map of theirs is recomputed exactly; linear in the length "
                          "(all: the final norm's input too)")
    gen.add_argument("--capture-out", default="capture.safetensors",
                     help="where captures go, as tensors (safetensors; docs/capture_format.md)")
    gen.add_argument("--max-capture-mb", type=int, default=None,
                     help="capture budget (default: the server's, PLAYGROUND_MAX_CAPTURE_MB or the device's default)")
    gen.add_argument("--draft", help="speculative draft: ngram, early-exit:N, or a model folder/extra name")
    gen.add_argument("--k", type=int, default=4, help="tokens drafted per round")
    gen.add_argument("--static", action="store_true", help=argparse.SUPPRESS)   # gone: STATIC_GONE says why
    gen.set_defaults(func=cmd_generate)


def add_model_commands(sub: Any) -> None:
    """card, hooks and provision."""
    card = sub.add_parser("card", help="print a model card (parameters, bytes, KV per token) as JSON")
    card.add_argument("--model", default="default")
    card.add_argument("--config", help="a Hugging Face config.json instead of a model")
    card.add_argument("--preset", help="a named preset, e.g. llama-3.1-8b")
    card.add_argument("--dtype", default="bf16")
    card.set_defaults(func=cmd_card)
    hooks = sub.add_parser("hooks", help="list the named hook points of a model")
    hooks.add_argument("--model", default="default")
    hooks.set_defaults(func=cmd_hooks)
    prov = sub.add_parser("provision", help="convert the embedded model (and --extras) to safetensors once")
    prov.add_argument("--extras", action="store_true", help="also the Qwen2.5-Coder 0.5B/1.5B extras")
    prov.set_defaults(func=cmd_provision)


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default", help="default, qwen-0.5b, qwen-1.5b, a local folder or a hub id")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: cuda when present)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16, float16 (default: bf16 on CUDA, fp32 on CPU)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (EngineError, KeyError, ValueError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"error: {one_line(message)}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - the user gets one line, never a traceback
        return unexpected(err)


def one_line(message: object) -> str:
    return " ".join(str(message).split())


def traceback_asked() -> bool:
    """PLAYGROUND_TRACEBACK=1 (the `traceback` setting); off when the settings themselves cannot be read."""
    try:
        return current().traceback
    except SettingsError:
        return False


def unexpected(err: Exception) -> int:
    """One line for an error nobody foresaw; the traceback only when PLAYGROUND_TRACEBACK=1."""
    if traceback_asked():
        raise err
    print(f"error: {type(err).__name__}: {one_line(err)} (unexpected: set PLAYGROUND_TRACEBACK=1 to see where, "
          "and please report it)", file=sys.stderr)
    return 1
