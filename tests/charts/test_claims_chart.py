"""The claims forest plot: one row per verdict, its interval, estimate and line, coloured and shaped by the verdict;
claim 1's ties by construction drawn apart."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from cwviz.analyses.schema import VERDICT_STATES
from cwviz.charts import claims as charts_claims
from cwviz.charts import palette
from cwviz.charts.palette import NEGATIVE, POSITIVE, VERDICT_COLOURS, VERDICT_SHAPES

ROWS = pd.DataFrame(
    {
        "claim": [1, 1, 1, 4, 5],
        "label": ["1 token comp. 10 %", "1 token suff. 10 %", "1 query comp. 10 %", "4", "5a"],
        "verdict": ["holds", "fails", "ties by construction", "unresolved", "holds"],
        "statistic": ["a", "b", "e", "c", "d"],
        "estimate": [0.2, -0.1, 0.05, 0.5, 0.03],
        "ci_low": [0.1, -0.2, -0.02, 0.3, 0.01],
        "ci_high": [0.3, -0.05, 0.1, 0.7, 0.05],
        "line": [0.0, 0.0, 0.0, 0.1, 0.0],
        "n": [50, 50, 50, 50, 50],
    }
)


def test_the_forest_draws_one_row_per_verdict_in_a_panel_per_claim_against_its_line():
    spec = charts_claims.forest(ROWS).to_dict()
    assert len(spec["vconcat"]) == 4  # claim 1, claim 1's ties by construction, 4, 5
    drawn = [row for rows in spec["datasets"].values() for row in rows]
    assert {row["label"] for row in drawn} == set(ROWS.label)
    assert {row["line"] for row in drawn if row["claim"] == 4} == {0.1}
    text = json.dumps(spec)
    assert all(colour in text for colour in VERDICT_COLOURS.values())
    assert POSITIVE not in text and NEGATIVE not in text  # red and blue mean a sign, never a verdict


def test_the_ties_by_construction_get_a_panel_of_their_own_after_claim_ones_other_rows():
    spec = charts_claims.forest(ROWS).to_dict()
    titles = [panel["title"]["text"] for panel in spec["vconcat"]]
    assert titles[1] == charts_claims.TIES_TITLE and titles[0] == charts_claims.TITLES[1]
    datasets = spec["datasets"]
    # each panel's first layer (its lines) lists every row of the panel
    panel_labels = [{row["label"] for row in datasets[panel["layer"][0]["data"]["name"]]} for panel in spec["vconcat"]]
    assert panel_labels[:2] == [{"1 token comp. 10 %", "1 token suff. 10 %"}, {"1 query comp. 10 %"}]


def test_each_verdict_has_its_own_colour_and_shape_and_its_hue_means_nothing_else():
    """Every verdict state has a colour and a mark shape, no two alike, and no verdict colour is another palette
    entry's (the sink, a sign, attention, an accent, a category)."""
    assert set(VERDICT_COLOURS) == set(VERDICT_SHAPES) == set(VERDICT_STATES)
    assert len(set(VERDICT_COLOURS.values())) == len(set(VERDICT_SHAPES.values())) == len(VERDICT_STATES)
    others = {v.lower() for k, v in vars(palette).items() if k.isupper() and isinstance(v, str) and v.startswith("#")}
    others |= {c.lower() for c in palette.CATEGORIES}
    assert not others & {c.lower() for c in VERDICT_COLOURS.values()}
    spec = json.dumps(charts_claims.forest(ROWS).to_dict())
    assert all(shape in spec for shape in VERDICT_SHAPES.values())


def test_rows_without_the_verdict_columns_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="claims.verdict_rows"):
        charts_claims.forest(ROWS.drop(columns=["line"]))


def test_a_row_without_an_estimate_keeps_its_label_and_line_but_draws_no_interval_or_point():
    """A model with no sink-active head gives claims 3 and 4 no estimate (NaN): the row is still listed against its
    line, and no interval or point is drawn from NaN (Vega would warn of an infinite extent)."""
    rows = ROWS.copy()
    rows.loc[rows.claim == 4, ["estimate", "ci_low", "ci_high"]] = float("nan")
    spec = charts_claims.forest(rows).to_dict()
    panel = next(p for p in spec["vconcat"] if p["title"]["text"] == charts_claims.TITLES[4])
    lines, bars, dots = (spec["datasets"][layer["data"]["name"]] for layer in panel["layer"])
    assert [row["label"] for row in lines] == ["4"] and lines[0]["line"] == 0.1
    assert bars == [] and dots == []
    drawn = next(p for p in spec["vconcat"] if p["title"]["text"] == charts_claims.TITLES[5])
    assert all(len(spec["datasets"][layer["data"]["name"]]) == 1 for layer in drawn["layer"])
