"""Recordings in the app: open a saved generation as the session's run, and save the current run.

A recording (engine/serving/recording.py) holds the records of one finished generation, captures included; saved, it
is a run file (`.run.zip`, engine/runs), the one format the playground writes (an older `.json.gz` still opens).
Opened here it becomes an `app.runs.run.Run` in `st.session_state[LAST_RUN]`, so the journey, attention
and KV-cache pages draw it exactly as they draw a live run, without the model; a speculative run comes
back with its `Speculation` (draft, k, rounds, plain baseline), so the speculative page draws it too. That is how a class
goes on when the model is busy or not loaded.

    run = open_bytes(upload.getvalue(), upload.name)     # RecordingError for a corrupt or foreign file
    st.session_state[LAST_RUN] = run
    data = run_bytes(run)                                # the .run.zip to download
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import streamlit as st
from streamlit.delta_generator import DeltaGenerator

from app.runs.recent import Recent, make_current, open_recent, recent, run_from_disk, run_store, store_note
from app.runs.recorded import recording_from_run, run_from_recording  # noqa: F401 - also the names others import from here
from app.room.session import person_id
from app.ui.format import fmt_bytes
from app.ui.nav import PAGES
from app.runs.run import LAST_RUN, Run
from engine.errors import EngineError
from engine.serving.limits import MiB, Limits, server_limits
from engine.service.client import ModelClient
from engine import runs as run_files
from engine.runs.kept import Kept, keep, kept_owner
from engine.serving.recording import MAX_FILE_BYTES, PARSE_PLACES, PARSE_SLOTS, Recording, loads_recording
from engine.store import RunDisk

ROOT = Path(__file__).resolve().parent.parent.parent
RECORDINGS_DIR = ROOT / "assets" / "recordings"
UPLOAD_KEY, OPENED_KEY = "recordings.upload", "recordings.opened"
KEPT_NOTE_KEY = "recordings.kept_note"
Waiting = Callable[[int], None]


def open_bytes(data: bytes, name: str = "the file", limits: Limits | None = None,
               on_wait: Waiting | None = None) -> Run:
    """Parse uploaded bytes (a recording, or a run file: a .zip, engine/runs) into a run; RecordingError (or
    RunFileError) says what is wrong with a bad file."""
    if data[:2] == b"PK":
        with PARSE_SLOTS.hold(on_wait):
            return run_from_recording(run_files.loads(data, name, limits).recording)
    return run_from_recording(loads_recording(data, name=name, limits=limits, on_wait=on_wait))


def open_shipped(path: Path) -> Run:
    """A shipped recording as a run, with an id of its own (the same each time: the run store keeps it once)."""
    run = run_from_recording(run_files.load(path).recording)
    run.id = shipped_id(path)
    return run


def shipped_id(path: Path) -> str:
    """By the file's stem, as the .json.gz it replaced had it: yesterday's links (`?run=shipped-...`) open it."""
    stem = path.name.removesuffix(run_files.SUFFIX)
    return "shipped-" + re.sub(r"[^A-Za-z0-9_-]+", "-", stem)[:60]


def run_bytes(run: Run, on_wait: Waiting | None = None, lm: ModelClient | None = None) -> bytes:
    """The run file of a finished run, with the views its policy names derived on the model server (`lm`) from the
    residual the run kept, while the server still keeps it; holds a parse place while it writes (`PARSE_SLOTS`)."""
    recording = with_server_views(recording_from_run(run), run, lm)
    with PARSE_SLOTS.hold(on_wait):
        return run_files.dumps(recording)


def with_server_views(recording: Recording, run: Run, lm: ModelClient | None) -> Recording:
    """The recording with the views the server derives for the run; as it is when the server cannot."""
    if lm is None or lm.label != run.model or not run.policy.views:
        return recording
    try:
        return run_files.with_views(recording, lambda: lm.quick("run.views", {"run_id": run.id}))
    except EngineError:                              # the run went from the server, or kept nothing: the records only
        return recording


def room_limits(lm: ModelClient | None) -> Limits:
    """The server's limits: the scheduler's when the model is loaded, else those of the launch variables."""
    return lm.limits if lm is not None else server_limits()


def kept_store(limits: Limits) -> RunDisk | None:
    """The run store when it keeps runs for people (a per-person cap above 0), else None."""
    return run_store()[0] if limits.max_saved_per_session > 0 else None


def file_name(run: Run) -> str:
    stem = re.sub(r"[^a-z0-9]+", "-", (run.source or run.request.prompt).lower()).strip("-")[:40]
    return f"{stem or 'run'}{run_files.SUFFIX}"


# --- token text without the model -------------------------------------------------------------------------

def known_texts(run: Run) -> dict[int, str]:
    """Every token id the run stored with its text: the prompt, the answer and each token's candidates."""
    texts = {p.id: p.text for p in (run.prefill.prompt if run.prefill else [])}
    for token in run.tokens:
        texts.update({c.id: c.text for c in token.top})
        texts.setdefault(token.id, token.text)
    return texts


def decoder(run: Run, lm: ModelClient | None) -> Callable[[int | list[int]], str]:
    """Token ids (one or a list) to text: the loaded tokenizer when the run came from this model, else the
    texts the run stored (ids it never stored show as '#id')."""
    if lm is not None and lm.label == run.model and lm.spec.vocab_size == run.spec.vocab_size:
        return lm.tokenizer.decode
    texts = known_texts(run)

    def decode(ids: int | list[int]) -> str:
        ids = [ids] if isinstance(ids, int) else ids
        return "".join(texts.get(int(i), f"#{int(i)}") for i in ids)

    return decode


# --- what ships in assets/ --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shipped:
    path: str
    title: str
    prompt: str
    answer: str
    model: str
    tokens: int
    layers: int


def shipped_paths() -> list[Path]:
    """The shipped run files (`make recordings` writes them; the .json.gz they were went through
    engine/runs/convert.py)."""
    return sorted(RECORDINGS_DIR.glob("*" + run_files.SUFFIX))


@st.cache_data(show_spinner=False)
def shipped_summaries(paths: tuple[str, ...]) -> list[Shipped]:
    """Title, prompt and size of each shipped recording (read once per process); unreadable ones are left out."""
    out = []
    for path in paths:
        try:
            rec = run_files.load(path).recording
        except EngineError:                          # RunFileError, RecordingError: left out of the list
            continue
        captured = {i for r in rec.records for i in getattr(r, "captures", {})}
        out.append(Shipped(path, rec.title, rec.request.prompt, rec.done.text, rec.model,
                           rec.done.generated_tokens, len(captured)))
    return out


# --- widgets ----------------------------------------------------------------------------------------------

def shipped_section() -> None:
    """One row per shipped recording with an Open button (where it is shown now: says so, in its place)."""
    items = shipped_summaries(tuple(str(p) for p in shipped_paths()))
    if not items:
        st.caption(f"No recordings in {RECORDINGS_DIR.relative_to(ROOT)}.")
        return
    for i, item in enumerate(items):
        left, right = st.columns([4, 1], vertical_alignment="center")
        left.text(f"{item.title}: {item.tokens} tokens from {item.model}, attention of {item.layers} layers\n"
                  f"Prompt: {one_line(item.prompt, 160)}\nAnswer: {one_line(item.answer, 160)}")
        if open_cell(right, shipped_id(Path(item.path)), f"recordings.open.{i}", ":material/play_arrow:"):
            make_current(open_shipped(Path(item.path)))
            st.rerun()                                 # the row says "Shown now", the pages below follow it


def one_line(text: str, limit: int) -> str:
    """Text on one line (newlines and runs of spaces as one space), cut to `limit` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit - 1].rstrip() + "…"


def open_cell(cell: DeltaGenerator, run_id: str, key: str, icon: str) -> bool:
    """A row's Open button; in its place, where the row's run is the one every page shows, 'Shown now' and a link to
    the journey page (the result of pressing Open, next to it)."""
    if shown_now(run_id):
        cell.success("Shown now", icon=":material/check:")
        cell.page_link(str(PAGES[0].path), label="See it", icon=PAGES[0].icon)
        return False
    return cell.button("Open", key=key, icon=icon)


def upload_section(limits: Limits) -> None:
    """A file picker for a recording or a run file; a bad file gives the error's one line."""
    upload = st.file_uploader("Open a run file (.run.zip) or an older recording (.json.gz)", type=["zip", "gz", "json"],
                              key=UPLOAD_KEY,
                              help=f"Files saved with 'Save this run', `python -m engine record`, the run file in an "
                                   f"'Open in a notebook' download or `GET /v1/playground/runs/<id>/file`, and the "
                                   f".json.gz recordings saved before run files; at most {fmt_bytes(MAX_FILE_BYTES)}.")
    if upload is None:
        return
    outcome = st.session_state.get(OPENED_KEY)
    if outcome is None or outcome[0] != upload.file_id:
        notice = st.empty()
        outcome = (upload.file_id, open_upload(upload.getvalue(), upload.name, limits, waiting_notice(notice)))
        notice.empty()
        st.session_state[OPENED_KEY] = outcome
    if outcome[1] is not None:
        st.error(outcome[1])
    elif isinstance(shown := st.session_state.get(LAST_RUN), Run) and shown.source is not None:
        st.success(f"Opened \u201c{shown.source}\u201d from {upload.name}: every page shows it now.",
                   icon=":material/check:")                  # the result of opening it, under the picker
        st.page_link(str(PAGES[0].path), label=f"See it on: {PAGES[0].title}", icon=PAGES[0].icon)


def waiting_notice(slot: st.delta_generator.DeltaGenerator) -> Waiting:
    def show(waiting: int) -> None:
        slot.info(f"The server is opening or saving {PARSE_PLACES} other recordings right now, the most it works on "
                  f"at once; yours is next in line ({waiting} waiting)…", icon=":material/hourglass_top:")
    return show


def open_upload(data: bytes, name: str, limits: Limits | None = None, on_wait: Waiting | None = None) -> str | None:
    """Make an uploaded recording the current run; the error message when it cannot be read."""
    try:
        make_current(open_bytes(data, name, limits, on_wait))
    except EngineError as err:                       # RecordingError, RunFileError: one line, the run shown stays
        return str(err)
    return None


def save_button(run: Run | None, key: str, lm: ModelClient | None = None) -> None:
    """'Save this run' for a finished run; the file is built only when the button is pressed."""
    if run is None or run.done is None or run.prefill is None:
        st.caption("Generate (or open a recording) to save a run; a run is saved once it has finished.")
        return
    st.download_button("Save this run", data=lambda: run_bytes(run, lm=lm), file_name=file_name(run),
                       mime="application/zip", key=f"{key}.save.{run.id}", on_click="ignore",
                       icon=":material/download:",
                       help="A run file (.run.zip) with the tokens, timings and captures; open it later on the "
                            "Recordings page, here or on another playground, or with engine.runs.load.")


def keep_button(run: Run | None, limits: Limits, lm: ModelClient | None = None) -> None:
    """'Keep on this server': the run's file kept in the run store for this person (this browser's reloads and tabs,
    across restarts of the server), listed among their kept runs (their newest `max_saved_per_session`)."""
    disk = kept_store(limits)
    if run is None or run.done is None or run.prefill is None or disk is None:
        return
    if note := st.session_state.pop(KEPT_NOTE_KEY, None):          # what the last press did, under the button
        st.success(note, icon=":material/bookmark_added:")
    if not st.button("Keep on this server", key=f"recordings.keep.{run.id}", icon=":material/bookmark_add:",
                     help=f"Up to {limits.max_saved_per_session} runs per person (this browser), in the run store "
                          f"with every other run ({fmt_bytes(disk.budget)}); the oldest go first."):
        return
    notice = st.empty()
    title = one_line(run.source or run.request.prompt, 60)
    try:
        kept = keep(disk, run_bytes(run, waiting_notice(notice), lm), person_id(), title, run.text, run.model,
                    limits.max_saved_per_session)
    except EngineError as err:                     # StoreWriteError (a full disk), RecordingError: one line
        notice.error(str(err))
        return
    st.session_state[KEPT_NOTE_KEY] = kept_message(kept, limits, disk.budget)
    st.rerun()                                     # the list above shows the new one, the note shows here


def kept_message(kept: Kept, limits: Limits, budget: int) -> str:
    """What keeping did, including what left to stay within the caps."""
    text = f"Kept \u201c{kept.title}\u201d on this server ({kept.size / 1e6:.2f} MB)."
    if kept.dropped:
        text += (f" To stay within {limits.max_saved_per_session} per person, your oldest was removed: "
                 f"{', '.join(kept.dropped)}.")
    if kept.evicted:
        text += (f" The run store was full ({fmt_bytes(budget)}): {kept.evicted} older run(s), other people's "
                 "included, were evicted.")
    return text


def kept_section(limits: Limits) -> None:
    """This person's kept runs (after reloads, in every tab, after a restart) with an Open button each; one evicted
    from the run store meanwhile says so in its row."""
    disk = kept_store(limits)
    if disk is None:
        st.caption(f"This server keeps no runs on its disk ({store_note() or 'a per-person limit of 0'}); use Save "
                   "this run to download one.")
        return
    entries = disk.claims(kept_owner(person_id()), limits.max_saved_per_session)
    if not entries:
        st.caption("None yet: press Keep on this server under a finished run.")
    for i, entry in enumerate(entries):
        left, right = st.columns([4, 1], vertical_alignment="center")
        when = time.strftime("%H:%M", time.localtime(entry.at))
        left.text(f"{entry.title} ({kept_size(disk, entry.id) / 1e6:.2f} MB, kept {when})" if entry.kept else
                  f"{entry.title} (kept {when}; evicted from the run store to make room for newer runs)")
        if entry.kept and open_cell(right, entry.id, f"recordings.kept.{i}.{entry.id}", ":material/play_arrow:"):
            open_kept(disk, entry.id, limits)


def kept_size(disk: RunDisk, run_id: str) -> int:
    try:
        return disk.row(run_id).size
    except EngineError:                            # evicted a moment ago
        return 0


def recent_section(limits: Limits, lm: ModelClient | None = None) -> None:
    """This person's last runs (kept in the run store, so across reloads, tabs and restarts), an Open button each."""
    items = recent(limits)
    if not items:
        st.caption("None yet: a finished run, generated or opened here, is listed here and reopens after a reload or "
                   "a restart of the server.")
    for i, item in enumerate(items):
        left, right = st.columns([4, 1], vertical_alignment="center")
        when = time.strftime("%H:%M", time.localtime(item.at))
        gone = "" if item.kept else "; evicted from the run store to make room for newer runs"
        left.text(f"\u201c{one_line(item.title, 80)}\u201d → \u201c{one_line(item.answer, 60)}\u201d "
                  f"({item.model}, {when}{gone})\nLink: ?run={item.id}")
        if (item.kept or shown_now(item.id)) and open_cell(right, item.id, f"recordings.recent.{i}.{item.id}",
                                                           ":material/history:"):
            open_listed(item, limits, lm)


def shown_now(run_id: str) -> bool:
    shown = st.session_state.get(LAST_RUN)
    return isinstance(shown, Run) and shown.id == run_id


def open_listed(item: Recent, limits: Limits, lm: ModelClient | None) -> None:
    try:
        run = open_recent(item, limits, lm)
    except EngineError as err:                      # evicted meanwhile, set aside, the model server away
        st.error(f"That run cannot be opened: {err}")
        return
    make_current(run, limits)
    st.rerun()


def store_section() -> None:
    """Where runs are kept, within what budget, what went to make room, and anything the store had to skip."""
    disk, note = run_store()
    if disk is None:
        st.warning(f"Runs are kept in this web process only: {note}.", icon=":material/warning:")
        return
    use = disk.usage()
    evicted = (f" To stay within it, {use.evicted_runs} older run(s) ({fmt_bytes(use.evicted_bytes)}) were evicted, "
               f"the last at {time.strftime('%H:%M', time.localtime(use.last_evicted))}." if use.evicted_runs else "")
    st.caption(f"Every finished run is kept on this server's disk ({use.runs} run{'s' * (use.runs != 1)}, "
               f"{fmt_bytes(use.bytes)} of a "
               f"{fmt_bytes(use.budget)} budget; the oldest go first).{evicted} Each opens again by its link, after a "
               "reload or a restart.")
    if use.write_error:
        st.warning(f"The run store: {use.write_error}.", icon=":material/warning:")
    elif use.free_bytes < MiB:
        st.warning(f"The disk holding the run store is full ({use.folder}): new runs are held in memory until space "
                   "frees; serving goes on.", icon=":material/warning:")
    for at, what in use.problems[:5]:
        st.caption(f"Skipped at {time.strftime('%H:%M', time.localtime(at))}: {what}.")


def open_kept(disk: RunDisk, run_id: str, limits: Limits) -> None:
    """One of this person's kept runs as the run every page shows; the error under its row when it is gone."""
    try:
        with PARSE_SLOTS.hold(waiting_notice(st.empty())):
            run = run_from_disk(disk, run_id, limits)
    except EngineError as err:
        st.error(f"That run cannot be opened: {err}")
        return
    make_current(run, limits)
    st.rerun()                                     # the row says "Shown now", the pages below follow it


def origin_sentence(run: Run) -> str:
    """Where and how a recording was made, from its own metadata: its timings are that machine's, then."""
    when = f" on {run.recorded[:10]}" if re.match(r"\d{4}-\d\d-\d\d", run.recorded) else ""
    where = f"{run.dtype or 'an unknown dtype'} on {run.device or 'an unknown device'}"
    where += f", {run.machine}" if run.machine else " (the file does not say how busy that machine was)"
    kept = run.policy.layer_ids(run.spec.n_layers) if run.policy.enabled else ()
    capture = (f"capturing {len(kept)} of {run.spec.n_layers} layers" if kept else "without captures")
    return (f"Recorded{when} in {where}, {capture}. Its times (time to first token, time per token) are that "
            "machine's at that moment, not this server's: generate here to time this server.")


def run_notes(run: Run | None, origin: bool = True) -> None:
    """Where the shown run came from (`origin`: and where it was recorded, unless the page says so beside its
    times), and why the server cut it short if it did."""
    if run is None:
        return
    if run.source is not None:
        st.text(f"Showing the recording \u201c{run.source}\u201d ({run.model}); no model runs for it.")
        if origin:
            st.caption(origin_sentence(run))
    if run.warning:
        st.warning(run.warning)
