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

import altair as alt
import pandas as pd

from .heatmaps import contribution_scale, label_expr, wrap
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


def head_map(heads: pd.DataFrame, value: str = "direct", title: str = "each head's direct part") -> alt.Chart:
    """The layer x head map of ``value`` on the maps' signed symmetric-log scale (red adds, blue subtracts)."""
    scale, rule = contribution_scale(heads[value], colour_range="full")
    tooltip = [alt.Tooltip("layer:O"), alt.Tooltip("head:O"), alt.Tooltip(f"{value}:Q", format="+.4f")]
    tooltip += [alt.Tooltip(f"{c}:N") for c in ("promoted", "suppressed") if c in heads.columns]
    layers, count = int(heads["layer"].max()) + 1, int(heads["head"].max()) + 1
    return (
        alt.Chart(heads, title=title)
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
