"""Real servers for the tests: `python -m engine serve` started as a process on a free loopback port, waited for
until /health answers 200, stopped at the end. No mocks: the tests speak HTTP to it with the official `openai`
client, httpx or raw sockets."""
from __future__ import annotations

import contextlib
import os
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
                   ready: bool = True) -> Iterator[tuple[str, subprocess.Popen]]:
    """`python -m engine serve ARGS --port P`; (its base url, the process). `ready=False`: do not wait for /health."""
    port = free_port()
    log = log_dir / f"serve-{port}.log"
    cmd = [python(), "-m", "engine", "serve", "--port", str(port), *args]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
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
