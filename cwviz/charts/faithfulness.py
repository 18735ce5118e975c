"""Faithfulness curves: the summary of :func:`cwviz.analyses.faithfulness_summary.summarize` in, ``alt.Chart`` out.
Pure.

One chart per curve: mean ΔPPL against the removal rate, a line per measure, the 95 % bootstrap
interval as a band of the same colour. ΔPPL often spans orders of magnitude between low and high rates
and can be negative (masking can help), so ``scale="symlog"`` offers a log-like axis that keeps zero
and negative values.
"""

from __future__ import annotations

import math

import altair as alt
import numpy as np
import pandas as pd

from ..analyses.schema import ALL_MEASURES
from .palette import CATEGORIES

CURVE_TITLES = {
    "comprehensiveness": "Comprehensiveness: most important keys removed (higher = more faithful)",
    "sufficiency": "Sufficiency: least important keys removed (lower = more faithful)",
}
SCALES = ("linear", "symlog")
WIDTH, HEIGHT = 520, 320


def symlog_ticks(values) -> list[float]:
    """Ticks of a symmetric-log axis over ``values``: 0, and ±1, ±10, ±100, … as far as the values reach on each
    side (1 at least, so that an axis never holds 0 alone)."""
    finite = np.asarray(values, dtype=float).ravel()
    finite = finite[np.isfinite(finite)]

    def decades(reach: float) -> list[float]:
        return [10.0**k for k in range(0, int(math.floor(math.log10(reach))) + 1)] if reach >= 1 else []

    top = float(finite.max()) if finite.size else 0.0
    bottom = float(finite.min()) if finite.size else 0.0
    return sorted([-d for d in decades(-bottom)] + [0.0] + (decades(top) or [1.0]))


def measure_colours(order: list[str]) -> alt.Scale:
    """The measures' line colours (:data:`~cwviz.charts.palette.CATEGORIES`), one a measure whichever are drawn: hues
    that mean nothing else (not a sign's red or blue, attention's green, the sink's purple). A measure that is not one
    of :data:`~cwviz.analyses.schema.ALL_MEASURES` is drawn in the random keys' grey."""
    colours = [CATEGORIES[ALL_MEASURES.index(m)] if m in ALL_MEASURES else CATEGORIES[-1] for m in order]
    return alt.Scale(domain=order, range=colours)


def curve_chart(summary: pd.DataFrame, curve: str, scale: str = "linear") -> alt.LayerChart:
    """ΔPPL against removal rate for one curve (columns of ``cwviz.analyses.faithfulness_summary.SUMMARY_COLUMNS``).

    Measures keep the order of the rows (the summary lists them raw first, random last).
    """
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {', '.join(SCALES)}, not {scale!r}")
    data = summary[summary["curve"] == curve]
    order = list(dict.fromkeys(data["measure"]))
    # The legend stands to the right (a bottom legend takes its rows from the plot's height) and belongs
    # to the lines alone, so its swatches are opaque, not the bands' 15 %.
    legend = alt.Legend(orient="right", symbolOpacity=1, symbolStrokeWidth=3, labelLimit=260)
    color = alt.Color("measure:N", sort=order, title="measure", legend=legend, scale=measure_colours(order))
    x = alt.X("rate:Q", title="keys removed per query (%)", scale=alt.Scale(zero=True))
    y_scale = alt.Scale(type=scale)
    # Vega's default ticks on a symlog axis are a linear few (0, 20,000, 40,000): label its decades instead.
    axis = (
        # Each tick formatted on its own: with format="~s" Vega shares one SI prefix over the axis ("1k, 0k, 0k").
        alt.Axis(
            values=symlog_ticks(data[["ci_low", "ci_high", "delta_ppl"]].to_numpy()),
            labelExpr="format(datum.value, '~s')",
        )
        if scale == "symlog"
        else alt.Axis()
    )
    base = alt.Chart(data).encode(x=x, color=color)
    band = base.mark_area(opacity=0.15).encode(
        color=alt.Color("measure:N", sort=order, legend=None, scale=measure_colours(order)),
        y=alt.Y("ci_low:Q", title="ΔPPL = PPL(masked) − PPL(clean)", scale=y_scale, axis=axis),
        y2="ci_high:Q",
    )
    tooltip = [
        alt.Tooltip("measure:N"),
        alt.Tooltip("rate:Q", title="rate (%)"),
        alt.Tooltip("delta_ppl:Q", title="mean ΔPPL", format=".4g"),
        alt.Tooltip("ci_low:Q", title="95% CI low", format=".4g"),
        alt.Tooltip("ci_high:Q", title="95% CI high", format=".4g"),
        alt.Tooltip("n:Q", title="examples"),
    ]
    line = base.mark_line(point=True).encode(y=alt.Y("delta_ppl:Q", scale=y_scale), tooltip=tooltip)
    # Independent legends: the band's is off, so the merged legend comes from the (opaque) lines only.
    return (
        alt.layer(band, line)
        .resolve_legend(color="independent")
        .properties(title=CURVE_TITLES.get(curve, curve), width=WIDTH, height=HEIGHT)
    )


def accuracy_chart(summary: pd.DataFrame, curve: str) -> alt.LayerChart:
    """Accuracy change (masked − clean, in points) against removal rate for one curve of a multiple-choice
    task: a line per measure and its paired bootstrap band (the accuracy columns of ``summarize``)."""
    data = summary[summary["curve"] == curve].assign(
        delta_points=lambda d: 100 * d["delta_accuracy"],
        low_points=lambda d: 100 * d["accuracy_ci_low"],
        high_points=lambda d: 100 * d["accuracy_ci_high"],
    )
    order = list(dict.fromkeys(data["measure"]))
    legend = alt.Legend(orient="right", symbolOpacity=1, symbolStrokeWidth=3, labelLimit=260)
    x = alt.X("rate:Q", title="keys removed per query (%)", scale=alt.Scale(zero=True))
    base = alt.Chart(data).encode(x=x)
    band = base.mark_area(opacity=0.15).encode(
        color=alt.Color("measure:N", sort=order, legend=None, scale=measure_colours(order)),
        y=alt.Y("low_points:Q", title="Δaccuracy (points) = masked − clean"),
        y2="high_points:Q",
    )
    tooltip = [
        alt.Tooltip("measure:N"),
        alt.Tooltip("rate:Q", title="rate (%)"),
        alt.Tooltip("delta_points:Q", title="Δaccuracy (points)", format="+.1f"),
        alt.Tooltip("accuracy_masked:Q", title="masked accuracy", format=".1%"),
        alt.Tooltip("n:Q", title="items"),
    ]
    line = base.mark_line(point=True).encode(
        y=alt.Y("delta_points:Q"),
        color=alt.Color("measure:N", sort=order, title="measure", legend=legend, scale=measure_colours(order)),
        tooltip=tooltip,
    )
    title = {
        "comprehensiveness": "Accuracy, most important keys removed",
        "sufficiency": "Accuracy, least important keys removed",
    }
    return (
        alt.layer(band, line)
        .resolve_legend(color="independent")
        .properties(title=title.get(curve, curve), width=WIDTH, height=HEIGHT)
    )
