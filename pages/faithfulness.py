"""faithfulness page (being built)."""

import streamlit as st

st.title("Faithfulness")
