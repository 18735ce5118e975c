"""The tables that analyses hand to charts: their types, the measure picker's vocabulary, and the words of the
analyses' settings (their defaults: :mod:`cwviz.core.defaults`).

Torch-free on purpose: :mod:`cwviz.charts` imports this module and must not import torch or
transformers (a test says so), so a chart can be built in a notebook from a saved table alone. It imports nothing
of cwviz but :mod:`cwviz.core.vocabulary`, the words the core shares (``check_kind``), and :mod:`cwviz.core.defaults`,
and not even pandas at run time: the command line's parsers (:mod:`cwviz.cli.parsers`) show these words in
``--help``, which must start in well under a second.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core.defaults import RANKED_MEASURES
from ..core.vocabulary import check_kind

if TYPE_CHECKING:
    import pandas as pd

#: What faithfulness ranks together (docs/METHOD.md section 3, "Ranking scopes"): each query's keys (``query``, the
#: default), the sequence's keys by their mean score over the queries that see them, each key then masked for every
#: query (``token``), or every visible (query, key) pair of a layer at once (``layer``).
RANK_SCOPES = ("query", "token", "layer")

# -- the words of the analyses' settings; their defaults live in cwviz.core.defaults -------------------------------
#: Every measure that can be ranked by faithfulness (:mod:`cwviz.analyses.faithfulness`): the defaults
#: (:data:`cwviz.core.defaults.RANKED_MEASURES`) and the intra-head output-normalised variant.
ALL_MEASURES: tuple[str, ...] = RANKED_MEASURES[:3] + ("value_weighted_output_normalized_intra",) + RANKED_MEASURES[3:]
#: ``Protocol.batch_size`` for as many masked runs per forward pass as memory allows (``--batch-size auto``):
#: every distinct run of an example on a GPU, at most :data:`cwviz.core.defaults.DEFAULT_BATCH_SIZE` on a CPU (where
#: a larger batch is no faster), fewer where :func:`cwviz.analyses.faithfulness.masked_run_bytes` says they would not
#: fit.
AUTO_BATCH = 0
RANK_BY = ("signed", "absolute")
#: The multiple-choice tasks (:mod:`cwviz.analyses.tasks`, whose ``TEMPLATES`` give each one's prompt).
TASKS: tuple[str, ...] = ("mmlu", "boolq", "winogrande")
#: A claims verdict's states (docs/METHOD.md section 5): the interval on the paper's side of the line, on the other,
#: straddling it; and a claim-1 row that cannot hold because its rank scope ranks two of its measures alike.
HOLDS, FAILS, UNRESOLVED, TIES = "holds", "fails", "unresolved", "ties by construction"
VERDICT_STATES: tuple[str, ...] = (HOLDS, FAILS, UNRESOLVED, TIES)
#: Sinks (:mod:`cwviz.analyses.sinks`): the word that asks for the detected sink.
AUTO = "auto"
#: The flow (``cwviz flow``, the Flow page): the tables ``--csv DIR`` writes, by file name.
FLOW_TABLES = ("tokens", "heads", "edges", "nodes", "parts", "vocabulary")
#: The attribution methods of :data:`cwviz.core.method.attribution.METHODS`, by name, in report order (the parsers
#: list them without importing torch; a test keeps the two equal).
FLOW_METHODS = ("effect", "effect_origin", "share_flow", "input_x_gradient", "alti", "rollout", "raw", "alti_logit")
#: The fewest tokens an item of the flow's causal test (:mod:`cwviz.analyses.flow_faithfulness`) needs (ρ needs 3
#: input tokens besides the target's).
FLOW_MIN_TOKENS = 4

#: How tables and files (DataFrames, CSV, JSON) name the layer-level rows; in code "all heads" is None.
ALL_HEADS = "all heads"

#: The measure picker: family -> (label, docs/METHOD.md name for inter, name for intra).
FAMILIES: dict[str, tuple[str, str, str]] = {
    "contribution": ("contribution weight", "contribution_inter", "contribution_intra"),
    "output_normalized": (
        "value-weighted, output-normalised",
        "value_weighted_output_normalized",
        "value_weighted_output_normalized_intra",
    ),
    "value_weighted": ("value-weighted attention", "value_weighted", "value_weighted"),
    "raw": ("raw attention", "raw", "raw"),
}
VIEWS = ("window", "binned")


def measure_name(family: str, kind: str) -> str:
    """The :data:`cwviz.MEASURES` name for a picker family and an intra/inter switch."""
    if family not in FAMILIES:
        raise ValueError(f"unknown measure family {family!r}; choose one of: {', '.join(FAMILIES)}")
    return FAMILIES[family][1 if check_kind(kind) == "inter" else 2]


def is_signed(measure: str) -> bool:
    """Whether a measure can be negative (contribution weights: destructive interference)."""
    return measure.startswith("contribution")


@dataclass(frozen=True)
class HeatmapCells:
    """One layer's heatmap: ``frame`` has one row per visible (query, key) cell.

    Columns: layer, head (:data:`ALL_HEADS` for the layer-level score), query, key (positions, or bin numbers when
    binned), query_token, key_token, attention, value (the picked measure), contribution (of ``kind``), norm_ratio and
    cosine (one head, unbinned only; else NaN), query_position (the token position a click on the cell selects: the
    query, or a bin's last position). ``labels[i]`` is the axis label of position (or bin) i; ``note`` says what is
    shown (window, bins, aggregation over heads).
    """

    frame: pd.DataFrame
    labels: tuple[str, ...]
    measure: str
    kind: str
    note: str
    binned: bool
    query: int | None = None  # the row (position, or bin when binned) of the selected query


@dataclass(frozen=True)
class TokenFactors:
    """The factors of the contributions to one query.

    ``wide``: one row per shown key (key, token, attention, norm_ratio, cosine, contribution, is_sink,
    order), sorted by contribution, largest first. ``frame``: the same in long form, one row per
    (key, factor), with ``factor`` in :attr:`factors` (the chart data). ``note`` says which keys are shown.
    """

    frame: pd.DataFrame
    wide: pd.DataFrame
    factors: tuple[str, ...]
    note: str


#: The maps a comparison draws: picker value -> (label, the columns' stem in :class:`CompareCells`).
COMPARE_MAPS: dict[str, str] = {"contribution": "contribution weights", "attention": "attention weights"}
#: The per-head summaries whose change a comparison ranks (columns of :func:`cwviz.analyses.tables.head_summary`).
HEAD_METRICS: dict[str, str] = {
    "divergence": "divergence of attention and contribution rows (½ Σ|α − c|)",
    "sink_attention": "sink share under attention",
    "sink_contribution": "sink share under contribution (intra-head)",
    "output_norm": "head output norm ‖o^h‖",
}


@dataclass(frozen=True)
class CompareCells:
    """One layer's maps for two aligned inputs A and B, and their difference B − A.

    ``frame`` has one row per visible (query, key) cell of the aligned grid: ``query`` and ``key`` are
    indices of aligned pairs (``labels[i]`` labels pair i), ``query_a``/``key_a`` and ``query_b``/``key_b``
    their positions in each input, ``query_token``/``key_token`` the pair labels, then ``attention_a``,
    ``attention_b``, ``attention_diff`` and the same for ``contribution`` (of ``kind``), and
    ``query_position`` (A's position, what a click on the cell selects). Causal models show keys <= query
    only. ``note`` says what is shown (window, heads, alignment); ``query`` is the selected query's pair.
    """

    frame: pd.DataFrame
    labels: tuple[str, ...]
    kind: str
    note: str
    query: int | None = None


#: The per-head statistics an atlas pools over prompts (:mod:`cwviz.analyses.atlas`): column -> label.
ATLAS_METRICS: dict[str, str] = {
    "sink_attention": "sink share under attention",
    "sink_contribution": "sink share under contribution (intra-head)",
    "cos_sink_rest": "cos(ṽ_sink, m): sink value against the rest",
    "divergence": "divergence of attention and contribution rows (½ Σ|α − c|)",
    "negative_share": "share of negative contribution mass",
    "output_norm": "head output norm ‖o^h‖",
}


def area_span(summary: pd.DataFrame) -> tuple[float, float] | None:
    """The first and last rate :func:`cwviz.analyses.faithfulness_summary.curve_areas` integrates over, as fractions
    (``(0.01, 0.5)``), or None when ``summary`` has fewer than two rates: a curve of one point has no area, and the 0
    it is given would read as a result."""
    rates = sorted(summary["rate"].unique()) if len(summary) else []
    return (rates[0] / 100, rates[-1] / 100) if len(rates) >= 2 else None
