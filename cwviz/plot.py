"""The dashboard's own charts, for notebooks: an :class:`~cwviz.Analysis` in, an Altair chart out.

>>> from cwviz import load_model, analyze, plot
>>> a = analyze(load_model("embedded"), "The capital of France is")
>>> plot.heatmaps(a, layer=12)                      # attention beside contribution weights
>>> plot.token_factors(a, layer=12, query=5, head=3) # attention x norm ratio x cosine
>>> plot.sink_ratio(a, layer=15)                     # the sink's convex relation
>>> plot.flow(a)                                     # the route into the prediction, each token's score

Each function calls the same table function of :mod:`cwviz.analyses` and the same chart builder of
:mod:`cwviz.charts` as the dashboard page that draws the chart, so a notebook shows exactly what the
page shows (without the page's caching and widgets). Jupyter draws a returned chart; ``chart.save("x.svg")``
or :mod:`cwviz.charts.export` writes it to a file.

Arguments follow the library's vocabulary: ``layer``, ``head`` (``None``: all heads, the layer-level
scores of docs/METHOD.md section 2), ``query`` (a token position; ``None``: the last token). Out-of-range
positions raise :class:`~cwviz.SelectionError`, unknown names :class:`~cwviz.InputError`; both name the fix.

Choices made here, where a page would have a widget:

* ``measure`` of :func:`heatmaps` is a picker family of the Heatmaps page (``"contribution"``,
  ``"output_normalized"``, ``"value_weighted"``, ``"raw"``), combined with ``kind``, or any name of
  :data:`cwviz.MEASURES` as it is.
* The sink functions take an Analysis (its :func:`~cwviz.analyses.sinks.sink_table` is computed at
  ``sink``) or a table already made by :func:`~cwviz.analyses.sinks.sink_table` or
  :func:`~cwviz.analyses.sinks.pool_tables` (prompts pooled, as the Sinks page pools them), so several
  charts can share one table.
* :func:`sink_ratio` with ``head=None`` draws the layer's most anti-aligned head, as the Sinks page does.
* :func:`faithfulness_curves` takes a summary (:func:`~cwviz.analyses.faithfulness_summary.summarize`, or the
  CLI's ``--out`` CSV read back with pandas) or the per-example table it is made from, and stacks both
  curves as the Faithfulness page does unless ``curve`` names one.

Importing this module does not import Streamlit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from numbers import Integral

import altair as alt
import pandas as pd

from .analyses import compare as compare_analyses
from .analyses import faithfulness, faithfulness_summary, route, sink_interventions, sinks, tables
from .analyses.flow_text import describe
from .charts import compare as compare_charts
from .charts import faithfulness as faithfulness_charts
from .charts import flow as flow_charts
from .charts import head_grid
from .charts import heatmaps as heatmap_charts
from .charts import sinks as sink_charts
from .charts import token as token_charts
from .core import defaults
from .core.method.analysis import Analysis
from .core.method.attribution import METHODS, Attribution, attribute, of_flow
from .core.method.flow_tables import Flow
from .core.method.measures import MEASURES
from .core.util.errors import InputError, SelectionError
from .core.vocabulary import check_kind

__all__ = [
    "anti_alignment",
    "compare_heads",
    "compare_logprobs",
    "compare_maps",
    "faithfulness_curves",
    "flow",
    "head_overview",
    "heatmaps",
    "sink_intervention",
    "sink_ratio",
    "sink_shares",
    "token_factors",
    "top_keys",
]


def _head(analysis: Analysis, head: int | None) -> int | None:
    return None if head is None else analysis.check_head(head)


def _measure(measure: str, kind: str) -> str:
    """A picker family with ``kind``, or a :data:`cwviz.MEASURES` name as it is."""
    if measure in tables.FAMILIES:
        return tables.measure_name(measure, kind)
    if measure in MEASURES:
        return measure
    raise InputError(
        f"unknown measure {measure!r}; choose a family ({', '.join(tables.FAMILIES)}) or one of: {', '.join(MEASURES)}"
    )


# -- the Heatmaps page ---------------------------------------------------------------------------------
def heatmaps(
    analysis: Analysis,
    layer: int,
    head: int | None = None,
    measure: str = "contribution",
    kind: str = "inter",
    query: int | None = None,
    view: str = "window",
    layout: str = "auto",
) -> alt.HConcatChart | alt.VConcatChart:
    """Attention beside ``measure`` for one layer: :func:`cwviz.analyses.tables.heatmap_cells` drawn by
    :func:`cwviz.charts.heatmaps.heatmap_pair`, the ``query`` row outlined (the last token when None).

    ``layout``: ``"auto"`` (side by side while the pair fits a laptop's page, else stacked), ``"side"`` or
    ``"stacked"``.

    ``view`` (``"window"`` or ``"binned"``) says how a layer with more than
    :data:`cwviz.analyses.tables.MAX_CELLS` cells is cut down; the chart's title says which was used.
    """
    name = _measure(measure, check_kind(kind))
    if view not in tables.VIEWS:
        raise InputError(f"view must be one of {', '.join(tables.VIEWS)}, not {view!r}")
    if layout not in heatmap_charts.LAYOUTS:
        raise InputError(f"layout must be one of {', '.join(heatmap_charts.LAYOUTS)}, not {layout!r}")
    cells = tables.heatmap_cells(analysis, layer, _head(analysis, head), name, kind, query=query, view=view)
    return heatmap_charts.heatmap_pair(cells, query=query, layout=layout)


def head_overview(
    analysis: Analysis, metric: str = "divergence", layer: int | None = None, head: int | None = None
) -> alt.LayerChart:
    """Every layer x head coloured by ``metric`` (:data:`cwviz.charts.head_grid.OVERVIEW_METRICS`), from
    :func:`cwviz.analyses.tables.head_summary`; the (``layer``, ``head``) cell outlined when both are given."""
    if metric not in head_grid.OVERVIEW_METRICS:
        raise InputError(f"metric must be one of {', '.join(head_grid.OVERVIEW_METRICS)}, not {metric!r}")
    if layer is not None:
        layer = analysis.check_layer(layer)
    head = _head(analysis, head)
    return head_grid.head_overview(tables.head_summary(analysis), metric, layer=layer, head=head)


# -- the Compare page ----------------------------------------------------------------------------------
def compare_maps(
    a: Analysis,
    b: Analysis,
    layer: int,
    head: int | None = None,
    what: str = "contribution",
    kind: str = "inter",
    query: int | None = None,
) -> alt.ConcatChart:
    """A, B and B − A of one map (``what``: ``"contribution"`` or ``"attention"``) on the aligned tokens:
    :func:`cwviz.analyses.compare.map_cells` drawn by :func:`cwviz.charts.compare.compare_maps`."""
    if what not in compare_charts.COMPARE_MAPS:
        raise InputError(f"what must be one of {', '.join(compare_charts.COMPARE_MAPS)}, not {what!r}")
    cells = compare_analyses.map_cells(compare_analyses.compare(a, b), layer, _head(a, head), check_kind(kind), query)
    return compare_charts.compare_maps(cells, what)


def compare_heads(
    a: Analysis, b: Analysis, metric: str = "divergence", layer: int | None = None, head: int | None = None
) -> alt.LayerChart:
    """Every layer x head coloured by the change B − A of ``metric``
    (:func:`cwviz.analyses.compare.head_changes`, :func:`cwviz.charts.compare.head_change_grid`)."""
    if metric not in compare_charts.HEAD_METRICS:
        raise InputError(f"metric must be one of {', '.join(compare_charts.HEAD_METRICS)}, not {metric!r}")
    changes = compare_analyses.head_changes(compare_analyses.compare(a, b))
    return compare_charts.head_change_grid(
        changes, metric, None if layer is None else a.check_layer(layer), _head(a, head)
    )


def compare_logprobs(a: Analysis, b: Analysis) -> alt.LayerChart:
    """log p_B − log p_A of each aligned token given the tokens before it
    (:func:`cwviz.analyses.compare.logprob_changes`, :func:`cwviz.charts.compare.logprob_change_chart`)."""
    return compare_charts.logprob_change_chart(compare_analyses.logprob_changes(compare_analyses.compare(a, b)))


# -- the Token page ------------------------------------------------------------------------------------
def token_factors(
    analysis: Analysis, layer: int, query: int, head: int | None = None, kind: str = "inter"
) -> alt.HConcatChart:
    """contribution = attention x norm ratio x cosine for each key of ``query``:
    :func:`cwviz.analyses.tables.token_factors` drawn by :func:`cwviz.charts.token.factor_bars`.

    With ``head=None`` only attention (mean over heads) and the layer-level contribution are drawn: the
    factorisation is per head.
    """
    factors = tables.token_factors(analysis, layer, query, _head(analysis, head), check_kind(kind))
    return token_charts.factor_bars(factors)


def top_keys(
    analysis: Analysis, query: int, head: int | None = None, kind: str = "inter", k: int = 5
) -> alt.LayerChart:
    """The ``k`` keys with the largest contribution to ``query`` in every layer:
    :func:`cwviz.analyses.tables.top_keys_across_layers` drawn by :func:`cwviz.charts.token.top_keys_chart`."""
    if not isinstance(k, int) or k < 1:
        raise InputError(f"k, the keys per layer, must be a whole number of at least 1, not {k!r}")
    query = analysis.check_token(query)
    frame = tables.top_keys_across_layers(analysis, query, _head(analysis, head), check_kind(kind), k)
    who = "all heads" if head is None else f"head {head}"
    note = (
        f"Query {query} {analysis.tokens[query]!r}: its top {k} keys by {kind}-head contribution in every layer "
        f"({who}); numbers are ranks"
    )
    return token_charts.top_keys_chart(frame, note)


# -- the Flow page (docs/METHOD.md sections 6 and 7) ------------------------------------------------------------
def flow(
    source: Analysis | Attribution | Flow,
    position: int | None = None,
    target: int | str | None = None,
    foil: int | str | None = None,
    kept: float = defaults.KEPT,
    method: str = defaults.FLOW_METHOD,
) -> alt.HConcatChart:
    """The Flow page's first screen: the route into the prediction (:func:`cwviz.analyses.route.of` at the kept
    fraction ``kept``) beside each input token's score, red adding and blue subtracting, under the sentence saying
    what is explained (:func:`cwviz.charts.flow.route_chart`). ``source``: an Analysis (``method``, ``position``,
    ``target`` and ``foil`` as :func:`cwviz.attribute` takes them), an attribution already made, or a
    :class:`~cwviz.core.method.flow_tables.Flow` (the share flow's)."""
    if isinstance(source, Analysis):
        result = attribute(source, method, position, target, foil)
    elif isinstance(source, Flow):
        result = of_flow(source)
    elif isinstance(source, Attribution):
        result = source
    else:
        raise InputError(f"expected an Analysis, an Attribution or a Flow, not {type(source).__name__}")
    label = METHODS[result.method].label
    note = f"The {label} {describe(result.asked)}"
    if math.isfinite(result.quantity):
        note += f": the quantity explained is {result.quantity:+.3f}"
    return flow_charts.route_chart(route.of(result, kept), result.tokens_table(), note + ".")


# -- the Sinks page ------------------------------------------------------------------------------------
def _sink_table(source: Analysis | pd.DataFrame, sink: int | str) -> pd.DataFrame:
    """The sink table of an Analysis at ``sink``, or ``source`` itself when it already is one."""
    if isinstance(source, Analysis):
        return sinks.sink_table(source, sink)
    if isinstance(source, pd.DataFrame):
        missing = [c for c in sinks.TABLE_COLUMNS if c not in source.columns]
        if missing:
            raise InputError(
                f"this table is not a sink table (no column {', '.join(missing)}); "
                "pass an Analysis or a table from cwviz.sinks.sink_table / pool_tables"
            )
        return source
    raise InputError(f"expected an Analysis or a sink table, not {type(source).__name__}")


def _check_in(table: pd.DataFrame, column: str, value: int | None) -> int | None:
    """``value`` when the table has rows for it, SelectionError naming the range otherwise."""
    if value is None:
        return None
    present = table[column]
    if not isinstance(value, Integral) or isinstance(value, bool) or not (present == value).any():
        raise SelectionError(
            f"{column} {value} is out of range; this table has {column}s {int(present.min())}..{int(present.max())}"
        )
    return int(value)


def _selection(
    source: Analysis | pd.DataFrame, table: pd.DataFrame, layer: int | None, head: int | None
) -> tuple[int | None, int | None]:
    """``layer`` and ``head`` checked against the Analysis (or, for a table, against its rows)."""
    if isinstance(source, Analysis):
        return (None if layer is None else source.check_layer(layer)), _head(source, head)
    return _check_in(table, "layer", layer), _check_in(table, "head", head)


def sink_ratio(
    source: Analysis | pd.DataFrame,
    layer: int,
    head: int | None = None,
    sink: int | str = defaults.DEFAULT_SINK,
    query: int | None = None,
) -> alt.LayerChart:
    """Sink ratio against head-output norm for one head, with its typical convex curve and minimiser
    (:func:`cwviz.analyses.sinks.head_curve`) drawn by :func:`cwviz.charts.sinks.ratio_norm_chart`.

    ``head=None``: the layer's most anti-aligned head (lowest mean cos(ṽ_sink, m)). ``query`` is ringed.
    """
    table = _sink_table(source, sink)
    layer, head = _selection(source, table, layer, head)
    if query is not None and isinstance(source, Analysis):
        query = source.check_token(query)
    if head is None:
        head = sinks.most_anti_aligned_head(sinks.sink_head_summary(table), layer)
        who = f"head {head} (the layer's most anti-aligned)"
    else:
        who = f"head {head}"
    curve = sinks.head_curve(table, layer, head)
    points = table[(table["layer"] == layer) & (table["head"] == head)]
    # Two title lines, so that the title is no wider than the plot (the page says the same in a caption).
    title = [
        f"Layer {layer}, {who}: sink ratio against ‖o‖",
        f"curve: the head's median ‖ṽ_sink‖, ‖m‖ and cos ({curve.cos:+.2f}); dashed: its minimum",
    ]
    return sink_charts.ratio_norm_chart(points, curve.table(), curve.minimiser, title=title, query=query)


def anti_alignment(
    source: Analysis | pd.DataFrame,
    sink: int | str = defaults.DEFAULT_SINK,
    layer: int | None = None,
    head: int | None = None,
) -> alt.LayerChart:
    """Layers x heads map of the mean cos(ṽ_sink, m) (blue: anti-aligned), from
    :func:`cwviz.analyses.sinks.sink_head_summary`, drawn by :func:`cwviz.charts.sinks.anti_alignment_map`;
    the selected layer (and head) outlined."""
    table = _sink_table(source, sink)
    layer, head = _selection(source, table, layer, head)
    return sink_charts.anti_alignment_map(sinks.sink_head_summary(table), layer=layer, head=head)


def sink_shares(
    source: Analysis | pd.DataFrame, sink: int | str = defaults.DEFAULT_SINK, layer: int | None = None
) -> alt.LayerChart:
    """Per layer, the sink's share under attention against its share under contribution weights
    (:func:`cwviz.analyses.sinks.sink_layer_summary`, drawn by :func:`cwviz.charts.sinks.share_chart`)."""
    table = _sink_table(source, sink)
    layer, _ = _selection(source, table, layer, None)
    return sink_charts.share_chart(sinks.sink_layer_summary(table), layer=layer)


def sink_intervention(
    analysis: Analysis,
    sink: int | str = defaults.DEFAULT_SINK,
    factor: float = defaults.DEFAULT_FACTOR,
    layers: Iterable[int] | None = None,
) -> alt.VConcatChart:
    """The effect of scaling the sink's value by ``factor`` in ``layers`` (None: every layer): head-output
    norms and the semantic cone per layer (:func:`cwviz.analyses.sink_interventions.intervene_on_sink`, drawn by
    :func:`cwviz.charts.sinks.intervention_chart`). One forward pass; the model is not modified."""
    position = sinks.resolve_sink(analysis, sink)
    result = sink_interventions.intervene_on_sink(analysis, position, factor, None if layers is None else tuple(layers))
    return sink_charts.intervention_chart(result.table)


# -- the Faithfulness page -----------------------------------------------------------------------------
def faithfulness_curves(
    frame: pd.DataFrame, scale: str = "linear", curve: str | None = None, seed: int = 0
) -> alt.LayerChart | alt.VConcatChart:
    """Mean ΔPPL against removal rate, a line per measure with its 95 % band
    (:func:`cwviz.charts.faithfulness.curve_chart`): both curves stacked, or only ``curve``.

    ``frame``: a summary (columns :data:`cwviz.analyses.faithfulness_summary.SUMMARY_COLUMNS`) or per-example
    results (:data:`~cwviz.analyses.faithfulness.EXAMPLE_COLUMNS`, e.g. the tables of
    :func:`~cwviz.analyses.faithfulness.iter_examples` concatenated), summarised here with ``seed``.
    ``scale``: ``"linear"`` or ``"symlog"`` (keeps zero and negative ΔPPL).
    """
    if scale not in faithfulness_charts.SCALES:
        raise InputError(f"scale must be one of {', '.join(faithfulness_charts.SCALES)}, not {scale!r}")
    if curve is not None and curve not in faithfulness.CURVES:
        raise InputError(f"curve must be one of {', '.join(faithfulness.CURVES)} (or None for both), not {curve!r}")
    if not isinstance(frame, pd.DataFrame):
        raise InputError(f"expected a pandas DataFrame of faithfulness results, not {type(frame).__name__}")
    if set(faithfulness_summary.SUMMARY_COLUMNS) <= set(frame.columns):
        summary = frame
    elif {"measure", "curve", "rate", "delta_ppl"} <= set(frame.columns):
        summary = faithfulness_summary.summarize(frame, seed=seed)
    else:
        raise InputError(
            "this table holds no faithfulness results: expected the columns of faithfulness_summary.summarize "
            f"({', '.join(faithfulness_summary.SUMMARY_COLUMNS)}) or of its per-example tables "
            f"({', '.join(faithfulness.EXAMPLE_COLUMNS)})"
        )
    if summary.empty:
        raise InputError("no faithfulness results to draw: the table has no rows")
    if curve is not None:
        return faithfulness_charts.curve_chart(summary, curve, scale=scale)
    return alt.vconcat(*(faithfulness_charts.curve_chart(summary, c, scale=scale) for c in faithfulness.CURVES))
