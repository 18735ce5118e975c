"""What the dashboard's tests share: the app run under ``streamlit.testing.v1.AppTest`` and read back (its charts, its
sidebar), and a link that sets every picker of every page (tests/app/test_links.py, tests/browser/test_browser.py)."""

from __future__ import annotations

import json
from pathlib import Path

from streamlit.dataframe_util import convert_arrow_bytes_to_pandas_df
from streamlit.testing.v1 import AppTest

from cwviz.app import state

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
TIMEOUT = 180


def run_app(page: str | None = None, params: dict | None = None) -> AppTest:
    """The dashboard run once in AppTest, with ``params`` in its URL, then switched to ``page`` if one is given."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    for key, value in (params or {}).items():
        at.query_params[key] = value
    at.run()
    if page is not None:
        at.switch_page(page).run()
    return at


def assert_clean(at: AppTest) -> None:
    """No exception and no error message on the page."""
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def charts(at: AppTest) -> list[dict]:
    """The Vega-Lite specs on the page, with the row count of their datasets. Each is checked against the Vega-Lite
    schema: the page converts its charts without Altair's check (:func:`cwviz.app.widgets._spec`)."""
    from altair.vegalite.v6.schema.core import Root

    out = []
    for element in at.get("vega_lite_chart"):
        spec = json.loads(element.proto.spec)
        Root.validate(spec)
        spec["_rows"] = sum(len(convert_arrow_bytes_to_pandas_df(d.data.data)) for d in element.proto.datasets)
        out.append(spec)
    return out


def title(spec: dict) -> str:
    """A chart spec's title as JSON text (a string, or a title with its subtitle)."""
    return json.dumps(spec.get("title"))


def widget(at: AppTest, kind: str, label: str):
    """The sidebar's widget of ``kind`` (``"selectbox"``, ``"slider"``, ...) labelled ``label``."""
    return next(w for w in getattr(at.sidebar, kind) if w.label == label)


# -- a link with every parameter ------------------------------------------------------------------
LINK_TEXT = state.examples()[1].text
SIDEBAR = {
    "prompt": LINK_TEXT,
    "layer": "3",
    "head": "2",
    "token": "4",
    "gen": "0",
    "dtype": "float32",
    "device": "cpu",
    "presenter": "true",
}

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
    "views/flow.py": (
        {"flow_at": "6", "target": " the", "foil_on": "true", "foil": " a", "kept": "0.5"},
        {"flow_at": 6, "target": " the", "foil_on": True, "foil": " a", "kept": 0.5},
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
            "prompt_b": LINK_TEXT + " Twice.",
            "model_b": "embedded",
            "cmp_map": "attention",
            "cmp_kind": "intra",
            "cmp_layout": "side",
            "cmp_metric": "sink_attention",
        },
        {
            "cmp_layout": "side",
            "prompt_b": LINK_TEXT + " Twice.",
            "model_b": "embedded",
            "cmp_map": "attention",
            "cmp_kind": "intra",
            "cmp_metric": "sink_attention",
        },
    ),
    "views/atlas.py": (
        {
            "atlas_source": "path",
            "atlas_path": "/data/prompts.jsonl",
            "atlas_n": "3",
            "atlas_out": "/tmp/cwviz-atlas-link",
        },
        {
            "atlas_source": "path",
            "atlas_path": "/data/prompts.jsonl",
            "atlas_n": 3,
            "atlas_out": "/tmp/cwviz-atlas-link",
        },
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
