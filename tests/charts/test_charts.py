"""Chart builders are pure: checked on their ``to_dict()`` output, their row counts, and rendered SVG."""

from __future__ import annotations

import colorsys
import json
import math

import altair as alt
import pandas as pd
import pytest

import cwviz
from cwviz.analyses import bertviz as bertviz_html
from cwviz.analyses import tables
from cwviz.charts import export, head_grid, heatmaps, palette, token
from tests.helpers import LONG_TEXT, TEXT, CharTokenizer, make_tiny, tiny_long_bundle

XSS = "<img src=x onerror=alert(1)>"


class XssTokenizer(CharTokenizer):
    """Every 'x' decodes to an HTML payload, so token labels carry markup."""

    def decode(self, ids, **_):
        return "".join(XSS if int(i) == ord("x") % self.vocab_size else chr(97 + int(i) % 26) for i in ids)


#: The most keys whose heatmap pair stands side by side under the automatic layout.
WIDEST = max(keys for keys in range(1, 200) if heatmaps.side_by_side(keys))


@pytest.fixture(scope="module")
def analysis():
    return cwviz.analyze(make_tiny("llama"), TEXT[:WIDEST])  # the widest pair drawn side by side


@pytest.fixture(scope="module")
def xss_analysis():
    bundle = make_tiny("llama")
    bundle = cwviz.bundle_from_model(bundle.model, XssTokenizer(100), model_id="tiny-xss")
    return cwviz.analyze(bundle, "a fox x")


@pytest.fixture(scope="module")
def long_analysis():
    return cwviz.analyze(tiny_long_bundle(), LONG_TEXT)


def _views(spec: dict) -> list[dict]:
    return spec.get("hconcat") or spec.get("layer") or [spec]


def _rows(spec: dict) -> int:
    """Rows in the chart's inline datasets."""
    return sum(len(values) for values in spec.get("datasets", {}).values())


def test_heatmap_pair_encodes_positions_with_token_labels_and_both_scales(analysis):
    cells = tables.heatmap_cells(analysis, 1, 0, "contribution_inter", "inter")
    spec = heatmaps.heatmap_pair(cells).to_dict()
    left, right = (view["layer"][0] for view in spec["hconcat"])  # each heatmap, under its query outline
    assert _rows(spec) == len(cells.frame)  # one shared dataset
    for view in (left, right):
        assert view["encoding"]["x"]["field"] == "key" and view["encoding"]["x"]["type"] == "ordinal"
        assert view["encoding"]["y"]["field"] == "query" and view["encoding"]["y"]["type"] == "ordinal"
        assert json.dumps(f"0 {analysis.tokens[0]}") in view["encoding"]["x"]["axis"]["labelExpr"]  # position and token
        tips = {t["field"] for t in view["encoding"]["tooltip"]}
        assert {"query_token", "key_token", "attention", "norm_ratio", "cosine", "contribution"} <= tips
    attention_scale = left["encoding"]["color"]["scale"]
    assert attention_scale["scheme"] == heatmaps.SEQUENTIAL and attention_scale["domain"][0] == 0
    contribution_scale = right["encoding"]["color"]["scale"]
    assert contribution_scale["scheme"] == heatmaps.DIVERGING and contribution_scale["domainMid"] == 0
    low, high = contribution_scale["domain"]
    off_sink = cells.frame.loc[cells.frame["key"] != 0, "value"].abs()
    assert low == -high and high == pytest.approx(off_sink.quantile(heatmaps.ROBUST_QUANTILE))
    assert contribution_scale["type"] == "symlog" and contribution_scale["clamp"] is True
    assert spec["resolve"]["scale"]["color"] == "independent"
    assert cells.note in json.dumps(spec["title"])
    # The selected query (the last token by default) is outlined on both heatmaps; a click selects a query.
    for view in spec["hconcat"]:
        frame = view["layer"][1]
        assert (
            frame["mark"]["stroke"] == "black"
            and {"filter": f"(datum.query === {analysis.num_tokens - 1})"} in frame["transform"]
        )
    assert spec["params"][0]["name"] == heatmaps.QUERY_PICK and spec["params"][0]["select"]["fields"] == [
        "query_position"
    ]
    assert len(spec["params"][0]["views"]) == 2


def test_the_contribution_scale_ends_at_a_robust_quantile_off_the_sink_and_says_when_it_clamps():
    """The sink's +1 must not set the end of the scale: a map whose other cells are within ±0.05 ends near 0.05,
    so that -0.03 is more than half-way to full blue on the symlog scale; "full" ends at the largest value."""
    values = pd.Series([1.0, -0.03, 0.04, -0.05, 0.001] * 20)
    sink = pd.Series([True, False, False, False, False] * 20)
    robust, title = heatmaps.contribution_scale(values, sink)
    assert robust.domain == [-0.05, 0.05] and title[0] == "clamped"  # the sink's +1 is beyond the end
    full, title = heatmaps.contribution_scale(values, sink, "full")
    assert full.domain == [-1.0, 1.0] and title[0] == "range"

    def share(value: float, bound: float) -> float:  # how far towards the end colour the symlog scale puts a value
        c = heatmaps.SYMLOG_CONSTANT
        return math.log1p(abs(value) / c) / math.log1p(bound / c)

    assert share(-0.03, 0.05) > 0.6 and share(-0.03, 1.0) > 0.25 and share(0.001, 0.05) < 0.1
    assert heatmaps.contribution_bound(pd.Series([0.0, 0.0]), pd.Series([False, False])) == 1.0  # no range: ±1
    with pytest.raises(ValueError, match="robust, full"):
        heatmaps.contribution_scale(values, sink, "wide")


def test_labels_are_thinned_to_never_overlap_but_keep_the_sink_and_the_query():
    """Rows of a 30-token map in 240 px leave 8 px a row: a 12 px label every second row, the first token and the
    query always labelled, their neighbours left out."""
    assert heatmaps.label_stride(30, 240, 12) == 2 and heatmaps.label_stride(30, 600, 12) == 1
    assert heatmaps.label_stride(30, 240, 16) == 3
    labels = [f"{i} t" for i in range(30)]
    expr = heatmaps.thinned_label_expr(labels, list(range(30)), 13, 2)
    shown = [i for i in range(30) if _vega_label(expr, i)]
    assert 0 in shown and 13 in shown and 12 not in shown and 14 not in shown
    assert all(b - a >= 2 for a, b in zip(shown, shown[1:]))
    assert len(shown) >= 13


def _vega_label(expr: str, value: int) -> bool:
    """Evaluate :func:`heatmaps.thinned_label_expr`'s condition in Python (its operators are Python's too)."""
    condition = expr.split(" ? ")[0].replace("datum.value", str(value)).replace("||", " or ").replace("&&", " and ")
    return bool(eval(condition, {"abs": abs}))


def test_unsigned_measures_get_a_sequential_scale(analysis):
    """Value-weighted attention is a magnitude, not attention: its map is not attention's green (issue 56: green drew
    the value-weighted right map); raw attention is attention, and green."""
    cells = tables.heatmap_cells(analysis, 0, None, "value_weighted", "inter")
    right = heatmaps.heatmap_pair(cells).to_dict()["hconcat"][1]["layer"][0]
    assert right["encoding"]["color"]["scale"]["scheme"] == palette.OTHER_SCHEME != palette.ATTENTION_SCHEME
    assert "value" in {t["field"] for t in right["encoding"]["tooltip"]}
    raw = heatmaps.heatmap_pair(tables.heatmap_cells(analysis, 0, None, "raw", "inter")).to_dict()["hconcat"][1][
        "layer"
    ][0]
    assert raw["encoding"]["color"]["scale"]["scheme"] == palette.ATTENTION_SCHEME


@pytest.mark.parametrize("view", tables.VIEWS)
def test_512_token_heatmaps_stay_under_the_altair_row_limit(long_analysis, view):
    assert long_analysis.num_tokens == 512
    cells = tables.heatmap_cells(long_analysis, 0, None, "contribution_inter", "inter", query=400, view=view)
    spec = heatmaps.heatmap_pair(cells).to_dict()  # raises MaxRowsError above 5000 rows
    assert _rows(spec) == len(cells.frame) < 5000
    assert ("window" if view == "window" else "bins") in json.dumps(spec["title"])


def test_chart_text_stays_text(xss_analysis):
    assert XSS in xss_analysis.tokens
    cells = tables.heatmap_cells(xss_analysis, 0, 0, "contribution_inter", "inter")
    svg = export.to_svg(heatmaps.heatmap_pair(cells)).decode()
    assert "<img" not in svg
    assert "&lt;img src=x onerror=alert(1)&gt;" in svg


def test_head_overview_has_a_pick_selection_and_one_cell_per_head(analysis):
    summary = tables.head_summary(analysis)
    spec = head_grid.head_overview(summary, "divergence", layer=1, head=2).to_dict()
    grid = spec["layer"][0]
    params = grid.get("params") or spec.get("params")
    pick = next(p for p in params if p["name"] == "pick")
    assert pick["select"]["fields"] == ["layer", "head"]
    assert len(spec["layer"]) == 2  # the selected head is outlined
    assert _rows(spec) == len(summary) + 1
    assert spec["height"] >= head_grid.OVERVIEW_MIN_HEIGHT  # two layers still get a readable grid
    with pytest.raises(ValueError, match="metric"):
        head_grid.head_overview(summary, "nonsense")


def test_factor_bars_sort_keys_by_contribution_and_mark_the_sink(analysis):
    factors = tables.token_factors(analysis, 1, analysis.num_tokens - 1, 3, "inter", top=8)
    spec = token.factor_bars(factors).to_dict()
    panels = spec["hconcat"]
    assert len(panels) == 4
    bars = [panel["layer"][0] for panel in panels]  # each panel: its bars, and each bar's number beside it
    order = panels[0]["encoding"]["y"]["sort"] if "encoding" in panels[0] else bars[0]["encoding"]["y"]["sort"]
    assert order == factors.wide["key"].tolist()
    colour = json.dumps(bars[0]["encoding"]["color"])
    assert "is_sink" in colour and token.SINK_COLOUR in colour and token.KEY_COLOUR in colour
    for hex_colour in (token.SINK_COLOUR, token.KEY_COLOUR):  # no bar looks like a heatmap's sign (red +, blue −)
        r, g, b = (int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5))
        hue, lightness, saturation = colorsys.rgb_to_hls(r, g, b)
        assert saturation < 0.15 or 0.72 < hue < 0.9, hex_colour  # grey, or purple
    assert _rows(spec) == len(factors.frame)
    filters = [json.dumps(panel["layer"][0]["transform"]) for panel in panels]
    assert all(name in f for name, f in zip(factors.factors, filters))
    # Linear axes a class can compare (issue 56: a symlog axis drew -0.033 as long as -0.6), each bar's value written.
    assert "symlog" not in json.dumps(spec)
    for panel in panels:
        bar, numbers = panel["layer"]
        assert bar["mark"]["type"] == "bar" and numbers["mark"]["type"] == "text"
        assert bar["encoding"]["x"]["scale"].get("type", "linear") == "linear"


def test_top_keys_chart_rows_and_its_rank_in_greys(analysis):
    """The rank is no sign: its cells are shaded in greys by rank, not in the contribution's red (issue 56)."""
    top = tables.top_keys_across_layers(analysis, 10, 1, "intra", k=4)
    spec = token.top_keys_chart(top, "note").to_dict()
    assert _rows(spec) == len(top) == analysis.num_layers * 4
    colour = spec["layer"][0]["encoding"]["color"]
    assert colour["field"] == "rank" and colour["scale"]["scheme"] == palette.OTHER_SCHEME


def test_exports_are_png_svg_and_csv(analysis):
    cells = tables.heatmap_cells(analysis, 0, 0, "raw", "inter")
    chart = heatmaps.heatmap_pair(cells)
    assert export.render_spec(chart.to_dict(), "png", scale=1).startswith(b"\x89PNG")
    assert export.to_svg(chart).lstrip().startswith(b"<svg")
    csv = export.to_csv(cells.frame).decode().splitlines()
    assert csv[0].startswith("layer,head,query,key") and len(csv) == len(cells.frame) + 1
    with pytest.raises(ValueError):
        export.render_spec(chart.to_dict(), "gif")


def test_bertviz_html_escapes_tokens_and_explains_a_missing_cdn(xss_analysis):
    for view in bertviz_html.BERTVIZ_VIEWS:
        for weights in bertviz_html.WEIGHTS:
            html = bertviz_html.render(xss_analysis, view=view, weights=weights, layer=0)
            assert "<img" not in html
            assert "\\u003cimg src=x onerror=alert(1)\\u003e" in html
            assert bertviz_html.FALLBACK_ID in html and "cdnjs" in html
            assert "__cwviz_token_" not in html


def test_bertviz_contributions_are_clipped_at_zero(analysis):
    weights = bertviz_html.weights(analysis, 1, "contribution", analysis.num_tokens)
    assert (weights >= 0).all()
    assert (analysis.contributions(1, "intra") < 0).any()  # so clipping matters on this model


def test_bertviz_scope_caps_tokens_and_layers(long_analysis):
    head = bertviz_html.scope(long_analysis, "head", 1)
    model = bertviz_html.scope(long_analysis, "model", 1)
    assert head.tokens == bertviz_html.HEAD_VIEW_TOKENS and head.layers == (1,)
    assert model.tokens == bertviz_html.MODEL_VIEW_TOKENS and len(model.layers) <= bertviz_html.MODEL_VIEW_LAYERS
    assert "first" in head.note


def test_label_expression_is_valid_for_awkward_tokens():
    labels = ['"', "\\", "</script>", "é", "\u202e"]
    chart = (
        alt.Chart(alt.Data(values=[{"k": i} for i in range(5)]))
        .mark_point()
        .encode(x=alt.X("k:O", axis=alt.Axis(labelExpr=heatmaps.label_expr(labels))))
    )
    svg = export.to_svg(chart).decode()
    assert "&lt;/script&gt;" in svg and "é" in svg


def test_csv_cells_that_look_like_formulas_are_neutralised_and_numbers_stay_numbers():
    import csv
    import io

    import pandas as pd

    from cwviz.charts.export import to_csv

    frame = pd.DataFrame(
        {
            "token": ["=1+1", "+x", "-x", "@x", "\tx", "\rx", "plain", "a=b"],
            "value": [-0.5, 1.0, -2.0, 0.0, 3.5, -1e-9, 2.0, 4.0],
        }
    )
    frame["head"] = "all heads"
    header, *rows = csv.reader(io.StringIO(to_csv(frame).decode("utf-8"), newline=""))
    assert header == ["token", "value", "head"]
    assert [r[0] for r in rows] == ["'=1+1", "'+x", "'-x", "'@x", "'\tx", "'\rx", "plain", "a=b"]
    assert [float(r[1]) for r in rows] == frame["value"].tolist()  # negative numbers stay numbers, unquoted
    assert rows[0][1] == "-0.5" and {r[2] for r in rows} == {"all heads"}


def test_the_automatic_layout_keeps_a_pair_side_by_side_only_while_it_fits_a_laptop_page():
    """A side-by-side pair is as wide as the page of a 1,366 px window allows (PAIR_FITS), never wider; a pair
    up to a couple of dozen keys still stands side by side (the default prompts' size)."""
    assert 20 <= WIDEST < 40
    for keys in (1, WIDEST, WIDEST + 1, 500):
        width = 2 * (max(heatmaps.SIDE, heatmaps.CELL * keys) + heatmaps.VIEW_EXTRA)
        assert heatmaps.side_by_side(keys) == (width <= heatmaps.PAIR_FITS)
    assert heatmaps.side_by_side(500, "side") and not heatmaps.side_by_side(3, "stacked")
    with pytest.raises(ValueError, match="layout must be one of"):
        heatmaps.side_by_side(3, "diagonal")


def test_a_pair_is_laid_out_as_asked_and_its_title_lines_fit_it(analysis):
    cells = tables.heatmap_cells(analysis, 0, None, "contribution_inter", "inter")
    stacked = heatmaps.heatmap_pair(cells, layout="stacked").to_dict()
    assert "vconcat" in stacked and len(stacked["vconcat"]) == 2
    for spec, views in ((stacked, 1), (heatmaps.heatmap_pair(cells).to_dict(), 2)):
        lines = spec["title"]["text"]
        assert any(cells.note.split("; ")[0] in line for line in lines)
        longest = views * (heatmaps._extent(analysis.num_tokens) + heatmaps.VIEW_EXTRA) // heatmaps.TITLE_PX_PER_CHAR
        assert all(len(line) <= longest for line in lines if "; " in line)
    for view in stacked["vconcat"]:  # each legend right of its map, as tall as it
        legend = view["layer"][0]["encoding"]["color"]["legend"]
        assert legend["orient"] == "right" and legend["gradientLength"] == view["height"]


def test_pairs_wider_than_side_by_side_are_stacked_and_every_position_keeps_its_label():
    analysis = cwviz.analyze(make_tiny("llama"), TEXT[: WIDEST + 1])
    spec = heatmaps.heatmap_pair(tables.heatmap_cells(analysis, 0, None, "contribution_inter", "inter")).to_dict()
    assert "vconcat" in spec and "hconcat" not in spec
    for view in spec["vconcat"]:
        assert view["width"] == view["height"] == heatmaps.CELL * analysis.num_tokens
        assert view["layer"][0]["encoding"]["x"]["axis"]["labelOverlap"] is False
