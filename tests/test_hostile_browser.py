"""The app under hostile and heavy use: bombs get a one-line message, kept runs stay within the caps and the
people whose runs were removed are told, wrong presenter tokens slow down. Drives app/main.py with AppTest on
the tiny model."""
from __future__ import annotations

from conftest import app_client, app_lm

import zlib
from dataclasses import replace

import pytest
from streamlit.testing.v1 import AppTest

from app.room import presenter
from app.room.presenter import PresenterBoard
from engine.serving.scheduler import scheduler_for

MAIN = "../app/main.py"
HEADER = b'{"format":"inference-playground/recording","version":1,"records":['


def gz(head: bytes, piece: bytes, times: int, tail: bytes) -> bytes:
    packer = zlib.compressobj(1, zlib.DEFLATED, 31)
    block = piece * (2**16 // len(piece))
    return b"".join([packer.compress(head)] + [packer.compress(block) for _ in range(times // (2**16 // len(piece)))]
                    + [packer.compress(tail), packer.flush()])


@pytest.fixture
def room(tiny_model_dir, monkeypatch, tmp_path):
    """The app on the tiny model, at most 2 kept runs per session."""
    monkeypatch.setenv("PLAYGROUND_MODEL", str(tiny_model_dir))
    monkeypatch.setenv("PLAYGROUND_DEVICE", "cpu")
    monkeypatch.setenv("PLAYGROUND_DTYPE", "float32")
    apps: list[AppTest] = []
    lm = None

    def new_app() -> AppTest:
        nonlocal lm
        at = AppTest.from_file(MAIN, default_timeout=60).run()
        at.switch_page("../pages/recordings.py").run()
        assert not at.exception, [e.value for e in at.exception]
        apps.append(at)
        lm = app_lm(tiny_model_dir)
        return at

    first = new_app()
    sched = scheduler_for(lm)
    saved = sched.limits
    sched.limits = replace(saved, max_saved_per_session=2, max_saved_mb=100)
    yield [first], new_app, sched
    sched.limits = saved
    for at in apps:
        if "session.id" in at.session_state:
            sched.leave(at.session_state["session.id"])


def clean(at: AppTest) -> AppTest:
    assert not at.exception, [e.value for e in at.exception]
    return at


def click(at: AppTest, prefix: str, index: int = 0) -> AppTest:
    buttons = [b for b in at.button if b.key and b.key.startswith(prefix)]
    assert buttons, [b.key for b in at.button]
    buttons[index].click().run()
    return clean(at)


@pytest.mark.parametrize("name,make,words", [
    ("bomb.json.gz", lambda: gz(b"[", b"0,", 24 * 2**20, b"0]"), "not a playground recording"),
    ("headed.json.gz", lambda: gz(HEADER, b"0,", 24 * 2**20, b"0]}"), "more than the"),
    ("string.json.gz", lambda: gz(HEADER + b'"', b"A", 48 * 2**20, b'"]}')[:-4] + (2**20).to_bytes(4, "little"),
     "trailer says"),
])
def test_a_bomb_upload_gets_one_line_and_the_page_carries_on(room, name, make, words):
    at = room[0][0]
    at.file_uploader(key="recordings.upload").set_value((name, make(), "application/gzip")).run()
    clean(at)
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and words in errors[0] and name in errors[0] and "\n" not in errors[0]
    assert "last_run" not in at.session_state
    click(at, "recordings.open.")                                   # a shipped one still opens
    assert at.session_state["last_run"].source


def test_kept_runs_stay_within_the_per_session_cap_and_the_user_is_told(room):
    at = room[0][0]
    titles = []
    for i in range(3):
        at.button(key=f"recordings.open.{i}").click().run()      # the row shown now has no Open button
        titles.append(at.session_state["last_run"].source)
        click(at, "recordings.keep.")
    notes = [s.value for s in at.success]
    assert any("your oldest was removed" in n for n in notes), notes
    listed = [t.value for t in at.text if "kept" in t.value and "MB" in t.value]
    assert len(listed) == 2, listed
    click(at, "recordings.kept.", 1)                                 # open the older of the two still kept
    assert at.session_state["last_run"].source == titles[1]


def test_someone_whose_runs_made_room_for_others_is_told_on_their_next_visit(room, monkeypatch, tmp_path):
    """Kept runs live in the run store with every other run: one that had to go to keep the store within its budget
    stays in its person's list, marked evicted, and the person who made room is told. (A store of this test's own:
    which runs are oldest must not depend on the tests before it.)"""
    from app.runs.recent import run_store

    monkeypatch.setenv("PLAYGROUND_RUNS_DIR", str(tmp_path / "store"))
    run_store.clear()
    try:
        first, new_app = room[0][0], room[1]
        click(first, "recordings.open.", 0)                         # the shipped run's file: the oldest in the store
        click(first, "recordings.keep.")                             # and the kept one
        disk = run_store()[0]
        (mine,) = [c.id for c in disk.rows(5) if c.id.startswith("kept-")]
        size = disk.row(mine).size                                   # the shipped file's, give or take its header
        monkeypatch.setattr(disk, "budget", size + size // 2)        # room for one such file: the next makes both go
        other = new_app()
        other.button(key="recordings.open.0").click().run()          # already in the store: nothing written
        click(other, "recordings.keep.")
        assert any("2 older run(s)" in s.value and "were evicted" in s.value for s in other.success), \
            [s.value for s in other.success]
        first.run()
        clean(first)
        rows = [t.value for t in first.text if "(kept " in t.value and "evicted from the run store" in t.value]
        assert len(rows) == 1 and not [b for b in first.button if b.key and b.key.startswith("recordings.kept.")]
    finally:
        monkeypatch.undo()
        run_store.clear()


def test_a_session_guessing_presenter_tokens_is_slowed_and_told_how_long(room, tiny_model_dir, monkeypatch):
    monkeypatch.setattr(app_client(tiny_model_dir), "board", PresenterBoard("front-of-the-room-token"))
    at = room[0][0].run()
    for i in range(presenter.FREE_GUESSES):
        at.text_input(key="presenter.token_input").input(f"guess number {i}").run()
        assert [e.value for e in at.sidebar.error] == ["That is not the presenter token."]
    at.text_input(key="presenter.token_input").input("front-of-the-room-token").run()
    clean(at)
    errors = [e.value for e in at.sidebar.error]
    assert len(errors) == 1 and errors[0].startswith("Too many wrong presenter tokens") and "wait" in errors[0]
    assert "presenter.token" not in at.session_state                  # the right token was not even tried
