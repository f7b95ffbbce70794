"""The run store's folder: run files, their index in SQLite, and what was set aside.

    <folder>/index.sqlite             runs, claims, evicted, problems, meta; PRAGMA user_version = STORE_VERSION
    <folder>/runs/<run id>.run.zip    one run file each (engine/runs), written whole or not at all
    <folder>/skipped/                 files set aside: cut short, changed after they were written, unreadable

A write puts the file under a temporary name, fsyncs it, renames it into place and fsyncs the folder; only then
does the index get its row, in one transaction that also evicts the oldest runs while the store is over its budget
(their files are removed after the commit). A file without a row (a writer stopped between the two) is adopted at
the next start when it reads, set aside when it does not. SQLite's own locking (write-ahead log, a busy timeout)
lets web processes and the model server write at once; every process has its own connection.
"""
from __future__ import annotations

import errno
import hashlib
import io
import json
import logging
import os
import re
import shutil
import sqlite3
import threading
import time
import zipfile
from contextlib import contextmanager
from datetime import datetime
from dataclasses import astuple, dataclass, field, fields
from pathlib import Path
from typing import Iterator, Mapping

from engine import settings
from engine.errors import EngineError
from engine.models.folder import cache_dir

DIR_ENV, BUDGET_ENV = "PLAYGROUND_RUNS_DIR", "PLAYGROUND_RUNS_MB"
DEFAULT_BUDGET_MB = 2048
STORE_FORMAT, STORE_VERSION = "inference-playground/run-store", 1
INDEX, RUNS, SKIPPED, SUFFIX = "index.sqlite", "runs", "skipped", ".run.zip"
RUN_ID = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
BUSY_SECONDS = 30.0                 # how long a writer waits for another process's transaction
OPEN_RETRY_SECONDS = 0.05           # the pause between two tries at opening the index
NOT_AN_INDEX_CODES = (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT)   # primary result codes: set the index aside
MAX_PROBLEMS, MAX_EVICTED = 50, 10_000
MAX_CLAIMS = 50                     # per person (the Recordings page shows the newest few)
STALE_TMP_SECONDS = 3600.0
WRITING_SECONDS = 120.0             # a file without a row younger than this may be between its rename and its row
MiB = 2**20

log = logging.getLogger("engine.store")


class StoreError(EngineError):
    """The run store cannot do what was asked; the message says why in one line."""


class StoreVersionError(StoreError):
    """The folder holds a store written by a newer playground: it is left as it is."""


class StoreWriteError(StoreError):
    """A run could not be written (a full disk, a quota, a failed write): serving goes on without it on disk."""


class RunGoneError(StoreError):
    """No file for that run: never kept here, or evicted to stay within the budget."""


class StoredFileError(StoreError):
    """A run file that was cut short or changed after it was written: set aside, never opened."""


class NotAnIndex(Exception):
    """SQLite said twice that the index file is no database or is malformed (inside RunDisk: it is set aside)."""


@dataclass(frozen=True)
class StoredRun:
    """One run's row in the index."""

    id: str
    created: float = field(default_factory=time.time)
    model: str = ""
    kind: str = "generation"           # "generation", "speculative", "recording" (a file a person opened)
    source: str = ""                   # "api", "page", "cli", "upload"
    parent: str | None = None          # the run a baseline measures against
    title: str = ""                    # the prompt's start
    answer: str = ""                   # the answer's start
    size: int = 0                      # bytes of the file
    sha256: str = ""


@dataclass(frozen=True)
class Claim:
    """A run in a person's recent runs (their own or one they opened), and whether its file is still kept."""

    person: str
    id: str
    at: float
    title: str
    answer: str
    model: str
    kept: bool


@dataclass(frozen=True)
class StoreUsage:
    folder: str
    runs: int
    bytes: int
    budget: int
    evicted_runs: int
    evicted_bytes: int
    last_evicted: float | None
    free_bytes: int                    # on the disk that holds the folder
    problems: tuple[tuple[float, str], ...]     # newest first: files skipped, set aside, dropped
    write_error: str | None            # this process's last failed write, while no write has succeeded since


def store_dir(environ: Mapping[str, str] | None = None) -> Path:
    """PLAYGROUND_RUNS_DIR, else `runs` in the playground's cache folder ($PLAYGROUND_CACHE)."""
    folder = settings.of(environ).runs_dir
    return Path(folder).expanduser() if folder else cache_dir(environ) / "runs"


def budget_bytes(environ: Mapping[str, str] | None = None) -> int:
    """PLAYGROUND_RUNS_MB (MiB; 0 keeps no runs on disk), else DEFAULT_BUDGET_MB."""
    mb = settings.of(environ).runs_mb
    return (DEFAULT_BUDGET_MB if mb is None else mb) * MiB


def open_store(folder: Path | None = None, budget: int | None = None) -> RunDisk:
    """The store in `folder` (default: store_dir()), checked; StoreError when it cannot be used or is turned off."""
    budget = budget if budget is not None else budget_bytes()
    if budget <= 0:
        raise StoreError(f"runs are not kept on disk ({BUDGET_ENV}=0): a restart loses them")
    return RunDisk(folder if folder is not None else store_dir(), budget)


SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (id TEXT PRIMARY KEY, created REAL NOT NULL, model TEXT NOT NULL, kind TEXT NOT NULL,
    source TEXT NOT NULL, parent TEXT, title TEXT NOT NULL, answer TEXT NOT NULL, size INTEGER NOT NULL,
    sha256 TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS runs_created ON runs (created);
CREATE INDEX IF NOT EXISTS runs_parent ON runs (parent);
CREATE TABLE IF NOT EXISTS claims (person TEXT NOT NULL, id TEXT NOT NULL, at REAL NOT NULL, title TEXT NOT NULL,
    answer TEXT NOT NULL, model TEXT NOT NULL, PRIMARY KEY (person, id));
CREATE TABLE IF NOT EXISTS evicted (id TEXT PRIMARY KEY, at REAL NOT NULL, size INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS problems (at REAL NOT NULL, what TEXT NOT NULL);
"""
RUN_COLUMNS = ", ".join(f.name for f in fields(StoredRun))


class RunDisk:
    """One process's handle on the store's folder (thread-safe; other processes may hold their own)."""

    def __init__(self, folder: Path, budget: int):
        self.folder, self.budget = Path(folder), int(budget)
        self._lock = threading.RLock()
        self._write_error: str | None = None
        self._last_logged = 0.0
        self._rebuilt = False                       # a new index replaced one that was not SQLite: adopt every file
        try:
            (self.folder / RUNS).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise StoreError(f"the run store's folder {self.folder} cannot be made ({err.strerror}): runs are not "
                             "kept on disk") from None
        self._db = self._connect()
        self.check()

    # --- opening ------------------------------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        """The index, made when new; a newer store refused by name; an index that is not SQLite set aside."""
        path = self.folder / INDEX
        try:
            return self._opened(path)
        except NotAnIndex as err:
            moved = self._set_aside(path, f"its index {INDEX} is not a SQLite database ({err})")
            for extra in ("-wal", "-shm"):
                Path(str(path) + extra).unlink(missing_ok=True)
            log.warning("run store: a new index replaces %s; the run files are indexed again", moved)
            self._rebuilt = True
            return self._prepared(path)

    def _opened(self, path: Path) -> sqlite3.Connection:
        """The index opened, trying again for BUSY_SECONDS while SQLite answers what another process's open or
        transaction can make it answer (busy, locked, a write-ahead log being recovered: SQLITE_PROTOCOL, an I/O
        error on the shared memory); NotAnIndex only when SQLite says twice in a row that the file is no database
        or is malformed: anything else never costs the index that other processes are writing."""
        deadline, bad = time.monotonic() + BUSY_SECONDS, None
        while True:
            try:
                return self._prepared(path)
            except StoreVersionError:
                raise
            except sqlite3.DatabaseError as err:
                code = getattr(err, "sqlite_errorcode", None)
                if code is not None and code & 0xFF in NOT_AN_INDEX_CODES:
                    if bad is not None:
                        raise NotAnIndex(str(err)) from None
                    bad = err
                else:
                    bad = None
                if time.monotonic() >= deadline:
                    raise StoreError(f"the run store's index {path} could not be opened for {BUSY_SECONDS:.0f} s "
                                     f"({err}): runs are not kept on disk") from None
                time.sleep(OPEN_RETRY_SECONDS)

    def _prepared(self, path: Path) -> sqlite3.Connection:
        db = sqlite3.connect(path, timeout=BUSY_SECONDS, isolation_level=None, check_same_thread=False)
        try:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > STORE_VERSION:
                raise StoreVersionError(
                    f"the run store at {self.folder} was written by a newer playground (run store version {version}; "
                    f"this one reads version {STORE_VERSION}): it is left untouched and runs are not kept on disk. "
                    "Upgrade the playground, or give it another folder (--runs-dir)")
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")       # an acknowledged row survives a power cut, not only a crash
            with self._txn(db):
                for statement in filter(str.strip, SCHEMA.split(";")):
                    db.execute(statement)
                db.execute("INSERT OR IGNORE INTO meta VALUES ('format', ?)", (STORE_FORMAT,))
                db.execute(f"PRAGMA user_version = {STORE_VERSION}")
            return db
        except BaseException:
            db.close()
            raise

    @contextmanager
    def _txn(self, db: sqlite3.Connection | None = None) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken at once (BEGIN IMMEDIATE) so two processes never deadlock upgrading a read."""
        db = db if db is not None else self._db
        with self._lock:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def check(self) -> None:
        """At open: rows whose file is gone or has another size are dropped (the file set aside), files without a
        row are adopted or set aside, and temporary files a crashed writer left are removed."""
        with self._txn() as db:
            files = {p.name[:-len(SUFFIX)]: p for p in (self.folder / RUNS).iterdir() if p.name.endswith(SUFFIX)}
            for run_id, size in db.execute("SELECT id, size FROM runs").fetchall():
                path = files.pop(run_id, None)
                if path is None:
                    self._drop(db, run_id, f"run {run_id}: its file is missing; dropped from the index")
                elif _size(path) != size:
                    self._drop(db, run_id, f"run {run_id}: its file is {_size(path)} bytes where {size} were written "
                                           "(cut short or changed)", path)
            for run_id, path in files.items():
                if self._rebuilt or time.time() - _mtime(path) > WRITING_SECONDS:   # younger: a writer may be adding
                    self._adopt(db, run_id, path)                                     # its row right now
        self._remove_stale()

    def _adopt(self, db: sqlite3.Connection, run_id: str, path: Path) -> None:
        """A run file with no row: indexed from its run.json when it reads, set aside when it does not."""
        try:
            row = describe(run_id, path.read_bytes())
        except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as err:
            self._problem(db, f"{path.name}: not a run file this store reads ({type(err).__name__}); skipped")
            self._set_aside(path, None)
            return
        db.execute(f"INSERT OR REPLACE INTO runs ({RUN_COLUMNS}) VALUES ({', '.join('?' * len(fields(row)))})",
                   astuple(row))

    def _remove_stale(self) -> None:
        now = time.time()
        for p in (self.folder / RUNS).glob(".*.tmp"):
            try:
                if now - p.stat().st_mtime > STALE_TMP_SECONDS:
                    p.unlink()
            except OSError:
                continue

    # --- writing ------------------------------------------------------------------------------------------------

    def put(self, run: StoredRun, data: bytes) -> list[str]:
        """Keep a run's file and its row (the oldest runs evicted to stay within the budget; their ids returned).
        StoreWriteError when it cannot: a full disk, a quota, a file larger than the whole budget."""
        path = self._path(run.id)
        if len(data) > self.budget:
            raise self._failed(f"run {run.id} was not kept on disk",
                               ValueError(f"it is {mib(len(data))}, more than the run store's whole budget "
                                          f"({mib(self.budget)})"))
        row = StoredRun(**{**vars(run), "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
        try:
            tmp = write_aside(path, data)
            try:
                with self._txn() as db:        # the rename under the index's write lock: two processes writing one id
                    place(tmp, path)           # (a shipped recording opened in two web processes) leave the file
                    db.execute(f"INSERT OR REPLACE INTO runs ({RUN_COLUMNS}) VALUES "   # and the row of the same one
                               f"({', '.join('?' * len(fields(row)))})", astuple(row))
                    victims = self._evict(db)
            finally:
                _unlink(tmp)                   # nothing there once it is in place
        except (OSError, sqlite3.Error) as err:
            _unlink(path)
            raise self._failed(f"run {run.id} was not kept on disk", err) from None
        for victim in victims:
            _unlink(self._path(victim))
        self._write_error = None
        return victims

    def _evict(self, db: sqlite3.Connection) -> list[str]:
        """The oldest runs while the store is over its budget: rows deleted here, files after the commit."""
        total = db.execute("SELECT COALESCE(SUM(size), 0) FROM runs").fetchone()[0]
        victims: list[tuple[str, int]] = []
        if total > self.budget:
            for run_id, size in db.execute("SELECT id, size FROM runs ORDER BY created, rowid"):
                if total <= self.budget:
                    break
                victims.append((run_id, size))
                total -= size
        now = time.time()
        for run_id, size in victims:
            db.execute("DELETE FROM runs WHERE id = ?", (run_id,))
            db.execute("INSERT OR REPLACE INTO evicted VALUES (?, ?, ?)", (run_id, now, size))
        if victims:
            self._bump(db, "evicted_runs", len(victims))
            self._bump(db, "evicted_bytes", sum(s for _, s in victims))
            db.execute("INSERT OR REPLACE INTO meta VALUES ('last_evicted', ?)", (str(now),))
            db.execute("DELETE FROM evicted WHERE rowid IN (SELECT rowid FROM evicted ORDER BY at DESC "
                       f"LIMIT -1 OFFSET {MAX_EVICTED})")
        return [run_id for run_id, _ in victims]

    def claim(self, person: str, run_id: str, title: str = "", answer: str = "", model: str = "",
              keep: int = MAX_CLAIMS, at: float | None = None) -> None:
        """`person` made or opened this run (`at`, default now): their recent runs list it (their newest `keep` are
        kept)."""
        self._path(run_id)
        try:
            with self._txn() as db:
                db.execute("INSERT OR REPLACE INTO claims VALUES (?, ?, ?, ?, ?, ?)",
                           (person, run_id, time.time() if at is None else at, title[:200], answer[:200], model[:200]))
                db.execute("DELETE FROM claims WHERE person = ? AND id NOT IN (SELECT id FROM claims WHERE person = ? "
                           "ORDER BY at DESC LIMIT ?)", (person, person, max(keep, 1)))
        except sqlite3.Error as err:
            raise self._failed(f"run {run_id} was not added to this person's recent runs", err) from None
        self._write_error = None

    def _failed(self, what: str, err: BaseException) -> StoreWriteError:
        """The one line a failed write gets (in the log at most once a minute, and on the Recordings page)."""
        line = f"{what}: {why(err, self.folder)}; serving goes on"
        self._write_error = line
        if time.monotonic() - self._last_logged > 60:
            self._last_logged = time.monotonic()
            log.warning("run store: %s", line)
        return StoreWriteError(line)

    # --- reading ------------------------------------------------------------------------------------------------

    def row(self, run_id: str) -> StoredRun:
        """The index row of a kept run; RunGoneError (saying whether it was evicted) when there is none."""
        self._path(run_id)
        with self._lock:
            found = self._db.execute(f"SELECT {RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,)).fetchone()
            evicted = None if found else self._db.execute("SELECT at FROM evicted WHERE id = ?", (run_id,)).fetchone()
        if found:
            return StoredRun(*found)
        if evicted:
            when = time.strftime("%H:%M", time.localtime(evicted[0]))
            raise RunGoneError(f"run {run_id} was evicted from the run store at {when} to stay within its budget of "
                               f"{mib(self.budget)} (the oldest runs go first)")
        raise RunGoneError(f"no run {run_id} in the run store at {self.folder}")

    def read(self, run_id: str) -> bytes:
        """A kept run's file, checked against the size and SHA-256 it was written with (a file changed since is
        set aside: StoredFileError)."""
        row = self.row(run_id)
        try:
            data = self._path(run_id).read_bytes()
        except FileNotFoundError:
            raise RunGoneError(f"run {run_id} was evicted from the run store a moment ago") from None
        except OSError as err:
            raise StoreError(f"run {run_id}'s file cannot be read ({err.strerror})") from None
        if len(data) != row.size or hashlib.sha256(data).hexdigest() != row.sha256:
            with self._txn() as db:
                self._drop(db, run_id, f"run {run_id}: its file was cut short or changed after it was written",
                           self._path(run_id))
            raise StoredFileError(f"run {run_id}'s file in the run store was cut short or changed after it was "
                                  f"written; it was set aside in {self.folder / SKIPPED} and cannot be opened")
        return data

    def rows(self, limit: int = 50, parent: str | None = None) -> list[StoredRun]:
        """The newest kept runs (or the runs measured against `parent`), newest first."""
        where, args = ("WHERE parent = ?", (parent,)) if parent is not None else ("", ())
        with self._lock:
            found = self._db.execute(f"SELECT {RUN_COLUMNS} FROM runs {where} ORDER BY created DESC, rowid DESC "
                                     "LIMIT ?", (*args, max(limit, 0))).fetchall()
        return [StoredRun(*r) for r in found]

    def claims(self, person: str, limit: int = 10) -> list[Claim]:
        """This person's recent runs, newest first."""
        with self._lock:
            found = self._db.execute(
                "SELECT c.person, c.id, c.at, c.title, c.answer, c.model, r.id IS NOT NULL FROM claims c "
                "LEFT JOIN runs r ON r.id = c.id WHERE c.person = ? ORDER BY c.at DESC LIMIT ?",
                (person, max(limit, 0))).fetchall()
        return [Claim(*r[:6], bool(r[6])) for r in found]

    def usage(self) -> StoreUsage:
        with self._lock:
            runs, total = self._db.execute("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM runs").fetchone()
            meta = dict(self._db.execute("SELECT key, value FROM meta").fetchall())
            problems = self._db.execute("SELECT at, what FROM problems ORDER BY at DESC, rowid DESC").fetchall()
        try:
            free = shutil.disk_usage(self.folder).free
        except OSError:
            free = 0
        last = meta.get("last_evicted")
        return StoreUsage(str(self.folder), runs, total, self.budget, int(meta.get("evicted_runs", 0)),
                          int(meta.get("evicted_bytes", 0)), float(last) if last else None, free,
                          tuple((float(a), w) for a, w in problems), self._write_error)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # --- inside ---------------------------------------------------------------------------------------------------

    def _path(self, run_id: str) -> Path:
        if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
            raise RunGoneError(f"{str(run_id)[:40]!r} is not a run id")
        return self.folder / RUNS / f"{run_id}{SUFFIX}"

    def _drop(self, db: sqlite3.Connection, run_id: str, what: str, path: Path | None = None) -> None:
        db.execute("DELETE FROM runs WHERE id = ?", (run_id,))
        if path is not None:
            self._set_aside(path, None)
            what += f"; set aside in {SKIPPED}/"
        self._problem(db, what)

    def _problem(self, db: sqlite3.Connection, what: str) -> None:
        log.warning("run store %s: %s", self.folder, what)
        db.execute("INSERT INTO problems VALUES (?, ?)", (time.time(), what[:300]))
        db.execute("DELETE FROM problems WHERE rowid NOT IN (SELECT rowid FROM problems ORDER BY at DESC "
                   f"LIMIT {MAX_PROBLEMS})")

    def _set_aside(self, path: Path, why_: str | None) -> Path:
        """Move a bad file into skipped/ (never deleted: someone may want to look at it)."""
        target = self.folder / SKIPPED / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{path.name}"
        try:
            target.parent.mkdir(exist_ok=True)
            os.replace(path, target)
        except FileNotFoundError:
            pass                                     # another process moved it first
        if why_ is not None:
            log.warning("run store %s: %s; moved to %s", self.folder, why_, target)
        return target

    def _bump(self, db: sqlite3.Connection, key: str, by: int) -> None:
        db.execute("INSERT INTO meta VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = CAST(value AS INTEGER) + ?",
                   (key, str(by), by))


def write_whole(path: Path, data: bytes) -> None:
    """Write, fsync, rename into place, fsync the folder: a reader sees the old state or the whole new file."""
    place(write_aside(path, data), path)


def write_aside(path: Path, data: bytes) -> Path:
    """`data` written and fsynced under a temporary name beside `path` (this process's and thread's own)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        _unlink(tmp)
        raise
    return tmp


def place(tmp: Path, path: Path) -> None:
    """A file written aside renamed into place, and the folder fsynced so that the rename survives a power cut."""
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def describe(run_id: str, data: bytes) -> StoredRun:
    """An index row read from a run file's run.json (for files found without a row)."""
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        doc = json.loads(z.read("run.json"))
    if doc.get("format") != "inference-playground/run":
        raise ValueError("not a run file")
    rec = doc["recording"]
    records = rec.get("records") or []
    answer = next((r.get("text", "") for r in reversed(records) if isinstance(r, dict) and "text" in r), "")
    kinds = {r.get("type") for r in records if isinstance(r, dict)}
    return StoredRun(run_id, created_time(rec.get("created")), str(rec["model"].get("label", "")),
                     "speculative" if "SpecRoundRecord" in kinds else "generation", "adopted", None,
                     str(rec["request"].get("prompt", ""))[:200], str(answer)[:200], len(data),
                     hashlib.sha256(data).hexdigest())


def created_time(value: object) -> float:
    """A recording's `created` ('2026-11-26T10:06:06+0000') as seconds since the epoch; now when unreadable."""
    try:
        return datetime.strptime(str(value), "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except ValueError:
        return time.time()


def why(err: BaseException, folder: Path) -> str:
    """A failed write in words a presenter can act on."""
    code = getattr(err, "errno", None)
    text = str(err).lower()
    if code == errno.ENOSPC or "disk is full" in text or "database or disk is full" in text:
        return f"the disk holding the run store ({folder}) is full"
    if code == errno.EDQUOT:
        return f"the run store ({folder}) is over its disk quota"
    if code == errno.EFBIG:
        return "the file is over this process's file size limit"
    if code in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"the run store ({folder}) cannot be written ({os.strerror(code)})"
    if isinstance(err, ValueError):
        return str(err)
    return f"the write failed ({getattr(err, 'strerror', None) or err})"


def mib(n: int) -> str:
    return f"{n / MiB:.0f} MiB" if n >= 10 * MiB else f"{n / MiB:.2f} MiB"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return time.time()


def _unlink(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass
