"""A room on one big machine: one model server, N Streamlit web processes, and nginx in front on one port.

    playground --web-processes 4 --host 0.0.0.0 --port 8501 --model /models/Llama-3.1-8B-Instruct

The model server (`python -m engine serve`) listens on loopback only, with an API key made up at start that only
the web processes hold. Each web process is `streamlit run app/main.py` on a loopback port of its own, a client
of that server (PLAYGROUND_ENGINE_URL). nginx listens where the room connects and keeps each browser on one web
process: a Streamlit session is a websocket plus the files it serves (uploads, downloads, media) from that process's
memory, so every request of a browser must reach the same one. nginx's open-source build has no sticky-cookie
directive, so it sets a cookie of its own (`playground_route`, a random id on the first response) and hashes it
(`hash $route consistent`): the same browser, the same process, across reloads and tabs. Streamlit's deployment
notes ask for exactly this (session affinity) behind any load balancer. We write no balancer of our own.

The API goes through the same port: nginx sends `/v1/` to the model server (its key, made up at start or given with
--api-key, is printed), and while the model server is down it answers 503 with Retry-After in OpenAI's error shape
at once, never a hung connection.

What dies is restarted (`supervise`): a web process, nginx or the model server that exits is started again with the
same command (same port, same key) after a backoff (RESTART_DELAYS), while the others go on. nginx sends a dead web
process's browsers to a live one (they reconnect to a new Streamlit session there, their runs read back from the run
store) and back once it answers again. Only a process that dies FAILURES_TO_GIVE_UP times within FAILURE_WINDOW
seconds stops the room, with its name and last log lines. The room's state (each process's pid, up or restarting,
how long each restart took) is kept in `status.json` in the room's folder, which the pages read
(PLAYGROUND_ROOM_STATUS) to say "the model is restarting; your runs are safe".
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

ROUTE_COOKIE = "playground_route"
STATUS_ENV = "PLAYGROUND_ROOM_STATUS"            # the room's status.json, for the pages (app/hosting/model.py)
RESTART_DELAYS = (0.5, 2.0, 5.0, 10.0, 20.0)      # seconds before the 1st, 2nd, ... restart within the window
FAILURES_TO_GIVE_UP, FAILURE_WINDOW = 5, 180.0    # this many exits within this many seconds stop the room
RETRY_AFTER_SECONDS = 5                           # what an API client is told while the model server is down
AWAY_JSON = ('{"error": {"message": "the model is restarting; your runs are safe: try again in a few seconds", '
             '"type": "service_unavailable", "param": null, "code": "not_ready"}}')
NGINX_CONF = """worker_processes 1;
daemon off;
pid {run}/nginx.pid;
error_log {run}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {run}/body;
    proxy_temp_path {run}/proxy;
    fastcgi_temp_path {run}/fastcgi;
    uwsgi_temp_path {run}/uwsgi;
    scgi_temp_path {run}/scgi;
    client_max_body_size {upload_mb}m;
    map $http_upgrade $connection_upgrade {{ default upgrade; '' close; }}
    map $cookie_{cookie} $route {{ "" $request_id; default $cookie_{cookie}; }}
    upstream web {{
        hash $route consistent;
{servers}
    }}
    server {{
        listen {listen};
        location /v1/ {{
            proxy_pass {model};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_connect_timeout 2s;
            proxy_read_timeout 1h;
            proxy_buffering off;
            error_page 502 504 = @model_away;
        }}
        location @model_away {{
            default_type application/json;
            add_header Retry-After {retry} always;
            return 503 '{away}';
        }}
        location / {{
            proxy_pass http://web;
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_connect_timeout 2s;
            proxy_next_upstream error timeout;
            proxy_read_timeout 1d;
            proxy_buffering off;
            add_header Set-Cookie "{cookie}=$route; Path=/; HttpOnly; SameSite=Lax" always;
        }}
    }}
}}
"""


class LaunchError(SystemExit):
    """A room that cannot start, with the reason (the launcher prints it and exits)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def nginx_conf(run_dir: Path, listen: str, ports: Sequence[int], upload_mb: int, model_url: str | None = None) -> str:
    """A dead web process is skipped for a few seconds (max_fails=1) and its browsers hashed to the next one."""
    servers = "\n".join(f"        server 127.0.0.1:{p} max_fails=1 fail_timeout=3s;" for p in ports)
    return NGINX_CONF.format(run=run_dir, listen=listen, servers=servers, cookie=ROUTE_COOKIE, upload_mb=upload_mb,
                             model=model_url or "http://127.0.0.1:9", retry=RETRY_AFTER_SECONDS, away=AWAY_JSON)


def listen_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def find_nginx() -> str:
    path = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx")
                                          if os.access(p, os.X_OK)), None)
    if path is None:
        raise LaunchError("playground: --web-processes puts nginx in front of the web processes, and nginx is not "
                          "installed (Debian/Ubuntu: sudo apt-get install nginx)")
    return path


@dataclass
class Member:
    """One process of the room: how to start it again, and its history of exits."""

    name: str
    cmd: list[str]
    env: dict[str, str]
    health: str | None                            # a url that answers 200 once it serves; None: up when running
    proc: subprocess.Popen | None = None
    state: str = "starting"                       # starting, up, restarting
    exits: deque = field(default_factory=deque)   # monotonic times of its recent exits
    restart_at: float | None = None
    down_since: float | None = None               # wall-clock time it was found dead
    restarts: int = 0
    back: list[float] = field(default_factory=list)   # seconds each restart took, from its exit to serving again


@dataclass
class Room:
    """The processes of one room, started in order, restarted when they die, stopped together."""

    run_dir: Path
    members: dict[str, Member] = field(default_factory=dict)

    def start(self, name: str, cmd: list[str], env: dict[str, str], health: str | None = None) -> subprocess.Popen:
        member = self.members.setdefault(name, Member(name, cmd, env, health))
        with open(self.run_dir / f"{name}.log", "a") as log:
            if member.proc is not None:
                log.write(f"\n--- playground: restarting {name} (restart {member.restarts}) ---\n")
                log.flush()
            member.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True)
        member.state = "starting"
        return member.proc

    @property
    def procs(self) -> list[tuple[str, subprocess.Popen]]:
        return [(m.name, m.proc) for m in self.members.values() if m.proc is not None]

    def stop(self) -> None:
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for _, proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()

    def dead(self) -> tuple[str, int] | None:
        return next(((name, p.returncode) for name, p in self.procs if p.poll() is not None), None)

    def tail(self, name: str, lines: int = 20) -> str:
        path = self.run_dir / f"{name}.log"
        text = path.read_text(errors="replace")[-6000:] if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def write_status(self) -> None:
        """status.json: each process's pid and state, and how long its restarts took (written whole, renamed)."""
        status = {m.name: {"pid": m.proc.pid if m.proc else None, "state": m.state, "restarts": m.restarts,
                           "down_since": m.down_since, "back_seconds": m.back} for m in self.members.values()}
        tmp = self.run_dir / ".status.json.tmp"
        tmp.write_text(json.dumps(status))
        os.replace(tmp, self.run_dir / "status.json")


def wait_for(url: str, room: Room, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (dead := room.dead()) is not None:
            raise LaunchError(f"playground: {dead[0]} exited ({dead[1]}) while starting:\n{room.tail(dead[0])}")
        if answers(url):
            return
        time.sleep(0.5)
    raise LaunchError(f"playground: {what} did not start within {timeout:.0f} s (logs in {room.run_dir})")


def answers(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except (OSError, urllib.error.HTTPError):
        return False


def serve_room(streamlit_cmd: list[str], env: dict[str, str], host: str, port: int, web_processes: int,
               engine_url: str | None, server_args: list[str], upload_mb: int, api_key: str | None = None) -> int:
    """Start the model server (unless `engine_url` names one), the web processes and nginx; keep them up; stop them
    all when interrupted or when one keeps dying."""
    nginx = find_nginx()
    room = Room(Path(tempfile.mkdtemp(prefix="playground-room-")))
    try:
        env = {**env, STATUS_ENV: str(room.run_dir / "status.json")}
        env = {**env, **start_model_server(room, env, engine_url, server_args, api_key)}
        ports = start_web_processes(room, streamlit_cmd, env, web_processes)
        conf = nginx_conf(room.run_dir, listen_address(host, port), ports, upload_mb, env["PLAYGROUND_ENGINE_URL"])
        (room.run_dir / "nginx.conf").write_text(conf)
        room.start("nginx", [nginx, "-c", str(room.run_dir / "nginx.conf"), "-p", str(room.run_dir)], env)
        wait_for(f"http://127.0.0.1:{port}/_stcore/health", room, "nginx", 30)
        for member in room.members.values():
            member.state = "up"
        room.write_status()
        print(f"Room ready: {web_processes} web processes behind http://{host}:{port}, one model server "
              f"({env['PLAYGROUND_ENGINE_URL']}); logs in {room.run_dir}", flush=True)
        if not engine_url:
            print(f"API (OpenAI-compatible): http://{host}:{port}/v1 with the key {env['PLAYGROUND_API_KEY']}",
                  flush=True)
        return supervise(room)
    finally:
        room.stop()


def start_model_server(room: Room, env: dict[str, str], engine_url: str | None,
                       server_args: list[str], api_key: str | None = None) -> dict[str, str]:
    """The model server's url and key for the web processes (a new server on loopback, or the one named)."""
    if engine_url:
        return {"PLAYGROUND_ENGINE_URL": engine_url}
    port, key = free_port(), api_key or secrets.token_urlsafe(24)
    cmd = [sys.executable, "-m", "engine", "serve", "--host", "127.0.0.1", "--port", str(port), *server_args]
    url = f"http://127.0.0.1:{port}"
    room.start("model-server", cmd, {**env, "PLAYGROUND_API_KEY": key}, health=url + "/health")
    print(f"Model server starting on {url} (loopback only; its API key is held by the web processes)", flush=True)
    wait_for(url + "/health", room, "the model server", 900)
    return {"PLAYGROUND_ENGINE_URL": url, "PLAYGROUND_API_KEY": key}


def start_web_processes(room: Room, streamlit_cmd: list[str], env: dict[str, str], n: int) -> list[int]:
    ports = [free_port() for _ in range(n)]
    for i, p in enumerate(ports):
        cmd = with_option(with_option(streamlit_cmd, "--server.address", "127.0.0.1"), "--server.port", str(p))
        room.start(f"web-{i + 1}", cmd, env, health=f"http://127.0.0.1:{p}/_stcore/health")
    for i, p in enumerate(ports):
        wait_for(f"http://127.0.0.1:{p}/_stcore/health", room, f"web process {i + 1}", 120)
    return ports


def with_option(cmd: list[str], name: str, value: str) -> list[str]:
    out = list(cmd)
    out[out.index(name) + 1] = value
    return out


def supervise(room: Room, tick: float = 0.25, stopped: Callable[[], bool] | None = None) -> int:
    """Keep the room up until interrupted (SIGINT, SIGTERM, or `stopped()`): restart what exits; give up (1) when
    one process keeps exiting."""
    stop = {"signal": None}

    def on_signal(signum: int, _frame: object) -> None:
        stop["signal"] = signum

    if stopped is None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, on_signal)
    while stop["signal"] is None and not (stopped and stopped()):
        for member in room.members.values():
            if not tend(room, member):
                return 1
        time.sleep(tick)
    return 0


def tend(room: Room, member: Member) -> bool:
    """One look at one process: note an exit and schedule its restart, restart it when due, see it serve again.
    False when it has exited too often to go on."""
    now = time.monotonic()
    if member.restart_at is None and member.proc is not None and member.proc.poll() is not None:
        return exited(room, member, now)
    if member.restart_at is not None and now >= member.restart_at:
        member.restart_at = None
        member.restarts += 1
        room.start(member.name, member.cmd, member.env)
        room.write_status()
    elif member.state == "starting" and member.proc is not None and member.proc.poll() is None and serving(member):
        member.state = "up"
        if member.down_since is not None:
            member.back.append(round(time.time() - member.down_since, 2))
            print(f"playground: {member.name} is back after {member.back[-1]:.1f} s", file=sys.stderr, flush=True)
        member.down_since = None
        room.write_status()
    return True


def exited(room: Room, member: Member, now: float) -> bool:
    """A process found dead: restart it after a backoff, or stop the room after too many exits in a short time."""
    member.exits.append(now)
    while member.exits and now - member.exits[0] > FAILURE_WINDOW:
        member.exits.popleft()
    code = member.proc.returncode
    if len(member.exits) >= FAILURES_TO_GIVE_UP:
        print(f"playground: {member.name} exited ({code}) {len(member.exits)} times within {FAILURE_WINDOW:.0f} s; "
              f"stopping the room. Its last lines:\n{room.tail(member.name)}", file=sys.stderr, flush=True)
        return False
    delay = RESTART_DELAYS[min(len(member.exits), len(RESTART_DELAYS)) - 1]
    member.state, member.restart_at = "restarting", now + delay
    member.down_since = member.down_since or time.time()
    room.write_status()
    print(f"playground: {member.name} exited ({code}); restarting it in {delay:.1f} s, the rest of the room goes on. "
          f"Its last lines:\n{room.tail(member.name, 8)}", file=sys.stderr, flush=True)
    return True


def serving(member: Member) -> bool:
    return member.health is None or answers(member.health, timeout=1.0)
