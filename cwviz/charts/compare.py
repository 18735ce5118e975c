"""Compare chart builders: two inputs' maps and their difference, per-head changes, log-probability changes.

Pure: tables from :mod:`cwviz.analyses.compare` in, Altair out. Differences use the diverging scale of the
heatmaps, centred at zero (red: B larger, blue: B smaller, white: no change).
"""

from __future__ import annotations

import warnings

import altair as alt
import pandas as pd

from ..analyses.schema import COMPARE_MAPS, HEAD_METRICS, CompareCells
from .head_grid import head_pick, outlined_grid
from .heatmaps import (
    CELL,
    LABEL_PX,
    PAIR_FITS,
    PRESENTER_CONTENT_WIDTH,
    PRESENTER_LABEL_LIMIT,
    PRESENTER_LABEL_PX,
    PRESENTER_ROW,
    check_layout,
    contribution_scale,
    label_expr,
    label_stride,
    query_outline,
    query_pick,
    sequential_scale,
    signed_scale,
    thinned_label_expr,
    wrap,
)
from .palette import NEGATIVE, OUTLINE, POSITIVE, RULE

#: Most aligned keys for which A, B and B − A stand in one row (``layout="auto"`` or ``"side"``); up to :data:`TWO_UP`
#: keys A and B stand side by side above the difference; beyond, the three are stacked (docs/dashboard.md).
THREE_UP = 16
TWO_UP = 32
#: Pixels the first map of a row adds to its plot area: its row labels ("12 lighthouse / 12 keeper", cut at
#: :data:`LABEL_LIMIT`) and axis title; a map beside it shows the same aligned rows and has no row labels, only
#: :data:`GAP` px before it (every legend lies below its map).
VIEW_EXTRA = 155
GAP = 24
SIDE = 220  # px, the least a compared map's axis gets
#: Width (px) the maps of a row may take under ``layout="side"``: the dashboard's main area in a 1,600 px window
#: with the sidebar open (about 1,220 px in Chromium), less a margin. A wider map is drawn smaller, its labels
#: thinned so that they never overlap (:func:`~cwviz.charts.heatmaps.label_stride`).
SIDE_FITS = 1180
#: Characters a title line holds: about 700 px at 13 px, narrower than the narrowest grid of maps.
TITLE_CHARS = 100
LABEL_LIMIT = 110  # px, the longest axis label ("12 lighthouse / 12 keeper" is cut with an ellipsis)
#: Width (px) the maps of a row may take in presenter mode: the content column of a projector's 1,280 px window with
#: the sidebar collapsed (:data:`~cwviz.charts.heatmaps.PRESENTER_CONTENT_WIDTH`), less a margin.
PRESENTER_FITS = PRESENTER_CONTENT_WIDTH - 40


def _extent(count: int) -> int:
    return max(SIDE, CELL * count)


def per_row(keys: int, layout: str = "auto") -> int:
    """How many of A, B and B − A share a row for ``keys`` aligned keys under ``layout``
    (:data:`~cwviz.charts.heatmaps.LAYOUTS`): 3 (one row) up to :data:`THREE_UP` keys, 2 (A and B above the difference)
    up to :data:`TWO_UP`, else 1 (stacked); always 1 under ``"stacked"``. The maps are drawn as small as the row needs
    to fit the page (:func:`map_size`)."""
    if check_layout(layout) == "stacked":
        return 1
    return 3 if keys <= THREE_UP else 2 if keys <= TWO_UP else 1


def map_size(
    keys: int, queries: int, rows: int, fits: int, least_cell: int = 0, label_room: int = VIEW_EXTRA
) -> tuple[int, int]:
    """Plot width and height (px) of each compared map, ``rows`` of them in a row of at most ``fits`` px: the first
    with ``label_room`` px of row labels, the others :data:`GAP` px apart. At most :data:`CELL` px a key (at least
    :data:`SIDE` a map), at least ``least_cell`` px a key (presenter mode's 16); a square grid stays square."""
    width = min(_extent(keys), (fits - label_room - (rows - 1) * GAP) // rows)
    width = max(width, least_cell * keys)
    height = width if queries == keys else max(_extent(queries) if not least_cell else least_cell * queries, SIDE)
    return width, height


def compare_maps(
    cells: CompareCells,
    what: str = "contribution",
    query: int | None = None,
    layout: str = "auto",
    label_px: int = LABEL_PX,
) -> alt.ConcatChart:
    """A, B and B − A of one map (``what``: ``"contribution"`` or ``"attention"``) on the aligned grid.

    A and B share one colour scale (sequential for attention, diverging at zero for contributions); the
    difference has its own, diverging at zero. The selected query's pair (``cells.query``) is outlined on each
    view; a click on a cell selects its query in A (:data:`~cwviz.charts.heatmaps.QUERY_PICK`, field
    ``query_position``). As many maps share a row as :func:`per_row` says, the row's width
    :data:`~cwviz.charts.heatmaps.PAIR_FITS` (``"auto"``: a 1,366 px window's page), :data:`SIDE_FITS` (``"side"``)
    or :data:`PRESENTER_FITS`; a map beside another has no row labels (its rows are the first map's). ``label_px``:
    the axis labels' size; presenter mode's (:data:`~cwviz.charts.heatmaps.PRESENTER_LABEL_PX`) keeps cells of
    16 px or more and the row labels whole, and labels the keys by position.
    """
    if what not in COMPARE_MAPS:
        raise ValueError(f"what must be one of {', '.join(COMPARE_MAPS)}, not {what!r}")
    frame = cells.frame
    row = cells.query if query is None else query
    rows, width, height = _arrangement(cells, layout, label_px)
    base = _base_map(cells, what, row, width, height, label_px)
    both = pd.concat([frame[f"{what}_a"], frame[f"{what}_b"]])
    # Contributions as on the Heatmaps page: the end off the sink column, symmetric-log, clamped (the legend says so).
    sink = pd.concat([frame["key_a"] == 0, frame["key_b"] == 0]) if {"key_a", "key_b"} <= set(frame) else None
    shared, rule = contribution_scale(both, sink) if what == "contribution" else (sequential_scale(both), None)
    diff_scale, diff_rule = contribution_scale(frame[f"{what}_diff"])
    label = COMPARE_MAPS[what]
    views = []
    # The legend titles are the scale rule's short lines, each cut at the map's width, so a legend never widens its
    # view.
    below = dict(orient="bottom", direction="horizontal", gradientLength=min(width, 200), titleLimit=width)
    # A and B share a scale: one legend, under B, unless each stands alone.
    for field, title, scale, legend in (
        (f"{what}_a", f"A: {label}", shared, alt.Legend(title=rule, **below) if rows == 1 else None),
        (f"{what}_b", f"B: {label}", shared, alt.Legend(title=rule, **below)),
        (f"{what}_diff", f"B − A: {label} (red: larger in B)", diff_scale, alt.Legend(title=diff_rule, **below)),
    ):
        chart = base.encode(color=alt.Color(f"{field}:Q", scale=scale, legend=legend)).properties(
            name=f"compare_{field}"
        )
        # beside A: its rows, unlabelled
        if (field == f"{what}_b" and rows > 1) or (field == f"{what}_diff" and rows == 3):
            chart = chart.encode(y=alt.Y("query:O", title=None, axis=alt.Axis(labels=False, ticks=False)))
        layers = [chart] + ([query_outline(row)] if row is not None else [])
        views.append(alt.layer(*layers).properties(title=title))
    lines = wrap(cells.note + "; click a cell to select its query", TITLE_CHARS)
    return _grid(views, rows, frame).properties(title=alt.TitleParams(lines, anchor="start", fontSize=13))


def _arrangement(cells: CompareCells, layout: str, label_px: int) -> tuple[int, int, int]:
    """``(maps per row, width, height)`` of each compared map (px): :func:`per_row` and :func:`map_size`, with
    presenter mode's cells of at least 16 px, every row labelled, and at most two maps a row unless stacked."""
    keys, queries = cells.frame["key"].nunique(), cells.frame["query"].nunique()
    if label_px < PRESENTER_LABEL_PX:
        rows = per_row(keys, layout)
        return (rows, *map_size(keys, queries, rows, SIDE_FITS if layout == "side" else PAIR_FITS))
    rows = per_row(keys, layout) if check_layout(layout) == "stacked" else min(per_row(keys, layout), 2)
    longest = max((len(str(label)) for label in cells.labels), default=4)
    room = min(PRESENTER_LABEL_LIMIT, round(0.6 * label_px * longest)) + 30
    width, _ = map_size(keys, queries, rows, PRESENTER_FITS, least_cell=PRESENTER_LABEL_PX, label_room=room)
    return rows, width, max(PRESENTER_ROW * queries, SIDE)  # a row as tall as its 16 px label needs: every row labelled


def _base_map(cells: CompareCells, what: str, row: int | None, width: int, height: int, label_px: int) -> alt.Chart:
    """The cells of one compared map, not yet coloured: axes labelled by aligned position (every n-th where the map is
    too small for all, always with the selected ``row``; keys by position alone in presenter mode) and tooltips
    holding A, B and B − A."""
    frame = cells.frame
    presenter = label_px >= PRESENTER_LABEL_PX
    limit = PRESENTER_LABEL_LIMIT if presenter else LABEL_LIMIT
    key_labels = [str(i) for i in range(len(cells.labels))] if presenter else cells.labels

    def axis(field: str, extent: int, labels=cells.labels, **more) -> alt.Axis:
        positions = sorted(frame[field].unique())
        stride = label_stride(len(positions), extent, label_px)
        text = thinned_label_expr(labels, positions, row, stride) if stride > 1 else label_expr(labels)
        return alt.Axis(labelExpr=text, labelLimit=limit, labelOverlap=False, labelFontSize=label_px, **more)

    tooltips = [
        alt.Tooltip("query_token:N", title="query (A / B)"),
        alt.Tooltip("key_token:N", title="key (A / B)"),
        alt.Tooltip(f"{what}_a:Q", title=f"{what}, A", format="+.4f"),
        alt.Tooltip(f"{what}_b:Q", title=f"{what}, B", format="+.4f"),
        alt.Tooltip(f"{what}_diff:Q", title=f"{what}, B − A", format="+.4f"),
    ]
    return (
        alt.Chart(frame)
        .mark_rect()
        .encode(
            x=alt.X("key:O", title="key (aligned position)", axis=axis("key", width, key_labels, labelAngle=-90)),
            y=alt.Y("query:O", title="query (aligned position)", axis=axis("query", height)),
            tooltip=tooltips,
        )
        .properties(width=width, height=height)
    )


def _grid(views: list[alt.LayerChart], rows: int, frame: pd.DataFrame) -> alt.ConcatChart:
    """A, B and B − A, ``rows`` maps a row (3: side by side; 2: A and B, B − A under them; 1: stacked), each with
    its own colour scale, one click parameter for all."""
    if rows == 3:
        grid = alt.hconcat(*views, data=frame)
    elif rows == 2:
        grid = alt.vconcat(alt.hconcat(*views[:2]).resolve_scale(color="independent"), views[2], data=frame)
    else:
        grid = alt.vconcat(*views, data=frame)
    grid = grid.resolve_scale(color="independent")
    with warnings.catch_warnings():
        # One click parameter for every view: Altair gives it to each unit chart and says so.
        warnings.filterwarnings(
            "ignore", message="Automatically deduplicated selection parameter", category=UserWarning
        )
        return grid.add_params(query_pick())


def head_change_grid(
    changes: pd.DataFrame, metric: str = "divergence", layer: int | None = None, head: int | None = None
) -> alt.LayerChart:
    """Every layer × head coloured by the change B − A of one per-head summary (diverging at zero); click a
    cell to pick that head (:data:`~cwviz.charts.head_grid.PICK`); the selected head is outlined."""
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
    return outlined_grid(
        grid,
        layer,
        head,
        layers,
        heads,
        cell,
        f"Change B − A in {HEAD_METRICS[metric]} (click a cell to pick the head)",
    )


def logprob_change_chart(changes: pd.DataFrame, query: int | None = None, label_px: int = LABEL_PX) -> alt.LayerChart:
    """One bar per aligned position: log p_B − log p_A of its token given the tokens before it (red: more
    likely in B, blue: less); the selected query's pair ringed. Positions nothing predicts (the first) are left out.
    ``label_px``: presenter mode's 16 px labels keep each position's label whole (up to
    :data:`~cwviz.charts.heatmaps.PRESENTER_LABEL_LIMIT` px)."""
    frame = changes.dropna(subset=["change"])
    labels = tuple(changes["label"]) if len(changes) else ()
    width = max(400, 16 * len(changes))
    x = alt.X(
        "pair:O",
        title="aligned position",
        axis=alt.Axis(
            labelExpr=label_expr(labels),
            labelAngle=-90,
            labelLimit=PRESENTER_LABEL_LIMIT if label_px >= PRESENTER_LABEL_PX else LABEL_LIMIT,
            labelFontSize=label_px,
        ),
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
