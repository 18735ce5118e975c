"""A link restores every picker: for each page, a URL with every parameter set to a value other than its
default opens with each widget showing that value, the sidebar included, and the URL keeps them.

The browser test (tests/browser/test_browser.py) checks the same in Chromium for a fresh browser context.
"""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from cwviz.app import state
from tests.app.test_app import APP, TIMEOUT, assert_clean, widget

TEXT = state.examples()[1].text
SIDEBAR = {"prompt": TEXT, "layer": "3", "head": "2", "token": "4", "gen": "0", "dtype": "float32", "device": "cpu", "presenter": "true"}

# page: (its parameters, {widget key: the value the widget must show})
PAGES = {
    "views/heatmaps.py": (
        {
            "measure": "value_weighted",
            "kind": "intra",
            "view": "binned",
            "layout": "stacked",
            "colour": "sink_contribution",
            "range": "full",
        },
        {
            "range": "full",
            "measure": "value_weighted",
            "kind": "intra",
            "view": "binned",
            "layout": "stacked",
            "colour": "sink_contribution",
        },
    ),
    "views/token.py": ({"token_kind": "intra", "top_k": "7"}, {"token_kind": "intra", "top_k": 7}),
    "views/bertviz_view.py": (
        {"bv_view": "model", "bv_weights": "contribution"},
        {"bv_view": "model", "bv_weights": "contribution"},
    ),
    "views/sinks.py": (
        {"sink": "position", "sink_pos": "1", "lambda": "0.5", "scope": "chosen", "layers": "1,3", "layerwise": "true"},
        {
            "sink": "position",
            "sink_pos": 1,
            "lambda": 0.5,
            "scope": "chosen",
            "layers": [1, 3],
            "layerwise": True,
        },
    ),
    "views/compare.py": (
        {
            "prompt_b": TEXT + " Twice.",
            "model_b": "embedded",
            "cmp_map": "attention",
            "cmp_kind": "intra",
            "cmp_layout": "side",
            "cmp_metric": "sink_attention",
        },
        {
            "cmp_layout": "side",
            "prompt_b": TEXT + " Twice.",
            "model_b": "embedded",
            "cmp_map": "attention",
            "cmp_kind": "intra",
            "cmp_metric": "sink_attention",
        },
    ),
    "views/atlas.py": (
        {"atlas_source": "path", "atlas_path": "/data/prompts.jsonl", "atlas_n": "3", "atlas_out": "/tmp/cwviz-atlas-link"},
        {"atlas_source": "path", "atlas_path": "/data/prompts.jsonl", "atlas_n": 3, "atlas_out": "/tmp/cwviz-atlas-link"},
    ),
    "views/claims.py": (
        {"claims_source": "run", "claims_n": "3", "claims_cap": "32"},
        {"claims_source": "run", "claims_n": 3, "claims_cap": 32},
    ),
    "views/faithfulness.py": (
        {
            "source": "path",
            "path": "/data/examples.jsonl",
            "field": "question",
            "n": "3",
            "cap": "64",
            "rates": "10,50",
            "measures": "raw,random",
            "mask_layer": "2",
            "per_head": "true",
            "rank_by": "absolute",
            "rank_scope": "layer",
            "seed": "7",
        },
        {
            "source": "path",
            "path": "/data/examples.jsonl",
            "field": "question",
            "n": 3,
            "cap": 64,
            "rates": [10.0, 50.0],
            "measures": ["raw", "random"],
            "mask_layer": 2,
            "per_head": True,
            "rank_by": "absolute",
            "rank_scope": "layer",
            "seed": 7,
        },
    ),
}


def _value(at: AppTest, key: str):
    for kind in (
        "radio",
        "selectbox",
        "multiselect",
        "button_group",
        "slider",
        "number_input",
        "text_input",
        "text_area",
        "checkbox",
        "toggle",
    ):
        found = [w for w in at.get(kind) if getattr(w, "key", None) == key]
        if found:
            return found[0].value
    raise AssertionError(f"no widget with key {key!r} on the page")


def _open(page: str, params: dict) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    for name, value in params.items():
        at.query_params[name] = value
    at.switch_page(page)
    at.run()
    assert_clean(at)
    assert not at.warning, [w.value for w in at.warning]
    assert widget(at, "slider", "Layer").value == 3
    assert widget(at, "selectbox", "Head").value == 2
    assert widget(at, "selectbox", "Query token").value == 4
    assert _value(at, state.PRESENTER) is True
    assert widget(at, "text_area", "Prompt").value == TEXT
    assert widget(at, "selectbox", "Dtype").value == "float32"
    assert widget(at, "selectbox", "Device").value == "cpu"
    return at


@pytest.mark.parametrize("page", list(PAGES))
def test_a_link_with_every_parameter_restores_every_picker(page):
    """A link written with the parameter names and values links have had (``kind=intra``, ``rates=10,50``) restores
    every picker. From the next run on (any click), the URL holds each picker's value in the form Streamlit's
    binding writes (the shown label, repeated parameters), and that URL, opened in turn, restores the same view."""
    params, expected = PAGES[page]
    at = _open(page, {**SIDEBAR, **params})
    assert {key: _value(at, key) for key in expected} == expected
    at.run()
    assert {key: _value(at, key) for key in expected} == expected
    url = dict(at.query_params)
    # Streamlit leaves a value equal to the widget's default out of the URL: claims_source=run is the default.
    assert set(params) - {"claims_source"} <= set(url), sorted(set(params) - set(url))
    again = _open(page, url)
    assert {key: _value(again, key) for key in expected} == expected


def test_a_malformed_picker_value_in_a_link_is_explained_and_the_default_shown():
    """Each kind of picker: an unknown option, a number out of range, a list with an unknown item, a boolean that is
    none. Each gets one warning naming it, the picker shows its default, and the URL drops the value."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    bad = {"kind": "sideways", "top_k": "99", "layerwise": "maybe", "measures": "raw,nonsense"}
    for name, value in bad.items():
        at.query_params[name] = value
    at.switch_page("views/heatmaps.py").run()
    assert_clean(at)
    assert _value(at, "kind") == "inter"
    assert [w.value for w in at.warning] == ["kind='sideways' in the link is not a valid choice for “Normalise by”; showing the default"]
    assert "kind" not in at.query_params
    for page, key, default in (("token", "top_k", 5), ("sinks", "layerwise", False), ("faithfulness", "measures", None)):
        at = AppTest.from_file(APP, default_timeout=TIMEOUT)
        at.query_params[key] = bad[key]
        at.switch_page(f"views/{page}.py").run()
        assert_clean(at)
        assert [w.value for w in at.warning if f"{key}=" in w.value], (page, [w.value for w in at.warning])
        if default is not None:
            assert _value(at, key) == default
        assert key not in at.query_params, (key, at.query_params)


def test_a_link_with_a_kind_pickers_earlier_label_still_picks_that_kind():
    """Every kind picker shows one label (:data:`cwviz.vocabulary.KIND_LABELS`); a link that holds the label the Token
    or Compare page showed before, in the form Streamlit's binding wrote it, still picks that kind, with no warning."""
    assert state.parse_kind("head output ‖o_i^h‖ (intra)") == "intra" and state.parse_kind(" inter ") == "inter"
    with pytest.raises(ValueError):
        state.parse_kind("sideways")
    at = _open("views/token.py", {**SIDEBAR, "token_kind": "head output ‖o_q^h‖ (intra)"})
    assert _value(at, "token_kind") == "intra"
