"""The answer's text as tokens arrive (engine.core.generate.TextStream) and each token's text alone
(engine.core.token_bytes.token_texts), both checked against the tokenizer decoding from scratch.

TextStream decodes incrementally with tokenizers' DecodeStream; the reference decodes every id so far at every push
(what TextStream did before), holding back text that ends inside a character."""
from __future__ import annotations

import random

import pytest

from engine.core.generate import TextStream
from engine.core.token_bytes import token_bytes, token_texts
from engine.models.shaped import SHAPES, write_tokenizer
from tests.test_token_bytes import CJK, EMOJI, MIXED, byte_fallback_tokenizer, smol_tokenizer

TEXTS = (CJK, EMOJI, MIXED, "Hello, world!  Two  spaces\n\ttab", "a" * 40)


class WholeDecode:
    """The reference: the whole answer decoded at every push."""

    def __init__(self, tokenizer):
        self.tokenizer, self.ids, self.text = tokenizer, [], ""

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        full = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if full.endswith("\ufffd"):
            return ""
        piece, self.text = full[len(self.text):], full
        return piece


def sequences(tokenizer, n: int, seed: int = 0) -> list[list[int]]:
    """Random ids; real text cut at a random token with a special token inside; its tokens shuffled (bytes of
    one character apart, or in the wrong order)."""
    rnd, size, special = random.Random(seed), len(tokenizer), list(tokenizer.all_special_ids)
    out = []
    for k in range(n):
        text = tokenizer.encode(rnd.choice(TEXTS) + rnd.choice(TEXTS), add_special_tokens=False)
        if k % 3 == 0:
            out.append([rnd.randrange(size) for _ in range(rnd.randint(1, 40))])
        elif k % 3 == 1:
            cut = rnd.randrange(len(text))
            out.append(text[cut:] + [rnd.choice(special)] + text[:cut])
        else:
            out.append([rnd.choice(text) for _ in range(30)])
    return out


def check_stream(tokenizer, n: int = 120) -> int:
    """Every push gives the reference's piece and leaves the reference's text; returns how many streams fell back
    to whole decoding."""
    fell_back = 0
    for ids in sequences(tokenizer, n):
        ours, ref = TextStream(tokenizer), WholeDecode(tokenizer)
        for i in ids:
            assert ours.push(i) == ref.push(i), ids
            assert ours.text == ref.text
        fell_back += ours._incremental is None
    return fell_back


def shaped_tokenizer(tmp_path):
    """The byte-level BPE of the shaped Llama checkpoints (Llama 3's kind: GPT-2 byte alphabet, specials)."""
    from transformers import AutoTokenizer

    write_tokenizer(SHAPES["tiny"], tmp_path)
    return AutoTokenizer.from_pretrained(tmp_path)


def test_text_stream_equals_whole_decoding_on_a_byte_level_bpe(tmp_path):
    tokenizer = shaped_tokenizer(tmp_path)
    assert check_stream(tokenizer) == 0                    # DecodeStream all the way


def test_text_stream_equals_whole_decoding_on_smollm2():
    assert check_stream(smol_tokenizer()) == 0


def test_text_stream_equals_whole_decoding_on_the_tests_word_level_tokenizer(tiny_lm):
    assert check_stream(tiny_lm.tokenizer, 60) == 0


def test_text_stream_falls_back_to_whole_decoding_where_decode_stream_refuses(tmp_path):
    """A byte-fallback SentencePiece tokenizer: DecodeStream raises on some invalid UTF-8; the stream carries on,
    decoding whole, with the same pieces."""
    assert check_stream(byte_fallback_tokenizer(tmp_path)) > 0


def wordpiece_tokenizer(tmp_path, tidy: bool):
    """A WordPiece tokenizer (BERT's kind), whose spaces transformers tidies after decoding when asked to."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "hi", ",", "there", ".", "it", "'", "s", "fine", "!", "##s"]
    core = Tokenizer(models.WordPiece({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    core.pre_tokenizer, core.decoder = pre_tokenizers.BertPreTokenizer(), decoders.WordPiece(cleanup=False)
    PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]",
                            clean_up_tokenization_spaces=tidy).save_pretrained(tmp_path)
    return PreTrainedTokenizerFast.from_pretrained(tmp_path)


def test_text_stream_decodes_whole_for_a_tokenizer_that_tidies_spaces(tmp_path):
    tokenizer = wordpiece_tokenizer(tmp_path, tidy=True)
    ids = tokenizer.encode("hi , there . it 's fine !", add_special_tokens=False)
    assert tokenizer.decode(ids) == "hi, there. it's fine!"           # tidied: DecodeStream would not do that
    stream, ref = TextStream(tokenizer), WholeDecode(tokenizer)
    assert stream._incremental is None
    assert [stream.push(i) for i in ids] == [ref.push(i) for i in ids]
    assert stream.text == "hi, there. it's fine!"


def test_text_stream_is_incremental_where_decoding_is_the_backends_alone(tmp_path):
    """The same WordPiece tokenizer untidied, and a BPE one asked to tidy (transformers skips that for BPE)."""
    assert TextStream(wordpiece_tokenizer(tmp_path / "wp", tidy=False))._incremental is not None
    bpe = shaped_tokenizer(tmp_path / "bpe")
    bpe.clean_up_tokenization_spaces = True
    assert TextStream(bpe)._incremental is not None
    assert check_stream(bpe, 30) == 0


@pytest.mark.parametrize("make", [shaped_tokenizer, byte_fallback_tokenizer])
def test_token_texts_and_bytes_equal_decoding_each_id_alone_and_are_remembered(make, tmp_path):
    tokenizer = make(tmp_path)
    ids = [i for seq in sequences(tokenizer, 9, seed=1) for i in seq] + [0, 0]
    expected = tokenizer.batch_decode([[i] for i in ids])
    assert token_texts(tokenizer, ids) == expected
    assert token_texts(tokenizer, ids) == expected          # from memory now
    first = token_bytes(tokenizer, ids)
    assert token_bytes(tokenizer, ids) == first and all(isinstance(b, bytes) for b in first)
    assert len(first) == len(ids)
