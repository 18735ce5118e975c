"""The flow's one chart set (docs/METHOD.md sections 6 and 7): the route into the prediction beside each input token's
score, as the Flow page, :func:`cwviz.plot.flow` and a report draw it. Tables in, Altair out; pure, no torch. Red adds
to the target (or to the representation), blue subtracts, as on every other chart (:func:`sign_colour`).

| builder            | draws                                                                               |
|--------------------|-------------------------------------------------------------------------------------|
| ``route_graph``    | the route (:class:`cwviz.analyses.route.Route`): positions across, layers up          |
| ``totals_bars``    | one bar a token (:func:`total_rows`), its score or total                            |
| ``route_chart``    | the two side by side under one sentence (a notebook's and a report's Flow page)    |
| ``head_pick_map``  | the layer x head map of one value, a click picking a head                           |
| ``check_scatter``  | the method's scores against the measured knockout effects                           |
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import altair as alt
import pandas as pd

from . import palette
from .head_grid import head_pick, outline
from .heatmaps import contribution_scale, wrap

#: The head map's cells (px).
CELL = 16


def sign_of(values: pd.Series) -> pd.Series:
    """Each value's sign as the legend says it: :data:`~cwviz.charts.palette.SIGNS` ("adds" for 0 too)."""
    adds, subtracts = palette.SIGNS
    return (values >= 0).map({True: adds, False: subtracts})


def sign_colour(legend: alt.Legend | None = None) -> alt.Color:
    """The flow's one sign scale: red where a row's ``sign`` (:func:`sign_of`) adds, blue where it subtracts."""
    scale = alt.Scale(domain=list(palette.SIGNS), range=list(palette.SIGN_COLOURS))
    return alt.Color("sign:N", scale=scale, legend=legend)


def head_map(heads: pd.DataFrame, value: str = "direct", title: str | None = "each head's direct part") -> alt.Chart:
    """The layer x head map of ``value`` on the maps' signed symmetric-log scale (red adds, blue subtracts)."""
    scale, rule = contribution_scale(heads[value], colour_range="full")
    tooltip = [alt.Tooltip("layer:O"), alt.Tooltip("head:O"), alt.Tooltip(f"{value}:Q", format="+.4f")]
    tooltip += [alt.Tooltip(f"{c}:N") for c in ("promoted", "suppressed") if c in heads.columns]
    layers, count = int(heads["layer"].max()) + 1, int(heads["head"].max()) + 1
    return (
        (alt.Chart(heads, title=title) if title else alt.Chart(heads))
        .mark_rect()
        .encode(
            x=alt.X("head:O", title="head"),
            y=alt.Y("layer:O", title="layer", sort="descending"),
            color=alt.Color(f"{value}:Q", scale=scale, legend=alt.Legend(title=rule)),
            tooltip=tooltip,
        )
        .properties(width=CELL * count, height=CELL * layers)
    )


# -- the Flow page (docs/dashboard.md): the route into the prediction beside the tokens' totals -------------------
#: The page's graph: plot width and height (px).
PAGE_WIDTH, PAGE_HEIGHT = 400, 215
#: An edge's width (px) from the smallest |weight| drawn to the largest: a small negative edge still reads as blue.
EDGE_WIDTHS = (1.5, 6.0)
#: Rows of the totals' bars: every input token up to this many, else the ones with the largest |total|; (px) a row.
TOTAL_ROWS, TOTAL_ROW_PX = 16, 15
#: The totals' bars: plot width (px; with their labels the chart is over 300 px wide).
TOTALS_WIDTH = 250
#: The click selection of a node of the graph; the page passes it to Streamlit as ``selection_mode``.
NODE_PICK = "node_pick"


class Drawn(Protocol):
    """A drawn route (:class:`cwviz.analyses.route.Route`) as the charts read it: the position p, the layers, the drawn
    edges (``layer, key, query, weight``), the tokens joined to p, the positions touched and each one's spine."""

    position: int
    layers: int
    edges: pd.DataFrame
    connected: tuple[int, ...]

    @property
    def positions(self) -> list[int]: ...

    def spines(self) -> pd.DataFrame: ...


@dataclass(frozen=True)
class RouteTables:
    """What the page's graph draws of a :class:`cwviz.analyses.route.Route`: ``edges`` (the route's table with
    ``top`` = layer + 1, ``key_label``, ``query_label``, ``sign``, ``size``), ``spines`` (``position, label, bottom,
    top``) and ``nodes`` (``layer, position, label, token, role``: each drawn edge's ends, each drawn position's input
    and the prediction, role "prediction", "input" or "passes"). Labels are ``"12 token"``."""

    edges: pd.DataFrame
    spines: pd.DataFrame
    nodes: pd.DataFrame
    order: list[str]


def route_tables(drawn: Drawn, tokens: Sequence[str]) -> RouteTables:
    """The tables :func:`route_graph` draws from the route ``drawn`` (:class:`cwviz.analyses.route.Route`; its edge
    rows unchanged, in its order) and the prompt's token strings."""
    label = {p: f"{p} {tokens[p]}" for p in drawn.positions}
    edges = drawn.edges.assign(
        top=drawn.edges["layer"] + 1,
        key_label=drawn.edges["key"].map(label),
        query_label=drawn.edges["query"].map(label),
        sign=sign_of(drawn.edges["weight"]),
        size=drawn.edges["weight"].abs(),
    )
    spines = drawn.spines()
    spines = spines.assign(label=spines["position"].map(label))
    ends = [(int(r.layer), int(r.key)) for r in edges.itertuples()] + [
        (int(r.top), int(r.query)) for r in edges.itertuples()
    ]
    ends += [(0, p) for p in drawn.positions]
    ends = sorted(set(ends) - {(drawn.layers, drawn.position)}) + [(drawn.layers, drawn.position)]
    nodes = pd.DataFrame(ends, columns=["layer", "position"])
    role = [
        "prediction" if (layer, p) == (drawn.layers, drawn.position) else "input" if layer == 0 else "passes"
        for layer, p in ends
    ]
    nodes = nodes.assign(label=nodes["position"].map(label), token=[tokens[p] for p in nodes["position"]], role=role)
    return RouteTables(edges.iloc[::-1].reset_index(drop=True), spines, nodes, [label[p] for p in drawn.positions])


@dataclass(frozen=True)
class _Axes:
    """The graph's shared position axis (x: the route's labels, in the text's order) and layer axis (y: 0 .. layers)."""

    x_scale: alt.Scale
    x_axis: alt.Axis
    y_scale: alt.Scale
    y_axis: alt.Axis

    def x(self, field: str = "label") -> alt.X:
        return alt.X(f"{field}:N", scale=self.x_scale, axis=self.x_axis, title=None)

    def y(self, field: str = "layer") -> alt.Y:
        return alt.Y(f"{field}:Q", scale=self.y_scale, axis=self.y_axis, title="layer")


def _axes(order: list[str], layers: int, label_px: int) -> _Axes:
    every = 5 if layers > 12 else 1  # a layer label each, or every fifth on a deep model
    return _Axes(
        alt.Scale(type="point", domain=order, padding=0.5),
        alt.Axis(labelAngle=-60, labelLimit=90, labelFontSize=label_px, labelOverlap=False),
        alt.Scale(domain=[0, layers], nice=False, zero=False),
        alt.Axis(values=list(range(0, layers + 1, every)), labelFontSize=label_px),
    )


def _edge_rules(edges: pd.DataFrame, axes: _Axes, label_px: int) -> alt.Chart:
    """Each edge (layer, key) → (layer + 1, query) a rule, red adding and blue subtracting, as wide as |weight|."""
    legend = alt.Legend(
        title=None,
        orient="top",
        labelFontSize=label_px,
        labelExpr="datum.label == 'adds' ? 'adds (red)' : 'subtracts (blue)'",
    )
    width = alt.StrokeWidth("size:Q", scale=alt.Scale(range=list(EDGE_WIDTHS), zero=False), legend=None)
    tooltip = [
        alt.Tooltip("layer:O", title="layer"),
        alt.Tooltip("key_label:N", title="from"),
        alt.Tooltip("query_label:N", title="to"),
        alt.Tooltip("weight:Q", format="+.4f"),
    ]
    return (
        alt.Chart(edges)
        .mark_rule(opacity=0.85, strokeCap="round")
        .encode(
            x=axes.x("key_label"),
            x2="query_label:N",
            y=axes.y(),
            y2="top:Q",
            color=sign_colour(legend),
            strokeWidth=width,
        )
        .encode(tooltip=tooltip)
    )


def _node_points(nodes: pd.DataFrame, axes: _Axes) -> alt.Chart:
    """The nodes as dots (the prediction a large one); a click on one is the selection :data:`NODE_PICK`."""
    pick = alt.selection_point(name=NODE_PICK, fields=["layer", "position"], on="click", clear=False)
    size = alt.Size(
        "role:N", scale=alt.Scale(domain=["prediction", "input", "passes"], range=[180, 22, 14]), legend=None
    )
    tooltip = [alt.Tooltip("layer:O"), alt.Tooltip("position:O"), alt.Tooltip("token:N"), alt.Tooltip("role:N")]
    return (
        alt.Chart(nodes)
        .mark_circle(opacity=1, color=palette.INK)
        .encode(x=axes.x(), y=axes.y(), size=size, tooltip=tooltip)
        .add_params(pick)
    )


def route_graph(
    tables: RouteTables,
    layers: int,
    title: str,
    label_px: int = 12,
    height: int = PAGE_HEIGHT,
    width: int = PAGE_WIDTH,
    selected: tuple[int, int] | None = None,
) -> alt.LayerChart:
    """The page's graph: the route's positions across the bottom (labelled ``"12 token"``, in the text's order), the
    layers upward (0: the input entering layer 0; ``layers``: the final residual, where the prediction is read); each
    position's spine a faint vertical line (the residual carrying it up), each edge of the route a rule from (layer,
    key) to (layer + 1, query) coloured by its sign (red adds, blue subtracts) and as wide as its |weight| (the largest
    drawn on top), the nodes small dots and the prediction a large one. A click on a node is the selection
    :data:`NODE_PICK` (fields ``layer, position``); ``selected`` (layer, position), the sidebar's, is ringed where the
    graph has that node."""
    axes = _axes(tables.order, layers, label_px)
    spines = (
        alt.Chart(tables.spines)
        .mark_rule(color=palette.SPINE, strokeWidth=2)
        .encode(x=axes.x(), y=axes.y("bottom"), y2="top:Q")
    )
    drawn = [spines, _edge_rules(tables.edges, axes, label_px), _node_points(tables.nodes, axes)]
    layer, position = selected if selected is not None else (-1, -1)
    ring = tables.nodes[(tables.nodes["layer"] == layer) & (tables.nodes["position"] == position)]
    if len(ring):
        mark = alt.Chart(ring[["layer", "label"]]).mark_point(
            shape="circle", size=420, filled=False, stroke=palette.RING, strokeWidth=2.5
        )
        drawn.append(mark.encode(x=axes.x(), y=axes.y()))
    return (
        alt.layer(*drawn, title=alt.TitleParams(title, anchor="start", fontSize=label_px + 1))
        .resolve_scale(strokeWidth="independent", size="independent")
        .properties(width=width, height=height)
    )


def check_scatter(frame: pd.DataFrame, title: str, label_px: int = 12) -> alt.LayerChart:
    """The check against knockouts: one point a token (``position, token, score, effect``), the measured effect across
    and the method's score up, coloured by the score's sign (red adds, blue subtracts), on zero lines."""
    data = frame.assign(
        sign=sign_of(frame["score"]), label=[f"{p} {t}" for p, t in zip(frame["position"], frame["token"], strict=True)]
    )
    colour = sign_colour()
    points = (
        alt.Chart(data)
        .mark_circle(size=60, opacity=0.9)
        .encode(
            x=alt.X(
                "effect:Q", title="measured effect of taking the token away (Δ)", axis=alt.Axis(labelFontSize=label_px)
            ),
            y=alt.Y("score:Q", title="the method's score", axis=alt.Axis(labelFontSize=label_px)),
            color=colour,
            tooltip=[
                alt.Tooltip("label:N", title="token"),
                alt.Tooltip("score:Q", format="+.4f"),
                alt.Tooltip("effect:Q", format="+.4f"),
            ],
        )
    )
    zero = pd.DataFrame({"zero": [0.0]})
    rules = [
        alt.Chart(zero).mark_rule(color=palette.RULE).encode(x="zero:Q"),
        alt.Chart(zero).mark_rule(color=palette.RULE).encode(y="zero:Q"),
    ]
    return alt.layer(points, *rules, title=alt.TitleParams(title, anchor="start", fontSize=label_px + 1)).properties(
        width=360, height=220
    )


def total_rows(
    tokens: pd.DataFrame, value: str = "total", rows: int = TOTAL_ROWS, keep: Sequence[int] = ()
) -> pd.DataFrame:
    """The rows the totals' bars draw: every input token up to ``rows``, else the ``rows`` largest |``value``| and the
    positions ``keep`` (those a sentence names); in the text's order, with ``label`` (``"12 token"``) and ``sign``."""
    if len(tokens) <= rows:
        shown = tokens
    else:
        picked = set(tokens[value].abs().nlargest(rows).index) | set(tokens.index[tokens["position"].isin(keep)])
        shown = tokens.loc[sorted(picked)]
    shown = shown.sort_values("position")
    labels = [f"{p} {t}" for p, t in zip(shown["position"], shown["token"], strict=True)]
    return shown[["position", "token", value]].assign(label=labels, sign=sign_of(shown[value])).reset_index(drop=True)


def page_sizes(label_px: int) -> dict[str, int]:
    """The graph's plot size on the page: at 12 px labels, or smaller with presenter mode's 16 px labels, so that the
    graph and the totals stand whole on a 1280 x 720 screen beside the sidebar."""
    return (
        {"width": PAGE_WIDTH, "height": PAGE_HEIGHT}
        if label_px <= 12
        else {"width": PAGE_WIDTH - 40, "height": PAGE_HEIGHT - 50}
    )


def totals_width(label_px: int) -> int:
    """The totals' bars' plot width (px): with their labels over 300 px, and within their column at 1280 px beside the
    sidebar (presenter mode's 16 px labels take more of it)."""
    return TOTALS_WIDTH if label_px <= 12 else TOTALS_WIDTH - 40


def total_row_count(label_px: int) -> int:
    """How many tokens the totals' bars show at ``label_px`` labels (each row a line of its label)."""
    return TOTAL_ROWS if label_px <= 12 else (TOTAL_ROWS * TOTAL_ROW_PX) // (label_px + 4)


def totals_bars(
    rows: pd.DataFrame,
    title: str,
    subtitle: str | list[str] = "",
    value: str = "total",
    label_px: int = 12,
    width: int = TOTALS_WIDTH,
) -> alt.Chart:
    """Horizontal bars of :func:`total_rows` (one a token, top to bottom in the text's order), red adding and blue
    subtracting, on a zero line; each row as tall as its label (``label_px`` + 3). ``subtitle``: a line, or lines."""
    colour = sign_colour()
    bars = (
        alt.Chart(rows)
        .mark_bar()
        .encode(
            y=alt.Y(
                "label:N",
                sort=list(rows["label"]),
                title=None,
                axis=alt.Axis(labelLimit=120, labelFontSize=label_px, labelOverlap=False),
            ),
            x=alt.X(f"{value}:Q", title=value, axis=alt.Axis(labelFontSize=label_px, tickCount=3)),
            color=colour,
            tooltip=[alt.Tooltip("position:O"), alt.Tooltip("token:N"), alt.Tooltip(f"{value}:Q", format="+.4f")],
        )
    )
    zero = alt.Chart(pd.DataFrame({"zero": [0.0]})).mark_rule(color=palette.INK).encode(x="zero:Q")
    height = max((label_px + 3) * len(rows), 60)
    heading = alt.TitleParams(
        title, subtitle=subtitle or alt.Undefined, anchor="start", fontSize=label_px + 1, subtitleFontSize=label_px
    )
    return alt.layer(bars, zero, title=heading).properties(width=width, height=height)


def route_chart(
    drawn: Drawn, tokens: pd.DataFrame, note: str, value: str = "score", label_px: int = 12
) -> alt.HConcatChart:
    """The Flow page's first screen as one chart (:func:`cwviz.plot.flow`, a report): the route ``drawn``
    (:class:`cwviz.analyses.route.Route`) beside the bars of ``tokens``' ``value`` (``position, token, <value>``), under
    ``note`` (one sentence; :func:`cwviz.analyses.flow_text.describe` says what is explained). A route of no layer (a
    method without edges): the bars alone."""
    rows = total_rows(tokens, value, total_row_count(label_px), keep=drawn.connected)
    some = "every token" if len(rows) == len(tokens) else f"the {len(rows)} largest of {len(tokens)},"
    bars = totals_bars(rows, f"Each token's {value}", [some, "in text order"], value, label_px, totals_width(label_px))
    heading = alt.TitleParams(wrap(note, 110), anchor="start")
    if drawn.layers == 0:
        return alt.hconcat(bars, title=heading)
    tables = route_tables(drawn, list(tokens.sort_values("position")["token"]))
    graph = route_graph(tables, drawn.layers, "The route into the prediction", label_px, **page_sizes(label_px))
    return alt.hconcat(graph, bars, title=heading)


def head_pick_map(heads: pd.DataFrame, value: str, layer: int | None, head: int | None, title: str) -> alt.LayerChart:
    """:func:`head_map` as the page draws it: a click on a cell is the selection ``pick`` (fields ``layer, head``, as on
    every layer x head grid), and the head ``(layer, head)`` is outlined (``head`` None: nothing is)."""
    cells = head_map(heads, value, title=None).add_params(head_pick())
    drawn = [cells]
    if layer is not None and head is not None:
        ring = pd.DataFrame({"layer": [layer], "head": [head]})
        drawn.append(outline(ring).encode(y=alt.Y("layer:O", sort="descending")))
    return alt.layer(*drawn, title=alt.TitleParams(title, anchor="start"))
