"""Odd but valid input works and shows as text; nothing crashes, nothing is silently wrong."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cwviz
from cwviz.cli import main
from cwviz.core.method.export import to_dict
from cwviz.core.util.tokens import display_token, display_tokens
from tests.helpers import ODD_PROMPTS, no_hooks


def visible(token: str) -> bool:
    """A display token is one non-empty line with no control, format or separator characters."""
    import unicodedata

    return bool(token) and all(unicodedata.category(c) not in ("Cc", "Cf", "Zl", "Zp", "Cs") for c in token)


@pytest.mark.parametrize("name", list(ODD_PROMPTS))
def test_odd_prompts_analyse_and_display(embedded, name):
    analysis = cwviz.analyze(embedded, ODD_PROMPTS[name])
    assert all(visible(t) for t in analysis.tokens), analysis.tokens
    contributions = analysis.contributions(analysis.num_layers - 1)
    assert np.isfinite(contributions).all()
    np.testing.assert_allclose(contributions.sum((0, 2)), 1, atol=1e-4)
    data = to_dict(analysis, layers=[0], heads=[0])
    assert data["text"] == ODD_PROMPTS[name]  # the prompt is kept exactly, as text


def test_html_prompt_stays_text_in_tokens(embedded):
    analysis = cwviz.analyze(embedded, ODD_PROMPTS["html"])
    assert "<" in "".join(analysis.tokens) and "onerror" in "".join(analysis.tokens)


def test_typed_special_tokens_are_the_tokenizers_special_tokens(embedded):
    """Documented choice: special tokens typed as text are read as such (chat-formatted prompts work)."""
    analysis = cwviz.analyze(embedded, ODD_PROMPTS["special"])
    assert analysis.tokens[0] == "<|im_start|>"
    assert "<|endoftext|>" in analysis.tokens


def test_one_token_repeated_a_thousand_times(embedded):
    analysis = cwviz.analyze(embedded, " the" * 1000)
    assert analysis.num_tokens == 1000
    for layer in (0, 29):
        c = analysis.contributions(layer)
        assert np.isfinite(c).all()
        np.testing.assert_allclose(c.sum((0, 2)), 1, atol=1e-3)


def test_cli_odd_input_from_a_file(tmp_path, capsys):
    path = tmp_path / "odd.txt"
    path.write_text(ODD_PROMPTS["control"] + ODD_PROMPTS["rtl"], encoding="utf-8")
    assert main(["analyze", "--file", str(path), "--layer", "0"]) == 0
    out = capsys.readouterr().out
    assert "\x00" not in out and "\u202e" not in out


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_display_of_any_text_is_visible_text(embedded, text):
    ids = embedded.tokenizer(text, add_special_tokens=False)["input_ids"]
    for token in display_tokens(embedded.tokenizer, ids):
        assert visible(token)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=49151))
def test_display_of_any_token_id_is_visible_text(embedded, token_id):
    assert visible(display_token(embedded.tokenizer, token_id))


def test_nothing_stays_on_the_model_after_an_analysis_that_raised(embedded, monkeypatch):
    from cwviz.core.method.capture import _ACTIVE

    def broken_forward(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(embedded.model.model.layers[3].mlp, "forward", broken_forward)
    with pytest.raises(RuntimeError, match="boom"):
        cwviz.analyze(embedded, "This analysis fails half way.")
    monkeypatch.undo()
    assert _ACTIVE.get() is None
    assert no_hooks(embedded.model)
    assert cwviz.analyze(embedded, "And the next one works.").num_tokens > 3
