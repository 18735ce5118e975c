"""Charts of the signed flow (docs/METHOD.md section 6): tables of :class:`cwviz.core.method.flow_tables.Flow` in, Altair out.
Pure: no torch. Red adds to the target (or to the representation), blue subtracts, as on every other chart.

| builder              | table in (columns)                                  | draws                                           |
|----------------------|-----------------------------------------------------|-------------------------------------------------|
| ``token_totals``     | ``position, token, total``                          | one bar per input token, coloured by its sign   |
| ``head_map``         | ``layer, head, <value>``                            | the layer x head map of one value (direct, routed) |
| ``flow_graph``       | nodes ``layer, position, value``; edges ``layer, source, target, weight`` | the pruned graph: positions across, layers up |
| ``flow_chart``       | the three                                           | all three, stacked, under one note              |
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import altair as alt
import pandas as pd

from . import palette
from .heatmaps import contribution_scale, head_pick, label_expr, outline, wrap
from .token import NEGATIVE_COLOUR, POSITIVE_COLOUR

#: Width (px) of the token bars and of the graph; the head map's cells.
WIDTH, CELL = 640, 16
#: Height (px) of the token bars and of the graph.
BAR_HEIGHT, GRAPH_HEIGHT = 160, 320
#: Most input positions the graph draws (those with the largest |value| in its nodes; the edges among them).
GRAPH_POSITIONS = 64


def _sign_colour() -> alt.Color:
    """Red where the row's ``sign`` is "adds", blue where it "subtracts" (the ends of the maps' diverging scale)."""
    return alt.Color(
        "sign:N",
        scale=alt.Scale(domain=["adds", "subtracts"], range=[POSITIVE_COLOUR, NEGATIVE_COLOUR]),
        legend=alt.Legend(title=None, orient="top"),
    )


def token_totals(tokens: pd.DataFrame, value: str = "total", title: str = "each input token's signed total") -> alt.Chart:
    """One bar per input position (labelled by its token), height ``value``, red adding and blue subtracting."""
    frame = tokens[["position", "token", value]].assign(sign=lambda f: (f[value] >= 0).map({True: "adds", False: "subtracts"}))
    labels = [f"{token} ({position})" for position, token in zip(frame["position"], frame["token"], strict=True)]
    return (
        alt.Chart(frame, title=title)
        .mark_bar()
        .encode(
            x=alt.X("position:O", title=None, axis=alt.Axis(labelExpr=label_expr(labels), labelAngle=-60, labelLimit=80)),
            y=alt.Y(f"{value}:Q", title=value),
            color=_sign_colour(),
            tooltip=[alt.Tooltip("position:O"), alt.Tooltip("token:N"), alt.Tooltip(f"{value}:Q", format="+.4f")],
        )
        .properties(width=WIDTH, height=BAR_HEIGHT)
    )


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


def flow_graph(nodes: pd.DataFrame, edges: pd.DataFrame, title: str = "the pruned graph") -> alt.LayerChart:
    """Positions across, layers up: a node per (layer, position) with a value, sized by |value|; an edge (layer,
    source) → (layer + 1, target) per row of ``edges``, its width |weight| and its colour the sign. At most
    :data:`GRAPH_POSITIONS` positions: those whose nodes carry the most |value|."""
    keep = nodes.assign(size=nodes["value"].abs()).groupby("position")["size"].sum().nlargest(GRAPH_POSITIONS).index
    nodes = nodes[nodes["position"].isin(keep) & (nodes["value"] != 0)].assign(
        sign=lambda f: (f["value"] >= 0).map({True: "adds", False: "subtracts"}), size=lambda f: f["value"].abs()
    )
    edges = edges[edges["source"].isin(keep) & edges["target"].isin(keep)].assign(
        top=lambda f: f["layer"] + 1,
        size=lambda f: f["weight"].abs(),
        sign=lambda f: (f["weight"] >= 0).map({True: "adds", False: "subtracts"}),
    )
    x = alt.X("position:Q", title="position", scale=alt.Scale(zero=False, nice=False))
    y = alt.Y("layer:Q", title="layer (residual entering it)", scale=alt.Scale(zero=False, nice=False))
    lines = (
        alt.Chart(edges)
        .mark_rule(opacity=0.6)
        .encode(
            x=alt.X("source:Q", title="position", scale=alt.Scale(zero=False, nice=False)),
            x2="target:Q",
            y=alt.Y("layer:Q", title="layer (residual entering it)", scale=alt.Scale(zero=False, nice=False)),
            y2="top:Q",
            color=_sign_colour(),
            strokeWidth=alt.StrokeWidth("size:Q", scale=alt.Scale(range=[0.3, 5]), legend=None),
            tooltip=[alt.Tooltip(c) for c in ("layer:O", "source:O", "target:O")] + [alt.Tooltip("weight:Q", format="+.4f")],
        )
    )
    points = (
        alt.Chart(nodes)
        .mark_circle()
        .encode(
            x=x,
            y=y,
            color=_sign_colour(),
            size=alt.Size("size:Q", scale=alt.Scale(range=[8, 300]), legend=None),
            tooltip=[alt.Tooltip("layer:O"), alt.Tooltip("position:O"), alt.Tooltip("value:Q", format="+.4f")],
        )
    )
    return alt.layer(lines, points, title=title).properties(width=WIDTH, height=GRAPH_HEIGHT)


def flow_chart(
    tokens: pd.DataFrame, heads: pd.DataFrame, nodes: pd.DataFrame, edges: pd.DataFrame, note: str, value: str = "total"
) -> alt.VConcatChart:
    """The token totals, the head map and the graph, stacked under ``note`` (one sentence saying what is shown)."""
    head_value = "direct" if heads["direct"].abs().sum() > 0 else "routed"
    return alt.vconcat(
        token_totals(tokens, value),
        alt.hconcat(head_map(heads, head_value, f"each head's {head_value} part"), flow_graph(nodes, edges)),
        title=alt.TitleParams(wrap(note, 110), anchor="start"),
    ).resolve_scale(color="independent", size="independent", strokeWidth="independent")


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


def _sign(values: pd.Series) -> pd.Series:
    return (values >= 0).map({True: "adds", False: "subtracts"})


def route_tables(drawn, tokens: Sequence[str]) -> RouteTables:
    """The tables :func:`route_graph` draws from the route ``drawn`` (:class:`cwviz.analyses.route.Route`; its edge
    rows unchanged, in its order) and the prompt's token strings."""
    label = {p: f"{p} {tokens[p]}" for p in drawn.positions}
    edges = drawn.edges.assign(
        top=drawn.edges["layer"] + 1,
        key_label=drawn.edges["key"].map(label),
        query_label=drawn.edges["query"].map(label),
        sign=_sign(drawn.edges["weight"]),
        size=drawn.edges["weight"].abs(),
    )
    spines = drawn.spines()
    spines = spines.assign(label=spines["position"].map(label))
    ends = [(int(r.layer), int(r.key)) for r in edges.itertuples()] + [(int(r.top), int(r.query)) for r in edges.itertuples()]
    ends += [(0, p) for p in drawn.positions]
    ends = sorted(set(ends) - {(drawn.layers, drawn.position)}) + [(drawn.layers, drawn.position)]
    nodes = pd.DataFrame(ends, columns=["layer", "position"])
    role = ["prediction" if (layer, p) == (drawn.layers, drawn.position) else "input" if layer == 0 else "passes" for layer, p in ends]
    nodes = nodes.assign(label=nodes["position"].map(label), token=[tokens[p] for p in nodes["position"]], role=role)
    return RouteTables(edges.iloc[::-1].reset_index(drop=True), spines, nodes, [label[p] for p in drawn.positions])


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
    x_scale = alt.Scale(type="point", domain=tables.order, padding=0.5)
    y_scale = alt.Scale(domain=[0, layers], nice=False, zero=False)
    x_axis = alt.Axis(labelAngle=-60, labelLimit=90, labelFontSize=label_px, labelOverlap=False)
    y_axis = alt.Axis(values=list(range(0, layers + 1, 5 if layers > 12 else 1)), labelFontSize=label_px)
    x = alt.X("label:N", scale=x_scale, axis=x_axis, title=None)
    y = alt.Y("layer:Q", scale=y_scale, axis=y_axis, title="layer")
    colour = alt.Color(
        "sign:N",
        scale=alt.Scale(domain=["adds", "subtracts"], range=[POSITIVE_COLOUR, NEGATIVE_COLOUR]),
        legend=alt.Legend(
            title=None, orient="top", labelFontSize=label_px, labelExpr="datum.label == 'adds' ? 'adds (red)' : 'subtracts (blue)'"
        ),
    )
    spines = (
        alt.Chart(tables.spines)
        .mark_rule(color=palette.SPINE, strokeWidth=2)
        .encode(
            x=alt.X("label:N", scale=x_scale, axis=x_axis, title=None),
            y=alt.Y("bottom:Q", scale=y_scale, axis=y_axis, title="layer"),
            y2="top:Q",
        )
    )
    lines = (
        alt.Chart(tables.edges)
        .mark_rule(opacity=0.85, strokeCap="round")
        .encode(
            x=alt.X("key_label:N", title=None, scale=x_scale, axis=x_axis),
            x2="query_label:N",
            y=alt.Y("layer:Q", title="layer", scale=y_scale, axis=y_axis),
            y2="top:Q",
            color=colour,
            strokeWidth=alt.StrokeWidth("size:Q", scale=alt.Scale(range=list(EDGE_WIDTHS), zero=False), legend=None),
            tooltip=[
                alt.Tooltip("layer:O", title="layer"),
                alt.Tooltip("key_label:N", title="from"),
                alt.Tooltip("query_label:N", title="to"),
                alt.Tooltip("weight:Q", format="+.4f"),
            ],
        )
    )
    pick = alt.selection_point(name=NODE_PICK, fields=["layer", "position"], on="click", clear=False)
    points = (
        alt.Chart(tables.nodes)
        .mark_circle(opacity=1, color="#31333f")
        .encode(
            x=x,
            y=y,
            size=alt.Size("role:N", scale=alt.Scale(domain=["prediction", "input", "passes"], range=[180, 22, 14]), legend=None),
            tooltip=[alt.Tooltip("layer:O"), alt.Tooltip("position:O"), alt.Tooltip("token:N"), alt.Tooltip("role:N")],
        )
        .add_params(pick)
    )
    drawn = [spines, lines, points]
    layer, position = selected if selected is not None else (-1, -1)
    ring = tables.nodes[(tables.nodes["layer"] == layer) & (tables.nodes["position"] == position)]
    if len(ring):
        drawn.append(
            alt.Chart(ring[["layer", "label"]])
            .mark_point(shape="circle", size=420, filled=False, stroke="#111111", strokeWidth=2.5)
            .encode(x=x, y=y)
        )
    return (
        alt.layer(*drawn, title=alt.TitleParams(title, anchor="start", fontSize=label_px + 1))
        .resolve_scale(strokeWidth="independent", size="independent")
        .properties(width=width, height=height)
    )


def check_scatter(frame: pd.DataFrame, title: str, label_px: int = 12) -> alt.LayerChart:
    """The check against knockouts: one point a token (``position, token, score, effect``), the measured effect across
    and the method's score up, coloured by the score's sign (red adds, blue subtracts), on zero lines."""
    data = frame.assign(sign=_sign(frame["score"]), label=[f"{p} {t}" for p, t in zip(frame["position"], frame["token"], strict=True)])
    colour = alt.Color("sign:N", scale=alt.Scale(domain=["adds", "subtracts"], range=[POSITIVE_COLOUR, NEGATIVE_COLOUR]), legend=None)
    points = (
        alt.Chart(data)
        .mark_circle(size=60, opacity=0.9)
        .encode(
            x=alt.X("effect:Q", title="measured effect of taking the token away (Δ)", axis=alt.Axis(labelFontSize=label_px)),
            y=alt.Y("score:Q", title="the method's score", axis=alt.Axis(labelFontSize=label_px)),
            color=colour,
            tooltip=[alt.Tooltip("label:N", title="token"), alt.Tooltip("score:Q", format="+.4f"), alt.Tooltip("effect:Q", format="+.4f")],
        )
    )
    zero = pd.DataFrame({"zero": [0.0]})
    rules = [
        alt.Chart(zero).mark_rule(color=palette.RULE).encode(x="zero:Q"),
        alt.Chart(zero).mark_rule(color=palette.RULE).encode(y="zero:Q"),
    ]
    return alt.layer(points, *rules, title=alt.TitleParams(title, anchor="start", fontSize=label_px + 1)).properties(width=360, height=220)


def total_rows(tokens: pd.DataFrame, value: str = "total", rows: int = TOTAL_ROWS, keep: Sequence[int] = ()) -> pd.DataFrame:
    """The rows the totals' bars draw: every input token up to ``rows``, else the ``rows`` largest |``value``| and the
    positions ``keep`` (those a sentence names); in the text's order, with ``label`` (``"12 token"``) and ``sign``."""
    if len(tokens) <= rows:
        shown = tokens
    else:
        picked = set(tokens[value].abs().nlargest(rows).index) | set(tokens.index[tokens["position"].isin(keep)])
        shown = tokens.loc[sorted(picked)]
    shown = shown.sort_values("position")
    labels = [f"{p} {t}" for p, t in zip(shown["position"], shown["token"], strict=True)]
    return shown[["position", "token", value]].assign(label=labels, sign=_sign(shown[value])).reset_index(drop=True)


def page_sizes(label_px: int) -> dict[str, int]:
    """The graph's plot size on the page: at 12 px labels, or smaller with presenter mode's 16 px labels, so that the
    graph and the totals stand whole on a 1280 x 720 screen beside the sidebar."""
    return {"width": PAGE_WIDTH, "height": PAGE_HEIGHT} if label_px <= 12 else {"width": PAGE_WIDTH - 40, "height": PAGE_HEIGHT - 50}


def totals_width(label_px: int) -> int:
    """The totals' bars' plot width (px): with their labels over 300 px, and within their column at 1280 px beside the
    sidebar (presenter mode's 16 px labels take more of it)."""
    return TOTALS_WIDTH if label_px <= 12 else TOTALS_WIDTH - 40


def total_row_count(label_px: int) -> int:
    """How many tokens the totals' bars show at ``label_px`` labels (each row a line of its label)."""
    return TOTAL_ROWS if label_px <= 12 else (TOTAL_ROWS * TOTAL_ROW_PX) // (label_px + 4)


def totals_bars(
    rows: pd.DataFrame, title: str, subtitle: str | list[str] = "", value: str = "total", label_px: int = 12, width: int = TOTALS_WIDTH
) -> alt.Chart:
    """Horizontal bars of :func:`total_rows` (one a token, top to bottom in the text's order), red adding and blue
    subtracting, on a zero line; each row as tall as its label (``label_px`` + 3). ``subtitle``: a line, or lines."""
    colour = alt.Color("sign:N", scale=alt.Scale(domain=["adds", "subtracts"], range=[POSITIVE_COLOUR, NEGATIVE_COLOUR]), legend=None)
    bars = (
        alt.Chart(rows)
        .mark_bar()
        .encode(
            y=alt.Y(
                "label:N", sort=list(rows["label"]), title=None, axis=alt.Axis(labelLimit=120, labelFontSize=label_px, labelOverlap=False)
            ),
            x=alt.X(f"{value}:Q", title=value, axis=alt.Axis(labelFontSize=label_px, tickCount=3)),
            color=colour,
            tooltip=[alt.Tooltip("position:O"), alt.Tooltip("token:N"), alt.Tooltip(f"{value}:Q", format="+.4f")],
        )
    )
    zero = alt.Chart(pd.DataFrame({"zero": [0.0]})).mark_rule(color="#31333f").encode(x="zero:Q")
    height = max((label_px + 3) * len(rows), 60)
    heading = alt.TitleParams(title, subtitle=subtitle or alt.Undefined, anchor="start", fontSize=label_px + 1, subtitleFontSize=label_px)
    return alt.layer(bars, zero, title=heading).properties(width=width, height=height)


def head_pick_map(heads: pd.DataFrame, value: str, layer: int | None, head: int | None, title: str) -> alt.LayerChart:
    """:func:`head_map` as the page draws it: a click on a cell is the selection ``pick`` (fields ``layer, head``, as on
    every layer x head grid), and the head ``(layer, head)`` is outlined (``head`` None: nothing is)."""
    cells = head_map(heads, value, title=None).add_params(head_pick())
    drawn = [cells]
    if layer is not None and head is not None:
        ring = pd.DataFrame({"layer": [layer], "head": [head]})
        drawn.append(outline(ring).encode(y=alt.Y("layer:O", sort="descending")))
    return alt.layer(*drawn, title=alt.TitleParams(title, anchor="start"))
