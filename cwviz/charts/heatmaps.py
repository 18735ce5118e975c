"""Heatmap chart builders: tidy tables from :mod:`cwviz.analyses.tables` in, ``alt.Chart`` out. Pure.

Cells are placed by position (``query``/``key`` as ordinal indices) and labelled with tokens through
the axis ``labelExpr``, because tokens repeat. Token text reaches the browser only as Vega text
(axis labels, tooltips), which is drawn as text, never parsed as HTML.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Sequence

import altair as alt
import pandas as pd

from ..analyses.schema import FAMILIES, HeatmapCells, is_signed

#: Diverging scale for signed measures: red positive, blue negative, white at zero.
DIVERGING = "redblue"
SEQUENTIAL = "blues"
SIDE = 330  # px, the least a heatmap axis gets
CELL = 13  # px per position: a 10 px label per row or column without overlap
#: How the heatmap pair is laid out: side by side when it fits (``"auto"``), or as the user asks.
LAYOUTS = ("auto", "side", "stacked")
#: How the pages name each layout.
LAYOUT_LABELS = {"auto": "auto", "side": "side by side", "stacked": "stacked"}
#: Width (px) the pair may take side by side under ``"auto"``: the dashboard's main area in a 1,366 px wide
#: window with the sidebar open, the narrowest common laptop screen (906 px in Chromium: the width of the head
#: overview, which fills it). A wider pair is stacked, so that no map runs past the page's right edge; the
#: page's Layout control puts it side by side on a wider screen.
PAIR_FITS = 906
#: Pixels a heatmap view adds to its plot area side by side: its row labels and axis title, and the gap to the
#: next view (its legend lies below the map). Measured in Chromium: a 22-token pair of 330 px maps was 882 px
#: wide, and a 30-token pair of 390 px maps 1,002 px; a token longer than about ten characters adds more.
VIEW_EXTRA = 115
#: The click selection of every layer x head grid; pages pass it to Streamlit as ``selection_mode``.
PICK = "pick"
#: The least height of the layer x head overview, title and head axis included: the dashboard draws it at the
#: column's width with Vega's "fit" autosize, where that height holds everything, so a model with few layers
#: (a 6-layer encoder: 6 x 22 px) would leave its grid a few pixels tall.
OVERVIEW_MIN_HEIGHT = 300
#: The click selection of the heatmap pair: a cell's ``query_position``.
QUERY_PICK = "query_pick"


def label_expr(labels: Sequence[str]) -> str:
    """A Vega expression mapping an ordinal position (``datum.value``) to its token label."""
    return f"{json.dumps([str(label) for label in labels])}[datum.value]"


def measure_label(measure: str) -> str:
    """Human name of a :data:`cwviz.MEASURES` name."""
    for label, inter, intra in FAMILIES.values():
        if measure == inter == intra:
            return label
        if measure == inter:
            return f"{label} (inter-head)"
        if measure == intra:
            return f"{label} (intra-head)"
    return measure


def signed_scale(values: pd.Series, least: float = 0.0) -> alt.Scale:
    """Diverging colour scale, symmetric around zero so that white means exactly 0.

    The domain covers ``values`` and at least ±``least``; ±1 when that leaves nothing to cover.
    """
    bound = float(values.abs().max()) if len(values) else math.nan
    bound = max(bound if math.isfinite(bound) else 0.0, least)
    bound = bound if bound > 0 else 1.0
    return alt.Scale(scheme=DIVERGING, reverse=True, domain=[-bound, bound], domainMid=0)


def sequential_scale(values: pd.Series) -> alt.Scale:
    top = float(values.max()) if len(values) else 1.0
    top = top if math.isfinite(top) and top > 0 else 1.0
    return alt.Scale(scheme=SEQUENTIAL, domain=[0, top])


def _tooltips(frame: pd.DataFrame, value_title: str, show_value: bool) -> list[alt.Tooltip]:
    tips = [
        alt.Tooltip("query:O", title="query"),
        alt.Tooltip("query_token:N", title="query token"),
        alt.Tooltip("key:O", title="key"),
        alt.Tooltip("key_token:N", title="key token"),
        alt.Tooltip("attention:Q", title="attention", format=".4f"),
    ]
    for name, title in (("norm_ratio", "norm ratio ‖ṽ‖/‖o‖"), ("cosine", "cosine")):
        if name in frame and frame[name].notna().any():
            tips.append(alt.Tooltip(f"{name}:Q", title=title, format="+.4f"))
    tips.append(alt.Tooltip("contribution:Q", title="contribution", format="+.4f"))
    if show_value:
        tips.append(alt.Tooltip("value:Q", title=value_title, format="+.4g"))
    return tips


def _extent(count: int) -> int:
    """Pixels of a heatmap axis with ``count`` positions: :data:`CELL` each, never under :data:`SIDE`."""
    return max(SIDE, CELL * count)


def query_outline(row: int) -> alt.Chart:
    """A black frame around one query row, layered over a heatmap: it reads the heatmap's own data
    (no extra dataset), keeps that row's cells and aggregates them to one mark that spans every key."""
    return (
        alt.Chart()
        .transform_filter(alt.datum.query == row)
        .transform_aggregate(cells="count()", groupby=["query"])
        .mark_rect(fill=None, stroke="black", strokeWidth=2)
        .encode(y="query:O")
    )


def query_pick() -> alt.Parameter:
    """Clicking a heatmap cell selects its query (the parameter :data:`QUERY_PICK`, field ``query_position``)."""
    return alt.selection_point(name=QUERY_PICK, fields=["query_position"], on="click", clear=False)


def check_layout(layout: str) -> str:
    """``layout`` when it is one of :data:`LAYOUTS`, else ValueError naming them."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    return layout


def side_by_side(keys: int, layout: str = "auto") -> bool:
    """Whether the heatmap pair of ``keys`` columns stands side by side under ``layout`` (:data:`LAYOUTS`)."""
    if check_layout(layout) != "auto":
        return layout == "side"
    return 2 * (_extent(keys) + VIEW_EXTRA) <= PAIR_FITS


def heatmap_pair(cells: HeatmapCells, query: int | None = None, layout: str = "auto") -> alt.HConcatChart | alt.VConcatChart:
    """Attention (sequential scale) beside the picked measure (diverging at zero when it can be negative).

    One dataset of ``len(cells.frame)`` rows feeds both views. The masked upper triangle has no rows,
    so it stays empty. Every row and column is labelled ``"12 the"`` (position and token; a heatmap has
    at most about 70 positions per axis, :data:`cwviz.analyses.tables.MAX_CELLS`), at :data:`CELL` px
    per position so no label overlaps its neighbour. The two heatmaps stand side by side when they fit a
    laptop's page (``layout="auto"``, :func:`side_by_side`) or when ``layout="side"``; else they are stacked, so
    each keeps its full width. Each legend lies below its map, to keep the pair narrow. The selected query's row
    (``cells.query``, or ``query`` when given) is outlined on both; a click on a cell selects its query
    (:data:`QUERY_PICK`).
    """
    frame = cells.frame
    row = cells.query if query is None or cells.binned else query
    value_title = measure_label(cells.measure)
    show_value = cells.measure != f"contribution_{cells.kind}"
    tooltips = _tooltips(frame, value_title, show_value)
    axis_args = dict(labelExpr=label_expr(cells.labels), labelLimit=120, labelOverlap=False, labelFontSize=10)
    keys, queries = frame["key"].nunique(), frame["query"].nunique()
    what = "bin of positions" if cells.binned else "position token"
    pick = query_pick()
    base = (
        alt.Chart(frame)
        .mark_rect()
        .encode(
            x=alt.X("key:O", title=f"key ({what})", axis=alt.Axis(labelAngle=-90, **axis_args)),
            y=alt.Y("query:O", title=f"query ({what})", axis=alt.Axis(**axis_args)),
            tooltip=tooltips,
        )
        .properties(width=_extent(keys), height=_extent(queries))
    )
    # The legends carry no title (each view's title names its measure) and lie below the maps: the pair stays narrow.
    legend = alt.Legend(orient="bottom", direction="horizontal", gradientLength=min(_extent(keys), 240), title=None)
    attention = base.encode(color=alt.Color("attention:Q", legend=legend, scale=sequential_scale(frame["attention"])))
    scale = signed_scale(frame["value"]) if is_signed(cells.measure) else sequential_scale(frame["value"])
    measure = base.encode(color=alt.Color("value:Q", legend=legend, scale=scale))
    views = []
    for name, chart, title in (
        ("attention", attention, "Attention weights"),
        ("measure", measure, value_title[:1].upper() + value_title[1:]),
    ):
        layers = [chart.properties(name=f"heatmap_{name}")] + ([query_outline(row)] if row is not None else [])
        views.append(alt.layer(*layers).properties(title=title))
    side = side_by_side(keys, layout)
    concat = alt.hconcat if side else alt.vconcat
    pair = concat(*views, data=frame).resolve_scale(color="independent")
    with warnings.catch_warnings():
        # One parameter for both views is what we want: Altair gives it to each unit chart and says so.
        warnings.filterwarnings("ignore", message="Automatically deduplicated selection parameter", category=UserWarning)
        pair = pair.add_params(pick)
    # The title on lines no wider than the maps (Vega cuts a longer line with an ellipsis).
    lines = wrap(
        cells.note + "; click a cell to select its query", ((2 if side else 1) * (_extent(keys) + VIEW_EXTRA)) // TITLE_PX_PER_CHAR
    )
    return pair.properties(title=alt.TitleParams(lines, anchor="start", fontSize=13))


#: About the width (px) of a character of a 13 px title, for :func:`wrap`.
TITLE_PX_PER_CHAR = 7


def wrap(note: str, width: int) -> list[str]:
    """A note's ``"; "``-separated parts on lines of at most about ``width`` characters (a title line wider
    than its chart would be cut, or widen the chart past the page); a part longer than ``width`` keeps a line
    of its own."""
    lines: list[str] = []
    for part in note.split("; "):
        if lines and len(lines[-1]) + len(part) + 2 <= width:
            lines[-1] += "; " + part
        else:
            lines.append(part)
    return lines


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
    return alt.Chart(cells).mark_rect(fill=None, stroke="black", strokeWidth=2).encode(x="head:O", y="layer:O")


def outlined_grid(grid: alt.Chart, layer: int | None, head: int | None, layers: int, heads: int, cell: int, title: str) -> alt.LayerChart:
    """A layer x head grid (``cell`` pixels a cell) with the selected head outlined, sized like the overview."""
    drawn = [grid]
    if layer is not None and head is not None:
        drawn.append(outline(pd.DataFrame({"layer": [layer], "head": [head]})))
    return alt.layer(*drawn).properties(
        width=max(160, cell * heads),
        height=max(cell * layers, OVERVIEW_MIN_HEIGHT),
        title=alt.TitleParams(title, anchor="start", fontSize=13),
    )


def head_overview(summary: pd.DataFrame, metric: str = "divergence", layer: int | None = None, head: int | None = None) -> alt.LayerChart:
    """Every layer × head, coloured by one per-head summary; click a cell to pick that head.

    The click selection is the parameter ``pick`` (fields layer and head). The selected head, if any,
    is outlined.
    """
    if metric not in OVERVIEW_METRICS:
        raise ValueError(f"metric must be one of {', '.join(OVERVIEW_METRICS)}, not {metric!r}")
    pick = head_pick()
    signed = metric == "sink_contribution" and bool((summary[metric] < 0).any())
    scale = signed_scale(summary[metric]) if signed else alt.Scale(scheme="viridis", reverse=metric == "divergence")
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
            .mark_rect(fill=None, stroke="black", strokeWidth=2)
            .encode(y="layer:O")
        )
    return alt.layer(*layers_out).properties(
        width=max(160, cell * heads),
        height=max(cell * layers, OVERVIEW_MIN_HEIGHT),
        title=alt.TitleParams(f"All heads: {OVERVIEW_METRICS[metric]} (click a cell to pick the head)", anchor="start", fontSize=13),
    )
