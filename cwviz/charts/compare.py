"""Compare chart builders: two inputs' maps and their difference, per-head changes, log-probability changes.

Pure: tables from :mod:`cwviz.analyses.compare` in, Altair out. Differences use the diverging scale of the
heatmaps, centred at zero (red: B larger, blue: B smaller, white: no change).
"""

from __future__ import annotations

import warnings

import altair as alt
import pandas as pd

from ..analyses.schema import COMPARE_MAPS, HEAD_METRICS, CompareCells
from .heatmaps import (
    CELL,
    LABEL_PX,
    PAIR_FITS,
    PRESENTER_LABEL_PX,
    check_layout,
    contribution_scale,
    head_pick,
    label_expr,
    label_stride,
    outlined_grid,
    presenter_height,
    query_outline,
    query_pick,
    sequential_scale,
    signed_scale,
    thinned_label_expr,
    wrap,
)
from .palette import NEGATIVE, OUTLINE, POSITIVE, RULE

#: Most aligned keys for which A, B and B − A stand in one row when the page is asked to put maps side by side
#: (``layout="side"``): 3 x (16 x 13 px + ~150 px of labels) fit the dashboard's main area in a 1600 px window;
#: wider grids put A and B in a row above the difference. Under ``layout="auto"`` (:func:`per_row`) as many maps
#: share a row as fit :data:`~cwviz.charts.heatmaps.PAIR_FITS`, the page of a 1,366 px window.
THREE_UP = 16
#: Pixels a compared map adds to its plot area in a row: its labels ("12 lighthouse / 12 keeper", cut at
#: :data:`LABEL_LIMIT`), its axis title and the gap to the next (its legend lies below it).
VIEW_EXTRA = 155
SIDE = 220  # px, the least a compared map's axis gets
#: Width (px) the maps of a row may take under ``layout="side"``: the dashboard's main area in a 1,600 px window
#: with the sidebar open (about 1,220 px in Chromium), less a margin. A wider map is drawn smaller, its labels
#: thinned so that they never overlap (:func:`~cwviz.charts.heatmaps.label_stride`).
SIDE_FITS = 1180
#: Characters a title line holds: about 700 px at 13 px, narrower than the narrowest grid of maps.
TITLE_CHARS = 100
LABEL_LIMIT = 110  # px, the longest axis label ("12 lighthouse / 12 keeper" is cut with an ellipsis)
#: Width (px) a map may take with its labels in presenter mode: the page of a projector's 1,280 px window with the
#: sidebar open (about 820 px), less a margin.
PRESENTER_FITS = 800


def _extent(count: int) -> int:
    return max(SIDE, CELL * count)


def per_row(keys: int, layout: str = "auto") -> int:
    """How many of A, B and B − A share a row for ``keys`` aligned keys under ``layout`` (:data:`~cwviz.charts.heatmaps.LAYOUTS`): 3 (one
    row), 2 (A and B above the difference) or 1 (stacked)."""
    if check_layout(layout) == "stacked":
        return 1
    if layout == "side":
        return 3 if keys <= THREE_UP else 2
    return next((n for n in (3, 2) if n * (_extent(keys) + VIEW_EXTRA) <= PAIR_FITS), 1)


def compare_maps(
    cells: CompareCells, what: str = "contribution", query: int | None = None, layout: str = "auto", label_px: int = LABEL_PX
) -> alt.ConcatChart:
    """A, B and B − A of one map (``what``: ``"contribution"`` or ``"attention"``) on the aligned grid.

    A and B share one colour scale (sequential for attention, diverging at zero for contributions); the
    difference has its own, diverging at zero. The selected query's pair (``cells.query``) is outlined on each
    view; a click on a cell selects its query in A (:data:`~cwviz.charts.heatmaps.QUERY_PICK`, field
    ``query_position``). ``label_px``: the axis labels' size; presenter mode's
    (:data:`~cwviz.charts.heatmaps.PRESENTER_LABEL_PX`) stacks the maps, each as large as the Heatmaps page's in
    presenter mode (:func:`~cwviz.charts.heatmaps.presenter_height`) within :data:`PRESENTER_FITS`.
    """
    if what not in COMPARE_MAPS:
        raise ValueError(f"what must be one of {', '.join(COMPARE_MAPS)}, not {what!r}")
    frame = cells.frame
    row = cells.query if query is None else query
    keys, queries = frame["key"].nunique(), frame["query"].nunique()
    presenter = label_px >= PRESENTER_LABEL_PX
    rows = 1 if presenter else per_row(keys, layout)
    width, height = _extent(keys), _extent(queries)
    if presenter:
        width = min(presenter_height(keys), PRESENTER_FITS - VIEW_EXTRA)
        height = width if queries == keys else presenter_height(queries)
    elif layout == "side":
        width = min(width, SIDE_FITS // rows - VIEW_EXTRA)
        height = min(height, width) if queries == keys else height

    def axis(field: str, extent: int, **more) -> alt.Axis:
        positions = sorted(frame[field].unique())
        stride = label_stride(len(positions), extent, label_px)
        labels = thinned_label_expr(cells.labels, positions, row, stride) if stride > 1 else label_expr(cells.labels)
        return alt.Axis(labelExpr=labels, labelLimit=LABEL_LIMIT, labelOverlap=False, labelFontSize=label_px, **more)

    tooltips = [
        alt.Tooltip("query_token:N", title="query (A / B)"),
        alt.Tooltip("key_token:N", title="key (A / B)"),
        alt.Tooltip(f"{what}_a:Q", title=f"{what}, A", format="+.4f"),
        alt.Tooltip(f"{what}_b:Q", title=f"{what}, B", format="+.4f"),
        alt.Tooltip(f"{what}_diff:Q", title=f"{what}, B − A", format="+.4f"),
    ]
    base = (
        alt.Chart(frame)
        .mark_rect()
        .encode(
            x=alt.X("key:O", title="key (aligned position)", axis=axis("key", width, labelAngle=-90)),
            y=alt.Y("query:O", title="query (aligned position)", axis=axis("query", height)),
            tooltip=tooltips,
        )
        .properties(width=width, height=height)
    )
    both = pd.concat([frame[f"{what}_a"], frame[f"{what}_b"]])
    # Contributions as on the Heatmaps page: the end off the sink column, symmetric-log, clamped (the legend says so).
    sink = pd.concat([frame["key_a"] == 0, frame["key_b"] == 0]) if {"key_a", "key_b"} <= set(frame) else None
    shared, rule = contribution_scale(both, sink) if what == "contribution" else (sequential_scale(both), None)
    diff_scale, diff_rule = contribution_scale(frame[f"{what}_diff"])
    label = COMPARE_MAPS[what]
    views = []
    # The legend titles are the scale rule's short lines, each cut at the map's width, so a legend never widens its view.
    below = dict(orient="bottom", direction="horizontal", gradientLength=min(width, 200), titleLimit=width)
    # A and B share a scale: one legend, under B, unless each stands alone.
    for field, title, scale, legend in (
        (f"{what}_a", f"A: {label}", shared, alt.Legend(title=rule, **below) if rows == 1 else None),
        (f"{what}_b", f"B: {label}", shared, alt.Legend(title=rule, **below)),
        (f"{what}_diff", f"B − A: {label} (red: larger in B)", diff_scale, alt.Legend(title=diff_rule, **below)),
    ):
        chart = base.encode(color=alt.Color(f"{field}:Q", scale=scale, legend=legend)).properties(name=f"compare_{field}")
        layers = [chart] + ([query_outline(row)] if row is not None else [])
        views.append(alt.layer(*layers).properties(title=title))
    if rows == 3:
        grid = alt.hconcat(*views, data=frame)
    elif rows == 2:
        grid = alt.vconcat(alt.hconcat(*views[:2]).resolve_scale(color="independent"), views[2], data=frame)
    else:
        grid = alt.vconcat(*views, data=frame)
    grid = grid.resolve_scale(color="independent")
    with warnings.catch_warnings():
        # One click parameter for every view: Altair gives it to each unit chart and says so.
        warnings.filterwarnings("ignore", message="Automatically deduplicated selection parameter", category=UserWarning)
        grid = grid.add_params(query_pick())
    lines = wrap(cells.note + "; click a cell to select its query", TITLE_CHARS)
    return grid.properties(title=alt.TitleParams(lines, anchor="start", fontSize=13))


def head_change_grid(
    changes: pd.DataFrame, metric: str = "divergence", layer: int | None = None, head: int | None = None
) -> alt.LayerChart:
    """Every layer × head coloured by the change B − A of one per-head summary (diverging at zero); click a
    cell to pick that head (:data:`~cwviz.charts.heatmaps.PICK`); the selected head is outlined."""
    if metric not in HEAD_METRICS:
        raise ValueError(f"metric must be one of {', '.join(HEAD_METRICS)}, not {metric!r}")
    column = f"{metric}_change"
    layers = int(changes["layer"].max()) + 1 if len(changes) else 1
    heads = int(changes["head"].max()) + 1 if len(changes) else 1
    cell = max(10, min(22, 520 // max(layers, 1)))
    grid = (
        alt.Chart(changes)
        .mark_rect()
        .encode(
            x=alt.X("head:O", title="head"),
            y=alt.Y("layer:O", title="layer"),
            color=alt.Color(f"{column}:Q", title=f"Δ {metric.replace('_', ' ')}", scale=signed_scale(changes[column])),
            tooltip=[
                alt.Tooltip("layer:O"),
                alt.Tooltip("head:O"),
                alt.Tooltip(f"{metric}_a:Q", title=f"{metric.replace('_', ' ')}, A", format=".4f"),
                alt.Tooltip(f"{metric}_b:Q", title=f"{metric.replace('_', ' ')}, B", format=".4f"),
                alt.Tooltip(f"{column}:Q", title="B − A", format="+.4f"),
            ],
        )
        .add_params(head_pick())
    )
    return outlined_grid(grid, layer, head, layers, heads, cell, f"Change B − A in {HEAD_METRICS[metric]} (click a cell to pick the head)")


def logprob_change_chart(changes: pd.DataFrame, query: int | None = None) -> alt.LayerChart:
    """One bar per aligned position: log p_B − log p_A of its token given the tokens before it (red: more
    likely in B, blue: less); the selected query's pair ringed. Positions nothing predicts (the first) are left out."""
    frame = changes.dropna(subset=["change"])
    labels = tuple(changes["label"]) if len(changes) else ()
    width = max(400, 16 * len(changes))
    x = alt.X(
        "pair:O",
        title="aligned position",
        axis=alt.Axis(labelExpr=label_expr(labels), labelAngle=-90, labelLimit=LABEL_LIMIT, labelFontSize=LABEL_PX),
    )
    bars = (
        alt.Chart(frame)
        .mark_bar()
        .encode(
            x=x,
            y=alt.Y("change:Q", title="log p_B − log p_A (nats)"),
            # By sign, not a continuous scale: a small change stays visible (a pale bar would vanish).
            color=alt.condition(alt.datum.change > 0, alt.value(POSITIVE), alt.value(NEGATIVE)),
            tooltip=[
                alt.Tooltip("label:N", title="position (A / B)"),
                alt.Tooltip("logprob_a:Q", title="log p, A", format=".3f"),
                alt.Tooltip("logprob_b:Q", title="log p, B", format=".3f"),
                alt.Tooltip("change:Q", title="B − A", format="+.3f"),
            ],
        )
    )
    drawn = [bars, alt.Chart(pd.DataFrame({"y": [0.0]})).mark_rule(color=RULE).encode(y="y:Q")]
    if query is not None and query in set(frame["pair"]):
        picked = frame[frame["pair"] == query]
        drawn.append(alt.Chart(picked).mark_bar(fill=None, stroke=OUTLINE, strokeWidth=2).encode(x=x, y="change:Q"))
    return alt.layer(*drawn).properties(
        width=width,
        height=260,
        title=alt.TitleParams(
            "Next-token log-probability: log p(token | the tokens before it) in B minus in A, at each aligned position",
            anchor="start",
            fontSize=13,
        ),
    )
