"""Real servers for the tests: `python -m engine serve` started as a process on a free loopback port, waited for
until /health answers 200, stopped at the end. No mocks: the tests speak HTTP to it with the official `openai`
client, httpx or raw sockets."""
from __future__ import annotations

import contextlib
import os
import random
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator, Sequence

import pytest

ROOT = Path(__file__).resolve().parent.parent


RAY_WORKER_PORTS = range(10002, 20000)      # Ray's default --min-worker-port..--max-worker-port
_handed: set[int] = set()                   # this process's ports handed out, not yet bound by their servers


def free_port() -> int:
    """A loopback port nothing listens on, for a server the test starts next.

    Drawn outside the range the kernel hands out for port 0 (and for every outgoing connection's own end) and
    outside Ray's worker ports: a port from bind(0) is free only until the kernel gives it to someone else, and
    between this check and the server's own bind a local Ray cluster starts a dozen processes that bind ports
    (a CI run's cluster server met a Ray gRPC listener on the port the test had drawn). Each xdist worker draws
    from its own residue class, so two workers never draw the same port, and a worker never draws one twice."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    mine = [p for p in quiet_ports() if p % workers == worker and p not in _handed]
    for port in random.sample(mine, min(len(mine), 200)):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed.add(port)
        return port
    with socket.socket() as s:                                       # no quiet range on this machine
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def quiet_ports() -> range:
    """Ports above Ray's worker ports and below the kernel's ephemeral range (Linux: 20000-32767), or above it."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999                                     # Linux's default
    below = range(RAY_WORKER_PORTS.stop, low)
    return below if len(below) >= 1000 else range(max(high + 1, RAY_WORKER_PORTS.stop), 65536)


def python() -> str:
    venv = ROOT / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float = 180, path: str = "/health") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + path, timeout=2) as r:
                if r.status == 200:
                    return
        except (OSError, urllib.error.HTTPError):
            time.sleep(0.3)
    raise RuntimeError(f"the server was not ready within {timeout} s:\n{log.read_text()[-3000:]}")


@contextlib.contextmanager
def running_server(log_dir: Path, args: Sequence[str] = (), env: dict[str, str] | None = None,
                   ready: bool = True, hold: "Hold | None" = None) -> Iterator[tuple[str, subprocess.Popen]]:
    """`python -m engine serve ARGS --port P`; (its base url, the process). `ready=False`: do not wait for /health.
    `hold`: the test can hold the server's worker at a run's record (`Hold`)."""
    port = free_port()
    log = log_dir / f"serve-{port}.log"
    cmd = [python(), "-m", "engine", "serve", "--port", str(port), *args]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {}),
                                     **(hold.env() if hold is not None else {})})
    url = f"http://127.0.0.1:{port}"
    try:
        if ready:
            wait_ready(url, proc, log)
        else:
            wait_ready(url, proc, log, path="/openapi.json")
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


class Hold:
    """Holds a served process's scheduler at a run's `at`-th record until the test releases it (tests/hold/
    sitecustomize.py, loaded by that process only): over HTTP as `Pause` in-process, so that what the test does
    meanwhile (a client that goes away, a second request) cannot race the model, however fast the machine.

        hold = Hold(tmp_path)                          # running_server(..., hold=hold)
        with hold.at(2):                               # the next run to reach its 2nd record waits there
            ...; run_id = hold.held()                  # it is held now (its id)
            ...; hold.cancelled()                      # the server has cancelled it meanwhile
        # released
    """

    def __init__(self, folder: Path):
        self.folder = folder

    def env(self) -> dict[str, str]:
        paths = [str(ROOT / "tests" / "hold"), os.environ.get("PYTHONPATH", "")]
        return {"TESTS_HOLD_DIR": str(self.folder), "PYTHONPATH": os.pathsep.join(p for p in paths if p)}

    @contextlib.contextmanager
    def at(self, record: int) -> Iterator["Hold"]:
        for name in ("held", "cancelled"):
            (self.folder / name).unlink(missing_ok=True)
        (self.folder / "armed.part").write_text(str(record))
        (self.folder / "armed.part").replace(self.folder / "armed")
        try:
            yield self
        finally:
            self.release()

    def release(self) -> None:
        """The held run goes on (and no other is held): before the block ends, where a test needs that."""
        (self.folder / "armed").unlink(missing_ok=True)

    def held(self, timeout: float = 120) -> str:
        """The id of the run held now (waits for it; the limit only guards against a hang)."""
        return self._wait("held", timeout)

    def cancelled(self, timeout: float = 120) -> str:
        """Returns once the held run's handle has been cancelled (the server noticed its client went away)."""
        return self._wait("cancelled", timeout)

    def _wait(self, name: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while not (self.folder / name).exists():
            assert time.monotonic() < deadline, f"the served process never wrote {name!r}"
            time.sleep(0.01)
        return (self.folder / name).read_text()


def tiny_args(model_dir: Path, *more: str) -> list[str]:
    return ["--model", str(model_dir), "--device", "cpu", "--dtype", "float32", *more]


@pytest.fixture(scope="module")
def model_server(tiny_model_dir, tmp_path_factory):
    """The tiny model served by `python -m engine serve` for one test module."""
    with running_server(tmp_path_factory.mktemp("remote"), tiny_args(tiny_model_dir)) as (url, _):
        yield url


@pytest.fixture
def app_env(tiny_model_dir, model_server, monkeypatch):
    """The app as a client of the model server: it loads no model (PLAYGROUND_ENGINE_URL). Overrides conftest's."""
    monkeypatch.setenv("PLAYGROUND_MODEL", str(tiny_model_dir))
    monkeypatch.setenv("PLAYGROUND_DEVICE", "cpu")
    monkeypatch.setenv("PLAYGROUND_DTYPE", "float32")
    monkeypatch.setenv("PLAYGROUND_ENGINE_URL", model_server)
    return tiny_model_dir
