"""Display tokens: visible, single-line, and faithful to the bytes of split characters."""

from __future__ import annotations

from cwviz.core.util.tokens import display_tokens


def test_split_emoji_shows_its_bytes(embedded):
    tokens = display_tokens(embedded.tokenizer, embedded.tokenizer("pizza 🍕")["input_ids"])
    pieces = "".join(tokens[2:])  # "p", "izza", then the space and the emoji
    # The escapes spell out exactly the UTF-8 bytes of " 🍕".
    assert pieces.encode("latin-1").decode("unicode_escape").encode("latin-1") == " 🍕".encode()


def test_whitespace_and_controls_are_visible(embedded):
    tokens = display_tokens(embedded.tokenizer, embedded.tokenizer("a\tb\nc\x00")["input_ids"])
    assert "⇥" in tokens and "↵" in tokens and "\\x00" in tokens
