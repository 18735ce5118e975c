"""Compare: two prompts on one model, or one prompt on two models, head by head."""

import streamlit as st

from cwviz import CwvizError
from cwviz.analyses import compare, schema
from cwviz.app import compare_services as services
from cwviz.app import widgets
from cwviz.app.sidebar import sidebar
from cwviz.app.state import examples, select, url_widget
from cwviz.charts import compare as charts
from cwviz.charts.heatmaps import LAYOUT_LABELS, LAYOUTS

sel = sidebar("Compare two inputs")
st.markdown(
    "Input A (the sidebar's) against input B (below): the maps of both, and B − A in red where B is larger, "
    "blue where smaller."
)
with st.expander("How to read this page"):
    st.markdown(
        "Input **A** is the sidebar's prompt and model; input **B** is the prompt below, on the same model or on a "
        "second model that shares its tokenizer. Tokens are paired by position when both inputs have as many, "
        "otherwise by a sequence alignment of the tokens (shown below); the maps show A, B and the difference "
        "B − A on a diverging scale centred at zero (**red: larger in B, blue: smaller, white: unchanged**). "
        "Layer, head and query follow the sidebar."
    )
if not sel.ok:
    st.stop()

left, right = st.columns([3, 1])
with left:
    text_b = url_widget(st.text_area, "prompt_b", "Prompt B", services.default_prompt_b(sel.request.text), height=100)
with right:
    model_b = url_widget(
        st.text_input,
        "model_b",
        "Model B",
        "",
        placeholder=sel.model,
        help="Empty: the sidebar's model. Another model must share its tokenizer (one prompt on two models).",
    )
request_b = services.request_b(sel.request, text_b, model_b)
if text_b == services.DEFAULT_PROMPT_B and sel.request.text != text_b:
    what = "the first example" if sel.request.text == examples()[0].text else "not the sidebar's prompt"
    st.caption(f"Prompt B is an example ({what}, with “evening” changed to “morning”): type your own B to compare.")
elif text_b == sel.request.text and not model_b.strip():
    st.info("Prompt B starts as the sidebar's prompt: change a word or two in it to see what the change does.")
try:
    described, alignment = services.alignment(sel.request, request_b)
except CwvizError as err:
    st.error(str(err))
    st.stop()

st.subheader("Alignment")
# B on A's model: one name
model_b_id = sel.analysis.info.id if request_b.model == sel.request.model else request_b.model
st.caption(f"A: {sel.analysis.info.id}; B: {model_b_id}. Tokens {described}.")
with st.expander(
    "Alignment table (one row a step: equal, replace, delete = only in A, insert = only in B)",
    # Open when tokens were inserted or deleted (a sequence alignment); a same-length pair says it in the caption.
    expanded=alignment["op"].isin(["insert", "delete"]).any() and len(alignment) <= 80,
):
    st.caption(
        "An empty position or token: that step's token is in one input only. Map labels: `12 fox` (the same token at "
        "the same position in both), `12/13 fox` (the same token, at 12 in A and 13 in B), `12 fox / 12 cat` (A's / "
        "B's)."
    )
    shown = alignment[alignment["op"] != "equal"] if len(alignment) > 80 else alignment
    # Positions as text, so that a step in one input only shows an empty cell rather than "None".
    shown = shown.assign(**{c: shown[c].astype("string").fillna("") for c in ("position_a", "position_b")})
    st.dataframe(shown, hide_index=True, key="compare_alignment")

st.subheader("Maps")
col_map, col_kind, col_layout = st.columns([2, 3, 2])
with col_map:
    what = url_widget(
        st.radio,
        "cmp_map",
        "Map",
        "contribution",
        options=list(schema.COMPARE_MAPS),
        format_func=schema.COMPARE_MAPS.get,
        horizontal=True,
    )
with col_kind:
    kind = widgets.kind_picker("cmp_kind", "Normalise contributions by")
with col_layout:
    layout = url_widget(
        st.radio,
        "cmp_layout",
        "Layout",
        LAYOUTS[0],
        options=list(LAYOUTS),
        format_func=LAYOUT_LABELS.get,
        help="auto: as many of A, B and B − A in a row as fit a 1,366 px wide window with the sidebar open. "
        "Choose side by side on a wider screen.",
        horizontal=True,
    )
cells = services.map_cells(sel.request, request_b, sel.layer, sel.head, kind, sel.query)
widgets.query_chart(
    charts.compare_maps(cells, what, layout=layout, label_px=widgets.label_px()),
    cells.frame,
    f"cwviz-compare-{what}-layer{sel.layer}",
    key="compare_maps",
)

st.subheader("Every head: change B − A")
metric = url_widget(
    st.radio,
    "cmp_metric",
    "Colour by",
    "divergence",
    options=list(schema.HEAD_METRICS),
    format_func=schema.HEAD_METRICS.get,
    horizontal=True,
)
changes = services.head_changes(sel.request, request_b)
widgets.head_grid(
    charts.head_change_grid(changes, metric, sel.layer, sel.head), changes, "cwviz-compare-heads", key="compare_heads"
)
st.markdown(f"**Heads ranked by |change| in {schema.HEAD_METRICS[metric]}** (select a row to show it)")
ranked = compare.rank_changes(changes, metric, top=15)
rows = st.dataframe(
    ranked,
    hide_index=True,
    on_select="rerun",
    selection_mode="single-row",
    key="compare_ranking",
    column_config={
        c: st.column_config.NumberColumn(format="%+.4f" if c.endswith("_change") else "%.4f")
        for c in ranked.columns
        if c not in ("rank", "layer", "head")
    },
)
chosen = rows.selection.rows if rows is not None else []
if chosen and chosen != st.session_state.get("_compare_last_row"):
    st.session_state["_compare_last_row"] = chosen
    row = ranked.iloc[chosen[0]]
    select(layer=int(row["layer"]), head=int(row["head"]))

st.subheader("Next-token log-probabilities")
if not sel.analysis.info.causal:
    st.info(
        f"{sel.analysis.info.id} is an encoder: it predicts no next token, so there are no log-probabilities to "
        "compare."
    )
else:
    logprobs = services.logprob_changes(sel.request, request_b)
    widgets.chart(
        charts.logprob_change_chart(logprobs, cells.query, widgets.label_px()),
        logprobs,
        "cwviz-compare-logprobs",
        key="compare_logprobs",
    )
