"""Heatmaps: attention beside contribution weights for the selected layer, and an overview of every head."""

import streamlit as st

from cwviz.analyses import tables
from cwviz.app import services, ui
from cwviz.charts import heatmaps as charts

sel = ui.sidebar()
st.title("Contribution weights vs attention")
st.markdown(ui.INTRO)
if not sel.ok:
    st.stop()

left, middle, right = st.columns([3, 2, 3])
family = left.radio(
    "Measure (right heatmap)",
    list(tables.FAMILIES),
    format_func=lambda f: tables.FAMILIES[f][0],
    horizontal=True,
    key="heatmaps_measure",
)
kind = middle.radio(
    "Normalise by",
    tables.KINDS,
    horizontal=True,
    key="heatmaps_kind",
    format_func=lambda k: "layer output ‖o_i‖ (inter)" if k == "inter" else "head output ‖o_i^h‖ (intra)",
    help="inter: shares of the whole layer output (heads together sum to 1); intra: shares of each head's own output.",
)
view = right.radio(
    "Long prompts",
    tables.VIEWS,
    horizontal=True,
    key="heatmaps_view",
    format_func=lambda v: "window around the query" if v == "window" else "whole prompt in bins",
    help=f"Used when a layer has more than {tables.MAX_CELLS:,} cells.",
)
measure = tables.measure_name(family, kind)
cells = services.heatmap_cells(sel.request, sel.layer, sel.head, measure, kind, sel.query, view)
ui.chart(charts.heatmap_pair(cells), cells.frame, f"cwviz-heatmap-layer{sel.layer}", key="heatmaps")

st.subheader("Every head")
metric = st.radio(
    "Colour by",
    list(charts.OVERVIEW_METRICS),
    format_func=lambda m: charts.OVERVIEW_METRICS[m],
    horizontal=True,
    key="heatmaps_overview_metric",
)
summary = services.head_summary(sel.request)
ui.head_grid(charts.head_overview(summary, metric, sel.layer, sel.head), summary, "cwviz-heads", key="overview")

st.markdown("**Heads ranked by divergence** between attention and intra-head contribution rows (select a row to show it)")
ranking = tables.head_ranking(summary, top=15)
rows = st.dataframe(
    ranking,
    hide_index=True,
    on_select="rerun",
    selection_mode="single-row",
    key="heatmaps_ranking",
    column_config={name: st.column_config.NumberColumn(format="%.3f") for name in ("sink_attention", "sink_contribution", "divergence")},
)
chosen = rows.selection.rows if rows is not None else []
if chosen and chosen != st.session_state.get("_heatmaps_last_row"):
    st.session_state["_heatmaps_last_row"] = chosen
    row = ranking.iloc[chosen[0]]
    ui.select(layer=int(row["layer"]), head=int(row["head"]))

ui.analysis_download(sel)
