"""The `playground` command: its flags become the environment the app reads, and it starts a server."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from app.launch import (LIMIT_FLAGS, TOKEN_ENV, banner, launch_env, main, presenter_token, room_secrets,
                        settings_of, streamlit_command)
from engine.serving.limits import ENV_VARS, Limits
from servers import free_port

BIN = Path(sys.executable).parent / "playground"

ROOT = Path(__file__).resolve().parent.parent


def parse(*argv: str):
    """The settings `playground ARGV` runs with, in an environment of its own (none of the machine's variables)."""
    return settings_of(list(argv), environ={})


def test_help_lists_every_flag():
    out = subprocess.run([str(BIN), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    for flag in ("--model", "--draft", "--device", "--dtype", "--host", "--port", "--presenter-token",
                 "--max-prompt-tokens", "--max-new-tokens", "--max-queue", "--max-sessions", "--max-capture-mb",
                 "--request-seconds"):
        assert flag in out.stdout


def test_every_limit_has_a_flag():
    assert {name for name, _, _ in LIMIT_FLAGS} == {f.name for f in dataclasses.fields(Limits)}


def test_flags_become_environment_variables():
    args = parse("--model", "/models/llama", "--draft", "ngram", "--device", "cuda:1", "--dtype", "bf16",
                 "--max-new-tokens", "64", "--max-sessions", "30", "--request-seconds", "45.5", "--max-queue", "0")
    env = launch_env(args, token="a-long-secret-token")
    assert env == {"PLAYGROUND_PORT": "8501", "PLAYGROUND_INVARIANT": "0", "PLAYGROUND_MODEL": "/models/llama", "PLAYGROUND_DRAFT": "ngram", "PLAYGROUND_DEVICE": "cuda:1",
                   "PLAYGROUND_DTYPE": "bf16", TOKEN_ENV: "a-long-secret-token",
                   ENV_VARS["max_new_tokens"]: "64", ENV_VARS["max_sessions"]: "30",
                   ENV_VARS["request_seconds"]: "45.5", ENV_VARS["max_queue"]: "0"}
    limits = Limits().with_env(env)                     # what the app's scheduler will read back
    assert (limits.max_new_tokens, limits.max_sessions, limits.request_seconds, limits.max_queue) == (64, 30, 45.5, 0)


def test_flags_left_out_set_nothing_but_the_port_the_room_listens_on_and_its_kernels():
    """The two defaults the launcher settles for its processes: the port, and the batch-invariant kernels (off on
    loopback, on in a hosted room: engine/settings.py)."""
    assert launch_env(parse()) == {"PLAYGROUND_PORT": "8501", "PLAYGROUND_INVARIANT": "0"}


def test_a_bad_limit_stops_the_launch_with_a_message():
    with pytest.raises(SystemExit, match="PLAYGROUND_MAX_SESSIONS"):
        launch_env(parse("--max-sessions", "0"))


def test_presenter_tokens():
    assert presenter_token(None) is None
    made = {presenter_token("auto") for _ in range(3)}
    assert len(made) == 3 and all(len(t) >= 20 for t in made)
    with pytest.raises(SystemExit, match="at least"):
        presenter_token("1234")


def test_the_server_listens_on_localhost_by_default():
    cmd = streamlit_command(parse())
    assert cmd[cmd.index("--server.address") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--server.headless") + 1] == "true"


def test_one_command_serves_the_pages_and_the_api_and_says_where():
    """`playground` runs app/asgi.py (pages + API over one model) unless the model lives in a model server or --no-api;
    Streamlit's own start-up lines (and its guess at an external address) are hidden: the banner says where to go."""
    cmd = streamlit_command(parse())
    assert cmd[4].endswith("app/asgi.py") and cmd[cmd.index("--logger.hideWelcomeMessage") + 1] == "true"
    for other in (("--no-api",), ("--engine-url", "http://127.0.0.1:8000"), ("--web-processes", "2")):
        assert streamlit_command(parse(*other))[4].endswith("app/main.py")
    args = parse("--port", "8765")
    assert room_secrets(args) == (None, None)                                   # this machine alone: no secrets
    text = banner(args, None)
    assert "open http://127.0.0.1:8765 in a browser" in text and "http://127.0.0.1:8765/v1" in text


def test_off_loopback_a_room_gets_an_api_key_and_a_presenter_token_printed():
    args = parse("--host", "0.0.0.0", "--port", "8765", "--public-url", "http://room.example:8765")
    token, key = room_secrets(args)
    assert len(token) >= 20 and len(key) >= 20 and token != key
    text = banner(args, token, "abcd-efgh-ijkl", key)
    assert "Join link: http://room.example:8765/?join=abcd-efgh-ijkl" in text
    assert f"http://room.example:8765/v1  API key: {key}" in text and f"Presenter token: {token}" in text
    assert room_secrets(parse("--host", "0.0.0.0", "--api-key", "a-key-of-my-own", "--presenter-token",
                              "a-token-of-my-own")) == ("a-token-of-my-own", "a-key-of-my-own")
    assert room_secrets(parse("--host", "0.0.0.0", "--no-api"))[1] is None
    with pytest.raises(SystemExit, match="at least"):
        room_secrets(parse("--host", "0.0.0.0", "--api-key", "short"))


def test_dry_run_prints_the_command_and_variables(capsys):
    assert main(["--dry-run", "--port", "8765", "--max-new-tokens", "32"], environ={}) == 0
    out = capsys.readouterr().out
    assert "streamlit run" in out and "8765" in out and "PLAYGROUND_MAX_NEW_TOKENS=32" in out
    assert "OMP_WAIT_POLICY=PASSIVE" in out                 # the model's process: OpenMP's threads poll briefly,
    assert "GOMP_SPINCOUNT=10000" in out                    # then sleep, not spin for good
    assert main(["--dry-run"], environ={"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "0"}) == 0
    out = capsys.readouterr().out                            # values set by hand are kept (inherited, not overridden)
    assert "OMP_WAIT_POLICY" not in out and "GOMP_SPINCOUNT" not in out


def test_the_engine_sets_openmps_wait_before_torch_loads_and_keeps_a_value_set_by_hand():
    """`python -m engine` (the server, the CLI) in a real process sets libgomp's waits (engine/__main__.py, before it
    imports anything that loads torch: libgomp reads them once, as it loads), and keeps a value set by hand."""
    code = ("import runpy, sys; sys.argv = ['engine', '--help']\n"
            "try:\n    runpy.run_module('engine', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "import os; print(os.environ['OMP_WAIT_POLICY'], os.environ['GOMP_SPINCOUNT'])")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert done.stdout.split()[-2:] == ["PASSIVE", "10000"], done.stderr[-2000:]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**env, "GOMP_SPINCOUNT": "0"})
    assert done.stdout.split()[-2:] == ["PASSIVE", "0"], done.stderr[-2000:]


def test_playground_starts_a_server_that_answers_its_health_check():
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([str(BIN), "--port", str(port), "--max-sessions", "5"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        body = None
        deadline = time.time() + 90
        while time.time() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as resp:
                    body = resp.read().decode()
                break
            except OSError:
                time.sleep(0.5)
        assert body == "ok"
    finally:
        proc.terminate()
        try:
            out, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    assert f"http://127.0.0.1:{port}" in out


def test_no_full_garbage_collection_after_every_rerun():
    """Streamlit's default collects all generations after each script run: with a room of pages redrawing
    twice a second over a heap of runs and captures, that took most of the server's time (docs/serving.md)."""
    cmd = streamlit_command(parse())
    assert cmd[cmd.index("--runner.postScriptGC") + 1] == "false"


def test_the_launcher_leaves_the_threads_to_the_schedulers_measurement(capsys):
    """No OMP_NUM_THREADS from the launcher: the scheduler measures every core against one fewer under the live
    load (engine/serving/threads.py; tests/test_threads.py). A person's own OMP_NUM_THREADS still reaches it."""
    assert main(["--dry-run"], environ={}) == 0
    assert "OMP_NUM_THREADS" not in capsys.readouterr().out


def test_a_presenter_token_that_begins_with_a_dash_reaches_the_model_server():
    """`token_urlsafe` makes a token that begins with "-" about one time in 64: the model server a room starts must
    still take it as the token's value, not as a flag (a fresh CI run's hosted room once failed to start on one)."""
    from engine.cli import build_parser  # the model server's own parser, as `python -m engine serve` builds it
    from engine.launch import server_args
    token = "-ghdEDJ4lt7YVLOU7vulsLll"
    args = build_parser().parse_args(["serve", *server_args(parse("--presenter-token", "auto"), token)])
    assert args.presenter_token == token
