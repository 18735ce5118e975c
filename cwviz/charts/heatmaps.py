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
import numpy as np
import pandas as pd

from ..analyses.schema import FAMILIES, HeatmapCells, is_signed
from .palette import ATTENTION_SCHEME, DIVERGING, INK, OTHER_SCHEME, OUTLINE, RING

#: Diverging scale for signed measures (:mod:`cwviz.charts.palette`): red positive, blue negative, white at zero.
#: Attention's sequential scale: green, neither red nor blue.
SEQUENTIAL = ATTENTION_SCHEME
SIDE = 330  # px, the least a heatmap axis gets in a notebook or an export
CELL = 15  # px per position in a notebook or an export: a 12 px label per row or column without overlap
#: How the heatmap pair is laid out in a notebook or an export: side by side when it fits (``"auto"``), or as asked.
LAYOUTS = ("auto", "side", "stacked")
#: How the pages name each layout.
LAYOUT_LABELS = {"auto": "auto", "side": "side by side", "stacked": "stacked"}
#: Width (px) a fixed-size pair may take side by side under ``"auto"``: a notebook's output cell, and the
#: Compare page's main area in a 1,366 px wide window with the sidebar open (906 px in Chromium). A wider pair is
#: stacked.
PAIR_FITS = 906
#: Pixels a heatmap view adds to its plot area side by side: its row labels and axis title, and the gap to the
#: next view (its legend lies below the map).
VIEW_EXTRA = 115
#: Axis and legend label size (px) of every chart, and in presenter mode: legible from the back of a room.
LABEL_PX, PRESENTER_LABEL_PX = 12, 16
#: A text label's line box, in units of its font size: labels of neighbouring rows closer than this would
#: overlap, so only every n-th row is labelled (:func:`label_stride`).
LINE_BOX = 1.15
#: The same across a rotated key label (its glyph box, in units of its font size).
ROTATED_BOX = 1.3
#: The attention map's legend: what its green means (it is never a sign).
ATTENTION_LEGEND = ["green:", "attention", "(darker:", "more)"]
#: In presenter mode every token is labelled up to this many positions, each row and column
#: :data:`PRESENTER_ROW` px: a cell of at least 16 px and a 16 px label per row, legible from the back row; 30 rows
#: (the default prompt) are 570 px, and a map with its title and key labels (its legend inside the empty future
#: triangle) stands whole on a 720 px screen.
PRESENTER_ALL_LABELS = 40
PRESENTER_ROW = math.ceil(16 * LINE_BOX)
#: Width (px) of the content column in presenter mode at 1,280 px: the sidebar collapsed and the page's side margins
#: trimmed to 1.5 rem (cwviz.app.sidebar.PRESENTER_CSS).
PRESENTER_CONTENT_WIDTH = 1280 - 2 * 24
#: Longest row label (px) in presenter mode: a token of up to about 25 characters whole, none cut with "…" (a longer
#: one is, and its tooltip has it whole).
PRESENTER_LABEL_LIMIT = 240
#: Height (px) of each map's plot area on the dashboard: the pair, with its titles, rotated key labels and legends,
#: fits a 1280 x 720 window with the sidebar open (the first screen).
SCREEN_SIDE = 240
#: The same in presenter mode, whose 16 px labels take more of the screen.
PRESENTER_SIDE = 220
#: Longest token label (px); a longer one ends with an ellipsis (its tooltip has the whole token).
LABEL_LIMIT = 80
#: The contribution scale's end: this quantile of |value| outside the sink column (:func:`contribution_scale`).
ROBUST_QUANTILE = 0.99
#: The symmetric-log colour scale's linear range: values much smaller than this are drawn near white, values a
#: few times larger already clearly coloured, so -0.03 stays blue beside the sink's +1.
SYMLOG_CONSTANT = 0.01
#: Colour ranges of a signed map: a robust end (the default) or the largest |value|.
RANGES = ("robust", "full")
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


def check_range(colour_range: str) -> str:
    """``colour_range`` when it is one of :data:`RANGES`, else ValueError naming them."""
    if colour_range not in RANGES:
        raise ValueError(f"colour range must be one of {', '.join(RANGES)}, not {colour_range!r}")
    return colour_range


def contribution_bound(values: pd.Series, sink: pd.Series | None = None, colour_range: str = "robust") -> float:
    """The end B of a signed colour scale (domain ±B), a positive number.

    ``"robust"``: the :data:`ROBUST_QUANTILE` quantile of |value| over the cells that are not the sink's
    (``sink``, a boolean Series beside ``values``; all cells when it marks every one). The sink's own
    contribution (about +1) would otherwise set the end and paint every contribution of a few hundredths
    near white. ``"full"``: the largest |value|.
    """
    # Positional masks: ``values`` may be a concatenation with repeated index labels (Compare's A and B).
    magnitude = np.abs(np.asarray(values, dtype=float))
    keep = np.isfinite(magnitude)
    if check_range(colour_range) == "robust":
        if sink is not None and not bool(np.all(sink)):
            keep &= ~np.asarray(sink, dtype=bool)
        bound = float(np.quantile(magnitude[keep], ROBUST_QUANTILE)) if keep.any() else 0.0
    else:
        bound = float(magnitude[keep].max()) if keep.any() else 0.0
    return bound if bound > 0 else 1.0


def contribution_scale(
    values: pd.Series, sink: pd.Series | None = None, colour_range: str = "robust"
) -> tuple[alt.Scale, list[str]]:
    """The colour scale of a signed map and the legend title (three short lines) that states its rule.

    Red is positive, blue negative, white exactly 0. The domain is ±:func:`contribution_bound`; values beyond it
    are drawn at the end colours (clamped, and the title says so). The scale is symmetric-log with the linear
    range :data:`SYMLOG_CONSTANT`, so a contribution of ±0.03 is clearly coloured even beside the sink's +1.
    """
    bound = contribution_bound(values, sink, colour_range)
    finite = values[values.map(math.isfinite)] if len(values) else values
    clamped = bool(len(finite)) and float(finite.abs().max()) > bound * (1 + 1e-9)
    # The last lines say what the colours mean, on every signed legend (the rule's lines first, as tests and pages
    # read).
    title = ["clamped" if clamped else "range", f"±{bound:.2g}", "symlog", "red: adds", "blue: subtracts"]
    scale = alt.Scale(
        type="symlog",
        constant=SYMLOG_CONSTANT,
        scheme=DIVERGING,
        reverse=True,
        domain=[-bound, bound],
        domainMid=0,
        clamp=True,
    )
    return scale, title


def sequential_scale(values: pd.Series, scheme: str = SEQUENTIAL) -> alt.Scale:
    """A sequential colour scale from 0 to the largest of ``values``: attention's green, or ``scheme``."""
    top = float(values.max()) if len(values) else 1.0
    top = top if math.isfinite(top) and top > 0 else 1.0
    return alt.Scale(scheme=scheme, domain=[0, top])


def summary_scale(values: pd.Series, metric: str, signed: bool) -> alt.Scale:
    """The colour scale of a per-head statistic on a layer x head grid: a signed one (a contribution share, a cosine)
    on :func:`signed_scale` even where none is negative, so red always adds; an attention share in attention's green;
    anything else (a divergence) in :data:`~cwviz.charts.palette.OTHER_SCHEME`."""
    if signed:
        return signed_scale(values)
    return alt.Scale(scheme=ATTENTION_SCHEME if "attention" in metric else OTHER_SCHEME)


def presenter_height(rows: int) -> int:
    """Plot height (px) of a map of ``rows`` query rows in presenter mode: :data:`PRESENTER_ROW` px a row up to
    :data:`PRESENTER_ALL_LABELS` rows (every token labelled), never less than :data:`PRESENTER_SIDE`; a longer map is as
    tall as 40 rows and labels every n-th row."""
    return max(PRESENTER_SIDE, PRESENTER_ROW * min(rows, PRESENTER_ALL_LABELS))


def label_stride(count: int, extent: float, label_px: int = LABEL_PX) -> int:
    """Label every n-th of ``count`` positions spread over ``extent`` px, so that labels of ``label_px`` never
    overlap."""
    return max(1, math.ceil(label_px * LINE_BOX * count / max(extent, 1.0)))


def thinned_label_expr(labels: Sequence[str], positions: Sequence[int], keep: int | None, stride: int | str) -> str:
    """A Vega expression labelling every ``stride``-th of ``positions`` (the axis's bands, in order) and always
    the first band (the sink) and ``keep`` (the query), leaving out their close neighbours, so that no two
    labels overlap. ``stride`` is a number or a Vega expression (one that reads the ``width`` signal sizes the
    columns' labels to the drawn width)."""
    index = [-1] * (max(positions, default=0) + 1)
    for i, position in enumerate(positions):
        index[int(position)] = i
    at = 0 if keep is None or keep < 0 or keep >= len(index) else index[keep]
    i = f"{json.dumps(index)}[datum.value]"
    s = f"({stride})"
    shown = f"{i} == 0 || {i} == {at} || ({i} % {s} == 0 && abs({i} - {at}) >= {s} && {i} >= {s})"
    return f"({shown}) ? {label_expr(labels)} : ''"


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
        .mark_rect(fill=None, stroke=OUTLINE, strokeWidth=2)
        .encode(y="query:O")
    )


def cell_ring(query: int, key: int) -> alt.Chart:
    """A ring around the cell (``query``, ``key``), layered over a heatmap from its own data: a circle of fixed size,
    so the cell a sentence names is found at any prompt length, however small its rect is drawn."""
    return (
        alt.Chart()
        .transform_filter((alt.datum.query == query) & (alt.datum.key == key))
        .mark_point(shape="circle", size=260, filled=False, stroke=RING, strokeWidth=3)
        .encode(x="key:O", y="query:O")
        .properties(name="marked_cell")
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


def heatmap_view(
    cells: HeatmapCells,
    which: str = "measure",
    query: int | None = None,
    *,
    width: int | str = "container",
    height: int = SCREEN_SIDE,
    label_px: int = LABEL_PX,
    colour_range: str = "robust",
    pick: bool = True,
    generated_from: int | None = None,
    key: int | None = None,
    row_labels: bool = True,
) -> alt.LayerChart:
    """One map of a heatmap pair: ``which="attention"`` (sequential scale) or ``"measure"`` (the picked measure;
    :func:`contribution_scale` when it can be negative).

    ``width`` is a number of px, or ``"container"``: as wide as the page's column (the dashboard), its column labels
    then thinned to the drawn width by the ``width`` signal. Rows are labelled ``"12 the"`` (position and token),
    every n-th where ``height`` is too short for all (:func:`label_stride`), always with the first token and the
    selected query (``cells.query``, or ``query`` when given), whose row is outlined. A click on a cell selects
    its query (:data:`QUERY_PICK`; ``pick=False`` leaves the parameter to a chart that holds this one). Positions
    from ``generated_from`` on were generated by the model, and their labels say so (``"31 the (gen)"``). ``key``: a
    key whose cell in the query's row is ringed (:func:`cell_ring`), the cell a page's sentence names.

    With presenter mode's 16 px labels (``label_px``) the rows keep their tokens, up to :data:`PRESENTER_LABEL_LIMIT`
    px, and the key axis is labelled by position only (the row of the same position names its token): a rotated
    token would be cut, or take a fifth of a projector's height. ``row_labels=False`` leaves the rows unlabelled, for
    the right map of a pair side by side, whose rows are the left map's.
    """
    if which not in ("attention", "measure"):
        raise ValueError(f"which must be 'attention' or 'measure', not {which!r}")
    frame = cells.frame
    row = cells.query if query is None or cells.binned else query
    presenting = label_px >= PRESENTER_LABEL_PX
    x_axis, y_axis = _axes(cells, row, width, height, label_px, generated_from, row_labels)
    colour, title = _colour(cells, which, height, label_px, colour_range)
    if presenting and row_labels:  # the rows' axis has no title here: the map's title names them
        title += " (rows: queries)"
    what = "bin" if cells.binned else "position token"
    rects = (
        alt.Chart(frame)
        .mark_rect()
        .encode(
            x=alt.X("key:O", title=f"key ({'position' if presenting and not cells.binned else what})", axis=x_axis),
            y=alt.Y("query:O", title=None if presenting or not row_labels else f"query ({what})", axis=y_axis),
            color=colour,
            tooltip=_tooltips(frame, measure_label(cells.measure), cells.measure != f"contribution_{cells.kind}"),
        )
        .properties(name=f"heatmap_{which}")
    )
    rects = rects.add_params(query_pick()) if pick else rects
    layers = [rects] + ([query_outline(row)] if row is not None else [])
    if row is not None and key is not None and not cells.binned:
        layers.append(cell_ring(row, key))
    return alt.layer(*layers, data=frame).properties(
        width=width, height=height, title=alt.TitleParams(title, anchor="start", fontSize=label_px + 2)
    )


def _axes(
    cells: HeatmapCells,
    row: int | None,
    width: int | str,
    height: int,
    label_px: int,
    generated_from: int | None,
    row_labels: bool,
) -> tuple[alt.Axis, alt.Axis]:
    """The key (x) and query (y) axes of :func:`heatmap_view`: labels thinned to what the drawn size holds, always
    with the first position and the selected row ``row``; generated positions marked; keys by position alone in
    presenter mode."""
    frame = cells.frame
    keys, queries = sorted(frame["key"].unique().tolist()), sorted(frame["query"].unique().tolist())
    # A rotated key label takes its whole glyph box across the axis: a little more than a row label's line box.
    x_box = label_px * ROTATED_BOX
    if width == "container":
        x_stride: int | str = f"max(1, ceil({x_box:.2f} * {len(keys)} / width))"
    else:
        x_stride = max(1, math.ceil(x_box * len(keys) / max(width, 1)))
    y_stride = label_stride(len(queries), height, label_px)
    presenting = label_px >= PRESENTER_LABEL_PX
    limit = PRESENTER_LABEL_LIMIT if presenting else LABEL_LIMIT
    axis = dict(labelLimit=limit, labelOverlap=False, labelFontSize=label_px, titleFontSize=label_px, labelColor=INK)
    labels = list(cells.labels)
    if generated_from is not None and not cells.binned:
        labels = [label + GENERATED if i >= generated_from else label for i, label in enumerate(labels)]
    key_labels = [str(i) for i in range(len(labels))] if presenting and not cells.binned else labels
    x_axis = alt.Axis(labelAngle=-90, labelExpr=thinned_label_expr(key_labels, keys, row, x_stride), **axis)
    if row_labels:
        y_axis = alt.Axis(labelExpr=thinned_label_expr(labels, queries, row, y_stride), **axis)
    else:
        y_axis = alt.Axis(labels=False, ticks=False, title=None, **axis)
    return x_axis, y_axis


def _colour(cells: HeatmapCells, which: str, height: int, label_px: int, colour_range: str) -> tuple[alt.Color, str]:
    """The colour encoding of :func:`heatmap_view` (its scale and legend) and the map's title."""
    frame = cells.frame
    presenting = label_px >= PRESENTER_LABEL_PX
    # The legend stands right of the map, as tall as it: below it, it would push the pair past a 720 px screen.
    legend = dict(orient="right", direction="vertical", gradientLength=height)
    legend |= dict(labelFontSize=label_px, titleFontSize=label_px)
    if presenting:  # presenter mode: the legend's title one line, the legend above the map (the cells get the column's
        # width), or inside its top right corner where a causal model's future leaves that triangle empty (no cell with
        # key > query), so that a map of 30 rows stands whole on a 720 px screen
        causal = not bool((frame["key"] > frame["query"]).any())
        legend |= dict(orient="top-right" if causal else "top", direction="horizontal", titleOrient="top")
        legend |= dict(titleLimit=400, gradientLength=min(height // 2, 200))
    if which == "attention":
        title_lines = " ".join(ATTENTION_LEGEND) if presenting else ATTENTION_LEGEND
        scale = sequential_scale(frame["attention"])
        return alt.Color(
            "attention:Q", scale=scale, legend=alt.Legend(title=title_lines, **legend)
        ), "Attention weights"
    value_title = measure_label(cells.measure)
    title = value_title[:1].upper() + value_title[1:]
    if is_signed(cells.measure):
        scale, rule = contribution_scale(frame["value"], frame["key"] == SINK_KEY, colour_range)
        rule = f"{' '.join(rule[:3])}: {rule[3]}, {rule[4]}" if presenting else rule
        return alt.Color("value:Q", scale=scale, legend=alt.Legend(title=rule, **legend)), title
    # raw attention in attention's green; value-weighted attention (a magnitude, not attention) in the other hue
    scheme = ATTENTION_SCHEME if cells.measure == "raw" else OTHER_SCHEME
    scale = sequential_scale(frame["value"], scheme)
    return alt.Color("value:Q", scale=scale, legend=alt.Legend(title=None, **legend)), title


#: How a generated token's axis label ends.
GENERATED = " (gen)"
#: The first position, the sink column of every map (:data:`cwviz.core.defaults.DEFAULT_SINK`).
SINK_KEY = 0


def heatmap_pair(
    cells: HeatmapCells,
    query: int | None = None,
    layout: str = "auto",
    label_px: int = LABEL_PX,
    colour_range: str = "robust",
) -> alt.HConcatChart | alt.VConcatChart:
    """Attention beside the picked measure, at a fixed size: notebooks (:mod:`cwviz.plot`) and the dashboard's
    PNG and SVG downloads. The dashboard draws each map on its own, as wide as its column (:func:`heatmap_view`).

    One dataset of ``len(cells.frame)`` rows feeds both views; the masked upper triangle has no rows, so it
    stays empty. Each axis gets :data:`CELL` px per position, at least :data:`SIDE`. The two maps stand side by
    side when they fit the dashboard's page (``layout="auto"``, :func:`side_by_side`) or when ``layout="side"``;
    else they are stacked.
    """
    keys, queries = cells.frame["key"].nunique(), cells.frame["query"].nunique()
    size = dict(width=_extent(keys), height=_extent(queries), label_px=label_px, colour_range=colour_range)
    views = [heatmap_view(cells, which, query, pick=False, **size) for which in ("attention", "measure")]
    side = side_by_side(keys, layout)
    with warnings.catch_warnings():
        # One parameter for both views is what we want: Altair gives it to each unit chart and says so.
        warnings.filterwarnings(
            "ignore", message="Automatically deduplicated selection parameter", category=UserWarning
        )
        pair = (
            (alt.hconcat if side else alt.vconcat)(*views, data=cells.frame)
            .resolve_scale(color="independent")
            .add_params(query_pick())
        )
    lines = wrap(cells.note, ((2 if side else 1) * (_extent(keys) + VIEW_EXTRA)) // TITLE_PX_PER_CHAR)
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
