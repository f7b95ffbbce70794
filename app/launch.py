"""`playground`: start the app for one person or a room, wrapping `streamlit run app/asgi.py`.

    playground                                        # the embedded model on this machine, http://127.0.0.1:8501
                                                      # and its OpenAI API at http://127.0.0.1:8501/v1 (app/hosting/hosted.py)
    playground --model /models/Llama-3.1-8B-Instruct --device cuda --dtype bf16 \\
               --host 0.0.0.0 --port 8501 --presenter-token auto --max-sessions 60
    playground --engine-url http://127.0.0.1:8000 --api-key KEY        # the model in a server: this process holds none
    playground --web-processes 4 --host 0.0.0.0 --presenter-token auto  # one model server, 4 web processes, nginx

On any address but loopback the room asks for a join code (made up at start unless --join-code or
PLAYGROUND_JOIN_CODE gives one; --open-room turns it off): the printed join link carries it. There the API asks for
a key and presenter mode for a token, each made up at start unless given, and printed beside the join link.

The settings (engine/settings.py, every one in docs/settings.md) are read once here, from the flags, then the
PLAYGROUND_* variables, then a settings file (--settings FILE), and handed to the processes this starts as
PLAYGROUND_* variables, with where each came from (PLAYGROUND_SETTINGS_ORIGINS, for the room page's table);
`--print-settings` shows them, secrets masked. engine/launch.py builds the commands of every
way to start. The browser can only use the model the launcher named; limits left unset take the defaults for the
device (engine/serving/limits.py).
"""
from __future__ import annotations

import argparse
import os
import secrets
import socket
import sys
from pathlib import Path
from typing import Mapping, Sequence

from app.hosting.fence import fence_line
from engine.launch import (LOOPBACK, OPENMP_WAIT, REPLICAS, UPLOAD_MB, WEB_PROCESSES, server_args, serves_api,  # noqa: F401
                           way, web_command)
from engine.serving.flags import LIMIT_FLAGS  # noqa: F401
from engine.settings import (FILE_ENV, LAUNCHER, PLAYGROUND, Settings, SettingsError, add_flags, load, origins,
                             origins_env, table)

APP = Path(__file__).resolve().parent
ROOT = APP.parent
TOKEN_ENV, KEY_ENV = "PLAYGROUND_PRESENTER_TOKEN", "PLAYGROUND_API_KEY"
JOIN_CODE_ENV, PUBLIC_URL_ENV = "PLAYGROUND_JOIN_CODE", "PLAYGROUND_PUBLIC_URL"   # read by app/room/join.py
MIN_TOKEN_CHARS = 12


def build_parser() -> argparse.ArgumentParser:
    """Every setting of `playground` as a flag (engine/settings.py), and what to do with them."""
    parser = argparse.ArgumentParser(
        prog="playground", description="Start the Inference Playground (a Streamlit app) for one person or a room.",
        epilog="Settings left out are read from their PLAYGROUND_* variable, then the settings file, else take their "
               "default (limits: the device's). docs/settings.md lists them all.")
    parser.add_argument("--dry-run", action="store_true", help="print the command and variables, start nothing")
    parser.add_argument("--print-settings", action="store_true",
                        help="print the settings this room would run with (secrets masked), start nothing")
    add_flags(parser, PLAYGROUND)
    return parser


def settings_of(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """The settings `playground ARGV` runs with, read from its flags, `environ` and the settings file."""
    return load(build_parser().parse_args(argv), os.environ if environ is None else environ, PLAYGROUND)


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


def room_secrets(settings: Settings) -> tuple[str | None, str | None]:
    """(presenter token, API key). Off loopback a room gets both, made up unless given: a room without a presenter
    token has no presenter mode, and its API needs a key as its pages need the join code. With --engine-url both
    are the model server's (the key as given, sent by this process)."""
    hosted_room = settings.host not in LOOPBACK
    if settings.engine_url:
        return presenter_token(settings.presenter_token), settings.api_key
    token = presenter_token(settings.presenter_token or ("auto" if hosted_room else None))
    if not serves_api(settings):
        return token, None
    key = settings.api_key or ("auto" if hosted_room else None)
    if key is not None and key != "auto" and len(key) < MIN_TOKEN_CHARS:
        raise SystemExit(f"playground: the API key must be at least {MIN_TOKEN_CHARS} characters (or --api-key auto)")
    return token, secrets.token_urlsafe(24) if key == "auto" else key


def join_code(settings: Settings) -> str | None:
    """The room's join code: as given (flag, variable or file), made up off loopback, none for an open room."""
    from engine.service.join import checked_code, new_code   # the gate's rules: only when a room starts

    if settings.open_room:
        return None
    if settings.join_code:
        try:
            return checked_code(settings.join_code)
        except ValueError as err:
            raise SystemExit(f"playground: {err}") from None
    return None if settings.host in LOOPBACK else new_code()


def room_urls(settings: Settings) -> list[str]:
    """Where a browser on another machine reaches this server: --public-url, else each of this machine's addresses."""
    if settings.public_url:
        return [settings.public_url.rstrip("/")]
    hosts = [settings.host]
    if settings.host in ("0.0.0.0", "::", ""):
        import psutil                                  # the machine's addresses: only for a room on every address

        hosts = [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
                 if a.family == socket.AF_INET and not a.address.startswith("127.")] or [socket.gethostname()]
    return [f"http://{f'[{h}]' if ':' in h else h}:{settings.port}" for h in hosts[:4]]


def checked(settings: Settings) -> Settings:
    """The settings with their limits checked as the engine will check them; a bad one stops the launch."""
    from dataclasses import replace                     # torch's limits: only once the flags parsed (fast --help)

    from engine.errors import EngineError
    from engine.serving.limits import Limits, validated

    try:
        validated(replace(Limits(), **settings.limits_given()))
    except EngineError as err:
        raise SystemExit(f"playground: {err}") from None
    return settings


def launch_env(settings: Settings, token: str | None = None, code: str | None = None,
               key: str | None = None) -> dict[str, str]:
    """The PLAYGROUND_* variables the web processes (and the model server) read back: the settings given, with the
    room's secrets as they were settled at start."""
    room = {TOKEN_ENV: token, JOIN_CODE_ENV: code, KEY_ENV: key,
            PUBLIC_URL_ENV: room_urls(settings)[0] if code else None}
    given = {var: value for var, value in checked(settings).to_env().items() if var not in room}
    return {**given, **{var: value for var, value in room.items() if value}}


def handed_origins(args: argparse.Namespace, environ: Mapping[str, str], settings: Settings,
                   given: Mapping[str, str]) -> dict[str, str]:
    """Where each setting came from, as `--print-settings` says, and 'launcher' for each value the launcher made up
    for the processes it starts (a secret, the join link's address): what the room page shows."""
    came = origins(args, environ)
    made = {"presenter_token": TOKEN_ENV, "api_key": KEY_ENV, "join_code": JOIN_CODE_ENV, "public_url": PUBLIC_URL_ENV}
    came.update({name: LAUNCHER for name, var in made.items()
                 if given.get(var) and getattr(settings, name) in (None, "auto")})
    return came


def streamlit_fence_line() -> str | None:
    """One line when the installed Streamlit is outside the fence of the room's runner fixes (app/hosting/fence.py),
    read from the package's metadata: the launcher says so at start without importing Streamlit."""
    from importlib.metadata import PackageNotFoundError, version   # here: only a start reads it

    try:
        return fence_line(version("streamlit"))
    except PackageNotFoundError:
        return "Streamlit is not installed: `make install` installs the release the lock holds"


def streamlit_command(settings: Settings) -> list[str]:
    return web_command(settings, APP)


def banner(settings: Settings, token: str | None, code: str | None = None, key: str | None = None) -> str:
    """What the launcher prints: where to open the app, the join link, the API, the presenter token."""
    urls = room_urls(settings)
    if settings.host in LOOPBACK:
        lines = [f"Inference Playground: open {urls[0]} in a browser on this machine."]
    else:
        lines = [f"Inference Playground for a room on port {settings.port} ({', '.join(urls)})."]
    if settings.engine_url:
        lines.append(f"The model: the server at {settings.engine_url} (this process holds none)")
        if token:
            lines.append("Note: presenter mode is the model server's: start it with --presenter-token")
    if code:
        links = [f"{url}/?join={code}" for url in urls]
        lines.append(f"Join link: {links[0]}  (share it with the room only: it lets a browser use the model)")
        lines += [f"       or: {link}" for link in links[1:]]
    elif settings.open_room and settings.host not in LOOPBACK:
        lines.append(f"WARNING: open room (--open-room): anyone who can reach port {settings.port} can use the "
                     "model, with no join code.")
    if serves_api(settings):
        lines.append(f"OpenAI API (notebooks, scripts, the openai package): {urls[0]}/v1"
                     + (f"  API key: {key}" if key else "  (no key on this machine alone)"))
    if token:
        lines.append(f"Presenter token: {token}  (enter it in the sidebar's presenter box; keep it to yourself)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    base = os.environ if environ is None else environ
    args = build_parser().parse_args(argv)
    try:
        settings = load(args, base, PLAYGROUND)
    except SettingsError as err:
        raise SystemExit(f"playground: {err}") from None
    if args.print_settings:
        came_from = origins(args, base)
        print(f"playground starts {way(settings)} with these settings (docs/settings.md; each from a flag, a variable, "
              f"the settings file or its default):\n{table(checked(settings), PLAYGROUND, came_from)}")
        return 0
    token, key = room_secrets(settings)
    code = join_code(settings)
    given = launch_env(settings, token, code, key)   # torch's threads: measured by the scheduler (engine/serving/threads.py)
    given.update(origins_env(handed_origins(args, base, settings, given), settings))   # for the room page's table
    for var, value in OPENMP_WAIT.items():   # as `python -m engine` does: OpenMP's threads poll briefly at a barrier,
        if var not in base:                  # then sleep (docs/engine.md, "The second thread's wait, ...")
            given[var] = value
    env = {var: value for var, value in {**base, **given}.items()
           if var != FILE_ENV and (code or var != JOIN_CODE_ENV)}   # the file was read here, once
    command = streamlit_command(settings)
    if args.dry_run:
        print(" ".join(command))
        for var, value in sorted(given.items()):
            print(f"{var}={value}")
        return 0
    print(banner(settings, token, code, key), flush=True)
    if line := streamlit_fence_line():
        print(f"Note: {line}.", flush=True)
    os.chdir(ROOT)
    if way(settings) in (WEB_PROCESSES, REPLICAS):
        from app.hosting.processes import serve_room            # nginx and the supervisor: only for a room of processes

        return serve_room(command, env, settings.host, settings.port, settings.web_processes or 1,
                          settings.engine_url, server_args(settings, token), UPLOAD_MB,
                          None if settings.engine_url else settings.api_key)
    os.execve(command[0], command, env)   # the server replaces this process: Ctrl+C and signals reach it


if __name__ == "__main__":
    sys.exit(main())
