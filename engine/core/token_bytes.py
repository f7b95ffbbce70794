"""The bytes behind each token, and which tokens together spell one character.

A byte-level tokenizer (GPT-2, Llama 3, SmolLM2, Qwen2) cuts UTF-8 bytes, not characters: 你 is three bytes
(E4 BD A0) and may come out as two tokens, E4 BD and A0, neither of which is text on its own (decoded alone,
each is U+FFFD "�"). SentencePiece tokenizers with byte fallback (Llama 2, Mistral) do the same with tokens
spelled <0xE4>. Here each token is turned back into its exact bytes, and consecutive tokens are grouped so that
every group's bytes decode to whole characters.

    pieces = token_bytes(tokenizer, ids)          # [b'\\xe4\\xbd', b'\\xa0', ...]
    groups = char_groups(pieces)                  # [range(0, 2), ...]: tokens 0 and 1 make 你
"""
from __future__ import annotations

import re
import weakref
from functools import lru_cache
from typing import Any, Callable

from transformers.convert_slow_tokenizer import bytes_to_unicode

BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")
SENTENCEPIECE_SPACE = "\u2581"          # "▁": SentencePiece's word boundary, a space in the text


@lru_cache(maxsize=1)
def _byte_of_char() -> dict[str, int]:
    """GPT-2's byte-level alphabet inverted: each of the 256 printable stand-ins -> the byte it stands for."""
    return {char: byte for byte, char in bytes_to_unicode().items()}


def piece_bytes(piece: str, text: str) -> bytes:
    """One token's bytes from its vocabulary entry `piece`, checked against `text` (the token decoded alone)."""
    if match := BYTE_FALLBACK.fullmatch(piece):
        return bytes([int(match.group(1), 16)])
    table = _byte_of_char()
    if piece and all(c in table for c in piece):
        raw = bytes(table[c] for c in piece)
        if raw.decode("utf-8", errors="replace") == text:          # what a byte-level decoder makes of it
            return raw
    if SENTENCEPIECE_SPACE in piece and "\ufffd" not in piece:
        return piece.replace(SENTENCEPIECE_SPACE, " ").encode()
    return text.encode()                                           # whole characters: the text is the bytes


def token_bytes(tokenizer: Any, ids: list[int]) -> list[bytes]:
    """Each token's exact bytes (a fragment of a character's UTF-8 where the tokenizer cut one)."""
    return _remembered(tokenizer, "bytes", ids, _bytes_of)


def token_texts(tokenizer: Any, ids: list[int]) -> list[str]:
    """Each token decoded alone, as `tokenizer.batch_decode([[i] for i in ids])` gives it.

    Remembered per tokenizer, since a token's text never changes: transformers' batch_decode spends about 5 µs of
    Python per id, which was most of a 30-row decode step's host time (a top-10 list per row: 300 ids, 1.5 ms)."""
    return _remembered(tokenizer, "texts", ids, lambda t, todo: t.batch_decode([[i] for i in todo]))


def decodes_as_its_backend(tokenizer: Any) -> bool:
    """Whether `tokenizer.decode` is its Rust backend's decode and nothing more, so that tokenizers' own
    incremental decoder (DecodeStream) spells the same text. Not so for a tokenizer without a backend, nor for one
    that tidies spaces after decoding (`clean_up_tokenization_spaces`, which transformers applies to WordPiece
    tokenizers and skips for BPE ones). Tried on text the tidying would change; remembered per tokenizer."""
    known = _MEMO.setdefault(tokenizer, {})
    if "plain" not in known:
        backend = getattr(tokenizer, "_tokenizer", None)
        ids = backend.encode(TIDIED, add_special_tokens=False).ids if backend is not None else []
        known["plain"] = backend is not None and all(
            tokenizer.decode(ids, skip_special_tokens=skip) == backend.decode(ids, skip_special_tokens=skip)
            for skip in (True, False))
    return known["plain"]


TIDIED = "Hi , there . It 's fine ! Is n't it ? Yes , we 're done"     # what clean_up_tokenization changes

_MEMO: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # tokenizer -> {"texts"|"bytes": {id: ...}, "plain": bool}


def _remembered(tokenizer: Any, kind: str, ids: list[int], compute: Callable[[Any, list[int]], list]) -> list:
    known = _MEMO.setdefault(tokenizer, {}).setdefault(kind, {})
    todo = list(dict.fromkeys(i for i in ids if i not in known))
    if todo:
        known.update(zip(todo, compute(tokenizer, todo)))
    return [known[i] for i in ids]


def _bytes_of(tokenizer: Any, ids: list[int]) -> list[bytes]:
    pieces = tokenizer.convert_ids_to_tokens(ids)
    texts = tokenizer.batch_decode([[i] for i in ids], clean_up_tokenization_spaces=False)
    return [piece_bytes(p or "", t) for p, t in zip(pieces, texts)]


def is_fragment(raw: bytes) -> bool:
    """True when the bytes are not whole UTF-8 characters (they start or end inside one)."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def char_groups(pieces: list[bytes]) -> list[range]:
    """Runs of consecutive tokens whose bytes together decode to whole characters; one token alone when it
    is whole. A run that never completes (cut off at the end, or bytes that are not UTF-8) ends where it stops."""
    groups, start, buffer = [], 0, b""
    for i, raw in enumerate(pieces):
        buffer += raw
        if not _incomplete(buffer):
            groups.append(range(start, i + 1))
            start, buffer = i + 1, b""
    if start < len(pieces):
        groups.append(range(start, len(pieces)))
    return groups


def _incomplete(buffer: bytes) -> bool:
    """Whether `buffer` stops inside a character that later bytes could finish."""
    try:
        buffer.decode("utf-8")
    except UnicodeDecodeError as err:
        return err.reason == "unexpected end of data"
    return False


def readable(raw: bytes, show: Callable[[str], str] = str) -> str:
    """Bytes as text where they are whole characters (passed through `show`) and as hex where they are not:
    b' \xf0\x9f' -> ' <F0 9F>'."""
    out, pending, rest = [], b"", raw
    while rest:
        try:
            text, bad, rest = rest.decode("utf-8"), b"", b""
        except UnicodeDecodeError as err:
            text, bad, rest = rest[:err.start].decode("utf-8"), rest[err.start:err.end], rest[err.end:]
        if text:
            out.append(_hex(pending) + show(text))
            pending = b""
        pending += bad                                   # neighbouring fragments are written as one <..>
    return "".join(out) + _hex(pending)


def _hex(raw: bytes) -> str:
    return "<" + " ".join(f"{b:02X}" for b in raw) + ">" if raw else ""
