"""One settings object (engine/settings.py): read once from flags, then PLAYGROUND_* variables, then a TOML file,
then the defaults; handed to started processes as variables; printed with the secrets masked; every setting in
docs/settings.md."""
from __future__ import annotations

import ast
import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.launch import build_parser, main, settings_of
from engine.launch import ENGINE_URL, ONE_PROCESS, REPLICAS, SERVE, WEB_PROCESSES, way
from engine.serving.flags import LIMIT_FLAGS
from engine.service.service import run_store_bytes
from engine.serving.limits import ENV_VARS, Limits
from engine.serving.threads import fixed_threads
from engine.store import budget_bytes, store_dir
from engine.settings import SPECS, Settings, SettingsError, current, load, origins, rows, table
from servers import ROOT

BIN = Path(sys.executable).parent / "playground"
TOKEN, KEY = "a-presenter-secret-123", "an-api-key-secret-4567"


def test_flag_beats_variable_beats_file_beats_default(tmp_path):
    file = tmp_path / "room.toml"
    file.write_text('model = "from-the-file"\ndevice = "cpu"\nmax_new_tokens = 11\nopen_room = true\n')
    env = {"PLAYGROUND_SETTINGS": str(file), "PLAYGROUND_DEVICE": "cuda:1", "PLAYGROUND_MAX_NEW_TOKENS": "22"}
    s = settings_of(["--max-new-tokens", "33"], env)
    assert (s.model, s.device, s.max_new_tokens, s.open_room, s.dtype) == ("from-the-file", "cuda:1", 33, True, None)
    assert settings_of([], env).max_new_tokens == 22
    assert settings_of(["--settings", str(file)], {}).max_new_tokens == 11
    assert settings_of([], {}) == Settings(port=8501, invariant=False)   # both resolved: this machine, loopback


def test_the_port_is_the_commands_own_unless_given():
    assert load(None, {}).port == 8501 and load(None, {}, SERVE).port == 8000
    assert settings_of(["--port", "9000"], {}).port == 9000


def test_a_started_process_reads_back_the_same_settings():
    s = settings_of(["--model", "qwen-1.5b", "--device", "cpu", "--max-batch", "4", "--request-seconds", "7.5",
                     "--runs-mb", "0"], {"PLAYGROUND_TIMELINES": "0"})
    env = s.to_env()
    assert env["PLAYGROUND_MAX_BATCH"] == "4" and env["PLAYGROUND_TIMELINES"] == "0" and "PLAYGROUND_DTYPE" not in env
    assert load(None, env) == s
    assert Limits().with_env(env).request_seconds == 7.5             # what the engine's limits read back


def test_current_reads_this_processes_environment_once_per_environment(monkeypatch):
    monkeypatch.setenv("PLAYGROUND_MODEL", "first")
    assert current() is current() and current().model == "first"
    monkeypatch.setenv("PLAYGROUND_MODEL", "second")
    assert current().model == "second"


@pytest.mark.parametrize("env, words", [
    ({"PLAYGROUND_RUNS_MB": "lots"}, "PLAYGROUND_RUNS_MB must be a whole number, not 'lots'"),
    ({"PLAYGROUND_REQUEST_SECONDS": "1m"}, "PLAYGROUND_REQUEST_SECONDS must be a number"),
    ({"PLAYGROUND_TIMELINES": "maybe"}, "PLAYGROUND_TIMELINES must be 1 or 0"),
])
def test_a_variable_that_cannot_be_read_is_named(env, words):
    with pytest.raises(SettingsError, match=re.escape(words)):
        load(None, env)


def test_a_bad_settings_file_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('modle = "qwen"\n')
    with pytest.raises(SystemExit, match="no setting called modle"):
        main(["--settings", str(bad), "--dry-run"], environ={})
    bad.write_text("model = \n")
    with pytest.raises(SystemExit, match="is not TOML"):
        main(["--settings", str(bad), "--dry-run"], environ={})
    with pytest.raises(SystemExit, match="cannot be read"):
        main(["--settings", str(tmp_path / "missing.toml"), "--dry-run"], environ={})
    bad.write_text('max_batch = "four"\n')
    with pytest.raises(SystemExit, match="max_batch in .* must be a whole number"):
        main(["--settings", str(bad), "--dry-run"], environ={})


def test_print_settings_shows_the_room_and_masks_its_secrets():
    """The real command, as a person runs it: the secrets given by flag and by variable never appear."""
    out = subprocess.run([str(BIN), "--print-settings", "--web-processes", "2", "--presenter-token", TOKEN,
                          "--max-sessions", "60"], env={"PATH": "/usr/bin:/bin", "PLAYGROUND_API_KEY": KEY,
                                                        "PLAYGROUND_JOIN_CODE": "room-code-2026"},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "playground starts web processes" in text
    assert re.search(r"^max_sessions +60 ", text, re.M) and re.search(r"^web_processes +2 ", text, re.M)
    assert TOKEN not in text and KEY not in text and "room-code-2026" not in text
    assert re.search(rf"^presenter_token +set \({len(TOKEN)} characters, hidden\)", text, re.M)
    assert re.search(rf"^api_key +set \({len(KEY)} characters, hidden\)", text, re.M)
    assert "replica_cpus" not in text                                  # `engine serve`'s own, not playground's


def test_print_settings_says_where_each_value_came_from(tmp_path):
    """flag, variable, file or default, for the real command."""
    file = tmp_path / "room.toml"
    file.write_text('model = "from-the-file"\nmax_queue = 3\nmax_batch = 2\n')
    out = subprocess.run([str(BIN), "--print-settings", "--max-batch", "4", "--settings", str(file)],
                         env={"PATH": "/usr/bin:/bin", "PLAYGROUND_MAX_QUEUE": "5"}, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    came = {m[0]: (m[1], m[2]) for m in re.findall(r"^(\w+) +(\S+(?: \S+)*?) +(flag|variable|file|default) ",
                                                  out.stdout, re.M)}
    assert came["max_batch"] == ("4", "flag") and came["max_queue"] == ("5", "variable")
    assert came["model"] == ("from-the-file", "file") and came["host"] == ("127.0.0.1", "default")
    assert came["settings_file"] == (str(file), "flag") and came["port"] == ("8501", "default")


def test_origins_name_the_source_of_each_setting(tmp_path):
    file = tmp_path / "room.toml"
    file.write_text('device = "cpu"\n')
    came = origins(None, {"PLAYGROUND_SETTINGS": str(file), "PLAYGROUND_DTYPE": "bf16"})
    assert (came["device"], came["dtype"], came["settings_file"], came["model"]) == ("file", "variable", "variable",
                                                                                     "default")


def test_print_settings_refuses_a_bad_limit(capsys):
    with pytest.raises(SystemExit, match="PLAYGROUND_MAX_SESSIONS"):
        main(["--print-settings", "--max-sessions", "0"], environ={})


def test_masked_rows_show_auto_and_unset_secrets():
    shown = {r["setting"]: r["value"] for r in rows(Settings(presenter_token="auto", port=8501))}
    assert shown["presenter_token"] == "auto (made up at start)" and shown["api_key"] == "(not set)"
    assert "auto" in table(Settings(presenter_token="auto", port=8501))


def test_one_launcher_names_every_way_to_start():
    assert way(settings_of([], {})) == ONE_PROCESS
    assert way(settings_of(["--engine-url", "http://127.0.0.1:8000"], {})) == ENGINE_URL
    assert way(settings_of(["--web-processes", "3"], {})) == WEB_PROCESSES
    assert way(settings_of(["--replicas", "2"], {})) == REPLICAS
    assert way(load(None, {}, SERVE), SERVE) == SERVE


def test_the_limits_are_settings_with_the_engines_own_names():
    limits = {spec.name: spec for spec in SPECS if spec.group == "limits"}
    assert set(limits) == {f.name for f in dataclasses.fields(Limits)} == {name for name, _, _ in LIMIT_FLAGS}
    assert {name: spec.env for name, spec in limits.items()} == ENV_VARS


def test_every_setting_is_in_the_table_of_docs_settings():
    doc = (ROOT / "docs" / "settings.md").read_text()
    for spec in SPECS:
        row = next((line for line in doc.splitlines() if line.startswith(f"| `{spec.name}` |")), None)
        assert row is not None, spec.name
        assert (spec.flag or "—") in row and (spec.env or "—") in row, row


def test_every_variable_the_code_reads_is_in_docs_settings():
    """Each PLAYGROUND_* name in engine/, app/ and pages/ is a setting or listed under "Not settings"."""
    doc = (ROOT / "docs" / "settings.md").read_text()
    names = {m for pkg in ("engine", "app", "pages") for path in (ROOT / pkg).rglob("*.py")
             for m in re.findall(r"PLAYGROUND_[A-Z][A-Z_]*[A-Z]", path.read_text())}
    assert len(names) > 20
    assert sorted(n for n in names if n not in doc and n != "PLAYGROUND_MAX") == []


def test_engine_serve_has_a_flag_for_each_of_its_settings():
    out = subprocess.run([sys.executable, "-m", "engine", "serve", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for spec in SPECS:
        if SERVE in spec.commands:
            assert spec.flag in out.stdout, spec.flag
    assert not re.search(r"^ +(--engine-url|--web-processes|--join-code) ", out.stdout, re.M)   # playground's own


def test_engine_serve_refuses_a_bad_setting_in_one_line():
    out = subprocess.run([sys.executable, "-m", "engine", "serve", "--log-level", "loud"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--log-level must be one of" in out.stderr and "Traceback" not in out.stderr
    out = subprocess.run([sys.executable, "-m", "engine", "serve"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env={"PATH": "/usr/bin:/bin", "PLAYGROUND_MAX_BATCH": "many"})
    assert out.returncode == 2 and "PLAYGROUND_MAX_BATCH must be a whole number" in out.stderr
    assert "Traceback" not in out.stderr


# Modules that may still read a PLAYGROUND_* variable themselves, each with its reason.
READS_ALLOWED = {
    "engine/runs/kept.py": "PLAYGROUND_SAVED_DIR: where the old shelf was, read once to convert what it holds",
}


def playground_names(tree: ast.AST) -> dict[str, str]:
    """The module's constants that hold a PLAYGROUND_* name (`ENV = "PLAYGROUND_THREADS"`, tuples too)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                pairs = (zip(target.elts, node.value.elts) if isinstance(target, ast.Tuple)
                         and isinstance(node.value, ast.Tuple) else [(target, node.value)])
                names.update({t.id: v.value for t, v in pairs if isinstance(t, ast.Name)
                              and isinstance(v, ast.Constant) and str(v.value).startswith("PLAYGROUND_")})
    return names


def environment_reads(tree: ast.AST, known: dict[str, str]) -> list[str]:
    """PLAYGROUND_* names read as `os.environ[...]`, `<anything>.get(...)`, `os.getenv(...)` or `.pop(...)`
    (a variable is read from the environment, or from a mapping handed in its place)."""
    def name_of(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and str(node.value).startswith("PLAYGROUND_"):
            return node.value
        return known.get(node.id) if isinstance(node, ast.Name) else None

    reads = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args \
                and node.func.attr in ("get", "getenv", "pop", "setdefault"):
            reads.append(name_of(node.args[0]))
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) \
                and ast.unparse(node.value) in ("os.environ", "environ"):
            reads.append(name_of(node.slice))
    return [name for name in reads if name]


def test_only_the_settings_read_playground_variables():
    """engine/, app/ and pages/ read their settings through engine/settings.py, never PLAYGROUND_* themselves."""
    trees = {str(path.relative_to(ROOT)): ast.parse(path.read_text()) for pkg in ("engine", "app", "pages")
             for path in (ROOT / pkg).rglob("*.py")}
    shared = {k: v for tree in trees.values() for k, v in playground_names(tree).items()}     # imported ones too
    readers = {path: environment_reads(tree, {**shared, **playground_names(tree)}) for path, tree in trees.items()
               if path != "engine/settings.py"}
    readers = {path: names for path, names in readers.items() if names}
    assert sorted(readers) == sorted(READS_ALLOWED)                 # and an allowance is dropped with its read


def test_the_scan_sees_each_way_of_reading_a_variable():
    tree = ast.parse('ENV, X = "PLAYGROUND_A", 1\nos.environ.get(ENV)\nos.environ["PLAYGROUND_B"]\n'
                     'os.getenv("PLAYGROUND_C")\nenv.get(CACHE_ENV, "")\nos.environ["PLAYGROUND_D"] = "1"\nos.environ.get("HOME")')
    assert sorted(environment_reads(tree, {"CACHE_ENV": "PLAYGROUND_CACHE", **playground_names(tree)})) == [
        "PLAYGROUND_A", "PLAYGROUND_B", "PLAYGROUND_C", "PLAYGROUND_CACHE"]                  # not the write, not HOME


def test_the_engines_readers_take_their_settings_from_the_environment_given():
    env = {"PLAYGROUND_RUNS_DIR": "/tmp/runs-here", "PLAYGROUND_RUNS_MB": "3", "PLAYGROUND_THREADS": "2",
           "PLAYGROUND_RUN_STORE_MB": "5"}
    assert (str(store_dir(env)), budget_bytes(env), fixed_threads(env)) == ("/tmp/runs-here", 3 * 2**20, 2)
    assert run_store_bytes(Limits(), env) == 5 * 2**20
    assert store_dir({"PLAYGROUND_CACHE": "/tmp/cache-here"}) == Path("/tmp/cache-here/runs")
    assert fixed_threads({"PLAYGROUND_THREADS": "auto"}) is None
    with pytest.raises(SettingsError, match="PLAYGROUND_RUNS_MB must be a whole number"):
        budget_bytes({"PLAYGROUND_RUNS_MB": "lots"})


def test_the_traceback_setting_is_read_through_the_settings(monkeypatch):
    from engine.cli import traceback_asked, unexpected     # the engine's command line: only for this test

    monkeypatch.setenv("PLAYGROUND_TRACEBACK", "on")
    assert traceback_asked()
    with pytest.raises(RuntimeError):
        unexpected(RuntimeError("boom"))
    monkeypatch.setenv("PLAYGROUND_TRACEBACK", "0")
    assert not traceback_asked() and unexpected(RuntimeError("boom")) == 1
    monkeypatch.setenv("PLAYGROUND_RUNS_MB", "lots")                 # settings that cannot be read: one line still
    monkeypatch.setenv("PLAYGROUND_TRACEBACK", "1")
    assert not traceback_asked()


def test_the_invariant_kernels_are_on_by_default_in_a_hosted_room_only(tmp_path):
    """Off loopback (a room with a join code) on unless said otherwise; on this machine off unless asked; where the
    value came from is --print-settings' column."""
    def invariant(*argv, env=None):
        args = build_parser().parse_args(list(argv))
        return load(args, env or {}).invariant, origins(args, env or {})["invariant"]

    assert invariant() == (False, "default") and invariant("--host", "0.0.0.0") == (True, "default")
    assert invariant("--invariant") == (True, "flag")
    assert invariant("--host", "0.0.0.0", env={"PLAYGROUND_INVARIANT": "off"}) == (False, "variable")
    file = tmp_path / "room.toml"
    file.write_text("invariant = false\n")
    assert invariant("--host", "0.0.0.0", "--settings", str(file)) == (False, "file")
    out = subprocess.run([str(BIN), "--print-settings", "--host", "0.0.0.0"], env={"PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert re.search(r"^invariant +on +default +--invariant / PLAYGROUND_INVARIANT$", out.stdout, re.M), out.stdout


def test_the_route_settings_reach_the_engine(monkeypatch):
    from engine.serving.graphed import warm_widths       # the CUDA graph module: only for this test

    assert warm_widths() == (256, 512)
    monkeypatch.setenv("PLAYGROUND_BATCH_GRAPH_WIDTHS", "256")      # as bench/gpu_session.sh sets it
    assert warm_widths() == (256,) and current().to_env()["PLAYGROUND_BATCH_GRAPH_WIDTHS"] == "256"
    assert load(None, {"PLAYGROUND_SMALL_BATCH": "off"}).small_batch == "off"


def test_the_processes_playground_starts_know_where_each_setting_came_from(tmp_path, capsys):
    """The variables `playground` hands the processes it starts (its dry run prints them), read back there as the
    room page reads them: each setting's value and where it came from are `--print-settings`'s, the settings file
    included; a secret or address the launcher made up says 'launcher'."""
    from engine.settings import as_started

    file = tmp_path / "room.toml"
    file.write_text('model = "from-the-file"\nmax_queue = 3\nmax_batch = 2\n')
    argv = ["--max-batch", "4", "--settings", str(file), "--host", "0.0.0.0", "--presenter-token", TOKEN]
    base = {"PLAYGROUND_MAX_QUEUE": "5"}
    assert main(["--dry-run", *argv], environ=base) == 0
    handed = dict(line.split("=", 1) for line in capsys.readouterr().out.splitlines()[1:])
    started, came = as_started({**base, **handed})
    printed = rows(settings_of(argv, base), "playground", origins(build_parser().parse_args(argv), base))
    shown = rows(started, "playground", came)
    made_up = {"join_code", "api_key", "public_url"}                  # a room off loopback: made up at start
    assert [r for r in shown if r["setting"] not in made_up] == [r for r in printed if r["setting"] not in made_up]
    by_name = {r["setting"]: r for r in shown}
    assert {name: by_name[name]["came from"] for name in made_up} == dict.fromkeys(made_up, "launcher")
    assert by_name["join_code"]["value"].startswith("set (") and by_name["settings_file"]["value"] == str(file)
    assert (by_name["max_batch"]["came from"], by_name["max_queue"]["came from"], by_name["model"]["came from"],
            by_name["presenter_token"]["came from"], by_name["port"]["came from"]) == ("flag", "variable", "file",
                                                                                       "flag", "default")


def test_a_process_started_by_hand_says_variable_or_default():
    from engine.settings import ORIGINS_ENV, as_started

    came = as_started({"PLAYGROUND_MAX_BATCH": "3"})[1]
    assert (came["max_batch"], came["model"]) == ("variable", "default")
    for bad in ("not json", "[1]", '{"from": {"max_batch": "hacked"}}'):                  # unreadable: ignored
        came = as_started({"PLAYGROUND_MAX_BATCH": "3", ORIGINS_ENV: bad})[1]
        assert came["max_batch"] in ("variable", "launcher") and came["model"] == "default"
