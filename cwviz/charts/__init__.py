"""Pure chart builders: tidy table in, ``alt.Chart`` (or HTML) out. No Streamlit, no torch."""
