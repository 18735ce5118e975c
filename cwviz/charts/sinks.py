"""Charts of docs/METHOD.md section 4 (attention sinks): tidy tables from :mod:`cwviz.analyses.sinks` in, ``alt.Chart``
out.

Colour convention of the dashboard (:mod:`cwviz.charts.palette`): diverging scales are centred at zero, red positive,
blue negative; attention is green; other lines are neutral grey and gold.
"""

from __future__ import annotations

import json
import math

import altair as alt
import pandas as pd

from .head_grid import head_pick, outline
from .heatmaps import signed_scale
from .palette import ACCENT, ATTENTION, KEY, MUTED, NEGATIVE, NEUTRAL, OUTLINE, POSITIVE, RULE

#: Plot width (px) of a chart that shares the page's width with another: it, its axis labels and title fit half the
#: main area of a 1,280 px window with the sidebar open.
HALF_WIDTH = 320
#: Most points drawn in the ratio/norm scatter (Altair's limit is 5000 rows); beyond it an even sample.
MAX_POINTS = 4000


def ratio_norm_chart(
    points: pd.DataFrame,
    curve: pd.DataFrame,
    minimiser: float,
    title: str = "",
    query: int | None = None,
    width: int = 460,
    height: int = 320,
) -> alt.LayerChart:
    """(a) Sink ratio against head-output norm for one head, with the analytic curve and its minimum.

    ``points``: rows of :func:`cwviz.analyses.sinks.sink_table` for one layer and head (optionally with a
    ``prompt`` column, for pooled prompts); ``curve``: ``sink_ratio, output_norm`` of the typical curve
    (:meth:`cwviz.analyses.sinks.SinkCurve.table`); ``minimiser``: the ratio where it is smallest; ``query``: a
    query position to ring (of prompt 0 when pooled).
    """
    data = points.dropna(subset=["sink_ratio", "output_norm"])
    if len(data) > MAX_POINTS:
        data = data.iloc[:: math.ceil(len(data) / MAX_POINTS)]
    pooled = "prompt" in data.columns and data["prompt"].nunique() > 1
    tooltip = [
        alt.Tooltip("query:Q", title="query"),
        alt.Tooltip("token:N", title="token"),
        alt.Tooltip("sink_ratio:Q", title="sink ratio s", format=".3f"),
        alt.Tooltip("output_norm:Q", title="‖o‖", format=".3f"),
        alt.Tooltip("rest_norm:Q", title="‖m‖", format=".3f"),
        alt.Tooltip("cos_sink_rest:Q", title="cos(ṽ_sink, m)", format=".3f"),
    ]
    if pooled:
        tooltip.insert(0, alt.Tooltip("prompt:N", title="prompt"))
    x = alt.X("sink_ratio:Q", title="sink ratio s (attention on the sink)", scale=alt.Scale(domain=[0, 1]))
    y = alt.Y("output_norm:Q", title="head output norm ‖o‖")
    dots = (
        alt.Chart(data)
        .mark_circle(size=36, opacity=0.6)
        .encode(
            x=x,
            y=y,
            color=alt.Color("prompt:N", title="prompt") if pooled else alt.value(KEY),
            tooltip=tooltip,
        )
    )
    line = (
        alt.Chart(curve.assign(label="‖s ṽ_sink + (1 − s) m‖, typical m"))
        .mark_line(color=ACCENT, strokeWidth=2)
        .encode(
            x=x,
            y=y,
            tooltip=[
                alt.Tooltip("label:N", title="curve"),
                alt.Tooltip("sink_ratio:Q", format=".2f"),
                alt.Tooltip("output_norm:Q", format=".3f"),
            ],
        )
    )
    layers = [dots, line]
    if math.isfinite(minimiser):
        marker = pd.DataFrame({"sink_ratio": [minimiser], "label": [f"min at s* = {minimiser:.2f}"]})
        rule = (
            alt.Chart(marker).mark_rule(color=ACCENT, strokeDash=[4, 3]).encode(x="sink_ratio:Q", tooltip=["label:N"])
        )
        text = (
            alt.Chart(marker)
            .mark_text(align="left", dx=4, dy=-6, color=ACCENT)
            .encode(x="sink_ratio:Q", y=alt.value(8), text="label:N")
        )
        layers += [rule, text]
    if query is not None:
        ringed = data[data["query"] == query]
        if "prompt" in ringed.columns:
            ringed = ringed[ringed["prompt"] == ringed["prompt"].min()]
        if not ringed.empty:
            layers.append(
                alt.Chart(ringed)
                .mark_point(size=160, shape="circle", filled=False, color=OUTLINE, strokeWidth=2)
                .encode(x=x, y=y, tooltip=tooltip)
            )
    return alt.layer(*layers).properties(title=title, width=width, height=height)


def anti_alignment_map(
    heads: pd.DataFrame, layer: int | None = None, head: int | None = None, width: int = 300, height: int = 420
) -> alt.LayerChart:
    """(b) Layers x heads map of the mean cos(ṽ_sink, m), diverging at zero (blue: anti-aligned).

    ``heads``: :func:`cwviz.analyses.sinks.sink_head_summary`. The selected layer (and head) is outlined. A click on a
    cell sets the selection parameter ``pick`` (:func:`cwviz.charts.head_grid.head_pick`).
    """
    pick = head_pick()
    color = alt.Color(
        "cos_sink_rest:Q",
        title="cos(ṽ_sink, m)",
        scale=signed_scale(heads["cos_sink_rest"], least=0.05),
    )
    base = alt.Chart(heads).encode(x=alt.X("head:O", title="head"), y=alt.Y("layer:O", title="layer"))
    cells = (
        base.mark_rect()
        .encode(
            color=color,
            tooltip=[
                alt.Tooltip("layer:O"),
                alt.Tooltip("head:O"),
                alt.Tooltip("cos_sink_rest:Q", title="mean cos(ṽ_sink, m)", format=".3f"),
                alt.Tooltip("sink_ratio:Q", title="mean sink ratio", format=".3f"),
                alt.Tooltip("minimising_ratio:Q", title="ratio minimising ‖o‖", format=".2f"),
            ],
        )
        .add_params(pick)
    )
    layers = [cells]
    if layer is not None:
        chosen = heads[(heads["layer"] == layer) & ((heads["head"] == head) if head is not None else True)]
        layers.append(outline(chosen))
    # Two lines: on one, the title was cut at the map's width with presenter mode's 18 px title.
    title = alt.TitleParams(
        "Anti-alignment per head", subtitle=["mean cos(ṽ_sink, m), blue: anti-aligned", "click a cell to pick the head"]
    )
    return alt.layer(*layers).properties(title=title, width=width, height=height)


def share_chart(layers: pd.DataFrame, layer: int | None = None, width: int = 460, height: int = 260) -> alt.LayerChart:
    """(c) Per layer, the sink's share under attention against its share under contribution weights.

    ``layers``: :func:`cwviz.analyses.sinks.sink_layer_summary` (attention averaged over heads, contribution the
    inter-head share summed over heads). The gap is how far attention overstates the sink.
    """
    long = layers.melt(
        id_vars=["layer"],
        value_vars=["sink_attention_share", "sink_contribution_share"],
        var_name="measure",
        value_name="share",
    )
    # exactly the model's layers
    span = [int(layers["layer"].min()), int(layers["layer"].max())] if len(layers) else [0, 1]
    long["measure"] = long["measure"].map(
        {"sink_attention_share": "attention", "sink_contribution_share": "contribution weight"}
    )
    lines = (
        alt.Chart(long)
        .mark_line(point=True)
        .encode(
            x=alt.X(
                "layer:Q",
                title="layer",
                axis=alt.Axis(tickMinStep=1),
                scale=alt.Scale(domain=span, nice=False, zero=False),
            ),
            y=alt.Y("share:Q", title="the sink's share of the layer output"),
            # Legend below the plot: the chart shares the page's width with chart (b).
            color=alt.Color(
                "measure:N",
                title="share under",
                scale=alt.Scale(domain=["attention", "contribution weight"], range=[ATTENTION, NEUTRAL]),
                legend=alt.Legend(orient="bottom"),
            ),
            tooltip=[alt.Tooltip("layer:Q"), alt.Tooltip("measure:N"), alt.Tooltip("share:Q", format=".3f")],
        )
    )
    charts = [lines]
    if layer is not None:
        charts.append(
            alt.Chart(pd.DataFrame({"layer": [layer]})).mark_rule(color=RULE, strokeDash=[4, 3]).encode(x="layer:Q")
        )
    return alt.layer(*charts).properties(title="How far attention overstates the sink", width=width, height=height)


#: The intervention chart's legend: a layer whose sink value the intervention scaled, or one it left alone.
SCALED, UNCHANGED = "scaled in this layer", "unchanged"


def intervention_chart(table: pd.DataFrame, width: int = 460, height: int = 200) -> alt.VConcatChart:
    """The effect of scaling the sink's value, per layer: change in mean head-output norm, and the
    semantic cone (mean pairwise cosine of head outputs) before and after.

    ``table``: :attr:`cwviz.analyses.sink_interventions.SinkIntervention.table`.
    """
    # Ordinal layers: the axis holds exactly the model's layers 0..L-1 (a quantitative one padded it to -4).
    x = alt.X("layer:O", title="layer", axis=alt.Axis(labelAngle=0))
    norm = (
        alt.Chart(table)
        # The legend names what the colour means (a layer whose sink value was scaled or not), not the column's
        # True/False; made in the spec, so that the chart's data stays the table.
        .transform_calculate(sink_value=f"datum.intervened ? '{SCALED}' : '{UNCHANGED}'")
        .mark_bar()
        .encode(
            x=x,
            y=alt.Y("output_norm_change:Q", title="Δ mean ‖o^h‖"),
            color=alt.Color(
                "sink_value:N", title="sink's value", scale=alt.Scale(domain=[SCALED, UNCHANGED], range=[ACCENT, MUTED])
            ),
            tooltip=[
                alt.Tooltip("layer:O"),
                alt.Tooltip("sink_value:N", title="sink's value"),
                alt.Tooltip("output_norm_before:Q", title="before", format=".3f"),
                alt.Tooltip("output_norm_after:Q", title="after", format=".3f"),
                alt.Tooltip("output_norm_change:Q", title="change", format="+.3f"),
            ],
        )
        .properties(title="Change in head-output norm", width=width, height=height)
    )
    long = table.melt(id_vars=["layer"], value_vars=["cone_before", "cone_after"], var_name="pass", value_name="cone")
    long["pass"] = long["pass"].map({"cone_before": "clean", "cone_after": "intervened"})
    cone = (
        alt.Chart(long)
        .mark_line(point=True)
        .encode(
            x=x,
            # Not from zero: a cosine has no zero baseline, and the lines (the difference is what counts) fill the plot.
            y=alt.Y("cone:Q", title="mean pairwise cos of head outputs", scale=alt.Scale(zero=False)),
            color=alt.Color(
                "pass:N", title="pass", scale=alt.Scale(domain=["clean", "intervened"], range=[MUTED, ACCENT])
            ),
            tooltip=[alt.Tooltip("layer:O"), alt.Tooltip("pass:N"), alt.Tooltip("cone:Q", format=".3f")],
        )
        .properties(title="Semantic cone (higher: outputs collapse into a narrower cone)", width=width, height=height)
    )
    return alt.vconcat(norm, cone).resolve_scale(color="independent")


#: Height (px) of one bar's row in :func:`scale_bars`: a 16 px label (presenter mode) with room around it, the four
#: rows a plot of at least 150 px, as every chart's (tests/browser).
SCALE_ROW_PX = 38


def scale_bars(table: pd.DataFrame, title: str, width: int = 180) -> alt.Chart:
    """The absolute scale beside a head's picture (tour steps 3 and 4): the head's output and the layer's as grey bars
    of their length in the model's stream, each followed by the sink's part of it, red where it adds and blue where it
    subtracts; each bar's label holds the number the step's sentence prints (written beside the axis, not at the bar's
    end, so that no number runs past the plot however narrow its column).

    ``table``: :func:`cwviz.analyses.tour_story.scale_table` (one row per bar, ``row`` top to bottom). A sink that is
    nearly all of a short head output and a small part of the layer's is then seen as such: two bars of nearly equal
    length, against a layer bar many times longer.
    """
    labels = table.sort_values("row")["label"].tolist()
    y = alt.Y(
        "row:O", title=None, axis=alt.Axis(labelExpr=f"{json.dumps(labels)}[datum.value]", labelLimit=260, ticks=False)
    )
    # An output's bar grey; the sink's part red where it adds, blue where it subtracts (scale None: the colours as
    # given).
    fill = f"datum.part == 'output' ? '{MUTED}' : datum.length < 0 ? '{NEGATIVE}' : '{POSITIVE}'"
    tooltip = [
        alt.Tooltip("label:N", title="bar"),
        alt.Tooltip("length:Q", format=".3f"),
        alt.Tooltip("share:Q", title="share of the output above", format="+.3f"),
    ]
    return (
        alt.Chart(table)
        .transform_calculate(fill=fill)
        .mark_bar()
        .encode(
            y=y,
            x=alt.X("length:Q", title="length in the stream"),
            color=alt.Color("fill:N", scale=None),
            tooltip=tooltip,
        )
        .properties(
            title=alt.TitleParams(title, anchor="start", fontSize=13),
            width=width,
            height=SCALE_ROW_PX * max(len(table), 1),
        )
    )
