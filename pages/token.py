"""Token: what makes up each key's contribution to the selected query, and its top keys across layers."""

import streamlit as st

from cwviz.analyses import tables
from cwviz.app import services, ui
from cwviz.charts import token as charts

sel = ui.sidebar()
st.title("One query token")
if not sel.ok:
    st.stop()

st.markdown(
    f"Query **{sel.token_label(sel.query)}** in layer **{sel.layer}**. Each key's contribution is the product "
    "attention × norm ratio ‖ṽ_k‖/‖o_q‖ × cosine(o_q, ṽ_k): a key can be strongly attended and still contribute "
    "little (short or orthogonal value), or contribute negatively (value pointing against the output)."
)
kind = st.radio(
    "Normalise by",
    tables.KINDS,
    horizontal=True,
    key="token_kind",
    format_func=lambda k: "layer output ‖o_q‖ (inter)" if k == "inter" else "head output ‖o_q^h‖ (intra)",
)
if sel.head is None:
    st.info(
        "The factorisation is per head: pick a head in the sidebar to see norm ratio and cosine. "
        "With all heads, attention is the mean over heads and contribution the layer-level score."
    )
factors = services.token_factors(sel.request, sel.layer, sel.query, sel.head, kind)
ui.chart(charts.factor_bars(factors), factors.wide, f"cwviz-token{sel.query}-layer{sel.layer}", key="factors")

st.subheader("Across layers")
k = st.slider("Top keys per layer", 1, 10, 5, key="token_top_k")
top = services.top_keys(sel.request, sel.query, sel.head, kind, k)
who = "all heads" if sel.head is None else f"head {sel.head}"
note = f"Query {sel.token_label(sel.query)}: its top {k} keys by {kind}-head contribution in every layer ({who}); numbers are ranks"
ui.chart(charts.top_keys_chart(top, note), top, f"cwviz-token{sel.query}-layers", key="top_keys")
