"""A person's last runs (app/runs/recent.py): listed from the run store on the Recordings page and opened from there (read
back from their files); while the store cannot take them, kept in memory, bounded per person and in bytes, oldest
first out. The reload itself, in Chromium: tests/test_browser.py."""
from __future__ import annotations

import numpy as np

from conftest import tiny_prompt
from test_pages import app, generate, open_page  # noqa: F401 - `app`: the fixture
from app.runs.recent import RecentRuns, run_bytes
from app.runs.run import LAST_RUN, Run
from engine.core.generate import GenerationRequest
from engine.core.hooks import CAPTURE_OFF, LayerCapture
from engine.core.records import CacheState, DoneRecord, PrefillRecord, SampledToken


def finished_run(tiny_lm, n_bytes: int) -> Run:
    """A finished run whose captures hold `n_bytes` of attention (what the store counts)."""
    run = Run(model=tiny_lm.label, spec=tiny_lm.spec, request=GenerationRequest("w1"), policy=CAPTURE_OFF)
    token = SampledToken(5, " w1", 1.0, [], np.zeros(0, np.int64), np.zeros(0, np.float32))
    cap = LayerCapture(0, heads=(0,), kv_heads=(0,), attention=np.zeros((1, 1, n_bytes // 4), np.float32))
    run.add(PrefillRecord([], {}, 0.1, CacheState(1, 0, []), token, {0: cap}))
    run.add(DoneRecord(" w1", "length", 1, 1, 0.1, 0.0, 0.1))
    return run


def test_runs_are_kept_per_person_newest_first_within_both_caps(tiny_lm):
    size = run_bytes(finished_run(tiny_lm, 40_000))
    store = RecentRuns(per_person=2, total_bytes=3 * size)
    a, b, c = (finished_run(tiny_lm, 40_000) for _ in range(3))
    for run in (a, b, c):
        store.add("p1", run)
    assert store.runs("p1") == [c, b]                                  # two per person: the oldest went
    store.add("p1", b)
    assert store.runs("p1") == [b, c]                                  # opened again: newest, not twice
    d, e = finished_run(tiny_lm, 40_000), finished_run(tiny_lm, 40_000)
    store.add("p2", d)
    store.add("p2", e)                                   # 4 runs, room for 3: p1 (seen first) loses its oldest
    assert store.runs("p1") == [b] and store.runs("p2") == [e, d] and store.bytes <= 3 * size
    assert RecentRuns(per_person=0, total_bytes=size).runs("p1") == []


def test_the_recordings_page_lists_this_persons_last_runs(app):  # noqa: F811
    at = open_page(app, "journey.py")
    generate(at, "journey", tiny_prompt(6, seed=11), 3)
    first = at.session_state[LAST_RUN]
    generate(at, "journey", tiny_prompt(6, seed=12), 3)
    open_page(at, "recordings.py")
    rows = [t.value for t in at.text if "→" in t.value]
    assert len(rows) == 2 and tiny_prompt(6, seed=12)[:20] in rows[0] and tiny_prompt(6, seed=11)[:20] in rows[1]
    at.button(key=f"recordings.recent.1.{first.id}").click().run()
    opened = at.session_state[LAST_RUN]                  # read back from its run file in the run store
    assert opened.id == first.id and opened.text == first.text and opened.source is None
    assert [t.id for t in opened.tokens] == [t.id for t in first.tokens]


def test_the_person_is_the_xsrf_token_whatever_its_mask():
    """Tornado re-masks its XSRF cookie on every page load (two loads of one browser, as Chromium kept them)."""
    from app.room.session import xsrf_token

    first = "2|b7be5fd4|1b8eed0441711859daccfc1e87f1dae5|1795645335"
    after_reload = "2|f6a3d300|5a9361d0006c948d9bd170cac6ec5631|1795645335"
    assert xsrf_token(first) == xsrf_token(after_reload) == "ac30b2d0f6cf478d6d72a3ca304f8531"
    assert xsrf_token("2|b7be5fd5|1b8eed0441711859daccfc1e87f1dae5|1795645335") != xsrf_token(first)
    assert xsrf_token("plain-old-cookie") == "plain-old-cookie" and xsrf_token("2|zz|yy|1") == "2|zz|yy|1"


# --- recordings kept on the server's disk: the person's, not the tab's --------------------------------------------

def kept_rows(at) -> list[str]:
    return [t.value for t in at.text if " MB, kept " in t.value]


def test_a_kept_recording_stays_listed_for_its_person_after_reloads_tabs_and_a_restart(app_env, monkeypatch, tmp_path):
    """Keep on this server files the run in the run store under the person (the browser's cookie, which AppTest
    cannot send: set here the way app.room.session.person_id reads it), so a new Streamlit session of the same browser
    lists it, and so does a restarted web process; another browser does not see it. A recording the person kept on
    the old shelf (written by the base commit's writer where its shelf put it) is listed too, taken into the store
    when the web process opened it, and opens."""
    from streamlit.testing.v1 import AppTest
    from app.runs import recent, recordings
    from base_recording import dumps_recording, shelve
    from engine.runs import load

    shipped = load(recordings.shipped_paths()[0]).recording
    old = shelve(tmp_path / "saved", "ana-browser", dumps_recording(shipped), "the old shelf", 1764230000000000000)
    monkeypatch.setenv("PLAYGROUND_SAVED_DIR", str(tmp_path / "saved"))
    recent.run_store.clear()                           # a web process starting: it takes the shelf in
    who = ["ana-browser"]
    monkeypatch.setattr(recordings, "person_id", lambda: who[0])

    def new_session() -> AppTest:                      # a reload, a second tab or a fresh start: a new session
        return open_page(AppTest.from_file("../app/main.py", default_timeout=60).run(), "recordings.py")

    first = new_session()
    assert [r.split(" (")[0] for r in kept_rows(first)] == ["The old shelf"] and not old.exists()
    first.button(key="recordings.open.0").click().run()
    run = first.session_state[LAST_RUN]
    first.button(key=f"recordings.keep.{run.id}").click().run()
    assert not first.exception and len(kept_rows(first)) == 2
    listed = kept_rows(first)
    assert any(s.value.startswith("Kept \u201c") for s in first.success)

    reloaded = new_session()
    assert kept_rows(reloaded) == listed and reloaded.session_state["session.id"] != first.session_state["session.id"]
    recent.run_store.clear()                           # the web process restarted: nothing but the store remains
    restarted = new_session()
    assert kept_rows(restarted) == listed
    name = next(b.key for b in restarted.button if b.key and b.key.startswith("recordings.kept."))
    restarted.button(key=name).click().run()
    assert not restarted.exception and restarted.session_state[LAST_RUN].text == run.text
    assert "Shown now" in [s.value for s in restarted.success]          # told in the row, next to where Open was
    old_key = next(b.key for b in restarted.button if b.key and b.key.startswith("recordings.kept.1."))
    assert old_key.endswith(old.name.removesuffix(".json.gz"))          # its id is the one its link had: kept-<name>
    restarted.button(key=old_key).click().run()
    assert not restarted.exception and restarted.session_state[LAST_RUN].text == shipped.done.text

    who[0] = "ben-browser"
    other = new_session()
    assert kept_rows(other) == [] and any(c.value.startswith("None yet: press Keep") for c in other.caption)


def test_an_uploaded_recording_says_it_opened_under_the_picker(app):  # noqa: F811
    from app.runs.recordings import RECORDINGS_DIR

    at = open_page(app, "recordings.py")
    path = sorted(RECORDINGS_DIR.glob("*.run.zip"))[0]
    at.file_uploader(key="recordings.upload").set_value((path.name, path.read_bytes(), "application/zip")).run()
    assert not at.exception and not at.error
    title = at.session_state[LAST_RUN].source
    said = [s.value for s in at.success]
    assert said[0] == f"Opened \u201c{title}\u201d from {path.name}: every page shows it now."
    assert said[1:] == ["Shown now"]                                   # and its row under Your last runs says so
