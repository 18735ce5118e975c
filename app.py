"""cwviz dashboard: ``make run`` (= ``cwviz app`` = ``streamlit run app.py``). Pages share the sidebar in
cwviz.app.sidebar."""

import sys

import streamlit as st

from cwviz.app.launch import start_server

start_server()
st.set_page_config(page_title="cwviz — contribution weights", layout="wide")

pages = [
    st.Page("views/heatmaps.py", title="Heatmaps", default=True),
    st.Page("views/flow.py", title="Flow"),
    st.Page("views/tour.py", title="Tour"),
    st.Page("views/token.py", title="Token"),
    st.Page("views/bertviz_view.py", title="bertviz"),
    st.Page("views/sinks.py", title="Sinks"),
    st.Page("views/faithfulness.py", title="Faithfulness"),
    st.Page("views/claims.py", title="Claims"),
    st.Page("views/compare.py", title="Compare"),
    st.Page("views/atlas.py", title="Atlas"),
]
page = st.navigation(pages)  # the page frame (the page list) is drawn now, before any page's imports
# A server's first page imports PyTorch and transformers (seconds): say so at once, not a blank page.
if "cwviz.app.services" in sys.modules:
    page.run()
else:
    starting = st.empty()
    starting.info(
        "Starting cwviz: loading PyTorch and the model. Only the server's first page waits for this.",
        icon=":material/hourglass_top:",
    )
    try:
        page.run()
    finally:
        starting.empty()
