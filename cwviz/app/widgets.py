"""Small widgets pages reuse: a chart with its downloads, the click-to-pick layer x head grid, the JSON export."""

from __future__ import annotations

import altair as alt
import streamlit as st

from ..charts.heatmaps import PICK, QUERY_PICK
from . import services
from .sidebar import Selection
from .state import select


def chart(chart_obj, data, name: str, key: str, on_select: str | None = None, selection_mode=None, width: str = "content"):
    """Show an Altair chart with PNG, SVG and CSV downloads (rendered only when clicked).

    Every chart is shown at its own size (``width="content"``): cwviz's chart builders size their plot
    areas themselves, and Streamlit's "stretch" turns on Vega's "fit" autosize, which does not apply to
    layered and concatenated charts (a console warning) and let a title and legend eat a fixed plot
    height. Charts are drawn as SVG. Returns the selection state when ``on_select`` is given.
    """
    from ..charts.export import to_csv, to_png, to_svg

    if isinstance(chart_obj, alt.TopLevelMixin):
        # SVG always: Streamlit switches to canvas above 2,000 rows a dataset, which drops every mark from
        # the page (no aria labels for screen readers, nothing a browser test can read). cwviz's charts hold
        # at most ~5,000 marks (tables.MAX_CELLS), which SVG draws without delay.
        top = {"usermeta": {"embedOptions": {"renderer": "svg"}}}
        if width == "content":
            # Streamlit adds autosize "fit" to any spec without one; "pad" keeps the chart's own size.
            top["autosize"] = alt.AutoSizeParams(type="pad", contains="padding")
        # Streamlit's theme sets labelFlush, which moves the first and last label of a discrete axis inwards,
        # off their rows (onto their neighbours' on a heatmap); a token axis keeps each label on its row.
        # One copy of the chart for the top-level properties, one for the config (each copies the chart).
        chart_obj = chart_obj.properties(**top).configure_axisDiscrete(labelFlush=False)
    kwargs = {} if on_select is None else {"on_select": on_select, "selection_mode": selection_mode}
    event = st.altair_chart(chart_obj, key=key, width=width, **kwargs)
    cols = st.columns([1, 1, 1, 5])
    cols[0].download_button(
        "PNG", data=lambda: to_png(chart_obj), file_name=f"{name}.png", mime="image/png", key=f"{key}_png", on_click="ignore"
    )
    cols[1].download_button(
        "SVG", data=lambda: to_svg(chart_obj), file_name=f"{name}.svg", mime="image/svg+xml", key=f"{key}_svg", on_click="ignore"
    )
    cols[2].download_button("CSV", data=lambda: to_csv(data), file_name=f"{name}.csv", mime="text/csv", key=f"{key}_csv", on_click="ignore")
    return event


def _picked(chart_obj, data, name: str, key: str, param: str) -> dict | None:
    """Show ``chart_obj`` (:func:`chart`) with the click selection ``param``; the point clicked since the last
    rerun, or None. Streamlit keeps returning the last pick on later reruns, so a pick is returned once:
    when it differs from the one remembered under this chart's key."""
    # "stretch": Streamlit sizes the small layer x head grid to the column; at its content size its
    # cells were drawn a fraction of a pixel wide in Chromium and could not be clicked.
    event = chart(chart_obj, data, name, key, on_select="rerun", selection_mode=param, width="stretch" if param == PICK else "content")
    picked = (event.selection.get(param) or [None])[0] if event is not None else None
    if picked and picked != st.session_state.get(f"_{key}_last_pick"):
        st.session_state[f"_{key}_last_pick"] = picked
        return picked
    return None


def head_grid(chart_obj, data, name: str, key: str) -> None:
    """Show a layer x head grid whose clicked cell selects that layer and head."""
    picked = _picked(chart_obj, data, name, key, PICK)
    if picked:
        select(layer=picked["layer"], head=picked["head"])


def query_heatmaps(chart_obj, cells, name: str, key: str) -> None:
    """Show the heatmap pair; a clicked cell selects its query (the sidebar's query picker and the link follow)."""
    picked = _picked(chart_obj, cells.frame, name, key, QUERY_PICK)
    if picked and "query_position" in picked:
        select(query=int(picked["query_position"]))


def analysis_download(sel: Selection, key: str = "json") -> None:
    """Download the whole analysis as JSON (the CLI's schema); the selected layer only when it would be huge."""
    if not sel.ok:
        return
    request = sel.request
    if services.json_export_size(sel.analysis) <= services.JSON_EXPORT_LIMIT:
        layers, label, name = None, "Analysis as JSON (all layers)", "cwviz-analysis.json"
    else:
        layers, label, name = (
            (sel.layer,),
            f"Analysis as JSON (layer {sel.layer}; all layers would be too large)",
            f"cwviz-analysis-layer{sel.layer}.json",
        )
    st.download_button(
        label,
        data=lambda: services.analysis_json(request, layers),
        file_name=name,
        mime="application/json",
        key=key,
        on_click="ignore",
        help="The same schema as `python -m cwviz analyze --json` (Analysis.to_dict).",
    )
