"""A room survives its own faults (app/hosting/processes.py): what exits is restarted while the rest goes on, only a process
that keeps exiting stops the room (naming it, with its last lines); nginx answers the API with a 503 and
Retry-After at once while the model server is down, and sends a dead web process's browsers to a live one and back.
Real processes and real nginx throughout; the whole room with the model is soaked in tests/test_soak_hosted.py."""
from __future__ import annotations

import http.server
import json
import os
import signal
import socketserver
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from app.hosting import processes
from app.hosting.processes import Room, nginx_conf, supervise
from servers import free_port

PY = sys.executable


@pytest.fixture
def quick_backoff(monkeypatch):
    monkeypatch.setattr(processes, "RESTART_DELAYS", (0.05, 0.1, 0.1, 0.1, 0.1))


def test_an_exited_process_is_restarted_and_the_others_go_on(tmp_path, quick_backoff):
    room = Room(tmp_path)
    steady = room.start("steady", [PY, "-c", "import time; time.sleep(120)"], dict(os.environ))
    room.start("server", [PY, "-c", "print('serving', flush=True); import time; time.sleep(120)"], dict(os.environ))
    first = room.members["server"].proc.pid
    done = threading.Event()
    watcher = threading.Thread(target=lambda: supervise(room, 0.05, done.is_set), daemon=True)
    watcher.start()
    try:
        time.sleep(0.5)
        os.kill(first, signal.SIGKILL)
        status = wait_status(tmp_path, lambda s: s["server"]["restarts"] == 1 and s["server"]["state"] == "up")
        assert status["server"]["pid"] != first and status["server"]["back_seconds"][0] < 5
        assert status["steady"] == {**status["steady"], "pid": steady.pid, "restarts": 0, "state": "up"}
        assert steady.poll() is None and "restarting server (restart 1)" in (tmp_path / "server.log").read_text()
    finally:
        done.set()
        watcher.join(5)
        room.stop()


def test_a_process_that_keeps_exiting_stops_the_room_with_its_name_and_last_lines(tmp_path, quick_backoff, capsys):
    room = Room(tmp_path)
    steady = room.start("web-1", [PY, "-c", "import time; time.sleep(120)"], dict(os.environ))
    room.start("model-server", [PY, "-c", "import sys; print('cannot load the model: no weights'); sys.exit(3)"],
               dict(os.environ))
    try:
        # stopped by the count, never a clock: a room that did not give up at the fifth exit would restart it again
        assert supervise(room, 0.05, lambda: room.members["model-server"].restarts > 4) == 1
        err = capsys.readouterr().err
        assert "model-server exited (3) 5 times within 180 s; stopping the room" in err
        assert "cannot load the model: no weights" in err.split("stopping the room")[-1]
        assert room.members["model-server"].restarts == 4 and steady.poll() is None   # stopped by room.stop() next
    finally:
        room.stop()
    assert steady.poll() is not None


def wait_status(folder, ok, seconds: float = 20.0) -> dict:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            status = json.loads((folder / "status.json").read_text())
            if ok(status):
                return status
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.05)
    raise AssertionError((folder / "status.json").read_text())


class Named(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:                    # noqa: N802 - the standard library's name
        body = self.server.name.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def web(port: int, name: str) -> socketserver.TCPServer:
    socketserver.TCPServer.allow_reuse_address = True
    server = socketserver.ThreadingTCPServer(("127.0.0.1", port), Named)
    server.name = name
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def get(url: str, cookie: str = "") -> tuple[int, dict, bytes, float]:
    start = time.monotonic()
    request = urllib.request.Request(url, headers={"Cookie": cookie} if cookie else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, dict(r.headers), r.read(), time.monotonic() - start
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read(), time.monotonic() - start
    except OSError:                              # nginx not listening yet
        return 0, {}, b"", time.monotonic() - start


def test_nginx_answers_the_api_at_once_while_the_model_server_is_down_and_routes_around_a_dead_web_process(
        tmp_path):
    try:
        nginx = processes.find_nginx()
    except processes.LaunchError:
        pytest.skip("nginx is not installed (make browser installs it)")
    ports, listen, model = [free_port(), free_port()], free_port(), free_port()        # nothing listens on `model`
    servers = [web(ports[0], "web-1"), web(ports[1], "web-2")]
    (tmp_path / "nginx.conf").write_text(nginx_conf(tmp_path, f"127.0.0.1:{listen}", ports, 1,
                                                    f"http://127.0.0.1:{model}"))
    proc = subprocess.Popen([nginx, "-c", str(tmp_path / "nginx.conf"), "-p", str(tmp_path)],
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{listen}"
    try:
        deadline = time.monotonic() + 20
        while get(url + "/")[0] != 200:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        status, headers, body, took = get(url + "/v1/models")
        assert status == 503 and headers["Retry-After"] == "5" and took < 3
        assert json.loads(body)["error"]["message"].startswith("the model is restarting; your runs are safe")
        on: dict[str, str] = {}
        for i in range(40):
            cookie = f"playground_route=browser-{i}"
            on.setdefault(get(url + "/", cookie)[2].decode(), cookie)
        assert set(on) == {"web-1", "web-2"}                            # browsers spread over both processes
        mine = on["web-1"]
        servers[0].shutdown()
        servers[0].server_close()                                       # web-1 dies
        assert [get(url + "/", mine)[2] for _ in range(3)] == [b"web-2"] * 3          # its browser goes on at web-2
        servers[0] = web(ports[0], "web-1")                             # web-1 is back
        deadline = time.monotonic() + 15
        while get(url + "/", mine)[2] != b"web-1":                      # and its browsers with it
            assert time.monotonic() < deadline
            time.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait(10)
        for server in servers:
            server.shutdown()
