"""cwviz dashboard: ``make run`` (= ``streamlit run app.py``). Pages share the sidebar in cwviz.ui."""

import streamlit as st

st.set_page_config(page_title="cwviz — contribution weights", page_icon="🔎", layout="wide")

pages = [
    st.Page("pages/heatmaps.py", title="Heatmaps", icon="🟥", default=True),
    st.Page("pages/token.py", title="Token", icon="🔤"),
    st.Page("pages/bertviz_view.py", title="bertviz", icon="🕸️"),
    st.Page("pages/sinks.py", title="Sinks", icon="⚓"),
    st.Page("pages/faithfulness.py", title="Faithfulness", icon="✂️"),
]
st.navigation(pages).run()
