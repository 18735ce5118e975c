"""Small widgets pages reuse: a chart with its downloads, the click-to-pick layer x head grid, the JSON export."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable

import altair as alt
import streamlit as st

from ..analyses.schema import HeatmapCells
from ..charts import heatmaps
from ..charts.flow import NODE_PICK
from ..charts.head_grid import PICK
from ..charts.heatmaps import QUERY_PICK
from ..charts.palette import INK
from ..core.vocabulary import KIND_LABELS, KINDS
from . import services
from .sidebar import Selection
from .state import parse_kind, presenter, select, toast_next_run, url_widget


def kind_picker(param: str, label: str = "Normalise by", *, compact: bool = False, disabled: bool = False) -> str:
    """The contribution kind (one of :data:`~cwviz.core.vocabulary.KINDS`, shown by its ``KIND_LABELS`` label), kept
    in the link as ``?param=`` (the forms older links hold are read by :func:`~cwviz.app.state.parse_kind`): a
    horizontal radio, or with ``compact`` a selectbox without its label, for a narrow column."""
    options = {"options": list(KINDS), "format_func": KIND_LABELS.get, "parse": parse_kind, "disabled": disabled}
    if compact:
        return url_widget(st.selectbox, param, label, KINDS[0], label_visibility="collapsed", **options)
    return url_widget(st.radio, param, label, KINDS[0], horizontal=True, **options)


def label_px() -> int:
    """The charts' label size in this session: presenter mode's, or the default (both at least 12 px)."""
    return heatmaps.PRESENTER_LABEL_PX if presenter() else heatmaps.LABEL_PX


def chart(
    chart_obj, data, name: str, key: str, on_select: str | None = None, selection_mode=None, width: str = "content"
):
    """Show an Altair chart with PNG, SVG and CSV downloads (rendered only when clicked).

    Every chart is shown at its own size (``width="content"``): cwviz's chart builders size their plot
    areas themselves, and Streamlit's "stretch" turns on Vega's "fit" autosize, which does not apply to
    layered and concatenated charts (a console warning) and let a title and legend eat a fixed plot
    height. Charts are drawn as SVG. Returns the selection state when ``on_select`` is given.
    """
    spec = _spec(chart_obj, width)
    if width == "content" and presenter() and _continuous_view(spec):
        # Presenter mode: a chart of one view (or layers of one) along a continuous axis is as wide as its column
        # (Vega's fit-x: labels and legend included), whatever the window; maps and concatenated panels keep their size.
        width = "stretch"
        spec["autosize"] = {"type": "fit-x", "contains": "padding"}
    kwargs = {} if on_select is None else {"on_select": on_select, "selection_mode": selection_mode}
    event = st.vega_lite_chart(spec=spec, key=key, width=width, **kwargs)
    downloads(lambda: spec, data, name, key)
    return event


def _continuous_view(spec: dict) -> bool:
    """Whether the spec is one view or a layer of views (no concatenation, facet or repeat) whose x axes are all
    continuous: what Vega's fit-x autosize can stretch to a column's width (a discrete axis keeps its step)."""
    if any(key in spec for key in ("hconcat", "vconcat", "concat", "facet", "repeat", "spec")):
        return False
    views = spec.get("layer", [spec])
    if any(not isinstance(view, dict) or "layer" in view or "mark" not in view for view in views):
        return False
    types = [(view.get("encoding") or spec.get("encoding") or {}).get("x", {}).get("type") for view in views]
    types = [kind for kind in types if kind is not None]
    return bool(types) and all(kind in ("quantitative", "temporal") for kind in types)


#: Altair's data transformer is one setting for the whole process; conversions of several sessions take turns.
_TO_DICT = threading.Lock()


def _to_arrow(data, datasets: dict) -> dict:
    """Altair data transformer: a chart's rows as Arrow IPC bytes in ``datasets``, named by their hash.

    What ``st.altair_chart`` does itself. Altair's default writes every row out as a dict of Python values, which
    Streamlit then turned back into Arrow: on a layer change that round trip of the two maps' rows was the largest
    part of the page's Python after the analysis (a py-spy profile; BENCHMARKS.md). The name is the content's hash,
    so an unchanged dataset keeps its name from run to run."""
    from streamlit import dataframe_util

    raw = dataframe_util.convert_anything_to_arrow_bytes(data)
    name = f"data-{hashlib.sha256(raw).hexdigest()[:32]}"
    datasets[name] = raw
    return {"name": name}


alt.data_transformers.register("cwviz_arrow", _to_arrow)


def _spec(chart_obj: alt.TopLevelMixin, width: str = "stretch") -> dict:
    """The Vega-Lite spec of ``chart_obj`` as the dashboard draws it: SVG, at its own size (``width="content"``),
    labels of :func:`label_px`, its data in ``datasets`` as Arrow bytes (:func:`_to_arrow`), which Streamlit
    sends as they are; :func:`_inline` gives the spec with the rows written out, as a download renders it.

    Converted once, without Altair's schema check and without the chart copies that ``configure_*`` makes, which
    with the download pair took about half of the Heatmaps page's Python on a layer change (a py-spy profile). The
    AppTests check every spec they read against the Vega-Lite schema (``tests/app/test_app.charts``).
    """
    datasets: dict[str, bytes] = {}
    with _TO_DICT, alt.data_transformers.enable("cwviz_arrow", datasets=datasets):
        spec = chart_obj.to_dict(validate=False)
    spec["datasets"] = {**spec.get("datasets", {}), **datasets}
    # SVG always: Streamlit switches to canvas above 2,000 rows a dataset, which drops every mark from
    # the page (no aria labels for screen readers, nothing a browser test can read). cwviz's charts hold
    # at most ~5,000 marks (tables.MAX_CELLS), which SVG draws without delay.
    spec["usermeta"] = {"embedOptions": {"renderer": "svg"}}
    # Streamlit adds autosize "fit" to any spec without one. "pad" keeps the chart's own size; "fit-x" fits the
    # width to the column and keeps the plot's height (plain "fit" would give the legend and the key labels'
    # height to the plot).
    spec["autosize"] = {"type": "pad" if width == "content" else "fit-x", "contains": "padding"}
    # Streamlit's theme sets labelFlush, which moves the first and last label of a discrete axis inwards,
    # off their rows (onto their neighbours' on a heatmap); a token axis keeps each label on its row.
    # Labels of at least 12 px (16 in presenter mode) in dark grey, legible from the back of a room.
    px = label_px()
    config = spec.setdefault("config", {})
    config["axis"] = {"labelFontSize": px, "titleFontSize": px, "labelColor": INK, "titleColor": INK}
    config["axisDiscrete"] = {"labelFlush": False}
    config["legend"] = {"labelFontSize": px, "titleFontSize": px, "titleLimit": 400}
    config["title"] = {"fontSize": px + 2, "subtitleFontSize": px}
    if px >= heatmaps.PRESENTER_LABEL_PX:
        # Presenter mode: every text of the chart at least as large as its axis labels, the sizes a builder set
        # itself too (titles, the numbers written on bars, a note above a map), and text marks that set none.
        config["text"] = {"fontSize": px}
        _at_least(spec, px)
    return spec


def _at_least(node, px: int) -> None:
    """Raise every font size in the spec ``node`` (``fontSize``, ``labelFontSize``, ...) below ``px`` to ``px``, in
    place; the datasets are not read."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasets":
                continue
            if key.endswith(("fontSize", "FontSize")) and isinstance(value, int | float) and value < px:
                node[key] = px
            else:
                _at_least(value, px)
    elif isinstance(node, list):
        for item in node:
            _at_least(item, px)


def _inline(spec: dict) -> dict:
    """``spec`` (:func:`_spec`) with its Arrow datasets written out as rows, as Vega-Lite outside Streamlit reads
    them (the PNG and SVG downloads, through vl-convert). Rows go through Altair's own conversion (NaN as null)."""
    import pyarrow as pa
    from altair.utils.data import to_values

    rows = {
        name: to_values(pa.ipc.open_stream(data).read_pandas())["values"] if isinstance(data, bytes) else data
        for name, data in spec.get("datasets", {}).items()
    }
    return {**spec, "datasets": rows}


def downloads(spec: Callable[[], dict], data, name: str, key: str) -> None:
    """PNG, SVG and CSV downloads of a chart (``spec`` gives its Vega-Lite spec as :func:`_spec` makes it; its rows
    are written out by :func:`_inline` for the render), rendered only when clicked."""
    from ..charts.export import render_spec, to_csv

    def rendered(fmt: str) -> bytes:
        return render_spec(_inline(spec()), fmt)

    # A row of buttons each as wide as its label (columns of a share of the width squeezed them to "P." in a half column
    # at 1,280 px); they wrap rather than overflow.
    row = st.container(horizontal=True, gap="small")
    row.download_button(
        "PNG",
        data=lambda: rendered("png"),
        file_name=f"{name}.png",
        mime="image/png",
        key=f"{key}_png",
        on_click="ignore",
    )
    row.download_button(
        "SVG",
        data=lambda: rendered("svg"),
        file_name=f"{name}.svg",
        mime="image/svg+xml",
        key=f"{key}_svg",
        on_click="ignore",
    )
    row.download_button(
        "CSV", data=lambda: to_csv(data), file_name=f"{name}.csv", mime="text/csv", key=f"{key}_csv", on_click="ignore"
    )


def _picked(chart_obj, data, name: str, key: str, param: str) -> dict | None:
    """Show ``chart_obj`` (:func:`chart`) with the click selection ``param``; the point clicked since the last
    rerun, or None. Streamlit keeps returning the last pick on later reruns, so a pick is returned once:
    when it differs from the one remembered under this chart's key."""
    # "stretch": Streamlit sizes the small layer x head grid to the column; at its content size its
    # cells were drawn a fraction of a pixel wide in Chromium and could not be clicked.
    event = chart(
        chart_obj,
        data,
        name,
        key,
        on_select="rerun",
        selection_mode=param,
        width="stretch" if param == PICK else "content",
    )
    picked = (event.selection.get(param) or [None])[0] if event is not None else None
    if picked and picked != st.session_state.get(f"_{key}_last_pick"):
        st.session_state[f"_{key}_last_pick"] = picked
        return picked
    return None


def head_grid(chart_obj, data, name: str, key: str) -> None:
    """Show a layer x head grid whose clicked cell selects that layer and head."""
    picked = _picked(chart_obj, data, name, key, PICK)
    if picked:
        # The maps this changes may be out of view above the grid: the next run says what changed.
        toast_next_run(f"Selected layer {picked['layer']}, head {picked['head']}: the charts of one head above follow.")
        select(layer=picked["layer"], head=picked["head"])


def query_chart(chart_obj, frame, name: str, key: str) -> None:
    """Show a chart of maps whose clicked cell selects its query (the Compare page's A, B and B − A)."""
    picked = _picked(chart_obj, frame, name, key, QUERY_PICK)
    if picked and "query_position" in picked:
        select(query=int(picked["query_position"]))


def node_graph(chart_obj, data, name: str, key: str, layers: int) -> None:
    """Show the Flow page's graph; a clicked node (layer, position) selects that layer and query token in the sidebar
    (the final residual, drawn as layer ``layers``, selects the last layer)."""
    picked = _picked(chart_obj, data, name, key, NODE_PICK)
    if picked and "layer" in picked and "position" in picked:
        layer = min(int(picked["layer"]), layers - 1)
        toast_next_run(
            f"Selected layer {layer} and query token {int(picked['position'])}: Heatmaps and Token open there."
        )
        select(layer=layer, query=int(picked["position"]))


def query_map(
    cells: HeatmapCells,
    which: str,
    query: int,
    name: str,
    key: str,
    colour_range: str = "robust",
    generated_from: int | None = None,
    key_mark: int | None = None,
    height: int | None = None,
    row_labels: bool = True,
    downloads_too: bool = True,
) -> None:
    """One map of the heatmap pair (:func:`~cwviz.charts.heatmaps.heatmap_view`, ``which`` "attention" or "measure"),
    as wide as its column; a clicked cell selects its query (the sidebar's query picker and the link follow).
    ``key_mark``'s cell in the query's row is ringed. ``height``: the plot's, by default the first screen's
    (:data:`~cwviz.charts.heatmaps.SCREEN_SIDE`, or in presenter mode a 16 px cell or more a row,
    :func:`~cwviz.charts.heatmaps.presenter_height`). ``downloads_too``: the map's PNG, SVG and CSV below it."""
    px = label_px()
    if height is None:
        height = heatmaps.presenter_height(cells.frame["query"].nunique()) if presenter() else heatmaps.SCREEN_SIDE
    view = heatmaps.heatmap_view(
        cells,
        which,
        query,
        height=height,
        label_px=px,
        colour_range=colour_range,
        generated_from=generated_from,
        key=key_mark,
        row_labels=row_labels,
    )
    spec = _spec(view)
    event = st.vega_lite_chart(
        spec=spec, key=f"{key}_map_{which}", width="stretch", on_select="rerun", selection_mode=QUERY_PICK
    )
    picked = (event.selection.get(QUERY_PICK) or [None])[0] if event is not None else None
    if picked and picked != st.session_state.get(f"_{key}_map_{which}_last_pick") and "query_position" in picked:
        st.session_state[f"_{key}_map_{which}_last_pick"] = picked
        select(query=int(picked["query_position"]))
    if downloads_too:
        downloads(lambda: _spec(view, "content"), cells.frame, name, key)


def presenter_columns(labels: list[str], px: int) -> list[float]:
    """Widths of the two columns of the heatmap pair side by side in presenter mode: the left map's row labels (about
    0.6 ``px`` a character) beside its plot, the right map's plot alone (its rows are the left map's), so that both
    plots get the same width and the cells are as wide as the content column allows."""
    label = 0.6 * px * max((len(text) for text in labels), default=4) + 16
    plot = (heatmaps.PRESENTER_CONTENT_WIDTH - label - 60) / 2
    return [label + plot, plot + 30]


def query_heatmaps(
    cells: HeatmapCells,
    query: int,
    name: str,
    key: str,
    stacked: bool = False,
    colour_range: str = "robust",
    generated_from: int | None = None,
    key_mark: int | None = None,
) -> None:
    """Attention beside the picked measure, each map as wide as its column of the page (one above the other when
    ``stacked``); a clicked cell of either selects its query (the sidebar's query picker and the link follow).
    Positions from ``generated_from`` on are labelled as generated; ``key_mark``'s cell in the query's row is ringed.

    In presenter mode the maps stand side by side, the right one without row labels (its rows are the left map's),
    each :func:`~cwviz.charts.heatmaps.presenter_height` tall: cells of 16 px or more and every token labelled up to
    40 tokens, both whole on a 1280 x 720 projector's screen.

    The downloads (PNG, SVG, CSV) hold the pair as one chart (:func:`cwviz.charts.heatmaps.heatmap_pair`)."""
    px = label_px()
    side = heatmaps.presenter_height(cells.frame["query"].nunique()) if presenter() else heatmaps.SCREEN_SIDE
    if stacked:
        columns = [st.container(), st.container()]
    elif presenter():
        columns = st.columns(presenter_columns(list(cells.labels), px), gap="small")
    else:
        columns = st.columns(2, gap="small")
    for column, which in zip(columns, ("attention", "measure")):
        with column:
            query_map(
                cells,
                which,
                query,
                name,
                key,
                colour_range=colour_range,
                generated_from=generated_from,
                key_mark=key_mark,
                height=side,
                row_labels=stacked or not presenter() or which == "attention",
                downloads_too=False,
            )

    def pair() -> dict:  # a third chart, never drawn on the page: built only when a download is clicked
        return _spec(heatmaps.heatmap_pair(cells, query, label_px=px, colour_range=colour_range), "content")

    downloads(pair, cells.frame, name, key)


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
        help="The same schema as `python -m cwviz analyze --json` (cwviz.to_dict).",
    )
