"""cwviz.plot, the notebook API: each function returns an Altair chart drawn from the very table the
library computes for the dashboard, rejects out-of-range selections with cwviz's errors, and importing
it does not import Streamlit."""

from __future__ import annotations

import json
import subprocess
import sys

import altair as alt
import numpy as np
import pandas as pd
import pytest

import cwviz
from cwviz import plot
from cwviz.analyses import faithfulness, faithfulness_summary, route, sink_interventions, sinks, tables
from cwviz.charts import flow as flow_charts
from cwviz.charts import heatmaps as heatmap_charts
from cwviz.charts.palette import NEGATIVE, POSITIVE
from cwviz.core.method import attribution
from tests.helpers import TEXT, assert_drawn_from, datasets, make_tiny


@pytest.fixture(scope="module")
def analysis():
    return cwviz.analyze(make_tiny("llama"), TEXT[:30])


def outlined_queries(chart) -> list[int]:
    """The query rows the heatmap pair outlines (one per heatmap): the outline layer filters the pair's data."""
    import re

    spec = json.dumps(chart.to_dict())
    return [int(q) for q in re.findall(r"datum\.query === (\d+)", spec)]


# -- Heatmaps and Token pages ----------------------------------------------------------------------------
@pytest.mark.parametrize("head", [None, 2])
def test_heatmaps_draw_the_heatmap_cells_and_outline_the_query(analysis, head):
    chart = plot.heatmaps(analysis, 1, head=head, measure="contribution", kind="intra", query=7)
    cells = tables.heatmap_cells(analysis, 1, head, "contribution_intra", "intra", query=7)
    assert_drawn_from(chart, cells.frame)
    assert outlined_queries(chart) == [7, 7]  # the outline of the query's row, on both heatmaps
    params = [p["name"] for p in chart.to_dict().get("params", [])]
    assert heatmap_charts.QUERY_PICK in params  # the dashboard's click-to-select-a-query comes along


def test_heatmaps_default_to_the_last_query_and_take_measure_names(analysis):
    chart = plot.heatmaps(analysis, 0, measure="value_weighted_output_normalized_intra")
    cells = tables.heatmap_cells(analysis, 0, None, "value_weighted_output_normalized_intra", "inter")
    assert_drawn_from(chart, cells.frame)
    assert outlined_queries(chart) == [analysis.num_tokens - 1] * 2


def test_head_overview_draws_the_head_summary(analysis):
    assert_drawn_from(plot.head_overview(analysis, "sink_attention", layer=1, head=0), tables.head_summary(analysis))


@pytest.mark.parametrize("head", [None, 1])
def test_token_factors_draw_the_factor_table(analysis, head):
    chart = plot.token_factors(analysis, 1, 12, head=head, kind="inter")
    assert_drawn_from(chart, tables.token_factors(analysis, 1, 12, head, "inter").frame)


def test_top_keys_draw_the_keys_across_layers(analysis):
    chart = plot.top_keys(analysis, 12, head=None, kind="intra", k=3)
    assert_drawn_from(chart, tables.top_keys_across_layers(analysis, 12, None, "intra", 3))


# -- Sinks page ----------------------------------------------------------------------------------------
def test_sink_ratio_draws_the_heads_rows_and_its_typical_curve(analysis):
    table = sinks.sink_table(analysis, 0)
    chart = plot.sink_ratio(analysis, 1, head=2, query=5)
    assert_drawn_from(chart, table[(table["layer"] == 1) & (table["head"] == 2)])
    curve = sinks.head_curve(table, 1, 2).table()
    drawn = [pd.DataFrame(rows) for rows in datasets(chart)]
    assert any(
        len(d) == len(curve) and d[["sink_ratio", "output_norm"]].equals(curve) for d in drawn if "output_norm" in d
    )


def test_sink_ratio_for_all_heads_draws_the_most_anti_aligned_head(analysis):
    table = sinks.sink_table(analysis, 0)
    heads = sinks.sink_head_summary(table)
    worst = int(heads[heads["layer"] == 0].sort_values("cos_sink_rest").iloc[0]["head"])
    assert_drawn_from(plot.sink_ratio(analysis, 0), table[(table["layer"] == 0) & (table["head"] == worst)])


def test_sink_charts_take_a_pooled_table(analysis):
    other = cwviz.analyze(analysis.bundle, TEXT[30:60])
    pooled = sinks.pool_tables([sinks.sink_table(analysis), sinks.sink_table(other)])
    assert_drawn_from(plot.sink_ratio(pooled, 1, head=0), pooled[(pooled["layer"] == 1) & (pooled["head"] == 0)])
    assert_drawn_from(plot.anti_alignment(pooled, layer=1), sinks.sink_head_summary(pooled))
    with pytest.raises(cwviz.SelectionError, match="layer 5"):
        plot.sink_shares(pooled, layer=5)
    with pytest.raises(cwviz.InputError, match="not a sink table"):
        plot.sink_shares(pooled.drop(columns="cos_sink_rest"))


def test_anti_alignment_and_shares_draw_the_sink_summaries(analysis):
    table = sinks.sink_table(analysis, 3)
    assert_drawn_from(plot.anti_alignment(analysis, sink=3, layer=1, head=1), sinks.sink_head_summary(table))
    shares = plot.sink_shares(analysis, sink=3, layer=1)
    layers = sinks.sink_layer_summary(table)
    drawn = pd.DataFrame(max(datasets(shares), key=len))  # the long form of the summary: a row per layer and share
    attention = drawn[drawn["measure"] == "attention"].sort_values("layer")["share"].tolist()
    contribution = drawn[drawn["measure"] == "contribution weight"].sort_values("layer")["share"].tolist()
    assert attention == layers["sink_attention_share"].tolist()
    assert contribution == layers["sink_contribution_share"].tolist()


def test_sink_intervention_draws_the_intervention_table(analysis):
    chart = plot.sink_intervention(analysis, sink=0, factor=0.0, layers=[1])
    assert_drawn_from(chart, sink_interventions.intervene_on_sink(analysis, 0, 0.0, (1,)).table)


# -- Faithfulness page ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def per_example(analysis):
    protocol = faithfulness.Protocol(rates=(10, 50), measures=("raw", "contribution_inter", "random"))
    return faithfulness.run_example(analysis.bundle, analysis.input_ids, protocol)


def test_faithfulness_curves_from_per_example_results_and_from_a_summary(per_example):
    summary = faithfulness_summary.summarize(per_example)
    both = plot.faithfulness_curves(per_example)
    assert isinstance(both, alt.VConcatChart)
    for curve in faithfulness.CURVES:
        assert_drawn_from(both, summary[summary["curve"] == curve])
    one = plot.faithfulness_curves(summary, scale="symlog", curve="sufficiency")
    assert_drawn_from(one, summary[summary["curve"] == "sufficiency"])
    assert len(datasets(one)) == 1


def test_faithfulness_curves_reject_what_they_cannot_draw(per_example):
    with pytest.raises(cwviz.InputError, match="scale"):
        plot.faithfulness_curves(per_example, scale="log")
    with pytest.raises(cwviz.InputError, match="curve"):
        plot.faithfulness_curves(per_example, curve="both")
    with pytest.raises(cwviz.InputError, match="no faithfulness results"):
        plot.faithfulness_curves(pd.DataFrame({"layer": [0]}))


# -- errors ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "call, match",
    [
        (lambda a: plot.heatmaps(a, a.num_layers), "layer"),
        (lambda a: plot.heatmaps(a, 0, head=a.num_heads), "head"),
        (lambda a: plot.heatmaps(a, 0, query=a.num_tokens), "token"),
        (lambda a: plot.head_overview(a, layer=-1), "layer"),
        (lambda a: plot.token_factors(a, 0, a.num_tokens), "token"),
        (lambda a: plot.token_factors(a, 0, 3, head=-1), "head"),
        (lambda a: plot.top_keys(a, -2), "token"),
        (lambda a: plot.sink_ratio(a, a.num_layers), "layer"),
        (lambda a: plot.sink_ratio(a, 0, head=a.num_heads), "head"),
        (lambda a: plot.anti_alignment(a, sink=a.num_tokens), "token"),
    ],
)
def test_out_of_range_selections_raise_selection_errors(analysis, call, match):
    with pytest.raises(cwviz.SelectionError, match=match):
        call(analysis)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda a: plot.heatmaps(a, 0, measure="attention"), "unknown measure"),
        (lambda a: plot.heatmaps(a, 0, kind="both"), "kind"),
        (lambda a: plot.heatmaps(a, 0, view="zoom"), "view"),
        (lambda a: plot.heatmaps(a, 0, layout="diagonal"), "layout"),
        (lambda a: plot.head_overview(a, metric="norm"), "metric"),
        (lambda a: plot.token_factors(a, 0, 3, kind="outer"), "kind"),
        (lambda a: plot.top_keys(a, 3, k=0), "at least 1"),
        (lambda a: plot.sink_shares(a, sink="middle"), "sink"),
        (lambda a: plot.sink_ratio([a], 0), "Analysis"),
    ],
)
def test_unknown_names_raise_input_errors(analysis, call, match):
    with pytest.raises(cwviz.InputError, match=match):
        call(analysis)


def test_importing_plot_does_not_import_streamlit():
    code = (
        "import sys, cwviz.plot; assert 'streamlit' not in sys.modules, sorted(m for m in sys.modules if 'streamlit' "
        "in m)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_plot_is_a_top_level_name():
    assert cwviz.plot is plot


# -- the Flow page (docs/METHOD.md sections 6 and 7) ------------------------------------------------------------
def test_flow_draws_the_pages_route_beside_every_tokens_score_under_the_flows_sentence(analysis):
    """``plot.flow`` is the Flow page's first screen: the route's edges exactly (route.of at the kept fraction, the
    builder the page and ``cwviz flow`` use), every token's score with its sign, and the sentence saying what is
    explained; from a Flow (the share flow) as from an Analysis (the page's default method)."""
    result = cwviz.flow(analysis, target=11, foil=60)
    chart = plot.flow(result, kept=0.5)
    assert isinstance(chart, alt.HConcatChart)
    rows = [r for rows_ in datasets(chart) for r in rows_]
    drawn_scores = [r for r in rows if "score" in r]  # the largest |score| (all tokens up to TOTAL_ROWS)
    largest = set(np.argsort(-np.abs(result.totals))[: flow_charts.TOTAL_ROWS].tolist())
    drawn = route.of(attribution.of_flow(result), 0.5)
    assert largest <= {r["position"] for r in drawn_scores} <= largest | set(drawn.connected)
    assert all(r["score"] == pytest.approx(result.totals[r["position"]], abs=1e-6) for r in drawn_scores)
    assert all(r["sign"] == ("adds" if r["score"] >= 0 else "subtracts") for r in drawn_scores)
    expected = drawn.edges
    drawn_edges = pd.DataFrame([r for r in rows if "weight" in r])
    assert len(drawn_edges) == len(expected) > 0
    assert sorted(zip(drawn_edges["layer"], drawn_edges["key"], drawn_edges["query"])) == sorted(
        zip(expected["layer"], expected["key"], expected["query"])
    )
    title = json.dumps(chart.to_dict()["title"])
    assert "toward logit(" in title and "share flow" in title
    assert isinstance(plot.flow(analysis, position=5), alt.HConcatChart)  # from an Analysis
    with pytest.raises(cwviz.InputError):
        plot.flow(pd.DataFrame())


def test_flow_charts_colour_adds_red_and_subtracts_blue():
    """The flow's one sign scale: 0 and above adds (red), below subtracts (blue), on every chart of the set."""
    tokens = pd.DataFrame({"position": [0, 1, 2], "token": ["a", "b", "c"], "score": [0.5, -0.25, 0.0]})
    rows = flow_charts.total_rows(tokens, "score")
    assert list(rows["sign"]) == ["adds", "subtracts", "adds"]
    scatter = tokens.assign(effect=[0.1, 0.2, 0.3])
    for chart in (flow_charts.totals_bars(rows, "scores", value="score"), flow_charts.check_scatter(scatter, "check")):
        colours = [
            v["encoding"]["color"]["scale"] for v in chart.to_dict()["layer"] if "color" in v.get("encoding", {})
        ]
        assert colours == [{"domain": ["adds", "subtracts"], "range": [POSITIVE, NEGATIVE]}]
