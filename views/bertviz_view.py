"""bertviz: head view and model view of attention or contribution weights."""

import streamlit as st

from cwviz.analyses import bertviz as bertviz_html
from cwviz.app import services
from cwviz.app.sidebar import sidebar
from cwviz.app.state import url_widget

sel = sidebar("bertviz views")
st.markdown(
    "bertviz draws each weight as the opacity of a line. Opacity cannot be negative, so for contribution "
    "weights this page draws **intra-head contributions clipped at zero**: negative contributions are not "
    "drawn at all (see their sign on the Heatmaps page). Intra-head contributions sum to 1 in every head, "
    "like attention, so the two views are comparable."
)
st.caption(
    "bertviz loads its scripts (require.js, d3, jQuery) from cdnjs.cloudflare.com: without network access the "
    "view below says so instead of drawing. Nothing else in cwviz needs the network."
)
if not sel.ok:
    st.stop()

left, right = st.columns(2)
with left:
    view = url_widget(
        st.radio,
        "bv_view",
        "View",
        bertviz_html.BERTVIZ_VIEWS[0],
        options=list(bertviz_html.BERTVIZ_VIEWS),
        horizontal=True,
        format_func=lambda v: f"{v} view",
    )
with right:
    weights = url_widget(
        st.radio,
        "bv_weights",
        "Weights",
        bertviz_html.WEIGHTS[0],
        options=list(bertviz_html.WEIGHTS),
        horizontal=True,
    )
where = bertviz_html.scope(sel.analysis, view, sel.layer)
st.caption(f"Showing {where.note}.")
html = services.bertviz_html(sel.request, view, weights, sel.layer)
st.iframe(html, height=900 if view == "model" else 620)
