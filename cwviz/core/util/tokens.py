"""Display-ready token strings.

Choices: each token is decoded on its own; a token that is only part of a multi-byte character (its
decoding contains U+FFFD) is shown by its bytes, ``\\xf0\\x9f``; newlines, tabs and carriage returns
become ``↵``, ``⇥`` and ``␍``; other control and format characters (NUL, bidi overrides, zero-width
marks) are shown as ``\\u202e``-style escapes so they can neither hide nor reorder text; a token of
only spaces shows as ``␣`` per space. Strings are plain text: every renderer escapes them as text.
"""

from __future__ import annotations

import functools
import unicodedata

_VISIBLE = {"\n": "↵", "\t": "⇥", "\r": "␍"}


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's byte-level alphabet: printable bytes stand for themselves, the other
    bytes for the code points from 256 up, in order (the table every byte-level BPE tokenizer uses)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {byte: chr(byte) for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in chars:
            chars[byte] = chr(256 + extra)
            extra += 1
    return {char: byte for byte, char in chars.items()}


def _visible(piece: str) -> str:
    if piece and not piece.strip(" "):
        return "␣" * len(piece)
    out = []
    for char in piece:
        if char in _VISIBLE:
            out.append(_VISIBLE[char])
        elif unicodedata.category(char) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
            code = ord(char)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(char)
    return "".join(out)


def _raw_bytes(raw: str) -> str | None:
    """A byte-level BPE token (GPT-2 alphabet) as ``\\xNN`` escapes (printable ASCII but the backslash
    as itself); None if it is not one."""
    decoder = _byte_decoder()
    if not raw or any(char not in decoder for char in raw):
        return None
    return "".join(chr(b) if 0x20 <= b < 0x7F and b != 0x5C else f"\\x{b:02x}" for b in (decoder[char] for char in raw))


def display_token(tokenizer, token_id: int) -> str:
    """One token as a short, visible, single-line string."""
    piece = tokenizer.decode([int(token_id)], clean_up_tokenization_spaces=False)
    if "\ufffd" in piece:
        raw = tokenizer.convert_ids_to_tokens(int(token_id))
        piece = _raw_bytes(raw) or str(raw)
        return piece
    if piece == "":
        raw = tokenizer.convert_ids_to_tokens(int(token_id))
        return _visible(str(raw)) if raw else "∅"
    return _visible(piece)


def display_tokens(tokenizer, token_ids) -> list[str]:
    """Display strings for a sequence of token ids (see the module docstring for the rules)."""
    return [display_token(tokenizer, token_id) for token_id in token_ids]
