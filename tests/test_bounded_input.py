"""Bounded work for everything a browser can send: recording files, prompt length, stop strings, kept
recordings on disk, presenter-token guesses; and the command line's one-line errors."""
from __future__ import annotations

import functools
import gzip
import json
import threading
import tracemalloc
import zlib
from pathlib import Path

import pytest

from conftest import tiny_prompt
from app.room.presenter import (FREE_GUESSES, GUESSES_KEY, PresenterBoard, PresenterError, guess_wait, is_presenter,
                           unlock)
from engine.serving import recording
from engine.errors import ContextLengthError, InvalidRequestError
from engine.core.generate import GenerationRequest, check_types, generate
from engine.core.hooks import CAPTURE_ALL
from engine.serving.limits import (CAPTURE_JSON_BYTES, CAPTURE_VALUES, CPU_LIMITS, GPU_LIMITS, RECORD_JSON_BYTES,
                                   RECORD_VALUES, Limits, capture_bytes, check_prompt_chars, max_prompt_chars,
                                   max_recording_bytes, max_recording_values)
from base_recording import dumps_recording, _encode
from engine.serving.recording import (PARSE_SLOTS, ParseSlots, RecordingError, load_recording, loads_recording,
                                      new_recording)

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted((ROOT / "assets" / "recordings").glob("*.run.zip"))


@functools.lru_cache(maxsize=None)
def old_bytes(path: Path) -> bytes:
    """A shipped recording as the base commit's writer saved it (.json.gz): what the old reader's caps bound."""
    from engine.runs import load                       # here: the run file is only this helper's way in

    return dumps_recording(load(path).recording)


HEADER = b'{"format":"inference-playground/recording","version":1,"records":['
SMALL = Limits(max_prompt_tokens=64, max_new_tokens=16, max_capture_mb=2, max_capture_layers=4)


def values(text: str | bytes) -> int:
    """The scan's count: every JSON value but the first of a container follows a comma."""
    b = text.encode() if isinstance(text, str) else text
    return b.count(b",") + b.count(b"[") + b.count(b"{")


# --- the caps, computed by hand -----------------------------------------------------------------------------

def test_the_recording_caps_follow_the_capture_limits_by_hand():
    # 2-core CPU defaults: 256 MiB of float32 capture -> float16 (half) -> base64 (x 4/3); 257 steps of records
    # and 64 layer captures; 2,048 prompt tokens; 32,768 prompt characters, up to 6 bytes each escaped; 64 KiB.
    attention = 256 * 2**20 // 2 * 4 // 3
    rest = 257 * (16384 + 64 * 2048) + 2048 * 256 + 32768 * 6 + 65536
    assert max_recording_bytes(CPU_LIMITS) == int(1.25 * (attention + rest))
    assert 250 * 2**20 < max_recording_bytes(CPU_LIMITS) < 270 * 2**20
    assert max_recording_values(CPU_LIMITS) == int(1.25 * (257 * (512 + 64 * 320) + 2048 * 8 + 4096))
    assert max_recording_bytes(GPU_LIMITS) > max_recording_bytes(CPU_LIMITS)
    assert max_prompt_chars(CPU_LIMITS) == 2048 * 16 and max_prompt_chars(GPU_LIMITS) == 32768 * 16


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_each_part_of_a_real_recording_is_within_what_the_cap_allows_for_it(path):
    """The constants behind the cap hold for recordings of the real SmolLM2 (30 layers, 9 heads)."""
    rec = loads_recording(old_bytes(path))
    text = gzip.decompress(old_bytes(path))
    attention = 0
    for r in rec.records:
        for cap in getattr(r, "captures", {}).values():
            attention += cap.attention.nbytes                                            # float16 as stored
            plain = _encode(cap)
            plain["attention"] = None
            part = json.dumps(plain, separators=(",", ":"))
            assert len(part) <= CAPTURE_JSON_BYTES and values(part) <= CAPTURE_VALUES
        plain = _encode(r)
        plain.pop("captures", None)
        plain.pop("prompt", None)                                                        # counted per prompt token
        part = json.dumps(plain, separators=(",", ":"))
        assert len(part) <= RECORD_JSON_BYTES and values(part) <= RECORD_VALUES
    n_prompt, n_new, layers = rec.done.prompt_tokens, rec.done.generated_tokens, len(rec.policy.layer_ids(30))
    limits = Limits(max_prompt_tokens=n_prompt, max_new_tokens=n_new, max_capture_layers=layers,
                    max_capture_mb=-(-capture_bytes(rec.spec, rec.policy, n_prompt, n_new) // 2**20))
    assert attention * 2 <= capture_bytes(rec.spec, rec.policy, n_prompt, n_new)      # float32 bound, stored half
    assert len(text) <= max_recording_bytes(limits) and values(text) <= max_recording_values(limits)
    assert loads_recording(old_bytes(path), limits=limits).done == rec.done         # opens under its own limits


def test_a_recording_made_at_the_limits_opens_under_them(tiny_lm):
    prompt = tiny_prompt(60, seed=2)
    request = GenerationRequest(prompt, max_new_tokens=SMALL.max_new_tokens, chat=False)
    records = list(generate(tiny_lm, request, CAPTURE_ALL))
    assert capture_bytes(tiny_lm.spec, CAPTURE_ALL, 60, 16) <= SMALL.max_capture_bytes
    data = dumps_recording(new_recording(tiny_lm, request, CAPTURE_ALL, records))
    assert len(gzip.decompress(data)) <= max_recording_bytes(SMALL)
    assert loads_recording(data, limits=SMALL).done == records[-1]


# --- bombs ----------------------------------------------------------------------------------------------------

def gz(parts: list[tuple[bytes, int]]) -> bytes:
    packer = zlib.compressobj(1, zlib.DEFLATED, 31)
    out = []
    for piece, times in parts:
        block = piece * (2**16 // len(piece) or 1)
        full, rest = divmod(times, 2**16 // len(piece) or 1)
        out += [packer.compress(block) for _ in range(full)] + [packer.compress(piece * rest)]
    return b"".join(out) + packer.flush()


def lying(data: bytes, claim: int) -> bytes:
    return data[:-4] + claim.to_bytes(4, "little")


TOO_LARGE = "expands to|holds more than"
EXPANDED = 48 * 2**20          # each bomb expands to 48 MiB; SMALL's cap is about 3 MiB
BOMBS = {
    "zeros (issue 14)": (lambda: gz([(b"[", 1), (b"0,", EXPANDED // 2), (b"0]", 1)]), "not a playground recording"),
    "zeros behind a header": (lambda: gz([(HEADER, 1), (b"0,", EXPANDED // 2), (b"0]}", 1)]), TOO_LARGE),
    "a string behind a header": (lambda: gz([(HEADER + b'"', 1), (b"A", EXPANDED), (b'"]}', 1)]), TOO_LARGE),
    "zeros, trailer lies": (lambda: lying(BOMBS["zeros behind a header"][0](), 2**15), "trailer says"),
    "zeros, trailer claims the cap": (lambda: lying(BOMBS["zeros behind a header"][0](), max_recording_bytes(SMALL)),
                                      "JSON values"),
    "a string, trailer claims the cap": (lambda: lying(BOMBS["a string behind a header"][0](),
                                                       max_recording_bytes(SMALL)), "trailer says"),
    "a string, trailer says nothing": (lambda: lying(BOMBS["a string behind a header"][0](), 0),
                                       "MB, more than the largest"),
    "empty lists behind a header": (lambda: gz([(HEADER, 1), (b"[],", EXPANDED // 3), (b"[]]}", 1)]), TOO_LARGE),
    "plain JSON zeros behind a header": (lambda: HEADER + b"0," * (8 * 2**20) + b"0]}", "JSON values"),
}


@pytest.mark.parametrize("case", sorted(BOMBS))
def test_a_bomb_is_refused_before_it_is_parsed_with_little_memory(case):
    make, words = BOMBS[case]
    data = make()
    tracemalloc.start()
    try:
        with pytest.raises(RecordingError, match=words) as err:
            loads_recording(data, name="bomb.json.gz", limits=SMALL)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20, f"{peak / 2**20:.1f} MiB"         # the bomb expands to 48 MiB and parses to far more
    assert "\n" not in str(err.value) and "bomb.json.gz" in str(err.value)


def test_a_cut_file_whose_trailer_says_it_is_huge_is_called_cut_not_huge():
    good = old_bytes(SHIPPED[0])
    cut = lying(good[: len(good) // 2], 2**31)                   # what is left at the end reads as a size
    with pytest.raises(RecordingError, match="damaged or truncated gzip file"):
        loads_recording(cut, limits=CPU_LIMITS)
    with pytest.raises(RecordingError, match="says it expands to 314.57 MB"):  # a whole bomb that says so: its word
        loads_recording(gz([(HEADER, 1), (b"0,", 150 * 2**20), (b"0]}", 1)]), limits=CPU_LIMITS)


def test_a_gzip_with_a_second_member_is_refused():
    good = old_bytes(SHIPPED[0])
    with pytest.raises(RecordingError, match="one gzip member|trailer says"):
        loads_recording(good + gzip.compress(b"more"))


# --- a few parses at once -------------------------------------------------------------------------------------

def test_parse_places_make_the_rest_wait_and_say_so():
    slots, told, order, waiting = ParseSlots(1), [], [], threading.Event()
    with slots.hold():
        def second() -> None:
            with slots.hold(on_wait=lambda n: (told.append(n), waiting.set())):
                order.append("second")

        thread = threading.Thread(target=second)
        thread.start()
        assert waiting.wait(120)                # the second parse has been told it waits (an event, not a clock)
        order.append("first done")
    thread.join(120)
    assert told == [1] and order == ["first done", "second"] and slots.waiting == 0


def test_a_wait_for_a_parse_place_ends_with_a_message():
    slots = ParseSlots(1, wait_seconds=0.05)
    with slots.hold():
        with pytest.raises(RecordingError, match="busy"):
            with slots.hold():
                pass


def test_loading_and_saving_share_the_process_wide_places(tiny_lm):
    data, told, done, waiting = old_bytes(SHIPPED[0]), [], threading.Event(), threading.Event()
    holders = [PARSE_SLOTS.hold() for _ in range(recording.PARSE_PLACES)]
    for h in holders:
        h.__enter__()
    try:
        thread = threading.Thread(target=lambda: (loads_recording(
            data, on_wait=lambda n: (told.append(n), waiting.set())), done.set()))
        thread.start()
        assert waiting.wait(120)                # told it waits for a place: an event, not a clock
        assert told == [1] and not done.is_set()
    finally:
        for h in holders:
            h.__exit__(None, None, None)
    thread.join(120)
    assert done.is_set()


# --- prompts and stop strings ----------------------------------------------------------------------------------

def test_a_prompt_is_refused_by_its_length_before_the_tokenizer_runs():
    limits = Limits(max_prompt_tokens=100)
    check_prompt_chars(limits, "x" * 1600)
    check_prompt_chars(limits, "x" * 1500, system="y" * 100)
    with pytest.raises(ContextLengthError, match="1,601 characters; this server reads at most 1,600") as err:
        check_prompt_chars(limits, "x" * 1601)
    assert "100 tokens" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ContextLengthError):
        check_prompt_chars(limits, "x", system="y" * 1600)


def test_a_prompt_at_the_token_limit_is_within_the_character_cap(tiny_lm):
    limits = Limits(max_prompt_tokens=200)
    prompt = tiny_prompt(200, seed=9)
    assert len(tiny_lm.tokenizer(prompt)["input_ids"]) >= 200
    check_prompt_chars(limits, prompt)


def test_stop_strings_are_capped_in_number_and_length():
    check_types(GenerationRequest("hi", stop=("x" * 200,) * 8))
    with pytest.raises(InvalidRequestError, match="at most 8 stop strings"):
        check_types(GenerationRequest("hi", stop=("x",) * 9))
    with pytest.raises(InvalidRequestError, match="200 characters"):
        check_types(GenerationRequest("hi", stop=("x" * 201,)))


# (recordings kept on the server's disk: tests/test_kept.py, now that they are runs in the run store)


# --- presenter token guesses ------------------------------------------------------------------------------------

def test_wrong_presenter_tokens_slow_further_guesses_from_that_session():
    board, state, t = PresenterBoard("the-right-token"), {}, 1000.0
    for i in range(FREE_GUESSES):
        assert unlock(state, board, f"guess-{i}", now=t) is False
    assert guess_wait(*state[GUESSES_KEY][:2], now=t) == 2.0
    with pytest.raises(PresenterError, match="wait 2 s"):
        unlock(state, board, "the-right-token", now=t)             # not even compared while waiting
    assert unlock(state, board, "guess-3", now=t + 2) is False     # waited: tried, wrong, and the wait doubles
    with pytest.raises(PresenterError, match="wait 4 s"):
        unlock(state, board, "guess-4", now=t + 2)
    assert unlock(state, board, "guess-3", now=t + 2) is False     # the same wrong token (a rerun) is no new guess
    assert state[GUESSES_KEY][0] == FREE_GUESSES + 1
    assert unlock(state, board, "the-right-token", now=t + 6) is True
    assert is_presenter(state, board) and GUESSES_KEY not in state
    other = {}
    assert unlock(other, board, "the-right-token", now=t) is True  # another session was never slowed


def test_the_wait_between_guesses_is_capped():
    assert guess_wait(FREE_GUESSES + 40, last=0.0, now=0.0) == 300.0
    assert guess_wait(FREE_GUESSES - 1, last=0.0, now=0.0) == 0.0


# --- the command line: one line, never a traceback ---------------------------------------------------------------

CONFIGS = {
    "truncated.json": '{"hidden_size": 4096', "a-list.json": "[1, 2]", "partial.json": '{"hidden_size": 4096}',
    "binary.json": b"\x80\x04\x95garbage", "infinite.json": '{"hidden_size": 1e400, "num_hidden_layers": 2, '
    '"num_attention_heads": 2, "vocab_size": 10, "intermediate_size": 4}',
    "nested.json": '{"hidden_size": {"a": 1}, "num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 10, '
                   '"intermediate_size": 4}',
}


@pytest.mark.parametrize("command", ["card", "project"])
def test_a_malformed_or_missing_config_gives_one_line_on_the_command_line(command, tmp_path, capsys):
    from engine.cli import main

    for name, text in {**CONFIGS, "missing.json": None, "a-folder": "dir"}.items():
        path = tmp_path / name
        if text == "dir":
            path.mkdir()
        elif text is not None:
            path.write_bytes(text if isinstance(text, bytes) else text.encode())
        code = main([command, "--config", str(path)])
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1, (name, err)
        assert lines[0].startswith("error: ") and name in lines[0] and "Traceback" not in err, (name, lines)


def test_an_unforeseen_error_is_one_line_too(monkeypatch, capsys):
    from engine import cli

    def broken(args):
        raise RuntimeError("something nobody expected\nover two lines")

    monkeypatch.setattr(cli, "cmd_card", broken)
    assert cli.main(["card", "--preset", "llama-3.1-8b"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "RuntimeError: something nobody expected over two lines" in err


def test_a_bomb_on_the_recording_command_line_gives_one_line(tmp_path, capsys):
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(BOMBS["zeros (issue 14)"][0]())
    from engine import cli

    assert cli.main(["show", str(path)]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "bomb.json.gz" in err and "not a playground recording" in err
