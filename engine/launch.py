"""Every way to start the playground, built from one Settings (engine/settings.py): the one launcher module.

    playground                              ONE_PROCESS    the pages and the OpenAI API over one model, one process
    playground --engine-url URL             ENGINE_URL     one web process, a client of a running model server
    playground --web-processes N            WEB_PROCESSES  a model server, N web processes and nginx in front
    playground --replicas N                 REPLICAS       the same, the model server as N replicas on Ray Serve
    python -m engine serve [--replicas N]   SERVE          the model server alone (in this process, or on Ray Serve)

`playground` (app/launch.py) reads its flags into Settings and asks this module for the commands: the web process's
(`web_command`) and the model server's (`server_args`); app/hosting/processes.py supervises a room of several processes.
`python -m engine serve` starts here (`cmd_serve`): the model server in this process (engine/server) or on Ray
Serve (engine/cluster), so engine/server imports neither this module nor engine/cluster.

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
from pathlib import Path
from typing import Any

from engine.settings import LOOPBACK, PLAYGROUND, SERVE, Settings, add_flags, load  # noqa: F401 (LOOPBACK: app's)

# How torch's OpenMP threads wait at a barrier in the model's process, set before torch loads unless set by hand
# (`python -m engine`, and `playground` for the processes it starts): poll 10,000 times, then sleep (engine/__main__.py
# says why; docs/engine.md, "The second thread's wait, on a machine where it pays", has the runs).
OPENMP_WAIT = {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "10000"}
MIN_SECRET_CHARS = 12
LOG_LEVELS = ("debug", "info", "warning", "error")
UPLOAD_MB = 64                      # largest recording a browser may upload (engine.serving.recording reads 64 MiB)
ONE_PROCESS, ENGINE_URL, WEB_PROCESSES, REPLICAS = "one process", "engine url", "web processes", "replicas"


def way(settings: Settings, command: str = PLAYGROUND) -> str:
    """Which way `command` starts with these settings."""
    if command == SERVE:
        return SERVE
    if settings.replicas:
        return REPLICAS
    if settings.web_processes:
        return WEB_PROCESSES
    return ENGINE_URL if settings.engine_url else ONE_PROCESS


# --- playground: the web processes and the model server they start ---------------------------------------------

def serves_api(settings: Settings) -> bool:
    """Whether the web process hosts the model for its pages and its OpenAI API (app/hosting/hosted.py): only when it is
    the one process (not a client of a model server) and the API is not turned off."""
    return way(settings) == ONE_PROCESS and not settings.no_api


def web_command(settings: Settings, app_dir: Path) -> list[str]:
    """`streamlit run` of the app: app/asgi.py (pages and API) as one process, else app/main.py (the pages)."""
    script = app_dir / ("asgi.py" if serves_api(settings) else "main.py")
    return [sys.executable, "-m", "streamlit", "run", str(script),
            "--server.address", settings.host, "--server.port", str(settings.port), "--server.headless", "true",
            "--browser.gatherUsageStats", "false", "--server.maxUploadSize", str(UPLOAD_MB),
            "--server.fileWatcherType", "none", "--server.enableXsrfProtection", "true",
            "--client.toolbarMode", "viewer",          # no Deploy button or developer menu for the room
            "--logger.hideWelcomeMessage", "true",     # the banner says where to go (Streamlit's guess read as an error)
            "--runner.postScriptGC", "false"]          # a full gc.collect() after every rerun: docs/serving.md


def server_args(settings: Settings, token: str | None) -> list[str]:
    """`python -m engine serve` flags for the model server a room starts (the rest travel as PLAYGROUND_*)."""
    pairs = (("--model", settings.model), ("--draft", settings.draft), ("--device", settings.device),
             ("--dtype", settings.dtype), ("--presenter-token", token),
             ("--replicas", settings.replicas and str(settings.replicas)), ("--ray-address", settings.ray_address))
    return [f"{flag}={value}" for flag, value in pairs if value]   # "=": a value may begin with "-" (a random token)


# --- python -m engine serve ------------------------------------------------------------------------------------

def add_serve(sub: Any) -> None:
    serve = sub.add_parser("serve", help="serve the model over HTTP: the OpenAI API and the playground's own")
    add_flags(serve, SERVE)
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
    return serve(load(args, command=SERVE))


def serve(settings: Settings) -> int:
    """The model server, with its checks first: a refused start answers at once."""
    api_key, token = secret(settings.api_key, "API key"), secret(settings.presenter_token, "presenter token")
    if settings.log_level not in LOG_LEVELS:
        print(f"error: --log-level must be one of {', '.join(LOG_LEVELS)}, not {settings.log_level!r}", file=sys.stderr)
        return 2
    if settings.host not in LOOPBACK and not api_key and not settings.no_api_key:
        print(f"error: {settings.host} is reachable from other machines: give --api-key KEY (or --api-key auto), or "
              "--no-api-key to let anyone who reaches the port use the model", file=sys.stderr)
        return 2
    os.environ.update(settings.to_env())     # read by the run store, the gate, the threads, and every replica
    print(banner(settings, api_key if settings.api_key == "auto" else None,
                 token if settings.presenter_token == "auto" else None, bool(api_key)), file=sys.stderr, flush=True)
    if settings.replicas or settings.ray_address:
        return serve_replicas(settings, api_key, token)
    from engine.server.app import serve as serve_http   # here, after the checks: a refused start answers at once,
    from engine.server.state import ServerState         # not after importing torch and transformers (9 s, 2 cores)

    state = ServerState(served_name=settings.served_model_name or "", api_key=api_key)
    serve_http(state, lambda progress: load_service(settings, state, token, progress), settings.host, settings.port,
               settings.log_level)
    return 0


def serve_replicas(settings: Settings, api_key: str | None, token: str | None) -> int:
    """The cluster: only now is Ray imported (an optional extra)."""
    try:
        from engine.cluster.launch import serve_cluster  # Ray Serve: an optional extra, only with --replicas
    except ImportError:
        print("error: --replicas runs the model server on Ray Serve, which is not installed: "
              "pip install 'inference-playground[cluster]' (or `make test`, which installs it)", file=sys.stderr)
        return 2
    return serve_cluster(settings.replace(replicas=max(settings.replicas, 1)), api_key, token)


def load_service(settings: Settings, state: Any, token: str | None, progress: Any) -> Any:
    """The model, its limits (device defaults, then the settings' limits) and the service."""
    from engine.core.loader import load_model            # torch and transformers: only once the server starts
    from engine.core.openmp import in_passing_thread
    from engine.service.service import EngineService, freeze_heap
    from engine.serving.limits import Limits, limits_from_flags

    # In a passing thread (engine.core.openmp): loading runs parallel work (the layout's timing, the weights'
    # copies), and the OpenMP team it leaves on a thread that lives on makes libgomp throttle the step loop's
    lm = in_passing_thread(lambda: load_model(settings.model, device=settings.device, dtype=settings.dtype,
                                              progress=progress))
    # Not yet ready to serve: a 503 meanwhile said "the model is still loading (ready (100%))".
    progress(1.0, "loaded; opening the run store, starting the scheduler and warming up the model (a short prefill "
                  "and a decode step, so that the first request does not pay the model's first call)")
    if lm.device.type == "cpu":
        print(cpu_threads(settings.threads), file=sys.stderr, flush=True)
    limits = limits_from_flags(settings, Limits.for_device(lm.device).with_env())
    service = EngineService(lm, limits, presenter_token=token, launched_draft=settings.draft)
    freeze_heap()                                         # loaded and warmed up: nothing of it is garbage
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
    import torch                                          # only once a model is on the CPU

    from engine.serving.threads import ENV, cores, fixed_threads

    if asked:
        os.environ[ENV] = str(asked)
    fixed = fixed_threads()
    torch.set_num_threads(fixed or cores())
    if fixed:
        return f"Torch threads: {fixed} (fixed)"
    return (f"Torch threads: measured under the live load, {cores()} or {max(1, cores() - 1)} of {cores()} cores "
            f"(--threads N fixes it)")


def banner(settings: Settings, api_key: str | None, token: str | None, keyed: bool) -> str:
    """What the server says at start; a secret only when it made it up (`auto`): one you gave is not echoed."""
    url = f"http://{settings.host}:{settings.port}/v1"
    lines = [f"Inference Playground model server on {url} (loading {settings.model}; /health answers 200 when ready)"]
    if api_key:
        lines.append(f"API key: {api_key}  (clients send `Authorization: Bearer <key>`; the web app: "
                     f"playground --engine-url http://{settings.host}:{settings.port} --api-key <key>)")
    elif keyed:
        lines.append("An API key is required (the one you gave).")
    elif settings.host not in LOOPBACK:
        lines.append("WARNING: no API key: anyone who can reach this port can use the model (--no-api-key)")
    if token:
        lines.append(f"Presenter token: {token}")
    return "\n".join(lines)
