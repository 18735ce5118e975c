"""Heatmaps: attention beside contribution weights for the selected layer, and an overview of every head."""

import streamlit as st

from cwviz.analyses import tables
from cwviz.app import services, widgets
from cwviz.app.sidebar import sidebar
from cwviz.app.state import select, url_widget
from cwviz.charts import heatmaps as charts

INTRO = (
    "**Contribution weights** measure how much each earlier token *k* (key) adds to what an attention "
    "layer writes for token *q* (query). Attention weights only say how strongly a key is selected; a "
    "contribution weight also accounts for the size of the key's projected value vector and for its "
    "direction relative to the layer's output: contribution = attention × (‖ṽ_k‖ / ‖o_q‖) × cos(o_q, ṽ_k). "
    "Each row sums to 1, but single contributions can be **negative**, when a value points against the "
    "output (destructive interference). Read each heatmap row by row: the row is the query token, the "
    "columns are the keys it can see. Attention uses a sequential scale (darker = more attention); "
    "contributions use a diverging scale centred at zero: **red is positive, blue is negative, white is "
    "zero**, and the empty upper triangle is the future, which a causal model cannot see."
)

sel = sidebar("Contribution weights vs attention")
st.markdown(INTRO)
if not sel.ok:
    st.stop()
if not sel.analysis.info.causal:
    st.info(
        f"{sel.analysis.info.id} is an encoder: attention is bidirectional, every query sees every key (earlier and "
        "later), so the heatmaps are square and full, with no empty triangle."
    )

left, middle, right, far = st.columns([3, 2, 3, 2])
with left:
    family = url_widget(
        st.radio,
        "measure",
        "Measure (right heatmap)",
        "contribution",
        options=list(tables.FAMILIES),
        format_func=lambda f: tables.FAMILIES[f][0],
        horizontal=True,
        key="heatmaps_measure",
    )
# Raw and value-weighted attention do not divide by an output norm: the choice is shown but cannot be made.
normalised = tables.FAMILIES[family][1] != tables.FAMILIES[family][2]
with middle:
    kind = url_widget(
        st.radio,
        "kind",
        "Normalise by",
        tables.KINDS[0],
        options=list(tables.KINDS),
        horizontal=True,
        format_func=lambda k: "layer output ‖o_i‖ (inter)" if k == "inter" else "head output ‖o_i^h‖ (intra)",
        help="inter: shares of the whole layer output (heads together sum to 1); intra: shares of each head's own output."
        + ("" if normalised else f" {tables.FAMILIES[family][0].capitalize()} is not divided by an output norm."),
        disabled=not normalised,
        key="heatmaps_kind",
    )
with right:
    view = url_widget(
        st.radio,
        "view",
        "Long prompts",
        tables.VIEWS[0],
        options=list(tables.VIEWS),
        horizontal=True,
        format_func=lambda v: "window around the query" if v == "window" else "whole prompt in bins",
        help=f"Used when a layer has more than {tables.MAX_CELLS:,} cells.",
        key="heatmaps_view",
    )
with far:
    layout = url_widget(
        st.radio,
        "layout",
        "Layout",
        charts.LAYOUTS[0],
        options=list(charts.LAYOUTS),
        format_func=charts.LAYOUT_LABELS.get,
        help="auto: the two heatmaps side by side while they fit a 1,366 px wide window with the sidebar open, "
        "else one above the other. Choose side by side on a wider screen.",
        key="heatmaps_layout",
    )
measure = tables.measure_name(family, kind)
if family == "raw":
    st.caption("Raw attention is the measure: the right heatmap repeats the left one.")
cells = services.heatmap_cells(sel.request, sel.layer, sel.head, measure, kind, sel.query, view)
widgets.query_heatmaps(charts.heatmap_pair(cells, query=sel.query, layout=layout), cells, f"cwviz-heatmap-layer{sel.layer}", key="heatmaps")
if any("\\x" in token or "\\u" in token for token in sel.analysis.tokens):
    st.caption(
        "Labels such as `\\xd7` are bytes: the tokenizer split a character (an emoji, an accent, a non-Latin letter) "
        "over several tokens, and each shows the bytes it holds. `\\u202e`-style labels are invisible control or "
        "format characters, shown so that they cannot hide or reorder text."
    )

st.subheader("Every head")
metric = url_widget(
    st.radio,
    "colour",
    "Colour by",
    next(iter(charts.OVERVIEW_METRICS)),
    options=list(charts.OVERVIEW_METRICS),
    format_func=lambda m: charts.OVERVIEW_METRICS[m],
    horizontal=True,
    key="heatmaps_overview_metric",
)
summary = services.head_summary(sel.request)
widgets.head_grid(charts.head_overview(summary, metric, sel.layer, sel.head), summary, "cwviz-heads", key="overview")

st.markdown("**Heads ranked by divergence** between attention and intra-head contribution rows (select a row to show it)")
ranking = tables.head_ranking(summary, top=15)
rows = st.dataframe(
    ranking,
    hide_index=True,
    on_select="rerun",
    selection_mode="single-row",
    key="heatmaps_ranking",
    column_config={
        name: st.column_config.NumberColumn(format="%.3f") for name in ("sink_attention", "sink_contribution", "divergence", "output_norm")
    },
)
chosen = rows.selection.rows if rows is not None else []
if chosen and chosen != st.session_state.get("_heatmaps_last_row"):
    st.session_state["_heatmaps_last_row"] = chosen
    row = ranking.iloc[chosen[0]]
    select(layer=int(row["layer"]), head=int(row["head"]))

widgets.analysis_download(sel)
