"""cwviz dashboard: ``make run`` (= ``cwviz app`` = ``streamlit run app.py``). Pages share the sidebar in cwviz.app.sidebar."""

import streamlit as st

from cwviz.app.launch import start_server

start_server()
st.set_page_config(page_title="cwviz — contribution weights", layout="wide")

pages = [
    st.Page("pages/heatmaps.py", title="Heatmaps", default=True),
    st.Page("pages/tour.py", title="Tour"),
    st.Page("pages/token.py", title="Token"),
    st.Page("pages/bertviz_view.py", title="bertviz"),
    st.Page("pages/sinks.py", title="Sinks"),
    st.Page("pages/faithfulness.py", title="Faithfulness"),
    st.Page("pages/claims.py", title="Claims"),
    st.Page("pages/compare.py", title="Compare"),
    st.Page("pages/atlas.py", title="Atlas"),
]
st.navigation(pages).run()
