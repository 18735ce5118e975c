"""Streamlit caching for the sinks page: small cached wrappers around :mod:`cwviz.analyses.sinks`.

The analysis itself comes from :func:`cwviz.app.services.get_analysis` (shared with every page); what is
cached here are the small pandas results per (request, sink, ...), so moving the layer, head or query
never recomputes them.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import streamlit as st

from ..analyses import sinks
from ..core.analysis import analyze
from ..core.inputs import tokenize
from ..core.progress import phase
from ..core.texts import read_texts
from . import hosting, services

#: Most extra prompts the page pools (each costs a forward pass and a table).
MAX_POOLED = 16


@dataclass(frozen=True)
class SinkTables:
    """The sink table of the sidebar prompt (``prompt`` 0), plus any pooled prompts, and its summaries."""

    sink: int  # the sidebar prompt's sink position
    sink_token: str
    prompts: int
    table: pd.DataFrame  # :func:`cwviz.analyses.sinks.pooled_sink_table` columns
    layers: pd.DataFrame  # :func:`cwviz.analyses.sinks.sink_layer_summary`
    heads: pd.DataFrame  # :func:`cwviz.analyses.sinks.sink_head_summary`


@dataclass(frozen=True)
class HeadView:
    """What chart (a) needs for one head: its points, the typical curve and where it is smallest."""

    layer: int
    head: int
    points: pd.DataFrame
    curve: pd.DataFrame
    minimiser: float
    cos: float


@st.cache_data(max_entries=8, show_spinner=False)
def sink_tables(request: services.Request, sink: str, pool_path: str = "", pool_n: int = 0) -> SinkTables:
    """Sink table and summaries; with ``pool_path``, also the first ``pool_n`` prompts of that JSONL file."""
    analysis = services.get_analysis(request).analysis
    position = sinks.resolve_sink(analysis, sink)
    with services.progress_bar("Splitting every head output at the sink") as progress:
        frames = [sinks.sink_table(analysis, position, progress=progress)]
    if pool_path.strip() and pool_n > 0:
        hosting.policy_from_env().check_server_file(pool_path)
        bundle = services.get_bundle(request.model, request.device, request.dtype)
        texts = read_texts(pool_path.strip(), n=min(pool_n, MAX_POOLED))
        for number, text in enumerate(texts, start=1):
            services.check_dashboard_length(bundle, len(tokenize(bundle, text)), 0)
            steps = 2 * bundle.info.layers  # the forward pass, then the table
            with services.progress_bar(f"Pooled prompt {number} of {len(texts)}", "layer steps") as progress:
                pooled = analyze(bundle, text, progress=phase(progress, 0, steps))
                frames.append(sinks.sink_table(pooled, sink, progress=phase(progress, steps // 2, steps)))
    table = sinks.pool_tables(frames)
    return SinkTables(
        sink=position,
        sink_token=analysis.tokens[position],
        prompts=len(frames),
        table=table,
        layers=sinks.sink_layer_summary(table),
        heads=sinks.sink_head_summary(table),
    )


@st.cache_data(max_entries=32, show_spinner=False)
def head_view(request: services.Request, sink: str, pool_path: str, pool_n: int, layer: int, head: int | None) -> HeadView:
    """Chart (a)'s data for ``head`` of ``layer`` (arguments as :func:`sink_tables`); for all heads
    (None), the layer's most anti-aligned head."""
    tables = sink_tables(request, sink, pool_path, pool_n)
    if head is None:
        head = sinks.most_anti_aligned_head(tables.heads, layer)
    curve = sinks.head_curve(tables.table, layer, head)
    points = tables.table[(tables.table["layer"] == layer) & (tables.table["head"] == head)]
    return HeadView(layer, head, points, curve.table(), curve.minimiser, curve.cos)


@st.cache_data(max_entries=16, show_spinner=False)
def intervention(request: services.Request, sink: int, factor: float, layers: tuple[int, ...] | None) -> sinks.SinkIntervention:
    """:func:`cwviz.analyses.sinks.intervene_on_sink` on the sidebar prompt."""
    analysis = services.get_analysis(request).analysis
    with services.progress_bar("Running with the sink's value scaled, then comparing", "layer steps") as progress:
        return sinks.intervene_on_sink(analysis, sink, factor, layers, progress=progress)


@st.cache_data(max_entries=8, show_spinner=False)
def layerwise(request: services.Request, sink: int, factor: float) -> pd.DataFrame:
    """:func:`cwviz.analyses.sinks.layerwise_removal` on the sidebar prompt."""
    analysis = services.get_analysis(request).analysis
    with services.progress_bar("Removing the sink's value one layer at a time") as progress:
        return sinks.layerwise_removal(analysis, sink, factor, progress=progress)
