"""Every setting of a room or a model server in one typed object, read once and passed down (docs/settings.md).

    settings = load(args, os.environ, command="playground")  # flags, then PLAYGROUND_* variables, then the
                                                             # settings file (--settings / PLAYGROUND_SETTINGS), then
                                                             # the defaults
    settings.model, settings.max_new_tokens                  # typed attributes, one per setting
    child_env = settings.to_env()                            # the PLAYGROUND_* variables a started process reads back
    print(table(settings))                                   # `playground --print-settings`: secrets masked

The launchers (`playground`, `python -m engine serve`; engine/launch.py) read the settings once, from their flags,
and hand them to the processes they start as PLAYGROUND_* variables, which those processes read back with
`current()` (once per environment: a test that changes a variable reads it anew).

A dataclass of our own, not pydantic-settings: docs/STYLE's "config is a flat dataclass" (no config framework),
torch-free and import-light so that `--help` answers at once, the flags stay argparse's, and the file is TOML read
by the standard library (tomllib). Nothing outside this module reads a PLAYGROUND_* variable itself, but for the
few docs/settings.md lists under "Not settings" (tests/test_settings.py).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator, Mapping

PREFIX = "PLAYGROUND_"
LOOPBACK = ("127.0.0.1", "localhost", "::1")     # a room on any other address is a hosted one
FILE_ENV = PREFIX + "SETTINGS"          # the optional settings file (TOML); also --settings FILE
PLAYGROUND, SERVE = "playground", "serve"
BOTH, NEITHER = (PLAYGROUND, SERVE), ()
GROUPS = ("model", "where", "room", "runs", "limits", "process")
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
FLAG, VARIABLE, FILE, DEFAULT = "flag", "variable", "file", "default"      # where a setting came from
LAUNCHER = "launcher"                   # ... or set by the launcher at start (a secret it made up, the join address)
SOURCES = (FLAG, VARIABLE, FILE, DEFAULT, LAUNCHER)
ORIGINS_ENV = PREFIX + "SETTINGS_ORIGINS"   # where each setting came from, as `playground` read them (not a setting)


class SettingsError(ValueError):
    """A setting that cannot be read (a word where a number goes, an unknown key in the file): said in one line."""


def setting(default: Any, kind: type, group: str, text: str, env: str | None = None, flag: str | None = None,
            commands: tuple[str, ...] = BOTH, secret: bool = False) -> Any:
    """One field of Settings, with where it is read from and what it changes (docs/settings.md's row)."""
    return field(default=default, metadata={"kind": kind, "group": group, "text": text, "env": env, "flag": flag,
                                            "commands": commands if flag else NEITHER, "secret": secret})


def limit(kind: type, text: str, name: str) -> Any:
    """A serving limit (engine/serving/limits.py): unset takes the device's default."""
    return setting(None, kind, "limits", text, PREFIX + name.upper(), "--" + name.replace("_", "-"))


@dataclass(frozen=True)
class Settings:
    """What a room or a model server runs with. None: not given (the device's or the command's default)."""

    # the model
    model: str = setting("default", str, "model", "'default' (SmolLM2-135M-Instruct), an extra's key, a local "
                         "safetensors folder or a hub id", PREFIX + "MODEL", "--model")
    draft: str | None = setting(None, str, "model", "draft for speculative decoding: 'ngram', 'early-exit:N', or a "
                                "model", PREFIX + "DRAFT", "--draft")
    device: str | None = setting(None, str, "model", "cpu, cuda, cuda:1 ... (default: CUDA when present)",
                                 PREFIX + "DEVICE", "--device")
    dtype: str | None = setting(None, str, "model", "float32, bf16, fp16 (default: bf16 on CUDA, float32 on CPU)",
                                PREFIX + "DTYPE", "--dtype")
    invariant: bool | None = setting(None, bool, "model", "batch-invariant kernels: a request's logits are the same "
                                     "bits alone or beside others, at a cost in time (docs/engine.md; default: on in "
                                     "a hosted room: --host off loopback; off otherwise)", PREFIX + "INVARIANT",
                                     "--invariant")
    threads: int | None = setting(None, int, "model", "torch threads on a CPU (default: OMP_NUM_THREADS when set, "
                                  "else measured under the live load)", PREFIX + "THREADS", "--threads", (SERVE,))
    cache: str | None = setting(None, str, "model", "where converted models (and by default the run store) live "
                                "(default: ~/.cache/inference-playground)", PREFIX + "CACHE")
    # where it listens and how it is started
    host: str = setting("127.0.0.1", str, "where", "address to listen on; 0.0.0.0 for a room (default: this "
                        "machine only)", PREFIX + "HOST", "--host")
    port: int | None = setting(None, int, "where", "port to listen on (default: 8501 for playground, 8000 for "
                               "engine serve)", PREFIX + "PORT", "--port")
    engine_url: str | None = setting(None, str, "where", "use the model server at this url (python -m engine serve) "
                                     "instead of loading a model in this process", PREFIX + "ENGINE_URL",
                                     "--engine-url", (PLAYGROUND,))
    web_processes: int = setting(0, int, "where", "start one model server and N Streamlit processes behind nginx "
                                 "(a room on one big machine; needs nginx)", PREFIX + "WEB_PROCESSES", "--web-processes",
                                 commands=(PLAYGROUND,))
    replicas: int = setting(0, int, "where", "the model server as N replicas on Ray Serve (the cluster extra)",
                            PREFIX + "REPLICAS", "--replicas")
    ray_address: str | None = setting(None, str, "where", "with --replicas: join this Ray cluster instead of "
                                      "starting one here", PREFIX + "RAY_ADDRESS", "--ray-address")
    replica_cpus: float | None = setting(None, float, "where", "CPUs per replica (default 1)", PREFIX + "REPLICA_CPUS", "--replica-cpus",
                                         commands=(SERVE,))
    no_api: bool = setting(False, bool, "where", "the pages only: no OpenAI API at /v1", PREFIX + "NO_API", "--no-api",
                           commands=(PLAYGROUND,))
    served_model_name: str | None = setting(None, str, "where", "the name API clients send as `model` (default: "
                                            "the model's label)", PREFIX + "SERVED_MODEL_NAME", "--served-model-name", commands=(SERVE,))
    log_level: str = setting("info", str, "where", "the model server's log level: debug, info, warning, error",
                             PREFIX + "LOG_LEVEL", "--log-level", commands=(SERVE,))
    # the room: its door and its secrets
    presenter_token: str | None = setting(None, str, "room", "secret that unlocks presenter mode; 'auto' makes one "
                                          "up", PREFIX + "PRESENTER_TOKEN", "--presenter-token", secret=True)
    api_key: str | None = setting(None, str, "room", "the key of the OpenAI API at /v1 ('auto' makes one up), or "
                                  "with --engine-url the model server's key", PREFIX + "API_KEY", "--api-key",
                                  secret=True)
    no_api_key: bool = setting(False, bool, "room", "serve a non-loopback address without an API key",
                               PREFIX + "NO_API_KEY", "--no-api-key", commands=(SERVE,))
    join_code: str | None = setting(None, str, "room", "the room's join code (default off loopback: one made up at "
                                    "start)", PREFIX + "JOIN_CODE", "--join-code", (PLAYGROUND,), secret=True)
    open_room: bool = setting(False, bool, "room", "no join code even off loopback: anyone who can reach the port "
                              "can use the model", PREFIX + "OPEN_ROOM", "--open-room", commands=(PLAYGROUND,))
    public_url: str | None = setting(None, str, "room", "the address participants open, for the join link "
                                     "(default: http://<this machine's address>:<port>)", PREFIX + "PUBLIC_URL",
                                     "--public-url", (PLAYGROUND,))
    # finished runs
    runs_dir: str | None = setting(None, str, "runs", "the run store's folder: every finished run kept on disk "
                                   "(default: $PLAYGROUND_CACHE/runs)", PREFIX + "RUNS_DIR", "--runs-dir")
    runs_mb: int | None = setting(None, int, "runs", "the run store's budget in MiB, the oldest runs evicted first "
                                  "(default 2048; 0 keeps none on disk)", PREFIX + "RUNS_MB", "--runs-mb")
    run_store_mb: int | None = setting(None, int, "runs", "live runs kept in memory, in MiB (default: twice a "
                                       "request's capture limit, 256 MiB at least)", PREFIX + "RUN_STORE_MB")
    # serving limits (engine/serving/limits.py): unset takes the device's default
    max_prompt_tokens: int | None = limit(int, "longest prompt in tokens, chat template included", "max_prompt_tokens")
    max_new_tokens: int | None = limit(int, "most tokens one request may generate", "max_new_tokens")
    max_queue: int | None = limit(int, "requests that may wait for a place in the batch (0: none wait)", "max_queue")
    max_batch: int | None = limit(int, "requests decoded together in one forward pass (1: one at a time)",
                                  "max_batch")
    prefix_cache_mb: int | None = limit(int, "memory for prompt K/V reused by later prompts that start alike, in "
                                        "MiB (0: off)", "prefix_cache_mb")
    max_sessions: int | None = limit(int, "browser sessions served at once", "max_sessions")
    max_capture_mb: int | None = limit(int, "attention capture one request may hold, in MiB", "max_capture_mb")
    max_capture_layers: int | None = limit(int, "layers one request may capture", "max_capture_layers")
    request_seconds: float | None = limit(float, "wall time of one request before it is stopped", "request_seconds")
    reserve_mb: int | None = limit(int, "memory kept free for everything else, in MiB", "reserve_mb")
    max_saved_per_session: int | None = limit(int, "runs the Recordings page lists for one person (a browser): their "
                                              "newest runs, and as many kept on the server (0: none)",
                                              "max_saved_per_session")
    max_saved_mb: int | None = limit(int, "a web process's memory for people's recent runs while the run store "
                                     "cannot take them (--runs-mb 0, a newer store, a full disk), in MiB for "
                                     "everyone; the oldest go first (the store's own budget is --runs-mb)",
                                     "max_saved_mb")
    # the process itself
    timelines: bool = setting(True, bool, "process", "keep each request's step timeline (off only to measure what "
                              "keeping one costs: bench/timings.py)", PREFIX + "TIMELINES")
    small_batch: str = setting("auto", str, "process", "batched decode steps on a CPU: 'auto' packs the weights whose "
                               "shape measured faster packed (copies of 0.2 to 0.5 GB for SmolLM2), 'off' none (a "
                               "machine short of memory), 'all' every one without measuring (the tests)",
                               PREFIX + "SMALL_BATCH")
    batch_graph_widths: str | None = setting(None, str, "process", "on a GPU: the key widths of the batched step's "
                                             "CUDA graphs compiled at start, comma-separated (default 256,512; 256 "
                                             "compiles one)", PREFIX + "BATCH_GRAPH_WIDTHS")
    traceback: bool = setting(False, bool, "process", "`python -m engine` shows the whole traceback of an "
                              "unexpected error instead of one line", PREFIX + "TRACEBACK")
    room_status: str | None = setting(None, str, "process", "the room's status.json, set by the room's supervisor "
                                      "(--web-processes) for its web processes", PREFIX + "ROOM_STATUS")
    settings_file: str | None = setting(None, str, "process", "a TOML file of settings (keys: the names in this "
                                        "table), below flags and variables", FILE_ENV, "--settings")

    def to_env(self) -> dict[str, str]:
        """The PLAYGROUND_* variables that give a started process these settings (those set, not the defaults)."""
        return {spec.env: as_text(value) for spec, value in self.items()
                if spec.env and spec.env != FILE_ENV and value is not None and value != spec.default}

    def items(self) -> Iterator[tuple["Spec", Any]]:
        for f in fields(self):
            yield Spec.of(f), getattr(self, f.name)

    def limits_given(self) -> dict[str, int | float]:
        """The serving limits set (by flag, variable or file), by Limits field name."""
        return {spec.name: value for spec, value in self.items() if spec.group == "limits" and value is not None}

    def replace(self, **changes: Any) -> "Settings":
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Spec:
    """One setting's row: its name, flag, variable, default, what it changes, and for which command."""

    name: str
    kind: type
    group: str
    text: str
    env: str | None
    flag: str | None
    commands: tuple[str, ...]
    secret: bool
    default: Any

    @classmethod
    def of(cls, f: dataclasses.Field) -> "Spec":
        m = f.metadata
        return cls(f.name, m["kind"], m["group"], m["text"], m["env"], m["flag"], m["commands"], m["secret"],
                   f.default)


SPECS: tuple[Spec, ...] = tuple(Spec.of(f) for f in fields(Settings))
BY_NAME = {spec.name: spec for spec in SPECS}


def as_text(value: Any) -> str:
    return ("1" if value else "0") if isinstance(value, bool) else str(value)


def parsed(spec: Spec, value: Any, where: str) -> Any:
    """`value` (text from a variable, or a TOML value) as the setting's type; SettingsError naming `where`."""
    if spec.kind is bool:
        text = str(value).strip().lower()
        if isinstance(value, bool) or text in TRUE + FALSE:
            return value if isinstance(value, bool) else text in TRUE
        raise SettingsError(f"{where} must be 1 or 0 (on or off), not {value!r}")
    if spec.kind in (int, float):
        if str(value).strip().lower() == "auto" and spec.default is None:
            return None                                 # "auto": the default (PLAYGROUND_THREADS=auto measures)
        try:
            number = spec.kind(str(value).strip())
        except ValueError:
            raise SettingsError(f"{where} must be a {'whole ' if spec.kind is int else ''}number, "
                                f"not {value!r}") from None
        return number
    text = str(value).strip()
    return text or None


def from_flags(args: argparse.Namespace | None) -> dict[str, Any]:
    """The settings given as flags (argparse leaves the others None)."""
    given = vars(args) if args is not None else {}
    return {name: value for name, value in given.items() if name in BY_NAME and value is not None}


def from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    return {spec.name: parsed(spec, environ[spec.env], spec.env) for spec in SPECS
            if spec.env and environ.get(spec.env, "").strip()}


def from_file(path: str | None) -> dict[str, Any]:
    """The settings in a TOML file (`model = "qwen-1.5b"`, `max_new_tokens = 128`); none without a file."""
    if not path:
        return {}
    try:
        with open(Path(path).expanduser(), "rb") as f:
            table = tomllib.load(f)
    except OSError as err:
        raise SettingsError(f"the settings file {path} cannot be read: {err.strerror or err}") from None
    except tomllib.TOMLDecodeError as err:
        raise SettingsError(f"the settings file {path} is not TOML: {err}") from None
    unknown = sorted(set(table) - set(BY_NAME))
    if unknown:
        raise SettingsError(f"the settings file {path} has no setting called {', '.join(unknown)} "
                            "(docs/settings.md lists them)")
    return {name: parsed(BY_NAME[name], value, f"{name} in {path}") for name, value in table.items()}


def layers(args: argparse.Namespace | None, environ: Mapping[str, str] | None) -> dict[str, dict[str, Any]]:
    """The settings given by each source, lowest first: the settings file, the variables, the flags."""
    env = os.environ if environ is None else environ
    flags, variables = from_flags(args), from_env(env)
    file = from_file(flags.get("settings_file") or variables.get("settings_file"))
    return {FILE: file, VARIABLE: variables, FLAG: flags}


def origins(args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Where each setting came from: 'flag', 'variable', 'file' or 'default' (`--print-settings`'s column)."""
    given = layers(args, environ)
    return {spec.name: next((source for source in (FLAG, VARIABLE, FILE) if spec.name in given[source]), DEFAULT)
            for spec in SPECS}


def load(args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None,
         command: str = PLAYGROUND) -> Settings:
    """The settings: each from its flag, else its PLAYGROUND_* variable, else the settings file, else its default."""
    given = layers(args, environ)
    values = {**given[FILE], **given[VARIABLE], **given[FLAG]}
    if values.get("port") is None:
        values["port"] = 8000 if command == SERVE else 8501
    if values.get("invariant") is None:
        values["invariant"] = hosted(values.get("host", BY_NAME["host"].default))
    return Settings(**values)


def hosted(host: str) -> bool:
    """Whether a room on `host` is a hosted one (reachable from other machines: a join code, an API key), where the
    batch-invariant kernels are on by default: there the same question must give the same numbers to everyone."""
    return host not in LOOPBACK


@functools.lru_cache(maxsize=8)
def _current(items: frozenset[tuple[str, str]]) -> Settings:
    return load(None, dict(items))


def of(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings in `environ`'s PLAYGROUND_* variables (default: this process's); read once per environment."""
    env = os.environ if environ is None else environ
    return _current(frozenset((k, v) for k, v in env.items() if k.startswith(PREFIX)))


def current() -> Settings:
    """This process's settings, as its launcher passed them down (read once per environment)."""
    return of()


def origins_env(came_from: Mapping[str, str], settings: Settings) -> dict[str, str]:
    """The variable that tells a process the launcher starts where each of its settings came from (`origins()`, and
    LAUNCHER for what the launcher made up) and which settings file was read: the room page shows what
    `--print-settings` shows."""
    return {ORIGINS_ENV: json.dumps({"from": dict(came_from), "file": settings.settings_file}, separators=(",", ":"))}


def told_origins(text: str | None) -> tuple[dict[str, str], str | None] | None:
    """ORIGINS_ENV read back: (setting -> where it came from, the settings file); None when absent or unreadable."""
    try:
        doc = json.loads(text or "")
    except ValueError:
        return None
    came = doc.get("from") if isinstance(doc, dict) else None
    if not isinstance(came, dict):
        return None
    known = {name: source for name, source in came.items() if name in BY_NAME and source in SOURCES}
    return known, doc["file"] if isinstance(doc.get("file"), str) else None


def as_started(environ: Mapping[str, str] | None = None) -> tuple[Settings, dict[str, str]]:
    """This process's settings and where each came from: as the launcher that started it read them (ORIGINS_ENV),
    ('launcher' for a secret or the join link's address it made up), and 'launcher' for a variable it did not know
    of (the room's status file, set by the supervisor); in a process started by hand, 'variable' or 'default'."""
    env = os.environ if environ is None else environ
    settings, own = of(env), origins(None, env)
    told = told_origins(env.get(ORIGINS_ENV))
    if told is None:
        return settings, own
    came, file = told
    return (settings.replace(settings_file=file or settings.settings_file),
            {name: came.get(name, DEFAULT if source == DEFAULT else LAUNCHER) for name, source in own.items()})


def add_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """Every setting of `command` as a flag, in groups; each left out is None (then variable, file, default)."""
    groups = {name: parser.add_argument_group(name) for name in GROUPS}
    for spec in SPECS:
        if command not in spec.commands:
            continue
        also = f" (also {spec.env})" if spec.env else ""
        group = groups[spec.group]
        if spec.kind is bool:
            group.add_argument(spec.flag, dest=spec.name, action="store_true", default=None, help=spec.text + also)
        else:
            group.add_argument(spec.flag, dest=spec.name, type=spec.kind, default=None, help=spec.text + also,
                               metavar=spec.name.upper() if spec.kind is str else None)


def masked(spec: Spec, value: Any) -> str:
    """A value as `--print-settings` and the room page show it: a secret only as set or not."""
    if value is None:
        return "(not set)" if spec.secret else "(default)"
    if spec.secret:
        return "auto (made up at start)" if value == "auto" else f"set ({len(str(value))} characters, hidden)"
    return ("on" if value else "off") if spec.kind is bool else str(value)


def rows(settings: Settings, command: str = PLAYGROUND,
         came_from: Mapping[str, str] | None = None) -> list[dict[str, str]]:
    """The settings a room runs with, one row each: name, value masked, where it came from (with `came_from`,
    `origins()` or `as_started()`), where to set it."""
    return [{"setting": spec.name, "value": masked(spec, value),
             **({"came from": came_from.get(spec.name, DEFAULT)} if came_from is not None else {}),
             "set by": " / ".join(x for x in (spec.flag if command in spec.commands else None, spec.env) if x)}
            for spec, value in settings.items()
            if (command in spec.commands or (spec.env and not spec.flag)) and (spec.name != "settings_file" or value)]


def table(settings: Settings, command: str = PLAYGROUND, came_from: Mapping[str, str] | None = None) -> str:
    """`--print-settings`: one line a setting, aligned: name, value, where it came from (`origins()`), its flag
    and variable."""
    lines = rows(settings, command, came_from)
    widths = {column: max(len(r[column]) for r in lines) for column in lines[0]}
    return "\n".join("  ".join(f"{r[column]:<{widths[column]}}" for column in r).rstrip() for r in lines)
