"""Test-only: a hold inside a served process (`python -m engine serve` started by tests/servers.py with a `Hold`), so
that a test over HTTP can act while a run is surely still running, however fast the machine's model: the process
imports this module at start-up (Python's `site` finds it on PYTHONPATH) and only when TESTS_HOLD_DIR names a folder.

The scheduler's `Handle._put` is wrapped, once engine.serving.scheduler is imported: after a record has gone to the
run's reader and listeners, while the folder holds `armed` (the record's number, written by the test), the run's
record of that number holds the worker (mid-step, as tests/conftest.py `Pause` does in-process). The hold writes
`held` (the run's id), writes `cancelled` once the run's handle has been cancelled meanwhile (the server noticed a
client that went away), and ends when the test removes `armed`. Nothing else changes; without `armed` the wrapper
only counts records.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import time
from pathlib import Path

FOLDER = os.environ.get("TESTS_HOLD_DIR")
TARGET = "engine.serving.scheduler"


def _write(path: Path, text: str) -> None:
    part = path.with_suffix(".part")
    part.write_text(text)
    part.replace(path)                                  # the test never reads half a file


def _hold(folder: Path, handle: object) -> None:
    """At the record `armed` names: wait until the test removes `armed`, saying what happened meanwhile."""
    armed = folder / "armed"
    try:
        at = int(armed.read_text())
    except (OSError, ValueError):
        return
    seen = getattr(handle, "_tests_seen", 0) + 1
    handle._tests_seen = seen
    if seen != at:
        return
    _write(folder / "held", handle.run_id)
    told = False
    while armed.exists():
        if not told and handle._cancel.is_set():
            _write(folder / "cancelled", handle.run_id)
            told = True
        time.sleep(0.005)                               # polls a file the test removes: not a guess at a speed


def _wrap(module: object) -> None:
    handle_class = module.Handle
    real, end, folder = handle_class._put, module._END, Path(FOLDER)

    def put(self, item):
        real(self, item)
        if item is not end:
            _hold(folder, self)

    handle_class._put = put


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the scheduler as it is imported (importing it here would import torch before the server sets its
    environment)."""

    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        execute = loader.exec_module

        def exec_module(module):
            execute(module)
            _wrap(module)

        loader.exec_module = exec_module
        return spec


if FOLDER:
    sys.meta_path.insert(0, _Finder())
