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
            "heatmaps_range": "full",
            "heatmaps_measure": "value_weighted",
            "heatmaps_kind": "intra",
            "heatmaps_view": "binned",
            "heatmaps_layout": "stacked",
            "heatmaps_overview_metric": "sink_contribution",
        },
    ),
    "views/token.py": ({"token_kind": "intra", "top_k": "7"}, {"token_kind": "intra", "token_top_k": 7}),
    "views/bertviz_view.py": (
        {"bv_view": "model", "bv_weights": "contribution"},
        {"bertviz_view": "model", "bertviz_weights": "contribution"},
    ),
    "views/sinks.py": (
        {"sink": "position", "sink_pos": "1", "lambda": "0.5", "scope": "chosen", "layers": "1,3", "layerwise": "true"},
        {
            "sinks_choice": "position",
            "sinks_position": 1,
            "sinks_factor": 0.5,
            "sinks_scope": "chosen",
            "sinks_layers": [1, 3],
            "sinks_layerwise": True,
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
            "compare_layout": "side",
            "compare_prompt_b": TEXT + " Twice.",
            "compare_model_b": "embedded",
            "compare_map": "attention",
            "compare_kind": "intra",
            "compare_metric": "sink_attention",
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
            "faith_source": "path",
            "faith_path": "/data/examples.jsonl",
            "faith_field": "question",
            "faith_n": 3,
            "faith_cap": 64,
            "faith_rates": [10.0, 50.0],
            "faith_measures": ["raw", "random"],
            "faith_layer": 2,
            "faith_per_head": True,
            "faith_rank_by": "absolute",
            "faith_rank_scope": "layer",
            "faith_seed": 7,
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


@pytest.mark.parametrize("page", list(PAGES))
def test_a_link_with_every_parameter_restores_every_picker(page):
    params, expected = PAGES[page]
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    for name, value in {**SIDEBAR, **params}.items():
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
    shown = {key: _value(at, key) for key in expected}
    assert shown == expected
    for name, value in params.items():  # the URL keeps them (a rerun rewrites it from the widgets)
        assert at.query_params[name] == [value] or at.query_params[name] == value, name
