"""Recordings kept on the server's disk for whoever saved them, within two caps. The app's `session` here is the
person (app.room.session.person_id: a browser's reloads, tabs and a restart of the server are one person).

    shelf = Shelf(Path("~/.cache/inference-playground/saved"), per_session=5, total_bytes=1024 * 2**20)
    kept = shelf.keep(session, data, "capital of France")    # Kept(entry, removed=[entries that made room])
    shelf.entries(session)                                    # newest first
    data = shelf.read(session, kept.entry.name)

Each session has its own folder (named by a hash of the session id, so no id and no user text becomes
a path). Keeping a file beyond `per_session` removes that session's oldest; keeping one beyond
`total_bytes` for everyone removes the oldest files of any session until it fits. `Kept.removed` names
what went, so the page can say so; a session that lost files to someone else's save sees them missing
from `entries`. Files are written to a temporary name and renamed, so a reader never sees half a file.
"""
from __future__ import annotations

import hashlib
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from engine.errors import EngineError
from engine.projection.units import fmt_bytes

SUFFIX = ".json.gz"
SAVED_DIR_ENV = "PLAYGROUND_SAVED_DIR"


@dataclass(frozen=True)
class Entry:
    """One kept recording."""

    session: str                  # the folder: a hash of the session id
    name: str                     # file name: <nanoseconds>-<slug>.json.gz
    size: int
    saved: float                  # seconds since the epoch

    @property
    def title(self) -> str:
        words = self.name[:-len(SUFFIX)].partition("-")[2].replace("-", " ") or "run"
        return words[0].upper() + words[1:]


@dataclass(frozen=True)
class Kept:
    entry: Entry
    removed: tuple[Entry, ...]    # oldest first; some may be other sessions'


def default_dir() -> Path:
    """PLAYGROUND_SAVED_DIR, else ~/.cache/inference-playground/saved."""
    folder = os.environ.get(SAVED_DIR_ENV)
    return Path(folder) if folder else Path.home() / ".cache" / "inference-playground" / "saved"


class Shelf:
    """Kept recordings on disk: at most `per_session` per session and `total_bytes` for all; oldest go first."""

    def __init__(self, root: Path, per_session: int, total_bytes: int):
        self.root, self.per_session, self.total_bytes = Path(root), per_session, total_bytes
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.per_session > 0 and self.total_bytes > 0

    def keep(self, session: str, data: bytes, title: str) -> Kept:
        """Write `data` for `session`, first removing the oldest files the caps require."""
        if not self.enabled:
            raise EngineError("this server keeps no recordings on its disk (started with a saved-recordings "
                              "limit of 0); use Save this run to download it instead")
        if len(data) > self.total_bytes:
            raise EngineError(f"this recording is {fmt_bytes(len(data))}; the server keeps at most "
                              f"{fmt_bytes(self.total_bytes)} of recordings in all. Download it instead")
        with self._lock:
            removed = self._make_room(_folder(session), len(data))
            return Kept(self._write(_folder(session), data, title), tuple(removed))

    def entries(self, session: str) -> list[Entry]:
        """This session's kept recordings, newest first."""
        with self._lock:
            return sorted(self._listing(self.root / _folder(session)), key=lambda e: e.name, reverse=True)

    def read(self, session: str, name: str) -> bytes:
        """The bytes of one of this session's kept recordings; EngineError when it is gone."""
        path = self.root / _folder(session) / name
        if not _NAME.fullmatch(name):
            raise EngineError(f"{name!r} is not a kept recording")
        try:
            return path.read_bytes()
        except OSError:
            raise EngineError("that recording is no longer kept on the server (the oldest go first when "
                              "the space for recordings is full)") from None

    def _make_room(self, folder: str, size: int) -> list[Entry]:
        everyone = sorted(self._all(), key=lambda e: e.name)             # oldest first
        mine = [e for e in everyone if e.session == folder]
        doomed = mine[:max(0, len(mine) - self.per_session + 1)]
        total = sum(e.size for e in everyone) - sum(e.size for e in doomed)
        for e in everyone:
            if total + size <= self.total_bytes:
                break
            if e not in doomed:
                doomed.append(e)
                total -= e.size
        for e in doomed:
            (self.root / e.session / e.name).unlink(missing_ok=True)
        return sorted(doomed, key=lambda e: e.name)

    def _write(self, folder: str, data: bytes, title: str) -> Entry:
        path = self.root / folder
        path.mkdir(parents=True, exist_ok=True)
        name = f"{time.time_ns()}-{_slug(title)}{SUFFIX}"
        tmp = path / f".{name}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, path / name)
        return Entry(folder, name, len(data), (path / name).stat().st_mtime)

    def _all(self) -> list[Entry]:
        if not self.root.is_dir():
            return []
        return [e for d in self.root.iterdir() if d.is_dir() for e in self._listing(d)]

    def _listing(self, folder: Path) -> list[Entry]:
        if not folder.is_dir():
            return []
        out = []
        for f in folder.iterdir():
            try:
                if _NAME.fullmatch(f.name):
                    stat = f.stat()
                    out.append(Entry(folder.name, f.name, stat.st_size, stat.st_mtime))
            except FileNotFoundError:        # removed meanwhile (by hand, or another process)
                continue
        return out


_NAME = re.compile(r"\d{1,20}-[a-z0-9-]{0,40}" + re.escape(SUFFIX))


def _folder(session: str) -> str:
    return hashlib.sha256(session.encode("utf-8", "replace")).hexdigest()[:24]


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:40].strip("-")
