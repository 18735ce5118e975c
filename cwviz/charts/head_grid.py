"""Layer x head grids: every head of a model as one cell, coloured by a per-head number; a click picks a head. Pure.

The overview of the Heatmaps page (:func:`head_overview`), and the pieces the Atlas, Sinks and Flow grids share: the
click selection (:func:`head_pick`, the parameter :data:`PICK`) and the selected head's outline (:func:`outline`,
:func:`outlined_grid`).
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from .heatmaps import signed_scale
from .palette import ATTENTION_SCHEME, OTHER_SCHEME, OUTLINE

#: The click selection of every layer x head grid; pages pass it to Streamlit as ``selection_mode``.
PICK = "pick"
#: The least height of the layer x head overview, title and head axis included: the dashboard draws it at the
#: column's width with Vega's "fit" autosize, where that height holds everything, so a model with few layers
#: (a 6-layer encoder: 6 x 22 px) would leave its grid a few pixels tall.
OVERVIEW_MIN_HEIGHT = 300
#: The per-head summaries the overview can colour by.
OVERVIEW_METRICS: dict[str, str] = {
    "divergence": "divergence of attention and contribution rows (½ Σ|α − c|)",
    "sink_attention": "sink share under attention",
    "sink_contribution": "sink share under contribution (intra-head)",
}


def head_pick() -> alt.Parameter:
    """Clicking a cell of a layer x head grid selects its layer and head (the parameter :data:`PICK`)."""
    return alt.selection_point(name=PICK, fields=["layer", "head"], on="click", clear=False)


def outline(cells: pd.DataFrame) -> alt.Chart:
    """A black outline on the (layer, head) cells of ``cells``, to layer over a layer x head grid."""
    return alt.Chart(cells).mark_rect(fill=None, stroke=OUTLINE, strokeWidth=2).encode(x="head:O", y="layer:O")


def outlined_grid(
    grid: alt.Chart, layer: int | None, head: int | None, layers: int, heads: int, cell: int, title: str
) -> alt.LayerChart:
    """A layer x head grid (``cell`` pixels a cell) with the selected head outlined, sized like the overview."""
    drawn = [grid]
    if layer is not None and head is not None:
        drawn.append(outline(pd.DataFrame({"layer": [layer], "head": [head]})))
    return alt.layer(*drawn).properties(
        width=max(160, cell * heads),
        height=max(cell * layers, OVERVIEW_MIN_HEIGHT),
        title=alt.TitleParams(title, anchor="start", fontSize=13),
    )


def head_overview(
    summary: pd.DataFrame, metric: str = "divergence", layer: int | None = None, head: int | None = None
) -> alt.LayerChart:
    """Every layer × head, coloured by one per-head summary; click a cell to pick that head.

    The click selection is the parameter ``pick`` (fields layer and head). The selected head, if any,
    is outlined.
    """
    if metric not in OVERVIEW_METRICS:
        raise ValueError(f"metric must be one of {', '.join(OVERVIEW_METRICS)}, not {metric!r}")
    pick = head_pick()
    # A contribution share is signed (red adds, blue subtracts) even where no head's is negative; attention shares in
    # attention's green; the divergence (neither) in the other sequential hue.
    signed = metric == "sink_contribution"
    scale = (
        signed_scale(summary[metric])
        if signed
        else alt.Scale(scheme=ATTENTION_SCHEME if metric == "sink_attention" else OTHER_SCHEME)
    )
    layers = int(summary["layer"].max()) + 1 if len(summary) else 1
    heads = int(summary["head"].max()) + 1 if len(summary) else 1
    cell = max(10, min(22, 520 // max(layers, 1)))
    grid = (
        alt.Chart(summary)
        .mark_rect()
        .encode(
            x=alt.X("head:O", title="head"),
            y=alt.Y("layer:O", title="layer"),
            color=alt.Color(f"{metric}:Q", title=metric.replace("_", " "), scale=scale),
            opacity=alt.condition(pick, alt.value(1.0), alt.value(0.85)),
            tooltip=[
                alt.Tooltip("layer:O"),
                alt.Tooltip("head:O"),
                alt.Tooltip("sink_attention:Q", title="sink share, attention", format=".3f"),
                alt.Tooltip("sink_contribution:Q", title="sink share, contribution", format="+.3f"),
                alt.Tooltip("divergence:Q", title="divergence", format=".3f"),
                alt.Tooltip("rank:Q", title="rank by divergence"),
            ],
        )
        .add_params(pick)
    )
    layers_out = [grid]
    if layer is not None and head is not None:
        layers_out.append(outline(pd.DataFrame({"layer": [layer], "head": [head]})))
    elif layer is not None:  # all heads: the whole layer row, aggregated from the grid's own data (no new dataset)
        layers_out.append(
            alt.Chart(summary)
            .transform_filter(alt.datum.layer == layer)
            .transform_aggregate(heads="count()", groupby=["layer"])
            .mark_rect(fill=None, stroke=OUTLINE, strokeWidth=2)
            .encode(y="layer:O")
        )
    return alt.layer(*layers_out).properties(
        width=max(160, cell * heads),
        height=max(cell * layers, OVERVIEW_MIN_HEIGHT),
        title=alt.TitleParams(
            f"All heads: {OVERVIEW_METRICS[metric]} (click a cell to pick the head)", anchor="start", fontSize=13
        ),
    )
