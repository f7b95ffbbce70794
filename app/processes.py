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

If a process dies, the supervisor stops everything (and says which one): a half room is worse than a restart.
"""
from __future__ import annotations

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

ROUTE_COOKIE = "playground_route"
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
        location / {{
            proxy_pass http://web;
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
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


def nginx_conf(run_dir: Path, listen: str, ports: Sequence[int], upload_mb: int) -> str:
    servers = "\n".join(f"        server 127.0.0.1:{p} max_fails=0;" for p in ports)
    return NGINX_CONF.format(run=run_dir, listen=listen, servers=servers, cookie=ROUTE_COOKIE, upload_mb=upload_mb)


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
class Room:
    """The processes of one room, started in order and stopped together."""

    run_dir: Path
    procs: list[tuple[str, subprocess.Popen]] = field(default_factory=list)

    def start(self, name: str, cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = open(self.run_dir / f"{name}.log", "w")
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append((name, proc))
        return proc

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

    def tail(self, name: str) -> str:
        path = self.run_dir / f"{name}.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""


def wait_for(url: str, room: Room, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (dead := room.dead()) is not None:
            raise LaunchError(f"playground: {dead[0]} exited ({dead[1]}) while starting:\n{room.tail(dead[0])}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except (OSError, urllib.error.HTTPError):
            time.sleep(0.5)
    raise LaunchError(f"playground: {what} did not start within {timeout:.0f} s (logs in {room.run_dir})")


def serve_room(streamlit_cmd: list[str], env: dict[str, str], host: str, port: int, web_processes: int,
               engine_url: str | None, server_args: list[str], upload_mb: int) -> int:
    """Start the model server (unless `engine_url` names one), the web processes and nginx; wait; stop them all."""
    nginx = find_nginx()
    room = Room(Path(tempfile.mkdtemp(prefix="playground-room-")))
    try:
        env = {**env, **start_model_server(room, env, engine_url, server_args)}
        ports = start_web_processes(room, streamlit_cmd, env, web_processes)
        (room.run_dir / "nginx.conf").write_text(nginx_conf(room.run_dir, listen_address(host, port), ports, upload_mb))
        room.start("nginx", [nginx, "-c", str(room.run_dir / "nginx.conf"), "-p", str(room.run_dir)], env)
        wait_for(f"http://127.0.0.1:{port}/_stcore/health", room, "nginx", 30)
        print(f"Room ready: {web_processes} web processes behind http://{host}:{port}, one model server "
              f"({env['PLAYGROUND_ENGINE_URL']}); logs in {room.run_dir}", flush=True)
        return supervise(room)
    finally:
        room.stop()


def start_model_server(room: Room, env: dict[str, str], engine_url: str | None,
                       server_args: list[str]) -> dict[str, str]:
    """The model server's url and key for the web processes (a new server on loopback, or the one named)."""
    if engine_url:
        return {"PLAYGROUND_ENGINE_URL": engine_url}
    port, key = free_port(), secrets.token_urlsafe(24)
    cmd = [sys.executable, "-m", "engine", "serve", "--host", "127.0.0.1", "--port", str(port), *server_args]
    room.start("model-server", cmd, {**env, "PLAYGROUND_API_KEY": key})
    url = f"http://127.0.0.1:{port}"
    print(f"Model server starting on {url} (loopback only; its API key is held by the web processes)", flush=True)
    wait_for(url + "/health", room, "the model server", 900)
    return {"PLAYGROUND_ENGINE_URL": url, "PLAYGROUND_API_KEY": key}


def start_web_processes(room: Room, streamlit_cmd: list[str], env: dict[str, str], n: int) -> list[int]:
    ports = [free_port() for _ in range(n)]
    for i, p in enumerate(ports):
        cmd = with_option(with_option(streamlit_cmd, "--server.address", "127.0.0.1"), "--server.port", str(p))
        room.start(f"web-{i + 1}", cmd, env)
    for i, p in enumerate(ports):
        wait_for(f"http://127.0.0.1:{p}/_stcore/health", room, f"web process {i + 1}", 120)
    return ports


def with_option(cmd: list[str], name: str, value: str) -> list[str]:
    out = list(cmd)
    out[out.index(name) + 1] = value
    return out


def supervise(room: Room) -> int:
    """Wait until interrupted or until one process dies (then everything stops, with the reason)."""
    stop = {"signal": None}

    def on_signal(signum: int, _frame: object) -> None:
        stop["signal"] = signum

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    while stop["signal"] is None:
        if (dead := room.dead()) is not None:
            print(f"playground: {dead[0]} exited ({dead[1]}); stopping the room. Its last lines:\n"
                  f"{room.tail(dead[0])}", file=sys.stderr, flush=True)
            return 1
        time.sleep(0.5)
    return 0
