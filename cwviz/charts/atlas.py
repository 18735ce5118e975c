"""Atlas chart builders: the pooled per-head statistics of :mod:`cwviz.analyses.atlas` as layer × head maps. Pure."""

from __future__ import annotations

import altair as alt
import pandas as pd

from ..analyses.schema import ATLAS_METRICS
from .head_grid import head_pick, outlined_grid
from .heatmaps import summary_scale

#: Statistics that can be negative, drawn on the diverging scale centred at zero.
SIGNED = ("cos_sink_rest", "sink_contribution")


def atlas_map(
    pooled: pd.DataFrame, metric: str = "sink_attention", layer: int | None = None, head: int | None = None
) -> alt.LayerChart:
    """Every layer × head coloured by the pooled mean of ``metric``; the tooltip gives its bootstrap interval.
    Click a cell to pick the head (:data:`~cwviz.charts.head_grid.PICK`); the selected head is outlined."""
    if metric not in ATLAS_METRICS:
        raise ValueError(f"metric must be one of {', '.join(ATLAS_METRICS)}, not {metric!r}")
    layers = int(pooled["layer"].max()) + 1 if len(pooled) else 1
    heads = int(pooled["head"].max()) + 1 if len(pooled) else 1
    cell = max(10, min(22, 520 // max(layers, 1)))
    scale = summary_scale(pooled[metric], metric, signed=metric in SIGNED)
    prompts = int(pooled["prompts"].iloc[0]) if "prompts" in pooled and len(pooled) else 0
    grid = (
        alt.Chart(pooled)
        .mark_rect()
        .encode(
            x=alt.X("head:O", title="head"),
            y=alt.Y("layer:O", title="layer"),
            # No legend title: the chart's title names the metric in words (a column name is no name for a reader).
            color=alt.Color(f"{metric}:Q", title=None, scale=scale),
            tooltip=[
                alt.Tooltip("layer:O"),
                alt.Tooltip("head:O"),
                alt.Tooltip(f"{metric}:Q", title=f"{ATLAS_METRICS[metric]} (mean over prompts)", format="+.4f"),
                alt.Tooltip(f"{metric}_low:Q", title="interval, low", format="+.4f"),
                alt.Tooltip(f"{metric}_high:Q", title="interval, high", format="+.4f"),
            ],
        )
        .add_params(head_pick())
    )
    return outlined_grid(
        grid,
        layer,
        head,
        layers,
        heads,
        cell,
        f"Mean over {prompts} prompt(s) of the {ATLAS_METRICS[metric]} (click a cell to pick the head)",
    )
