"""Heatmaps: attention beside contribution weights for the selected layer, and an overview of every head."""

import streamlit as st

from cwviz.analyses import tables
from cwviz.app import services, widgets
from cwviz.app.sidebar import sidebar
from cwviz.app.state import select, url_widget
from cwviz.charts import head_grid
from cwviz.charts import heatmaps as charts

SENTENCE = (
    "Each row is a query token: the left map shows how strongly it **attends** to each earlier token, the right map "
    "how much each one really **contributes** to what the layer writes (red adds, blue subtracts)."
)
MORE = (
    "Attention weights only say how strongly a key is selected; a contribution weight also accounts for the size of "
    "the key's projected value vector (what the key writes, ṽ_k) and for its direction relative to the layer's output "
    "o_q: contribution = attention × (‖ṽ_k‖ / ‖o_q‖) × cos(o_q, ṽ_k). Each row of contributions sums to 1, but single "
    "contributions can be **negative**, when a value points against the output (destructive interference). The first "
    "token (the *sink*) usually takes most of the attention, yet its contribution shows what it really "
    "writes.\n\n**Colours.** Attention uses a green sequential scale (darker = more), never a sign. Contributions use "
    "a diverging scale centred at zero: red positive, blue negative, white zero. Its end is the 99th percentile of "
    "|contribution| outside the sink column, so that the sink's +1 does not wash out the small negative values; "
    "larger values are drawn at the end colour (the legend says *clamped*), and the scale is symmetric-log, so that "
    "−0.03 is clearly blue. Choose *full range* to end the scale at the largest value instead. The empty upper "
    "triangle is the future, which a causal model cannot see."
)

sel = sidebar("Contribution weights vs attention")
st.markdown(SENTENCE)
with st.expander("How to read these maps"):
    st.markdown(MORE)
if not sel.ok:
    st.stop()
if not sel.analysis.info.causal:
    st.info(
        f"{sel.analysis.info.id} is an encoder: attention is bidirectional, every query sees every key (earlier and "
        "later), so the heatmaps are square and full, with no empty triangle."
    )

measure_col, kind_col, range_col, more_col = st.columns([3, 3, 2, 1])
with measure_col:
    family = url_widget(
        st.selectbox,
        "measure",
        "Right map",
        "contribution",
        options=list(tables.FAMILIES),
        format_func=lambda f: f"Right map: {tables.FAMILIES[f][0]}",
        label_visibility="collapsed",
    )
# Raw and value-weighted attention do not divide by an output norm: the choice is shown but cannot be made.
normalised = tables.FAMILIES[family][1] != tables.FAMILIES[family][2]
with kind_col:
    kind = widgets.kind_picker("kind", compact=True, disabled=not normalised)
with range_col:
    colour_range = url_widget(
        st.selectbox,
        "range",
        "Colour range",
        charts.RANGES[0],
        options=list(charts.RANGES),
        format_func=lambda r: f"Colours: {'robust' if r == 'robust' else 'full range'}",
        label_visibility="collapsed",
    )
with more_col, st.popover("More", width="stretch"):
    view = url_widget(
        st.radio,
        "view",
        "Long prompts",
        tables.VIEWS[0],
        options=list(tables.VIEWS),
        format_func=lambda v: "window around the query" if v == "window" else "whole prompt in bins",
        help=f"Used when the input has more than {tables.SCREEN_POSITIONS} tokens.",
    )
    layout = url_widget(
        st.radio,
        "layout",
        "Layout",
        charts.LAYOUTS[0],
        options=list(charts.LAYOUTS),
        format_func=charts.LAYOUT_LABELS.get,
        help="auto and side by side: the two maps share the page's width; stacked: each takes the whole width.",
    )
measure = tables.measure_name(family, kind)
cells = services.heatmap_cells(sel.request, sel.layer, sel.head, measure, kind, sel.query, view)
# All heads summed rarely subtract: where this map shows no clear blue (no cell below -SYMLOG_CONSTANT), name the head
# whose key does, one click away.
subtracts = None
if sel.head is None and family == "contribution" and not (cells.frame["value"] < -charts.SYMLOG_CONSTANT).any():
    subtracts = services.subtracting_key(sel.request, sel.layer, kind)
    subtracts = subtracts if subtracts is not None and subtracts.contribution < 0 else None
st.caption(
    cells.note
    + "; click a cell to select its query"
    + ("; the right map repeats the left one (raw attention is the measure)" if family == "raw" else "")
    + (
        f"; with all heads summed no key clearly subtracts (no blue): in head {subtracts.head}, key {subtracts.key} "
        f"does ({subtracts.contribution:+.3f} for query {subtracts.query})"
        if subtracts is not None
        else ""
    )
)
generated = sel.prompt_tokens if sel.analysis.num_tokens > sel.prompt_tokens else None
widgets.query_heatmaps(
    cells,
    sel.query,
    f"cwviz-heatmap-layer{sel.layer}",
    key="heatmaps",
    stacked=layout == "stacked",
    colour_range=colour_range,
    generated_from=generated,
)
if subtracts is not None:
    st.button(
        f"Show head {subtracts.head}, where key {sel.token_label(subtracts.key)} subtracts (blue)",
        on_click=select,
        kwargs={"layer": sel.layer, "head": subtracts.head, "query": subtracts.query},
        key="heatmaps_subtracts",
    )
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
    next(iter(head_grid.OVERVIEW_METRICS)),
    options=list(head_grid.OVERVIEW_METRICS),
    format_func=lambda m: head_grid.OVERVIEW_METRICS[m],
    horizontal=True,
)
summary = services.head_summary(sel.request)
widgets.head_grid(head_grid.head_overview(summary, metric, sel.layer, sel.head), summary, "cwviz-heads", key="overview")

st.markdown(
    "**Heads ranked by divergence** between attention and intra-head contribution rows (select a row to show it)"
)
ranking = tables.head_ranking(summary, top=15)
rows = st.dataframe(
    ranking,
    hide_index=True,
    on_select="rerun",
    selection_mode="single-row",
    key="heatmaps_ranking",
    column_config={
        name: st.column_config.NumberColumn(format="%.3f")
        for name in ("sink_attention", "sink_contribution", "divergence", "output_norm")
    },
)
chosen = rows.selection.rows if rows is not None else []
if chosen and chosen != st.session_state.get("_heatmaps_last_row"):
    st.session_state["_heatmaps_last_row"] = chosen
    row = ranking.iloc[chosen[0]]
    select(layer=int(row["layer"]), head=int(row["head"]))

widgets.analysis_download(sel)
