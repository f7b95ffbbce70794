"""Runs a person kept ("Keep on this server" on the Recordings page): run files in the one run store (engine/store),
listed under the person's kept claims; and the shelf of kept recordings that came before run files (one folder of
`.json.gz` files per person, named by a hash of the person), converted into the store when a web process starts.

    kept = keep(disk, data, person, "Capital of France", answer, model, per_person=5)   # Kept: id, size, what went
    disk.claims(kept_owner(person), 5)           # the person's kept runs, newest first (each says if its file is kept)
    import_shelf(disk)                           # every old shelf entry into the store, once; how many

The store's budget bounds kept runs like every other run (the oldest go first); `per_person` bounds a person's list.
"""
from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from engine.runs.format import RunFileError, dumps, loads
from engine.store import RunDisk, StoredRun, StoreError

SAVED_DIR_ENV = "PLAYGROUND_SAVED_DIR"          # where the shelf was; read only to convert what it holds
SHELF_NAME = re.compile(r"(\d{1,20})-([a-z0-9-]{0,40})\.json\.gz")   # <nanoseconds>-<slug>.json.gz
OWNER_DIR = re.compile(r"[0-9a-f]{24}")
log = logging.getLogger("engine.runs.kept")


@dataclass(frozen=True)
class Kept:
    """What keeping a run did."""

    id: str
    title: str
    size: int                                   # bytes of its run file
    dropped: tuple[str, ...]                    # titles of the person's own kept runs that left their list
    evicted: int                                # runs of anyone evicted to keep the store within its budget


def kept_owner(person: str) -> str:
    """Whose kept runs a claim lists: a hash of the person, as the shelf named its folders (so converted entries land
    in the same list, and no person id is written twice)."""
    return "kept:" + hashlib.sha256(person.encode("utf-8", "replace")).hexdigest()[:24]


def slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:40].strip("-")


def keep(disk: RunDisk, data: bytes, person: str, title: str, answer: str, model: str, per_person: int) -> Kept:
    """A run file kept for `person` under a new id and listed first among their kept runs (their newest `per_person`
    stay listed); StoreError (a full disk, a file over the budget) says why not."""
    owner = kept_owner(person)
    before = {c.id: c.title for c in disk.claims(owner, per_person)}
    run_id = f"kept-{time.time_ns()}-{slug(title)}"
    evicted = disk.put(StoredRun(run_id, model=model, kind="recording", source="kept", title=title[:200],
                                 answer=answer[:200]), data)
    disk.claim(owner, run_id, title, answer, model, keep=per_person)
    after = {c.id for c in disk.claims(owner, per_person)}
    return Kept(run_id, title, len(data), tuple(t for i, t in before.items() if i not in after), len(evicted))


# --- the shelf that came before ---------------------------------------------------------------------------------

def shelf_dir() -> Path:
    """PLAYGROUND_SAVED_DIR, else ~/.cache/inference-playground/saved: where the shelf kept its recordings."""
    folder = os.environ.get(SAVED_DIR_ENV)
    return Path(folder) if folder else Path.home() / ".cache" / "inference-playground" / "saved"


def import_shelf(disk: RunDisk, folder: Path | None = None) -> int:
    """Every recording the shelf kept, into the store as a kept run of its person (its id `kept-<name>`, as its
    link had it); each file goes once it is in, a file that does not open stays where it is, with a line in the log.
    Several web processes starting at once take turns (a lock on the folder, let go when a process dies)."""
    folder = shelf_dir() if folder is None else folder
    if not folder.is_dir():
        return 0
    try:
        with open(folder / ".importing", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)           # the next one finds the files gone
            return import_folder(disk, folder)
    except OSError as err:                              # a folder this process cannot write: left for another start
        log.warning("the kept recordings in %s were not moved into the run store (%s)", folder, err.strerror or err)
        return 0


def import_folder(disk: RunDisk, folder: Path) -> int:
    done = 0
    for owner in sorted(p for p in folder.iterdir() if p.is_dir() and OWNER_DIR.fullmatch(p.name)):
        for path in sorted(owner.iterdir()):
            match = SHELF_NAME.fullmatch(path.name)
            done += bool(match) and import_entry(disk, owner.name, path, match)
        try:
            owner.rmdir()                               # empty now, unless a file did not open
        except OSError:
            pass
    if done:
        log.info("run store: %d recording(s) kept on the old shelf (%s) are kept runs now", done, folder)
    return done


def import_entry(disk: RunDisk, owner: str, path: Path, match: re.Match) -> bool:
    """One shelf file into the store; False when it is gone (another process took it) or does not convert."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return False
    try:
        recording = loads(data, path.name).recording
        at, title = int(match[1]) / 1e9, (match[2].replace("-", " ") or "run").capitalize()
        run_id, answer = f"kept-{match[1]}-{match[2]}", recording.done.text
        disk.put(StoredRun(run_id, at, recording.model, "recording", "kept", None, title, answer[:200]),
                 dumps(recording))
        disk.claim("kept:" + owner, run_id, title, answer, recording.model, at=at)
    except (RunFileError, StoreError) as err:
        log.warning("the kept recording %s was not moved into the run store (%s); it stays where it is", path, err)
        return False
    path.unlink(missing_ok=True)
    return True
