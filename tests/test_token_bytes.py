"""A token is a run of bytes: each token's bytes recovered from the tokenizer, grouped into whole characters, and
shown on the token chips as hex with a bracket for the character they spell (issue 11 item 7)."""
from __future__ import annotations

import json

import pytest

from app.journey.sections import split_note
from app.journey.tokens import chips_figure, layout_chips
from engine.core.loader import cache_dir
from engine.core.token_bytes import char_groups, is_fragment, readable, token_bytes

CJK = "你好，世界。今天天气很好"
EMOJI = "Hi 👋🏽 there 🎉🚀"
MIXED = "naïve café ∑ 日本語 😀!"


def smol_tokenizer():
    from transformers import AutoTokenizer

    folder = cache_dir() / "smollm2-135m-instruct"
    if not (folder / "tokenizer.json").exists():
        pytest.skip("the embedded SmolLM2 is not provisioned (make run does it)")
    return AutoTokenizer.from_pretrained(folder)


def byte_fallback_tokenizer(tmp_path):
    """A SentencePiece-style BPE with byte fallback (Llama 2, Mistral): unknown characters become <0xNN> tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": 1 + b for b in range(256)}}
    for word in ("▁Hi", "▁there", "Hi", "▁", "n", "a", "ï", "v", "e"):
        vocab.setdefault(word, len(vocab))
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    core.pre_tokenizer = pre_tokenizers.Metaspace()
    core.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace()])
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>")
    tok.save_pretrained(tmp_path)
    return PreTrainedTokenizerFast.from_pretrained(tmp_path)


def check_groups(tokenizer, text: str, prefix: str = "") -> list[bytes]:
    """`prefix`: what the tokenizer itself adds in front (SentencePiece's leading space)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    pieces = token_bytes(tokenizer, ids)
    text = prefix + text
    assert b"".join(pieces) == text.encode("utf-8")                     # every byte, in order, nothing else
    groups = char_groups(pieces)
    assert [i for run in groups for i in run] == list(range(len(ids)))  # the groups cover the tokens once
    spelled = [b"".join(pieces[i] for i in run).decode("utf-8") for run in groups]   # each decodes on its own
    assert "".join(spelled) == text
    assert all(len(run) == 1 or all(is_fragment(pieces[i]) for i in run) for run in groups)
    return pieces


@pytest.mark.parametrize("text", [CJK, EMOJI, MIXED])
def test_smollm2_tokens_are_bytes_and_group_into_the_original_characters(text):
    tok = smol_tokenizer()
    ids = tok(text, add_special_tokens=False)["input_ids"]
    pieces = check_groups(tok, text)
    splits = [run for run in char_groups(pieces) if len(run) > 1]       # SmolLM2 cuts these characters apart
    assert splits and all(is_fragment(pieces[i]) for run in splits for i in run)
    for run in splits:                                                  # what the chips showed before: "?"
        assert any("\ufffd" in tok.decode([ids[i]]) for i in run)


def test_the_chinese_greeting_splits_as_the_issue_describes():
    tok = smol_tokenizer()
    pieces = check_groups(tok, "你好")
    assert [readable(p) for p in pieces] == ["<E4 BD>", "<A0>", "<E5 A5>", "<BD>"]
    assert [list(run) for run in char_groups(pieces)] == [[0, 1], [2, 3]]


def test_byte_fallback_tokens_give_their_byte(tmp_path):
    tok = byte_fallback_tokenizer(tmp_path)
    pieces = check_groups(tok, "Hi 世界 🎉", prefix=" ")
    assert b"\xe4" in pieces and b"\xf0" in pieces                       # <0xE4>, <0xF0> tokens: one byte each
    assert pieces[0] == b" "                                             # "▁": SentencePiece's space, a real byte


def test_readable_writes_fragments_as_hex_and_whole_characters_as_text():
    assert readable(b"\xe4\xbd") == "<E4 BD>" and readable("你".encode()) == "你"
    assert readable(b" \xf0\x9f") == " <F0 9F>" and readable(b"a\xff\xfeb") == "a<FF FE>b"
    assert readable(b" x", show=lambda t: t.replace(" ", "·")) == "·x"
    assert char_groups([b"\xe4", b"\xbd"]) == [range(0, 2)]              # cut off: ends where it stops
    assert char_groups([b"\xff", b"a"]) == [range(0, 1), range(1, 2)]    # not UTF-8: no endless group


def test_chips_show_bytes_and_bracket_each_split_character():
    tok = smol_tokenizer()
    ids = tok(EMOJI, add_special_tokens=False)["input_ids"]
    pieces = token_bytes(tok, ids)
    texts = [tok.decode([i]) for i in ids]
    chips = layout_chips(texts, ids, pieces=pieces)
    labels = [c.label for c in chips]
    assert "&lt;91&gt;" in labels and not any("\ufffd" in label for label in labels)   # escaped hex, no "?"
    assert all(c.group == chips[1].group for c in chips[1:4])           # " 👋" is one group of three tokens
    fig = json.loads(chips_figure(texts, ids, pieces=pieces).to_json())
    marks = [t for t in fig["data"] if t.get("mode") == "text" and "👋" in "".join(t.get("text", []))]
    assert marks and "🎉" in marks[0]["text"] and "🏽" in marks[0]["text"]
    assert any("bytes 91" in h for h in fig["data"][0]["hovertext"])
    plain = json.loads(chips_figure(["a", "b"], [1, 2]).to_json())       # no pieces: no brackets
    assert len(plain["data"]) == 3


def test_the_journey_caption_explains_byte_fragments_only_when_there_are_some():
    tok = smol_tokenizer()
    pieces = token_bytes(tok, tok("你好", add_special_tokens=False)["input_ids"])
    note = split_note(pieces)
    assert "not always a whole character" in note and "`E4 BD + A0`" in note and "`<E4 BD>`" in note
    assert split_note(token_bytes(tok, tok("plain text", add_special_tokens=False)["input_ids"])) == ""
