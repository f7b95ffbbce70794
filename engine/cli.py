"""Command line: `python -m engine generate|card|hooks|provision|project ...`.

Output is JSON (one object per line for `generate`) on stdout; progress and errors go to stderr.
Errors the user can fix exit with status 2 and one line of explanation, never a traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable

from engine.errors import ConfigError, EngineError


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


def cmd_generate(args: argparse.Namespace) -> int:
    from engine.core.generate import GenerationRequest, generate
    from engine.core.hooks import CapturePolicy
    from engine.models.loader import load_model
    from engine.core.records import to_json

    lm = load_model(args.model, device=args.device, dtype=args.dtype, progress=_progress)
    if args.static:
        from engine.core.fastpath import enable_static_decode

        enable_static_decode(lm)
    layers = parse_layers(args.capture_layers, lm.spec.n_layers)
    policy = CapturePolicy(layers=layers, logit_lens=args.logit_lens, max_keys=args.max_keys)
    request = GenerationRequest(args.prompt, args.max_new_tokens, args.temperature, args.top_k, args.top_p,
                                args.seed, tuple(args.stop or ()), chat=not args.raw)
    if args.draft:
        from engine.speculative import decode as speculative

        draft = speculative.draft_from_spec(args.draft, lm)
        records: Any = speculative.speculative_generate(lm, request, draft, args.k)
        dump: Callable[[Any], dict] = speculative.record_to_json
    else:
        records = generate(lm, request, policy)
        dump = lambda rec: to_json(rec, with_captures=bool(layers is None or layers))  # noqa: E731
    for record in records:
        print(json.dumps(dump(record), ensure_ascii=False), flush=True)
    return 0


def cmd_card(args: argparse.Namespace) -> int:
    from engine.projection.card import model_card
    from engine.projection.specs import ModelSpec, model_preset

    if args.config:
        spec = read_config(args.config, ModelSpec.from_json)
    elif args.preset:
        spec = model_preset(args.preset)
    else:
        from engine.models.loader import read_spec, resolve

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
    from engine.core.hooks import hook_points
    from engine.models.loader import load_model

    lm = load_model(args.model, device="cpu", progress=_progress)
    print(json.dumps(hook_points(lm.model), indent=2))
    return 0


def cmd_provision(args: argparse.Namespace) -> int:
    from engine.models.loader import provision

    print(json.dumps({"default": str(provision("default", _progress))}))
    if args.extras:
        from engine.models.extras import provision_extras

        print(json.dumps({k: str(v) for k, v in provision_extras(_progress).items()}))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

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
    gen.add_argument("--draft", help="speculative draft: ngram, early-exit:N, or a model folder/extra name")
    gen.add_argument("--k", type=int, default=4, help="tokens drafted per round")
    gen.add_argument("--static", action="store_true",
                     help="static KV cache, decode step as a CUDA graph on CUDA (engine/core/fastpath.py)")
    gen.set_defaults(func=cmd_generate)

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

    try:
        from engine import projection_cli
    except ImportError:
        projection_cli = None
    if projection_cli is not None:
        projection_cli.register(sub)
    return parser


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


def unexpected(err: Exception) -> int:
    """One line for an error nobody foresaw; the traceback only when PLAYGROUND_TRACEBACK=1."""
    if os.environ.get("PLAYGROUND_TRACEBACK") == "1":
        raise err
    print(f"error: {type(err).__name__}: {one_line(err)} (unexpected: set PLAYGROUND_TRACEBACK=1 to see where, "
          "and please report it)", file=sys.stderr)
    return 1
