"""The tables that analyses hand to charts: their types and the measure picker's vocabulary.

Torch-free on purpose: :mod:`cwviz.charts` imports this module and must not import torch or
transformers (a test says so), so a chart can be built in a notebook from a saved table alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

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
KINDS = ("inter", "intra")
VIEWS = ("window", "binned")


def measure_name(family: str, kind: str) -> str:
    """The :data:`cwviz.MEASURES` name for a picker family and an intra/inter switch."""
    if family not in FAMILIES:
        raise ValueError(f"unknown measure family {family!r}; choose one of: {', '.join(FAMILIES)}")
    if kind not in KINDS:
        raise ValueError(f"kind must be 'inter' or 'intra', not {kind!r}")
    return FAMILIES[family][1 if kind == "inter" else 2]


def is_signed(measure: str) -> bool:
    """Whether a measure can be negative (contribution weights: destructive interference)."""
    return measure.startswith("contribution")


@dataclass(frozen=True)
class HeatmapCells:
    """One layer's heatmap: ``frame`` has one row per visible (query, key) cell.

    Columns: layer, head (:data:`ALL_HEADS` for the layer-level score), query, key (positions, or bin numbers when binned),
    query_token, key_token, attention, value (the picked measure), contribution (of ``kind``),
    norm_ratio and cosine (one head, unbinned only; else NaN), query_position (the token
    position a click on the cell selects: the query, or a bin's last position). ``labels[i]`` is the axis label of
    position (or bin) i; ``note`` says what is shown (window, bins, aggregation over heads).
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
