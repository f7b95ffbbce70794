"""The hosted room's join gate: its rules (engine/service/join.py), the launcher's code and link (app/launch.py),
and the app's door (app/room/join.py, before anything else in app/main.py) driven with AppTest on the tiny Llama.
The same in real Chromium: tests/test_browser_join.py."""
from __future__ import annotations

import threading

import pytest
from streamlit.testing.v1 import AppTest

from app import launch
from app.launch import join_code, launch_env, room_urls, settings_of
from engine.service import join
from engine.service.join import (FREE_GUESSES, FREE_GUESSES_PER_ADDRESS, MEMBER_SECONDS, JoinGate, JoinRefused,
                                 checked_code, new_code, normalized)

CODE = "k7mq-3xtp-9wha"
REPLACED = "that join code was replaced by a new one: ask the presenter for the new link"
MAIN = "../app/main.py"


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def gate(code: str | None = CODE) -> tuple[JoinGate, Clock, Clock]:
    clock, wall = Clock(), Clock(1.7e9)
    return JoinGate(code, clock=clock, wall=wall), clock, wall


# --- the rules ------------------------------------------------------------------------------------------------

def test_new_codes_are_three_groups_of_four_unambiguous_characters():
    codes = {new_code() for _ in range(200)}
    assert len(codes) == 200
    for code in codes:
        groups = code.split("-")
        assert [len(g) for g in groups] == [4, 4, 4]
        assert not set(code) & set("01lio")


def test_codes_compare_ignoring_case_spaces_and_dashes():
    g, _, _ = gate()
    assert normalized(" K7MQ 3xtp-9WHA ") == "k7mq3xtp9wha"
    assert g.admits(g.join("K7MQ 3XTP 9WHA", client="a"))
    assert g.admits(g.join("k7mq3xtp9wha", client="b"))


def test_a_code_given_at_launch_must_be_long_enough_and_fit_a_link():
    assert checked_code("Workshop-2026") == "Workshop-2026"
    for bad in ("short", "a b c d e f g h", "café-café-café", "x?join=1&y=2"):
        with pytest.raises(ValueError):
            checked_code(bad)


def test_an_open_room_admits_everyone():
    g, _, _ = gate(None)
    assert not g.required() and g.admits(None) and g.admits("anything")
    with pytest.raises(JoinRefused):
        g.rotate()


def test_member_tokens_are_signed_by_this_gate_and_last_a_day():
    g, _, wall = gate()
    token = g.join(CODE, client="a")
    assert CODE not in token and normalized(CODE) not in token
    assert g.admits(token)
    other, _, _ = gate()
    assert not other.admits(token)                                   # another gate's secret
    head, issued, nonce, sig = token.split(".")
    for forged in (f"{head}.{issued}.{nonce}x.{sig}", f"{head}.{int(issued) + 60}.{nonce}.{sig}",
                   f"{head}.{issued}.{nonce}.{sig[:-2]}", "", "m1...", "x" * 500, None):
        assert not g.admits(forged)
    wall.now += MEMBER_SECONDS + 1
    assert not g.admits(token)


def test_wrong_codes_wait_longer_and_longer_per_browser():
    g, clock, _ = gate()
    for i in range(FREE_GUESSES):
        with pytest.raises(JoinRefused, match="not the join code"):
            g.join(f"wrong-code-{i}", client="a")
    with pytest.raises(JoinRefused, match="wait 2 s") as refused:
        g.join(CODE, client="a")                                      # the next try waits, even the right code
    assert refused.value.wait_seconds == pytest.approx(2.0)
    assert g.admits(g.join(CODE, client="b"))                         # another browser is not held up
    clock.now += 2.1
    with pytest.raises(JoinRefused, match="not the join code"):
        g.join("wrong-code-x", client="a")
    with pytest.raises(JoinRefused, match="wait 4 s"):
        g.join(CODE, client="a")                                      # twice as long after each wrong one
    clock.now += 4.1
    assert g.admits(g.join(CODE, client="a"))                         # and a right code clears the count
    with pytest.raises(JoinRefused, match="not the join code"):
        g.join("wrong-code-y", client="a")


def test_the_same_wrong_code_again_is_not_a_new_guess():
    g, _, _ = gate()
    for _ in range(10):
        with pytest.raises(JoinRefused, match="not the join code"):
            g.join("wrong-code-1", client="a")                        # a double click, a rerun with the same value
    assert g.admits(g.join(CODE, client="a"))


def test_one_address_gets_more_tries_than_one_browser_but_not_unlimited():
    g, _, _ = gate()
    for i in range(FREE_GUESSES_PER_ADDRESS):                         # a script that comes back as a new browser
        with pytest.raises(JoinRefused, match="not the join code"):
            g.join(f"wrong-{i}-code", client=f"browser-{i}", address="203.0.113.7")
    with pytest.raises(JoinRefused, match="wait"):
        g.join(CODE, client="fresh", address="203.0.113.7")
    assert g.admits(g.join(CODE, client="fresh", address="198.51.100.1"))


def test_a_quiet_hour_forgets_the_wrong_tries():
    g, clock, _ = gate()
    for i in range(FREE_GUESSES + 5):
        clock.now += 1000
        with pytest.raises(JoinRefused):
            g.join(f"wrong-code-{i}", client="a")
    clock.now += 3601
    assert g.admits(g.join(CODE, client="a"))


def test_rotating_keeps_members_and_turns_the_old_code_away_without_counting_it():
    g, _, _ = gate()
    member = g.join(CODE, client="a")
    new = g.rotate()
    assert new != CODE and g.code() == new
    assert g.admits(member)
    for _ in range(FREE_GUESSES + 3):                                 # a room reloading the old link
        with pytest.raises(JoinRefused, match="replaced"):
            g.join(CODE, client="b", address="203.0.113.7")
    assert g.admits(g.join(new, client="b", address="203.0.113.7"))   # no wait: the old link is not a guess


def test_a_closed_room_lets_nobody_new_in_and_keeps_its_members():
    g, _, _ = gate()
    member = g.join(CODE, client="a")
    g.close(True)
    assert g.closed()
    with pytest.raises(JoinRefused, match="closed"):
        g.join(CODE, client="b")
    assert g.admits(member)
    g.close(False)
    assert g.admits(g.join(CODE, client="b"))


def test_the_gate_is_thread_safe():
    """200 browsers at once, half with the right code and half with a wrong one, while the presenter rotates the
    code: every wrong code is refused, and every right one is admitted (at once, or with the new code after being
    told the old one was replaced, as a browser following the new link would be)."""
    g, _, _ = gate()
    outcomes: dict[int, list[str]] = {}

    def knock(i: int) -> None:
        said = outcomes.setdefault(i, [])
        code = CODE if i % 2 else f"wrong-code-{i}"
        for _ in range(2):
            try:
                token = g.join(code, client=f"c{i}")
            except JoinRefused as refused:
                said.append(str(refused))
                if "replaced" not in str(refused):
                    break
                code = g.code()                                   # the new link
            else:
                said.append("admitted" if g.admits(token) else "a token the gate does not admit")
                break
        if i == 50:
            g.rotate()

    threads = [threading.Thread(target=knock, args=(i,)) for i in range(200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert g.code() != CODE                                           # it did rotate, while others knocked
    for i, said in outcomes.items():
        if i % 2:
            assert said in (["admitted"], [REPLACED, "admitted"]), (i, said)
        else:
            assert said == ["that is not the join code"], (i, said)
    assert len(outcomes) == 200


# --- the launcher ---------------------------------------------------------------------------------------------

def parse(*argv: str, environ: dict | None = None):
    return settings_of(list(argv), environ or {})


def test_loopback_stays_open_and_any_other_address_gets_a_made_up_code():
    assert join_code(parse()) is None
    assert join_code(parse("--host", "localhost")) is None
    made_up = join_code(parse("--host", "0.0.0.0"))
    assert made_up and len(made_up.split("-")) == 3
    assert join_code(parse("--host", "0.0.0.0", "--join-code", "Workshop-2026")) == "Workshop-2026"
    assert join_code(parse("--host", "10.0.0.5", environ={join.JOIN_CODE_ENV: "from-the-env-1"})) == "from-the-env-1"
    assert join_code(parse("--join-code", "on-loopback-too")) == "on-loopback-too"
    assert join_code(parse("--host", "0.0.0.0", "--open-room", environ={join.JOIN_CODE_ENV: "from-the-env-1"})) is None
    with pytest.raises(SystemExit, match="at least 8"):
        join_code(parse("--host", "0.0.0.0", "--join-code", "abc"))


def test_the_banner_prints_the_join_link_and_warns_about_an_open_room():
    args = parse("--host", "0.0.0.0", "--port", "8600", "--public-url", "https://room.example.org/")
    text = launch.banner(args, "a-presenter-token-x", CODE)
    assert f"Join link: https://room.example.org/?join={CODE}" in text and "Presenter token" in text
    assert "WARNING" in launch.banner(parse("--host", "0.0.0.0", "--open-room"), None, None)
    assert "WARNING" not in launch.banner(parse("--open-room"), None, None)
    assert launch_env(args, code=CODE)[launch.PUBLIC_URL_ENV] == "https://room.example.org"
    assert all(url.startswith("http://") and url.endswith(":8601") for url in room_urls(parse("--host", "0.0.0.0",
                                                                                              "--port", "8601")))


def test_an_open_room_drops_a_code_left_in_the_environment(monkeypatch, capsys):
    started = {}
    monkeypatch.setattr(launch.os, "execve", lambda path, cmd, env: started.update(env))
    monkeypatch.setattr(launch.os, "chdir", lambda path: None)
    launch.main(["--host", "0.0.0.0", "--open-room"], {join.JOIN_CODE_ENV: "left-over-code", "PATH": "/bin"})
    assert join.JOIN_CODE_ENV not in started and "WARNING" in capsys.readouterr().out
    launch.main(["--host", "0.0.0.0", "--join-code", "Workshop-2026"],
                {"PATH": "/bin", launch.PUBLIC_URL_ENV: "https://room.example.org"})
    assert started[join.JOIN_CODE_ENV] == "Workshop-2026"
    assert "Join link: https://room.example.org/?join=Workshop-2026" in capsys.readouterr().out
    assert started[launch.PUBLIC_URL_ENV] == "https://room.example.org"


# --- the app's door (AppTest: no cookies, so membership lives in the session) ---------------------------------------

@pytest.fixture
def room(app_env, monkeypatch):
    """The app with a join code, and a record of every model load and seat in the room it asks for."""
    from app.hosting import model

    from app.room import session
    g = JoinGate(CODE)
    monkeypatch.setattr(join, "_GATE", g)
    asked = []
    load, seat = model.get_model, session.join_session
    monkeypatch.setattr(model, "get_model", lambda *a, **k: asked.append("model") or load(*a, **k))
    monkeypatch.setattr(session, "join_session", lambda *a, **k: asked.append("seat") or seat(*a, **k))
    return g, asked


def opened(query: dict[str, str] | None = None) -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=60)
    for key, value in (query or {}).items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def kept_out(at: AppTest) -> bool:
    return [t.value for t in at.title] == ["Join the room"]


def test_without_the_code_only_the_join_form_runs(room):
    g, asked = room
    at = opened()
    assert kept_out(at) and not asked                                 # no model, no seat in the room
    assert len(at.main.children) == 3 and not at.sidebar.children     # a title, a line, the form
    at.text_input[0].input("wrong-code-1")
    at.button[0].click().run()
    assert kept_out(at) and not asked
    assert [e.value for e in at.error] == ["That is not the join code."]
    at.text_input[0].input(CODE.upper())
    at.button[0].click().run()
    assert not kept_out(at) and asked == ["model", "seat"] and g.admits(at.session_state["join.member"])


def test_the_link_lets_in_and_leaves_the_address_bar(room):
    g, asked = room
    at = opened({"join": CODE})
    assert not kept_out(at) and asked
    assert "join" not in at.query_params
    assert not any(CODE in str(at.session_state[key]) for key in at.session_state)


def test_a_rotated_code_keeps_members_and_turns_the_old_link_away(room):
    g, _ = room
    member = opened({"join": CODE})
    g.rotate()
    member.run()
    assert not kept_out(member)
    late = opened({"join": CODE})
    assert kept_out(late) and "replaced" in late.error[0].value
    assert not kept_out(opened({"join": g.code()}))


def test_a_room_without_a_code_opens_as_before(app_env, monkeypatch):
    monkeypatch.setattr(join, "_GATE", JoinGate(None))
    assert not kept_out(opened())
