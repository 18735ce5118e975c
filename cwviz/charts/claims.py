"""The claims check as a picture: a forest plot, one row per verdict of ``claims.csv`` (docs/METHOD.md section 5).
Pure: the verdict rows of :func:`cwviz.analyses.claims.verdicts` in, ``alt.Chart`` out.

Each row draws its estimate (a dot) and its 95 % bootstrap interval (a bar) against the row's own line (a tick: 0,
or 0.5 for claim 4's share), coloured by the verdict (:data:`~cwviz.charts.palette.VERDICT_COLOURS`). The rows'
statistics differ in unit (a log-perplexity ratio, a cosine, a share), so each claim is its own panel with its own
x scale; within a panel rows share one.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from .palette import NEUTRAL, VERDICT_COLOURS

#: The columns the chart reads.
COLUMNS = ["claim", "label", "verdict", "statistic", "estimate", "ci_low", "ci_high", "line", "n"]
ROW_HEIGHT, WIDTH = 18, 420
TITLES = {
    1: "1 faithfulness order (log-PPL ratio, deciding pair; > 0: paper's order)",
    2: "2 sink vs other keys: geometry over attention (> 0)",
    3: "3 cos(sink value, rest), sink-active heads (< 0)",
    4: "4 share of U-shaped heads (> 0.5)",
    5: "5 sink removed: (a) spread, (b) toward centroid, (c) log-PPL ratio (> 0)",
}


def forest(rows: pd.DataFrame) -> alt.VConcatChart:
    """One panel per claim, one row per verdict: its interval, its estimate and its line, coloured by its verdict."""
    missing = [c for c in COLUMNS if c not in rows.columns]
    if missing:
        raise ValueError(f"the verdict rows need columns {', '.join(missing)}; give cwviz.analyses.claims.verdicts(table)")
    data = rows[COLUMNS].copy()
    verdicts = list(VERDICT_COLOURS)
    colour = alt.Color(
        "verdict:N",
        scale=alt.Scale(domain=verdicts, range=[VERDICT_COLOURS[v] for v in verdicts]),
        legend=alt.Legend(orient="top", title="verdict"),
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
    for claim, group in data.groupby("claim", sort=True):
        order = list(group["label"])
        y = alt.Y("label:N", sort=order, title=None, axis=alt.Axis(labelLimit=220))
        base = alt.Chart(group).encode(y=y)
        x = alt.X("ci_low:Q", title=None, scale=alt.Scale(zero=False, nice=True), axis=alt.Axis(tickCount=6))
        bars = base.mark_rule(strokeWidth=3).encode(x=x, x2="ci_high:Q", color=colour, tooltip=tooltip)
        dots = base.mark_point(filled=True, size=60).encode(x="estimate:Q", color=colour, tooltip=tooltip)
        lines = base.mark_tick(color=NEUTRAL, thickness=2, size=ROW_HEIGHT).encode(x="line:Q")
        panels.append(
            alt.layer(lines, bars, dots).properties(
                width=WIDTH,
                height=ROW_HEIGHT * max(1, len(group)),
                title=alt.TitleParams(TITLES.get(int(claim), f"claim {claim}"), anchor="start", fontSize=12),
            )
        )
    return alt.vconcat(*panels, spacing=8).resolve_scale(x="independent", color="shared")
