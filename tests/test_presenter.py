"""Presenter mode: only the token holder pushes; followers adopt each push once and can still explore."""
from __future__ import annotations

import threading

import pytest
from streamlit.testing.v1 import AppTest

import app.room.presenter as presenter
from app.room.presenter import (PresenterBoard, PresenterError, apply_push, follow_page, new_push, page_values, push_from,
                           pushed_view, unlock)

TOKEN = "correct-horse-battery"


def test_presenter_mode_is_off_without_a_token():
    board = PresenterBoard(None)
    assert not board.enabled and not board.check("") and not board.check(TOKEN)
    with pytest.raises(PresenterError, match="off"):
        board.push(TOKEN, prompt="hi")


def test_only_the_token_holder_can_push():
    board = PresenterBoard(TOKEN)
    for wrong in (None, "", "correct-horse-batter", TOKEN + " ", TOKEN.upper()):
        with pytest.raises(PresenterError, match="not the presenter token"):
            board.push(wrong, prompt="hi")
    assert board.latest() is None
    push = board.push(TOKEN, prompt="Why is the sky blue?", settings={"temperature": 0.7, "max_new_tokens": 32},
                      page="attention", view={"layer": 12, "head": 3}, note="Look at head 3")
    assert (push.version, push.prompt, push.settings, push.page, push.view) == \
           (1, "Why is the sky blue?", {"temperature": 0.7, "max_new_tokens": 32}, "attention", {"layer": 12, "head": 3})
    assert board.latest() == push


@pytest.mark.parametrize("fields,words", [
    ({"settings": {"temperature": float("nan")}}, "number"),
    ({"settings": {"__class__": 1}}, "cannot be pushed|not a setting"),
    ({"settings": {"top_k": True}}, "number"),
    ({"view": {"layer": "3"}}, "number"),
    ({"page": "../../etc/passwd"}, "not a page"),
    ({"page": "<script>"}, "not a page"),
    ({"prompt": "x" * 20_001}, "at most"),
    ({"prompt": 42}, "text"),
])
def test_pushed_values_are_checked(fields, words):
    with pytest.raises(PresenterError, match=words):
        PresenterBoard(TOKEN).push(TOKEN, **fields)


def test_concurrent_pushes_get_distinct_versions():
    board = PresenterBoard(TOKEN)
    versions: list[int] = []
    lock = threading.Lock()

    def presenter_tab(i: int) -> None:
        for j in range(50):
            v = board.push(TOKEN, prompt=f"{i}-{j}").version
            with lock:
                versions.append(v)

    threads = [threading.Thread(target=presenter_tab, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(versions) == list(range(1, 401)) and board.latest().version == 400


def test_followers_adopt_each_push_once_and_keep_exploring():
    board = PresenterBoard(TOKEN)
    lead, follower, loner = {}, {}, {"presenter.follow": False}
    assert unlock(lead, board, TOKEN) and not unlock({}, board, "guess-guess-guess")
    push_from(lead, board, prompt="Pushed", settings={"temperature": 0.5}, view={"layer": 4})
    assert new_push(lead, board) is None                          # the presenter does not re-adopt its own push
    assert new_push(loner, board) is None                         # not following
    push = new_push(follower, board)
    assert apply_push(follower, push, "journey") == ["journey.prompt", "journey.temperature"]
    assert follower["journey.prompt"] == "Pushed" and pushed_view(follower, "layer") == 4
    follower["journey.prompt"] = "my own idea"                    # exploring on their own
    assert new_push(follower, board) is None and follower["journey.prompt"] == "my own idea"
    push_from(lead, board, prompt="Next")
    assert new_push(follower, board).prompt == "Next"


def test_a_push_for_another_page_switches_then_applies_there():
    board = PresenterBoard(TOKEN)
    board.push(TOKEN, prompt="Attend!", page="attention")
    state, switched = {}, []
    follow_page(state, board, "journey", "journey", switch=switched.append)
    assert switched == ["attention"] and "journey.prompt" not in state
    follow_page(state, board, "attention", "attention", switch=switched.append)   # the page after the switch
    assert state["attention.prompt"] == "Attend!" and switched == ["attention"]
    assert follow_page(state, board, "attention", "attention") is None


def test_page_values_read_back_what_apply_push_wrote():
    board = PresenterBoard(TOKEN)
    push = board.push(TOKEN, prompt="p", settings={"top_p": 0.9, "seed": 7})
    state = {}
    apply_push(state, push, "kv")
    assert page_values(state, "kv") == {"prompt": "p", "settings": {"top_p": 0.9, "seed": 7}}


def demo_page():
    import streamlit as st

    from app.room.presenter import follow_page, presenter_board, presenter_box, push_button

    board = presenter_board()
    follow_page(st.session_state, board, "demo", "demo")
    presenter_box(board)
    st.text_area("Prompt", key="demo.prompt")
    st.slider("Temperature", 0.0, 2.0, key="demo.temperature")
    push_button(board, "demo", "demo", view={"layer": 2})


def test_a_presenter_session_pushes_to_a_follower_session(monkeypatch):
    board = PresenterBoard(TOKEN)
    monkeypatch.setattr(presenter, "presenter_board", lambda: board)
    lead, follower = AppTest.from_function(demo_page), AppTest.from_function(demo_page)
    lead.run()
    follower.run()
    assert not lead.button                                          # no push button before unlocking
    lead.text_input(key="presenter.token_input").input("wrong-token-123").run()
    assert lead.error and not lead.button
    lead.text_input(key="presenter.token_input").input(TOKEN).run()
    lead.text_area(key="demo.prompt").input("Pushed from the front").run()
    lead.slider(key="demo.temperature").set_value(0.8).run()
    lead.button(key="demo.presenter_push").click().run()
    assert not lead.exception and lead.success
    follower.run()
    assert follower.text_area(key="demo.prompt").value == "Pushed from the front"
    assert follower.slider(key="demo.temperature").value == pytest.approx(0.8)
    follower.text_area(key="demo.prompt").input("my own prompt").run()
    follower.run()
    assert follower.text_area(key="demo.prompt").value == "my own prompt"
    assert not follower.exception
