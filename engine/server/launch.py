"""`python -m engine serve`: the model server's flags and start-up.

    python -m engine serve                                    # the embedded model, http://127.0.0.1:8000/v1
    python -m engine serve --model /models/Llama-3.1-8B-Instruct --host 0.0.0.0 --api-key auto \\
        --presenter-token auto --max-batch 32

Binding anything but loopback needs an API key (`--api-key KEY` or `auto`), or `--no-api-key` to say out loud that
anyone who reaches the port may use the model.
"""
from __future__ import annotations

import argparse
import os
import secrets
import sys
from typing import Any

from engine.serving.flags import add_limit_flags

LOOPBACK = ("127.0.0.1", "localhost", "::1")
DEFAULT_PORT = 8000
API_KEY_ENV, TOKEN_ENV = "PLAYGROUND_API_KEY", "PLAYGROUND_PRESENTER_TOKEN"
MIN_SECRET_CHARS = 12


def add_serve(sub: Any) -> None:
    serve = sub.add_parser("serve", help="serve the model over HTTP: the OpenAI API and the playground's own")
    serve.add_argument("--model", default=os.environ.get("PLAYGROUND_MODEL") or "default",
                       help="default, qwen-0.5b, qwen-1.5b, a local folder or a hub id")
    serve.add_argument("--device", default=os.environ.get("PLAYGROUND_DEVICE") or None,
                       help="cpu, cuda, cuda:1 (default: cuda when present)")
    serve.add_argument("--dtype", default=os.environ.get("PLAYGROUND_DTYPE") or None,
                       help="float32, bfloat16, float16 (default: bf16 on CUDA, fp32 on CPU)")
    serve.add_argument("--draft", default=os.environ.get("PLAYGROUND_DRAFT") or None,
                       help="the draft model the speculative page offers (a folder or an extra's name)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT)
    serve.add_argument("--served-model-name", help="the name clients send as `model` (default: the model's label)")
    serve.add_argument("--api-key", default=os.environ.get(API_KEY_ENV) or None,
                       help="require `Authorization: Bearer KEY` on /v1 ('auto' makes one up); also PLAYGROUND_API_KEY")
    serve.add_argument("--no-api-key", action="store_true", help="serve a non-loopback address without a key")
    serve.add_argument("--presenter-token", default=os.environ.get(TOKEN_ENV) or None,
                       help="secret that unlocks presenter mode for the web app ('auto' makes one up)")
    serve.add_argument("--threads", type=int, default=None,
                       help="torch threads on a CPU (default: PLAYGROUND_THREADS or OMP_NUM_THREADS when set, else "
                            "measured under the live load: every core, or every core but one when that is faster)")
    serve.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    serve.add_argument("--runs-dir", help="the run store's folder: every finished run kept on disk (default: "
                                          "$PLAYGROUND_CACHE/runs; also PLAYGROUND_RUNS_DIR)")
    serve.add_argument("--runs-mb", type=int, help="the run store's budget in MiB, oldest evicted first (default "
                                                   "2048; 0 keeps none on disk; also PLAYGROUND_RUNS_MB)")
    cluster = serve.add_argument_group("past one machine (Ray Serve; pip install '.[cluster]')")
    cluster.add_argument("--replicas", type=int, default=0, metavar="N",
                         help="serve N replicas of the model on Ray Serve, behind one ingress")
    cluster.add_argument("--ray-address", help="join this Ray cluster (e.g. ray://head:10001) instead of starting one")
    cluster.add_argument("--replica-cpus", type=float, default=None, help="CPUs per replica (default 1)")
    add_limit_flags(serve)
    serve.set_defaults(func=cmd_serve)


def secret(value: str | None, what: str) -> str | None:
    if value is None:
        return None
    if value == "auto":
        return secrets.token_urlsafe(24)
    if len(value) < MIN_SECRET_CHARS:
        raise SystemExit(f"error: the {what} must be at least {MIN_SECRET_CHARS} characters (or 'auto')")
    return value


def cmd_serve(args: argparse.Namespace) -> int:
    api_key, token = secret(args.api_key, "API key"), secret(args.presenter_token, "presenter token")
    if args.runs_dir:                 # read by engine/store, here and in every replica (they inherit PLAYGROUND_*)
        os.environ["PLAYGROUND_RUNS_DIR"] = args.runs_dir
    if args.runs_mb is not None:
        os.environ["PLAYGROUND_RUNS_MB"] = str(max(args.runs_mb, 0))
    if args.host not in LOOPBACK and not api_key and not args.no_api_key:
        print(f"error: {args.host} is reachable from other machines: give --api-key KEY (or --api-key auto), or "
              "--no-api-key to let anyone who reaches the port use the model", file=sys.stderr)
        return 2
    print(banner(args, api_key if args.api_key == "auto" else None, token if args.presenter_token == "auto" else None,
                 bool(api_key)), file=sys.stderr, flush=True)
    if args.replicas or args.ray_address:
        return serve_replicas(args, api_key, token)
    from engine.server.app import serve            # here, after the checks: a refused start answers at once, not
    from engine.server.state import ServerState    # after importing torch and transformers (9 s on a 2-core CPU)

    state = ServerState(served_name=args.served_model_name or "", api_key=api_key)
    serve(state, lambda progress: load_service(args, state, token, progress), args.host, args.port, args.log_level)
    return 0


def serve_replicas(args: argparse.Namespace, api_key: str | None, token: str | None) -> int:
    """The cluster: only now is Ray imported (an optional extra)."""
    try:
        from engine.cluster.launch import serve_cluster
    except ImportError:
        print("error: --replicas runs the model server on Ray Serve, which is not installed: "
              "pip install 'inference-playground[cluster]' (or `make test`, which installs it)", file=sys.stderr)
        return 2
    if args.replicas < 1:
        args.replicas = 1
    return serve_cluster(args, api_key, token)


def load_service(args: argparse.Namespace, state: Any, token: str | None, progress: Any) -> Any:
    """The model, its limits (device defaults, PLAYGROUND_MAX_* variables, then the flags) and the service."""
    from engine.core.loader import load_model
    from engine.service.service import EngineService
    from engine.serving.limits import Limits, limits_from_flags

    lm = load_model(args.model, device=args.device, dtype=args.dtype, progress=progress)
    # Not yet ready to serve: a 503 meanwhile said "the model is still loading (ready (100%))".
    progress(1.0, "loaded; opening the run store and starting the scheduler")
    if lm.device.type == "cpu":
        print(cpu_threads(args.threads), file=sys.stderr, flush=True)
    limits = limits_from_flags(args, Limits.for_device(lm.device).with_env())
    service = EngineService(lm, limits, presenter_token=token, launched_draft=args.draft)
    state.served_name = state.served_name or lm.label
    state.aliases = {lm.name, lm.label, str(lm.source)}
    return service


def cpu_threads(asked: int | None) -> str:
    """Torch's threads for a model on the CPU; returns what the start-up line says about them.

    As asked (`--threads N`, which fixes it for the scheduler too: PLAYGROUND_THREADS), else as PLAYGROUND_THREADS
    or OMP_NUM_THREADS fix it, else every core to start with and then measured by the scheduler under the live
    load (engine.serving.threads): alone on a machine every core is fastest, as vLLM takes them all; beside a
    browser or busy web processes one thread fewer often is (docs/serving.md).
    """
    import torch

    from engine.serving.threads import ENV, cores, fixed_threads

    if asked:
        os.environ[ENV] = str(asked)
    fixed = fixed_threads()
    torch.set_num_threads(fixed or cores())
    if fixed:
        return f"Torch threads: {fixed} (fixed)"
    return (f"Torch threads: measured under the live load, {cores()} or {max(1, cores() - 1)} of {cores()} cores "
            f"(--threads N fixes it)")


def banner(args: argparse.Namespace, api_key: str | None, token: str | None, keyed: bool) -> str:
    """What the server says at start; a secret only when it made it up (`auto`): one you gave is not echoed."""
    url = f"http://{args.host}:{args.port}/v1"
    lines = [f"Inference Playground model server on {url} (loading {args.model}; /health answers 200 when ready)"]
    if api_key:
        lines.append(f"API key: {api_key}  (clients send `Authorization: Bearer <key>`; the web app: "
                     f"playground --engine-url http://{args.host}:{args.port} --api-key <key>)")
    elif keyed:
        lines.append("An API key is required (the one you gave).")
    elif args.host not in LOOPBACK:
        lines.append("WARNING: no API key: anyone who can reach this port can use the model (--no-api-key)")
    if token:
        lines.append(f"Presenter token: {token}")
    return "\n".join(lines)
