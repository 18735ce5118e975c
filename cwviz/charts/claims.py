"""The claims check as a picture: a forest plot, one row per verdict of ``claims.csv`` (docs/METHOD.md section 5).
Pure: the verdict rows of :func:`cwviz.analyses.claims.verdict_rows` in, ``alt.Chart`` out.

Each row draws its estimate (a mark) and its 95 % bootstrap interval (a bar) against the row's own line (a tick: 0,
or 0.1 for claim 4's operating distance), coloured by the verdict and shaped by it too
(:data:`~cwviz.charts.palette.VERDICT_COLOURS`, :data:`~cwviz.charts.palette.VERDICT_SHAPES`). The rows' statistics
differ in unit (a log-perplexity ratio, a cosine, a distance), so each claim is its own panel with its own x scale;
within a panel rows share one. Claim 1's rows that tie by construction cannot hold: they get a panel of their own,
below the rows that can.
"""

from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from ..analyses.schema import TIES
from .palette import NEUTRAL, VERDICT_COLOURS, VERDICT_SHAPES

#: The columns the chart reads.
COLUMNS = ["claim", "label", "verdict", "statistic", "estimate", "ci_low", "ci_high", "line", "n"]
ROW_HEIGHT, WIDTH = 18, 420
TITLES = {
    1: "1 faithfulness order (log-PPL ratio, deciding pair; > 0: paper's order)",
    2: "2 sink vs other keys: geometry over attention (> 0)",
    3: "3 cos(sink value, rest), sink-active heads (< 0)",
    4: "4 sink-active heads: distance from operating point to minimiser (< 0.1)",
    5: "5 sink removed: (a) spread, (b) toward centroid, (c) log-PPL ratio minus the control's (> 0)",
}
#: The panel of claim 1's rows that tie by construction.
TIES_TITLE = "1 ties by construction: VW and VW/‖o‖ rank alike here, so these rows cannot hold (not counted)"


def forest(rows: pd.DataFrame) -> alt.VConcatChart:
    """One panel per claim, one row per verdict: its interval, its estimate and its line, coloured and shaped by its
    verdict; claim 1's ties by construction in a panel of their own, after claim 1's."""
    missing = [c for c in COLUMNS if c not in rows.columns]
    if missing:
        raise ValueError(
            f"the verdict rows need columns {', '.join(missing)}; give cwviz.analyses.claims.verdict_rows(table)"
        )
    data = rows[COLUMNS].copy()
    verdicts = list(VERDICT_COLOURS)
    legend = alt.Legend(orient="top", title="verdict")
    colour = alt.Color(
        "verdict:N", scale=alt.Scale(domain=verdicts, range=[VERDICT_COLOURS[v] for v in verdicts]), legend=legend
    )
    shape = alt.Shape(
        "verdict:N", scale=alt.Scale(domain=verdicts, range=[VERDICT_SHAPES[v] for v in verdicts]), legend=legend
    )
    tooltip = [
        alt.Tooltip("label:N", title="row"),
        alt.Tooltip("statistic:N"),
        alt.Tooltip("estimate:Q", format="+.3g"),
        alt.Tooltip("ci_low:Q", title="95 % low", format="+.3g"),
        alt.Tooltip("ci_high:Q", title="95 % high", format="+.3g"),
        alt.Tooltip("line:Q", format="g"),
        alt.Tooltip("verdict:N"),
        alt.Tooltip("n:Q", title="items"),
    ]
    panels = []
    ties = data["verdict"] == TIES
    for (claim, tied), group in data.groupby(["claim", ties], sort=True):  # a claim's tie rows right after its others
        order = list(group["label"])
        y = alt.Y("label:N", sort=order, title=None, axis=alt.Axis(labelLimit=220))
        base = alt.Chart(group).encode(y=y)
        # A row with no estimate (no item had the heads it needs: NaN) keeps its label and line but draws no interval
        # or point; given NaN, Vega would warn of an infinite extent and draw nothing of the panel's scale.
        estimated = alt.Chart(group[np.isfinite(group[["estimate", "ci_low", "ci_high"]]).all(axis=1)]).encode(y=y)
        x = alt.X("ci_low:Q", title=None, scale=alt.Scale(zero=False, nice=True), axis=alt.Axis(tickCount=6))
        bars = estimated.mark_rule(strokeWidth=3).encode(x=x, x2="ci_high:Q", color=colour, tooltip=tooltip)
        dots = estimated.mark_point(filled=True, size=80, opacity=1).encode(
            x="estimate:Q", color=colour, shape=shape, tooltip=tooltip
        )
        lines = base.mark_tick(color=NEUTRAL, thickness=2, size=ROW_HEIGHT).encode(x="line:Q")
        panels.append(
            alt.layer(lines, bars, dots).properties(
                width=WIDTH,
                height=ROW_HEIGHT * max(1, len(group)),
                title=alt.TitleParams(
                    TIES_TITLE if tied else TITLES.get(int(claim), f"claim {claim}"), anchor="start", fontSize=12
                ),
            )
        )
    return alt.vconcat(*panels, spacing=8).resolve_scale(x="independent", color="shared", shape="shared")
