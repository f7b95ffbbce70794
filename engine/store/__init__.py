"""The run store: every finished run kept on disk as its run file (engine/runs: `inference-playground/run`, version 1)
with an index in SQLite, so that a person's recent runs, the Recordings page, the API's `/v1/playground/runs/{id}`
and watch mode find it again after any restart of a web process, the model server or the whole room.

    disk = open_store()                               # PLAYGROUND_RUNS_DIR, else $PLAYGROUND_CACHE/runs; None + a line
    disk.put(StoredRun("run-1a2b", model="SmolLM2", title="Why is the sky blue?"), data)   # atomic, or StoreWriteError
    disk.read("run-1a2b")                             # the run file's bytes; RunGoneError, StoredFileError
    disk.claim("p1f2e", "run-1a2b", "Why is the sky blue?", "Because...")   # the person's recent runs list it
    disk.claims("p1f2e")                              # newest first, each saying whether its file is still kept
    disk.usage()                                      # what it holds, its budget, what was evicted, what was skipped

No UI and no torch: the model server, the web processes and the replicas of a cluster all open the same folder.
See docs/store.md for what is kept, where, for how long and how to move it.
"""
from engine.store.disk import (BUDGET_ENV, DEFAULT_BUDGET_MB, DIR_ENV, STORE_VERSION, Claim, RunDisk, RunGoneError,
                               StoredFileError, StoredRun, StoreError, StoreUsage, StoreVersionError,
                               StoreWriteError, budget_bytes, open_store, store_dir)

__all__ = ["BUDGET_ENV", "DEFAULT_BUDGET_MB", "DIR_ENV", "STORE_VERSION", "Claim", "RunDisk", "RunGoneError",
           "StoredFileError", "StoredRun", "StoreError", "StoreUsage", "StoreVersionError", "StoreWriteError",
           "budget_bytes", "open_store", "store_dir"]
