"""Streamlit caching for the sinks page and the tour: small cached wrappers around :mod:`cwviz.analyses.sinks`
and :mod:`cwviz.analyses.tour`.

The analysis itself comes from :func:`cwviz.app.services.get_analysis` (shared with every page); what is
cached here are the small pandas results per (request, sink, ...), so moving the layer, head or query
never recomputes them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pandas as pd
import streamlit as st

from ..analyses import sink_interventions, sinks, sweep, tour
from ..analyses.codecs.sweeps import SINKS
from ..core import defaults
from ..core.loading.checkpoints import EMBEDDED_ENCODER
from ..core.loading.provenance import model_provenance
from ..core.method.analysis import analyze
from ..core.util.errors import CwvizError
from ..core.util.progress import phase
from . import hosting, run_services, services

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
        frames += pooled_tables(request, sink, pool_path, pool_n)
    table = sinks.pool_tables(frames)
    return SinkTables(
        sink=position,
        sink_token=analysis.tokens[position],
        prompts=len(frames),
        table=table,
        layers=sinks.sink_layer_summary(table),
        heads=sinks.sink_head_summary(table),
    )


def pooled_tables(request: services.Request, sink: str, path: str, n: int) -> list[pd.DataFrame]:
    """The sink tables of the first ``n`` prompts of the JSONL file ``path``, through the one runner (in memory), each
    prompt's record kept as it ends, so that a run stopped part-way resumes."""
    hosting.policy_from_env().check_server_file(path)
    bundle = services.get_bundle(request.model, request.device, request.dtype)
    texts = services.pooled_prompts(bundle, path, n, MAX_POOLED)
    plan = sweep.Sweep(SINKS, SINKS.settings(sink, defaults.DEFAULT_FACTOR, False, model_provenance(bundle)), texts)
    steps = 2 * bundle.info.layers  # the forward pass, then the table

    def compute(index: int) -> dict:
        with services.progress_bar(f"Pooled prompt {index + 1} of {len(texts)}", "layer steps") as progress:
            pooled = analyze(bundle, texts[index], progress=phase(progress, 0, steps))
            position = sinks.resolve_sink(pooled, sink)
            return SINKS.encode(
                sinks.sink_table(pooled, position, progress=phase(progress, steps // 2, steps)), position, pooled.tokens
            )

    # The records kept in this server process (run_services.kept): a run stopped part-way (the page's Stop) resumes.
    with services.item_bar(
        f"Pooling {len(texts)} prompts", len(texts), len(run_services.kept(plan)), "prompt"
    ) as progress:
        outcome = sweep.run(plan, compute, progress=progress, store=run_services.kept(plan))
    return [SINKS.decode(record) for record in outcome.records]


@st.cache_data(max_entries=32, show_spinner=False)
def head_view(
    request: services.Request, sink: str, pool_path: str, pool_n: int, layer: int, head: int | None
) -> HeadView:
    """Chart (a)'s data for ``head`` of ``layer`` (arguments as :func:`sink_tables`); for all heads
    (None), the layer's most anti-aligned head."""
    tables = sink_tables(request, sink, pool_path, pool_n)
    if head is None:
        head = sinks.most_anti_aligned_head(tables.heads, layer)
    curve = sinks.head_curve(tables.table, layer, head)
    points = tables.table[(tables.table["layer"] == layer) & (tables.table["head"] == head)]
    return HeadView(layer, head, points, curve.table(), curve.minimiser, curve.cos)


@st.cache_data(max_entries=8, show_spinner=False)
def clean_outputs(request: services.Request, sink: int) -> pd.DataFrame:
    """:func:`cwviz.analyses.sink_interventions.head_output_stats` of the sidebar prompt: the intervention's clean side
    (the analysis's recorded head outputs reduced, no forward pass), made once for every λ."""
    analysis = services.get_analysis(request).analysis
    with services.progress_bar(f"Head outputs of {analysis.info.id}'s pass, as recorded") as progress:
        return sink_interventions.head_output_stats(analysis, sink, progress=progress)


@st.cache_data(max_entries=16, show_spinner=False)
def intervention(
    request: services.Request,
    sink: int,
    factor: float,
    layers: tuple[int, ...] | None,
) -> sink_interventions.SinkIntervention:
    """:func:`cwviz.analyses.sink_interventions.intervene_on_sink` on the sidebar prompt (its clean side from
    :func:`clean_outputs`): one forward pass a λ, recording nothing."""
    analysis = services.get_analysis(request).analysis
    clean = clean_outputs(request, sink)
    with services.progress_bar(
        f"λ = {factor:g}: a forward pass of {analysis.info.id} with the sink's value scaled"
    ) as progress:
        return sink_interventions.intervene_on_sink(analysis, sink, factor, layers, progress=progress, clean=clean)


#: Layers a batched pass of the layer-by-layer ΔPPL holds: a pass ends within seconds on a CPU, so Stop (which
#: interrupts the page between two passes) takes effect soon and keeps every finished layer. One pass of all 30 layers
#: of the embedded model ran 123 s with nothing to stop it.
LAYERWISE_CHUNK = 3


@st.cache_resource(max_entries=8, show_spinner=False)
def layerwise_done(request: services.Request, sink: int, factor: float) -> dict[int, float]:
    """The perplexities of the layers finished so far (layer -> perplexity) of :func:`layerwise` in this server process:
    a run stopped part-way resumes from them."""
    return {}


def layerwise(request: services.Request, sink: int, factor: float) -> pd.DataFrame:
    """:func:`cwviz.analyses.sink_interventions.layerwise_removal` on the sidebar prompt, :data:`LAYERWISE_CHUNK` layers
    a pass, each pass's perplexities kept as it ends (:func:`layerwise_done`), with a bar saying which layer runs and
    how long is left. Stopped (any click interrupts the page between passes), it keeps the finished layers and resumes
    from them."""
    analysis = services.get_analysis(request).analysis
    done = layerwise_done(request, sink, factor)
    todo = [layer for layer in range(analysis.num_layers) if layer not in done]
    if not todo:
        return sink_interventions.layerwise_table(analysis, [done[layer] for layer in range(analysis.num_layers)])
    with services.item_bar(
        "ΔPPL with the sink's value scaled, one layer at a time", analysis.num_layers, len(done), "layer"
    ) as progress:
        for start in range(0, len(todo), LAYERWISE_CHUNK):
            chunk = todo[start : start + LAYERWISE_CHUNK]
            perplexities = sink_interventions.removal_perplexity(analysis, [[layer] for layer in chunk], sink, factor)
            done.update(zip(chunk, perplexities.tolist()))
            progress(start + len(chunk), len(todo))
    return sink_interventions.layerwise_table(analysis, [done[layer] for layer in range(analysis.num_layers)])


#: The sink the tour shows: the first token, as the Sinks page's default "first" (the same cache entries).
TOUR_SINK = "0"


@st.cache_data(max_entries=8, show_spinner=False)
def tour_plan(request: services.Request) -> tour.TourPlan:
    """:func:`cwviz.analyses.tour.plan`: what each step of the tour shows, picked from the sidebar prompt's analysis."""
    analysis = services.get_analysis(request).analysis
    tables = sink_tables(request, TOUR_SINK)
    return tour.plan(analysis, services.head_summary(request), tables.layers, tables.heads)


@dataclass(frozen=True)
class EncoderView:
    """The tour's last step: the sidebar prompt in an encoder (the user's model when it is one, else the embedded
    MiniLM), its sink tables and the layer where [CLS] takes most attention; or why it could not be analysed."""

    request: services.Request
    own_model: bool  # the sidebar's model is the encoder shown
    tables: SinkTables | None = None
    layer: tour.SinkLayer | None = None
    error: str | None = None


def tour_encoder(request: services.Request) -> EncoderView:
    """:class:`EncoderView` of ``request``'s prompt; a model that cannot be loaded (say, not offered by a hosted
    server) is reported in ``error``, not raised."""
    own = not services.get_analysis(request).analysis.info.causal
    encoder = request if own else replace(request, model=EMBEDDED_ENCODER, generate=0)
    try:
        tables = sink_tables(encoder, TOUR_SINK)
    except CwvizError as err:
        return EncoderView(encoder, own, error=str(err))
    return EncoderView(encoder, own, tables, tour.most_attended_layer(tables.layers))
