"""cwviz dashboard entry point (the full dashboard lands with the dashboard issue)."""

import streamlit as st

st.set_page_config(page_title="cwviz", layout="wide")
st.title("cwviz — contribution weights")
