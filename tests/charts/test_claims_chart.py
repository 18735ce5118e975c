"""The claims forest plot: one row per verdict, its interval, estimate and line, coloured by the verdict."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from cwviz.charts import claims as charts_claims
from cwviz.charts.palette import NEGATIVE, POSITIVE, VERDICT_COLOURS

ROWS = pd.DataFrame(
    {
        "claim": [1, 1, 4, 5],
        "label": ["1 query comp. 10 %", "1 query suff. 10 %", "4", "5a"],
        "verdict": ["holds", "fails", "unresolved", "holds"],
        "statistic": ["a", "b", "c", "d"],
        "estimate": [0.2, -0.1, 0.5, 0.03],
        "ci_low": [0.1, -0.2, 0.3, 0.01],
        "ci_high": [0.3, -0.05, 0.7, 0.05],
        "line": [0.0, 0.0, 0.5, 0.0],
        "n": [50, 50, 50, 50],
    }
)


def test_the_forest_draws_one_row_per_verdict_in_a_panel_per_claim_against_its_line():
    spec = charts_claims.forest(ROWS).to_dict()
    assert len(spec["vconcat"]) == 3  # claims 1, 4, 5
    drawn = [row for rows in spec["datasets"].values() for row in rows]
    assert {row["label"] for row in drawn} == set(ROWS.label)
    assert {row["line"] for row in drawn if row["claim"] == 4} == {0.5}
    text = json.dumps(spec)
    assert all(colour in text for colour in VERDICT_COLOURS.values())
    assert POSITIVE not in text and NEGATIVE not in text  # red and blue mean a sign, never a verdict


def test_rows_without_the_verdict_columns_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="claims.verdicts"):
        charts_claims.forest(ROWS.drop(columns=["line"]))
