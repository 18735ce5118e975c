"""The Compare page through AppTest: the default minimal pair on the embedded model, pickers in the link, a pair
of identical prompts drawn as zero, and clear messages for a prompt B that cannot be compared (tiny models)."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

import cwviz
from cwviz.app import compare_services, services
from tests.helpers import CharTokenizer, map_views, tiny_long_bundle
from tests.helpers.app import APP, TIMEOUT, assert_clean, charts, title

PAGE = "views/compare.py"
TINY_A = "the cat sat on the mat"
TINY_B = "the big dog sat on a mat"


def open_page(params: dict | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    for key, value in (params or {}).items():
        at.query_params[key] = value
    at.run()
    at.switch_page(PAGE).run()
    return at


@pytest.fixture
def tiny_models(monkeypatch):
    """``tiny-long`` and ``tiny-other`` (the same weights, another tokenizer) as model names."""
    bundle = tiny_long_bundle()
    other = cwviz.bundle_from_model(bundle.model, CharTokenizer(50), model_id="tiny-other")
    real = services.load_model
    named = {"tiny-long": bundle, "tiny-other": other}
    monkeypatch.setattr(services, "load_model", lambda name, **kw: named[name] if name in named else real(name, **kw))
    return bundle


def test_default_load_compares_the_example_with_its_minimal_pair():
    at = open_page()
    assert_clean(at)
    assert at.title[0].value == "Compare two inputs"
    assert at.text_area(key="prompt_b").value == compare_services.DEFAULT_PROMPT_B
    specs = charts(at)
    assert len(specs) == 3  # the maps, the head grid, the log-probabilities
    maps, grid, logprobs = specs
    assert "aligned by position" in title(maps) and "all heads" in title(maps)
    assert len(map_views(maps)) == 3
    assert "Change B" in title(grid) and "in divergence" in title(grid) and grid["_rows"] == 30 * 9
    assert "log-probability" in title(logprobs)
    assert all(spec["_rows"] < 5000 for spec in specs)
    assert {b.label for b in at.get("download_button")} >= {"PNG", "SVG", "CSV"}
    assert any("differ" in c.value for c in at.caption)


def test_a_link_restores_the_pickers_and_the_maps_follow_the_selection(tiny_models):
    at = open_page(
        {
            "model": "tiny-long",
            "prompt": TINY_A,
            "prompt_b": TINY_B,
            "cmp_map": "attention",
            "cmp_kind": "intra",
            "cmp_metric": "output_norm",
            "layer": "1",
            "head": "2",
        }
    )
    assert_clean(at)
    assert at.radio(key="cmp_map").value == "attention" and at.radio(key="cmp_kind").value == "intra"
    assert at.radio(key="cmp_metric").value == "output_norm"
    maps, grid, _ = charts(at)
    assert "layer 1, head 2" in title(maps) and "sequence alignment" in title(maps)
    assert "'attention_diff'" in str(maps) and "output norm" in title(grid)
    # The alignment is shown: the inserted and replaced tokens are in its table.
    table = at.dataframe[0].value
    assert {"insert", "equal"} <= set(table["op"])
    assert (table.loc[table["op"] == "insert", "position_a"] == "").all()  # only in B: an empty cell, not "None"
    at.radio(key="cmp_map").set_value("contribution").run()
    assert_clean(at)
    assert "'contribution_diff'" in str(charts(at)[0])


def test_identical_prompts_are_drawn_as_zero_change(tiny_models):
    at = open_page({"model": "tiny-long", "prompt": TINY_A, "prompt_b": TINY_A})
    assert_clean(at)
    assert any("aligned by position" in c.value and "0 step(s) differ" in c.value for c in at.caption)
    ranking = at.dataframe[-1].value
    assert (ranking["divergence_change"] == 0).all()


@pytest.mark.parametrize(
    "params, message",
    [
        ({"prompt_b": "   "}, "Input B: the prompt is empty"),
        ({"prompt_b": "x" * 2000}, "Input B: prompt has 2,000 tokens"),
        ({"model_b": "tiny-other"}, "Input B: the tokenizers of tiny-long and tiny-other differ"),
    ],
)
def test_a_prompt_b_that_cannot_be_compared_gets_a_clear_message(tiny_models, monkeypatch, params, message):
    monkeypatch.setenv("CWVIZ_APP_MAX_TOKENS", "512")
    at = open_page({"model": "tiny-long", "prompt": TINY_A, "prompt_b": TINY_B, **params})
    assert not at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and errors[0].startswith(message), errors
    assert not charts(at)


def test_an_encoder_is_compared_without_log_probabilities():
    at = open_page(
        {"model": "embedded-encoder", "prompt": "the cat sat on the mat", "prompt_b": "the big dog sat on a mat"}
    )
    assert_clean(at)
    assert any("predicts no next token" in i.value for i in at.info)
    maps, grid = charts(at)
    assert "sequence alignment" in title(maps) and "Change B" in title(grid)
    aligned = 7  # [CLS] the ... mat [SEP] against [CLS] the big dog ...: the paired tokens
    assert maps["_rows"] == aligned * aligned  # an encoder's maps are full squares


def test_prompt_b_starts_from_the_sidebar_prompt_not_the_example(tiny_models):
    at = open_page({"model": "tiny-long", "prompt": TINY_A})
    assert_clean(at)
    assert at.text_area(key="prompt_b").value == TINY_A  # the user's own prompt to edit, never the example beside it
    assert any("starts as the sidebar's prompt" in i.value for i in at.info)
    at.text_area(key="prompt_b").set_value(TINY_B).run()
    assert_clean(at)
    assert not any("starts as the sidebar's prompt" in i.value for i in at.info)


def test_the_example_b_says_it_is_an_example():
    at = open_page()
    assert any(c.value.startswith("Prompt B is an example (the first example") for c in at.caption)
