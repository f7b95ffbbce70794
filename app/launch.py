"""`playground`: start the app for one person or a room, wrapping `streamlit run app/asgi.py`.

    playground                                        # the embedded model on this machine, http://127.0.0.1:8501
                                                      # and its OpenAI API at http://127.0.0.1:8501/v1 (app/hosted.py)
    playground --model /models/Llama-3.1-8B-Instruct --device cuda --dtype bf16 \\
               --host 0.0.0.0 --port 8501 --presenter-token auto --max-sessions 60
    playground --engine-url http://127.0.0.1:8000 --api-key KEY        # the model in a server: this process holds none
    playground --web-processes 4 --host 0.0.0.0 --presenter-token auto  # one model server, 4 web processes, nginx

On any address but loopback the room asks for a join code (made up at start unless --join-code or
PLAYGROUND_JOIN_CODE gives one; --open-room turns it off): the printed join link carries it. There the API asks for
a key and presenter mode for a token, each made up at start unless given, and printed beside the join link.

Every flag becomes an environment variable the app reads (PLAYGROUND_MODEL, PLAYGROUND_MAX_NEW_TOKENS,
...), so setting the variables yourself works as well. The browser can only use the model the
launcher named; limits left unset take the defaults for the device (engine/serving/limits.py).
"""
from __future__ import annotations

import argparse
import os
import secrets
import socket
import sys
from pathlib import Path
from typing import Mapping, Sequence

from engine.serving.flags import LIMIT_FLAGS, add_limit_flags

MAIN = Path(__file__).resolve().parent / "main.py"
ASGI = MAIN.parent / "asgi.py"          # the pages and the OpenAI API over one model (app/hosted.py)
ROOT = MAIN.parent.parent
MODEL_ENV, DRAFT_ENV, DEVICE_ENV, DTYPE_ENV = "PLAYGROUND_MODEL", "PLAYGROUND_DRAFT", "PLAYGROUND_DEVICE", "PLAYGROUND_DTYPE"
TOKEN_ENV, URL_ENV, KEY_ENV = "PLAYGROUND_PRESENTER_TOKEN", "PLAYGROUND_ENGINE_URL", "PLAYGROUND_API_KEY"
JOIN_CODE_ENV, PUBLIC_URL_ENV = "PLAYGROUND_JOIN_CODE", "PLAYGROUND_PUBLIC_URL"   # read by app/join.py
RUNS_DIR_ENV, RUNS_MB_ENV = "PLAYGROUND_RUNS_DIR", "PLAYGROUND_RUNS_MB"             # read by engine/store
LOOPBACK = ("127.0.0.1", "localhost", "::1")
MIN_TOKEN_CHARS = 12
UPLOAD_MB = 64                      # largest recording a browser may upload (engine.serving.recording reads at most 64 MiB)

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="playground", description="Start the Inference Playground (a Streamlit app) for one person or a room.",
        epilog="Limits left out take the defaults for the device: a 2-core CPU or a GPU server.")
    parser.add_argument("--model", help="'default' (SmolLM2-135M-Instruct), an extra's key, or a local "
                                        "safetensors folder (default: default)")
    parser.add_argument("--draft", help="draft for speculative decoding: 'ngram', 'early-exit:N', or a model")
    parser.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: CUDA when present)")
    parser.add_argument("--dtype", help="float32, bf16, fp16 (default: bf16 on CUDA, float32 on CPU)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on; 0.0.0.0 for a room "
                                                           "(default: 127.0.0.1, this machine only)")
    parser.add_argument("--port", type=int, default=8501)
    parser.add_argument("--presenter-token", help="secret that unlocks presenter mode; 'auto' makes one up")
    parser.add_argument("--engine-url", help="use the model server at this url (python -m engine serve) instead of "
                                             "loading a model in this process")
    parser.add_argument("--api-key", help="the key of the OpenAI API at /v1 ('auto' makes one up; made up anyway off "
                                          "loopback), or with --engine-url the model server's key (also "
                                          "PLAYGROUND_API_KEY)")
    parser.add_argument("--no-api", action="store_true", help="the pages only: no OpenAI API at /v1")
    parser.add_argument("--web-processes", type=int, default=0, metavar="N",
                        help="start one model server and N Streamlit processes behind nginx on --host:--port "
                             "(a room on one big machine; needs nginx)")
    parser.add_argument("--replicas", type=int, default=0, metavar="N",
                        help="the model server as N replicas on Ray Serve (the cluster extra), with --web-processes "
                             "web processes (default 1) in front")
    parser.add_argument("--ray-address", help="with --replicas: join this Ray cluster instead of starting one here")
    parser.add_argument("--join-code", help="the room's join code (default off loopback: one made up at start; "
                                            f"also {JOIN_CODE_ENV})")
    parser.add_argument("--open-room", action="store_true", help="no join code even off loopback: anyone who can "
                                                                 "reach the port can use the model")
    parser.add_argument("--public-url", help="the address participants open, for the join link (default: "
                                             "http://<this machine's address>:<port>)")
    parser.add_argument("--runs-dir", help="the run store's folder: every finished run kept on disk (default: "
                                           "$PLAYGROUND_CACHE/runs; also PLAYGROUND_RUNS_DIR)")
    parser.add_argument("--runs-mb", type=int, help="the run store's budget in MiB, the oldest runs evicted first "
                                                    "(default 2048; 0 keeps none on disk; also PLAYGROUND_RUNS_MB)")
    parser.add_argument("--dry-run", action="store_true", help="print the command and variables, start nothing")
    add_limit_flags(parser)
    return parser


def presenter_token(value: str | None) -> str | None:
    """The token as given, a fresh random one for 'auto', or an error for one too easy to guess."""
    if value is None:
        return None
    if value == "auto":
        return secrets.token_urlsafe(18)
    if len(value) < MIN_TOKEN_CHARS:
        raise SystemExit(f"playground: the presenter token must be at least {MIN_TOKEN_CHARS} characters "
                         "(or use --presenter-token auto)")
    return value


def serves_api(args: argparse.Namespace) -> bool:
    """Whether this process hosts the model for its pages and its OpenAI API (app/hosted.py): not when the model
    lives in a model server (--engine-url, --web-processes, --replicas), nor with --no-api."""
    return not (args.no_api or args.engine_url or args.web_processes or args.replicas)


def room_secrets(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(presenter token, API key). Off loopback a room gets both, made up unless given: a room without a presenter
    token has no presenter mode, and its API needs a key as its pages need the join code. With --engine-url both
    are the model server's (the key as given, sent by this process)."""
    hosted_room = args.host not in LOOPBACK
    if args.engine_url:
        return presenter_token(args.presenter_token), args.api_key
    token = presenter_token(args.presenter_token or ("auto" if hosted_room else None))
    if not serves_api(args):
        return token, None
    key = args.api_key or ("auto" if hosted_room else None)
    if key is not None and key != "auto" and len(key) < MIN_TOKEN_CHARS:
        raise SystemExit(f"playground: the API key must be at least {MIN_TOKEN_CHARS} characters (or --api-key auto)")
    return token, secrets.token_urlsafe(24) if key == "auto" else key


def join_code(args: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    """The room's join code: as given (flag, then variable), made up off loopback, none for an open room."""
    from engine.service.join import checked_code, new_code

    given = args.join_code or environ.get(JOIN_CODE_ENV)
    if args.open_room:
        return None
    if given:
        try:
            return checked_code(given)
        except ValueError as err:
            raise SystemExit(f"playground: {err}") from None
    return None if args.host in LOOPBACK else new_code()


def room_urls(args: argparse.Namespace) -> list[str]:
    """Where a browser on another machine reaches this server: --public-url, else each of this machine's addresses."""
    if args.public_url:
        return [args.public_url.rstrip("/")]
    hosts = [args.host]
    if args.host in ("0.0.0.0", "::", ""):
        import psutil

        hosts = [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
                 if a.family == socket.AF_INET and not a.address.startswith("127.")] or [socket.gethostname()]
    return [f"http://{f'[{h}]' if ':' in h else h}:{args.port}" for h in hosts[:4]]


def limit_env(args: argparse.Namespace) -> dict[str, str]:
    """PLAYGROUND_MAX_... variables for the limits given as flags, checked as the engine will check them."""
    from dataclasses import replace

    from engine.errors import EngineError
    from engine.serving.limits import ENV_VARS, Limits, validated

    given = {name: getattr(args, name) for name, _, _ in LIMIT_FLAGS if getattr(args, name) is not None}
    try:
        validated(replace(Limits(), **given))
    except EngineError as err:
        raise SystemExit(f"playground: {err}") from None
    return {ENV_VARS[name]: str(value) for name, value in given.items()}


def launch_env(args: argparse.Namespace, token: str | None = None, code: str | None = None,
               key: str | None = None) -> dict[str, str]:
    """The PLAYGROUND_* variables the flags stand for (only those given)."""
    public = room_urls(args)[0] if code else None
    env = {var: value for var, value in ((MODEL_ENV, args.model), (DRAFT_ENV, args.draft),
                                          (DEVICE_ENV, args.device), (DTYPE_ENV, args.dtype),
                                          (TOKEN_ENV, token), (JOIN_CODE_ENV, code), (PUBLIC_URL_ENV, public),
                                          (URL_ENV, args.engine_url), (KEY_ENV, key),
                                          (RUNS_DIR_ENV, args.runs_dir),
                                          (RUNS_MB_ENV, None if args.runs_mb is None else str(args.runs_mb)))
           if value}
    return {**env, **limit_env(args)}


def server_args(args: argparse.Namespace, token: str | None) -> list[str]:
    """`python -m engine serve` flags for the model server a room starts (limits travel as PLAYGROUND_MAX_*)."""
    pairs = (("--model", args.model), ("--draft", args.draft), ("--device", args.device), ("--dtype", args.dtype),
             ("--presenter-token", token), ("--replicas", args.replicas and str(args.replicas)),
             ("--ray-address", args.ray_address))
    return [x for flag, value in pairs if value for x in (flag, value)]


def streamlit_command(args: argparse.Namespace) -> list[str]:
    script = ASGI if serves_api(args) else MAIN
    return [sys.executable, "-m", "streamlit", "run", str(script),
            "--server.address", args.host, "--server.port", str(args.port), "--server.headless", "true",
            "--browser.gatherUsageStats", "false", "--server.maxUploadSize", str(UPLOAD_MB),
            "--server.fileWatcherType", "none", "--server.enableXsrfProtection", "true",
            "--client.toolbarMode", "viewer",          # no Deploy button or developer menu for the room
            "--logger.hideWelcomeMessage", "true",     # the banner says where to go (Streamlit's guess read as an error)
            "--runner.postScriptGC", "false"]          # a full gc.collect() after every rerun: docs/serving.md


def banner(args: argparse.Namespace, token: str | None, code: str | None = None, key: str | None = None) -> str:
    """What the launcher prints: where to open the app, the join link, the API, the presenter token."""
    urls = room_urls(args)
    if args.host in LOOPBACK:
        lines = [f"Inference Playground: open {urls[0]} in a browser on this machine."]
    else:
        lines = [f"Inference Playground for a room on port {args.port} ({', '.join(urls)})."]
    if args.engine_url:
        lines.append(f"The model: the server at {args.engine_url} (this process holds none)")
        if token:
            lines.append("Note: presenter mode is the model server's: start it with --presenter-token")
    if code:
        links = [f"{url}/?join={code}" for url in urls]
        lines.append(f"Join link: {links[0]}  (share it with the room only: it lets a browser use the model)")
        lines += [f"       or: {link}" for link in links[1:]]
    elif args.open_room and args.host not in LOOPBACK:
        lines.append(f"WARNING: open room (--open-room): anyone who can reach port {args.port} can use the model, "
                     "with no join code.")
    if serves_api(args):
        lines.append(f"OpenAI API (notebooks, scripts, the openai package): {urls[0]}/v1"
                     + (f"  API key: {key}" if key else "  (no key on this machine alone)"))
    if token:
        lines.append(f"Presenter token: {token}  (enter it in the sidebar's presenter box; keep it to yourself)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    token, key = room_secrets(args)
    base = os.environ if environ is None else environ
    args.public_url = args.public_url or base.get(PUBLIC_URL_ENV)
    code = join_code(args, base)
    given = launch_env(args, token, code, key)    # torch's threads: measured by the scheduler (engine/serving/threads.py)
    env = {var: value for var, value in {**base, **given}.items() if code or var != JOIN_CODE_ENV}
    command = streamlit_command(args)
    if args.dry_run:
        print(" ".join(command))
        for var, value in sorted(given.items()):
            print(f"{var}={value}")
        return 0
    print(banner(args, token, code, key), flush=True)
    os.chdir(ROOT)
    if args.web_processes or args.replicas:
        from app.processes import serve_room

        return serve_room(command, env, args.host, args.port, args.web_processes or 1, args.engine_url,
                          server_args(args, token), UPLOAD_MB, None if args.engine_url else args.api_key)
    os.execve(command[0], command, env)   # the server replaces this process: Ctrl+C and signals reach it


if __name__ == "__main__":
    sys.exit(main())
