"""Token: what makes up each key's contribution to the selected query, and its top keys across layers."""

import streamlit as st

from cwviz.app import services, widgets
from cwviz.app.sidebar import sidebar
from cwviz.app.state import url_widget
from cwviz.charts import token as charts

sel = sidebar("One query token")
if not sel.ok:
    st.stop()

st.markdown(
    f"Query **{sel.token_label(sel.query)}** in layer **{sel.layer}**. Each key's contribution is the product "
    "attention × norm ratio ‖ṽ_k‖/‖o_q‖ × cosine(o_q, ṽ_k): a key can be strongly attended and still contribute "
    "little (short or orthogonal value), or contribute negatively (value pointing against the output)."
)
kind = widgets.kind_picker("token_kind")
if sel.head is None:
    st.info(
        "The factorisation is per head: pick a head in the sidebar to see norm ratio and cosine. "
        "With all heads, attention is the mean over heads and contribution the layer-level score."
    )
factors = services.token_factors(sel.request, sel.layer, sel.query, sel.head, kind)
widgets.chart(charts.factor_bars(factors), factors.wide, f"cwviz-token{sel.query}-layer{sel.layer}", key="factors")

st.subheader("Across layers")
k = url_widget(
    st.slider, "top_k", "Top keys per layer", 5, parse=int, min_value=1, max_value=10, valid=lambda v: 1 <= v <= 10
)
top = services.top_keys(sel.request, sel.query, sel.head, kind, k)
who = "all heads" if sel.head is None else f"head {sel.head}"
note = (
    f"Query {sel.token_label(sel.query, markdown=False)}: its top {k} keys by {kind}-head contribution in every layer "
    f"({who}); numbers are ranks"
)
widgets.chart(charts.top_keys_chart(top, note), top, f"cwviz-token{sel.query}-layers", key="top_keys")
