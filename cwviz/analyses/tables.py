"""Tidy pandas tables from an :class:`~cwviz.Analysis`: one row per observation, dimension vocabulary
(``layer, head, query, key``) in the column names. Pure: no Streamlit, no charts.

Every table stays small enough to chart (well under Altair's 5000-row limit): a heatmap of a long
prompt is windowed around the selected query or aggregated into bins, and says which in ``note``.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

from ..core.defaults import DEFAULT_SINK
from ..core.method.analysis import Analysis
from ..core.method.measures import LAYER_AGGREGATION, MEASURES, LayerMeasures
from ..core.util.progress import Progress, counted

# The picker vocabulary and table types are part of this module's interface too (pages use tables.FAMILIES).
from ..core.vocabulary import KINDS, check_kind  # noqa: F401
from .schema import ALL_HEADS, FAMILIES, VIEWS, HeatmapCells, TokenFactors, is_signed, measure_name  # noqa: F401

#: Most cells one heatmap may have (Altair refuses more than 5000 rows per dataset).
MAX_CELLS = 2500
#: Positions of the dashboard's maps: a prompt of up to 40 tokens is shown whole, and fits the first screen
#: (1280 x 720) beside its twin with readable labels; a longer one is shown in a window or in bins.
SCREEN_POSITIONS = 40


def screen_cells(causal: bool) -> int:
    """The ``max_cells`` of a map of :data:`SCREEN_POSITIONS` positions: a triangle for a causal model, a square
    for an encoder."""
    return _causal_cells(SCREEN_POSITIONS, SCREEN_POSITIONS, causal)


#: Keys shown per query on the token page (plus the sink).
TOP_KEYS = 24


def _causal_cells(num_queries: int, num_keys: int, causal: bool) -> int:
    return num_queries * (num_queries + 1) // 2 if causal else num_queries * num_keys


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().float().cpu().numpy()


def _layer_matrices(m: LayerMeasures, head: int | None, measure: str, kind: str) -> dict[str, np.ndarray]:
    """[query, key] matrices of ``m`` (a whole layer, or some of its rows: :meth:`cwviz.Analysis.rows`) for
    one head or aggregated over heads (docs/METHOD.md layer-level rules)."""
    if measure not in MEASURES:
        raise ValueError(f"unknown measure {measure!r}; choose one of: {', '.join(MEASURES)}")
    contribution_name = f"contribution_{kind}"
    if head is None:
        return {
            name: _numpy(m.layer_level(source))
            for name, source in (("attention", "raw"), ("value", measure), ("contribution", contribution_name))
        }
    return {
        "attention": _numpy(m.attention[head]),
        "value": _numpy(m.per_head(measure)[head]),
        "contribution": _numpy(m.contribution(kind)[head]),
        "norm_ratio": _numpy(m.norm_ratio(kind)[head]),
        "cosine": _numpy(m.cosine(kind)[head]),
    }


def heads_note(head: int | None, measure: str, kind: str) -> str:
    if head is not None:
        return f"head {head}"
    # No "; " inside: a chart's title is wrapped at its "; " (cwviz.charts.heatmaps.wrap).
    how = AGGREGATED[LAYER_AGGREGATION[measure]]
    contribution = AGGREGATED[LAYER_AGGREGATION[f"contribution_{kind}"]]
    if measure == f"contribution_{kind}":
        return f"all heads (attention averaged over heads, contributions {contribution})"
    if measure == "raw":
        return f"all heads (attention averaged over heads, contributions in the tooltip {contribution})"
    return f"all heads (attention averaged over heads, this measure {how}, contributions in the tooltip {contribution})"


#: How a note says each aggregation over heads (:data:`cwviz.core.method.measures.LAYER_AGGREGATION`).
AGGREGATED = {"mean": "averaged", "sum": "summed"}


def window_bounds(num_tokens: int, query: int, size: int) -> tuple[int, int]:
    """First and last position of a window of ``size`` positions around ``query``, inside the prompt."""
    size = min(size, num_tokens)
    lo = max(0, min(query - size // 2, num_tokens - size))
    return lo, lo + size - 1


def heatmap_cells(
    analysis: Analysis,
    layer: int,
    head: int | None,
    measure: str,
    kind: str = "inter",
    query: int | None = None,
    view: str = "window",
    max_cells: int = MAX_CELLS,
    progress: Progress | None = None,
) -> HeatmapCells:
    """The cells of one layer's attention / measure heatmaps.

    ``head=None`` aggregates over heads. When the prompt has more cells than ``max_cells``,
    ``view="window"`` keeps the queries (and keys) in a window around ``query`` plus the first key
    (the sink), and ``view="binned"`` averages groups of consecutive queries and sums groups of
    consecutive keys (so attention rows still sum to 1). Causal models show only keys <= query: the
    masked upper triangle has no rows at all, so it is drawn empty, not as zero. ``progress`` is told the
    query rows done by the binned view (the one view that reads the whole layer, in its row blocks).
    """
    layer = analysis.check_layer(layer)
    if head is not None:
        head = analysis.check_head(head)
    if view not in VIEWS:
        raise ValueError(f"view must be one of {VIEWS}, not {view!r}")
    t = analysis.num_tokens
    query = t - 1 if query is None else analysis.check_token(query)
    causal = analysis.bundle.arch.causal
    tokens = analysis.tokens
    who = heads_note(head, measure, kind)

    if _causal_cells(t, t, causal) <= max_cells:
        mats = _layer_matrices(analysis.layer(layer), head, measure, kind)
        positions = np.arange(t)
        frame = _cells(mats, positions, positions, causal, tokens, tokens)
        labels, binned, note = position_labels(tokens), False, f"layer {layer}, {who}; all {t} tokens"
    elif view == "window":
        size = 1
        while _causal_cells(size + 1, size + 1, causal) + size + 1 <= max_cells:
            size += 1
        lo, hi = window_bounds(t, query, size)
        rows = np.arange(lo, hi + 1)
        keys = np.concatenate([[DEFAULT_SINK], rows]) if lo > DEFAULT_SINK else rows
        # Only the window's query rows are computed: W x T per head, not T x T.
        mats = _layer_matrices(analysis.rows(layer, lo, hi + 1), head, measure, kind)
        frame = _cells(mats, rows, keys, causal, tokens, tokens, row_offset=lo)
        labels, binned = position_labels(tokens), False
        note = (
            f"layer {layer}, {who}; window: queries and keys {lo}–{hi} of {t} tokens"
            f"{' plus the first token' if lo > DEFAULT_SINK else ''}, around query {query}"
        )
    else:
        bins = 1
        while _causal_cells(bins + 1, bins + 1, causal) <= max_cells:
            bins += 1
        width = math.ceil(t / bins)
        edges = np.arange(0, t, width)
        binned_mats = _binned_matrices(analysis, layer, head, measure, kind, edges, progress)
        labels = tuple(f"{s}–{min(s + width, t) - 1}" for s in edges)
        positions = np.arange(len(edges))
        frame = _cells(binned_mats, positions, positions, causal, labels, labels)
        last = np.minimum(edges + width, t) - 1  # the position a click on a bin selects: its last one
        frame["query_position"] = last[frame["query"].to_numpy()]
        binned = True
        note = f"layer {layer}, {who}; all {t} tokens in bins of {width} (mean over queries, sum over keys)"
    if not binned:
        frame["query_position"] = frame["query"]
    frame.insert(0, "head", ALL_HEADS if head is None else head)
    frame.insert(0, "layer", layer)
    selected = int(np.searchsorted(edges, query, side="right") - 1) if binned else query
    return HeatmapCells(
        frame=frame, labels=labels, measure=measure, kind=kind, note=note, binned=binned, query=selected
    )


def position_labels(tokens) -> tuple[str, ...]:
    """Axis labels ``"12 the"``: the position first, so repeated tokens stay apart."""
    return tuple(f"{i} {token}" for i, token in enumerate(tokens))


def _binned_matrices(
    analysis: Analysis,
    layer: int,
    head: int | None,
    measure: str,
    kind: str,
    edges: np.ndarray,
    progress: Progress | None = None,
) -> dict[str, np.ndarray]:
    """[query_bin, key_bin] attention, measure and contribution: the mean over a bin's queries of the sum over
    a bin's keys (attention rows still sum to 1), read in the layer's row blocks (:meth:`cwviz.Analysis.row_blocks`;
    a bin may span several blocks) that are reduced as they go: the layer's T x T maps are never held.
    ``progress(rows done, T)``."""
    t, count = analysis.num_tokens, len(edges)
    out = {name: np.zeros((count, count)) for name in ("attention", "value", "contribution")}
    bin_of_row = np.searchsorted(edges, np.arange(t), side="right") - 1
    for start, stop, m in analysis.row_blocks(layer):
        # (rows, keys): a causal block holds the keys 0..stop-1 it can see
        mats = _layer_matrices(m, head, measure, kind)
        bins = int(np.searchsorted(edges, mats["attention"].shape[1]))  # the key bins that start among those keys
        for name in out:
            key_sums = np.add.reduceat(mats[name].astype(np.float64), edges[:bins], axis=1)  # (rows, key bins)
            np.add.at(out[name], (bin_of_row[start:stop, None], np.arange(bins)[None, :]), key_sums)
        if progress is not None:
            progress(stop, t)
    queries = np.diff(np.append(edges, t))  # queries a bin
    return {name: (matrix / queries[:, None]).astype(np.float32) for name, matrix in out.items()}


def _cells(
    mats: dict[str, np.ndarray],
    rows: np.ndarray,
    keys: np.ndarray,
    causal: bool,
    row_labels,
    key_labels,
    row_offset: int = 0,
) -> pd.DataFrame:
    """Long table of the (row, key) cells, without the masked (key > query) ones when causal. The matrices'
    row r holds query ``r + row_offset`` (they may hold only some rows of the layer)."""
    q, k = np.meshgrid(rows, keys, indexing="ij")
    keep = (k <= q) if causal else np.ones_like(q, dtype=bool)
    q, k = q[keep], k[keep]
    data = {
        "query": q.astype(int),
        "key": k.astype(int),
        "query_token": [row_labels[i] for i in q],
        "key_token": [key_labels[j] for j in k],
    }
    for name in ("attention", "value", "contribution", "norm_ratio", "cosine"):
        data[name] = mats[name][q - row_offset, k].astype(float) if name in mats else np.full(len(q), np.nan)
    return pd.DataFrame(data)


def _queries_after_first(analysis: Analysis) -> slice:
    """Queries used for per-head summaries: all but the first, which can only attend to itself."""
    return slice(1, None) if analysis.num_tokens > 1 else slice(0, None)


def head_summary(analysis: Analysis, progress: Progress | None = None) -> pd.DataFrame:
    """One row per (layer, head), averaged over queries 1..T-1 (query 0 sees only itself):

    * ``sink_attention``: mean attention on the first token (the sink ratio of docs/METHOD.md section 4);
    * ``sink_contribution``: mean intra-head contribution weight of the first token;
    * ``divergence``: mean over queries of ½ Σ_j |α_ij − c_ij|, how differently attention and
      intra-head contribution weights distribute the query's row (0 when they agree; both rows sum
      to 1, so it is at least the share that moves);
    * ``output_norm``: mean head output norm ‖o_i^h‖ (the head's write, before the output-projection bias).

    Intra-head contributions are used because, like attention, they sum to 1 in every head. ``progress(done, layers)``
    (:mod:`cwviz.core.util.progress`) is called after each layer. Each layer is read in blocks of query rows
    (:meth:`cwviz.Analysis.row_blocks`) that are reduced as they go, so the working memory is O(block x T), not the
    layer's T x T maps.
    """
    heads = analysis.num_heads
    first = _queries_after_first(analysis).start
    count = analysis.num_tokens - first
    columns: dict[str, list] = {
        "layer": [],
        "head": [],
        "sink_attention": [],
        "sink_contribution": [],
        "divergence": [],
        "output_norm": [],
    }
    with torch.inference_mode():
        for layer in counted(range(analysis.num_layers), analysis.num_layers, progress):
            # Row blocks, reduced as they go: [head, block, T] at a time, never the whole [head, T, T].
            sink_attention, sink_contribution, divergence = torch.zeros(heads), torch.zeros(heads), torch.zeros(heads)
            output_norm = torch.zeros(heads)
            for _, _, m in analysis.row_blocks(layer, first, kinds=("intra",)):
                attention, contribution = m.attention, m.contribution("intra")  # (H, rows, K)
                sink_attention += attention[:, :, DEFAULT_SINK].sum(-1).cpu()
                sink_contribution += contribution[:, :, DEFAULT_SINK].sum(-1).cpu()
                output_norm += m.head_output_norm.sum(-1).cpu()
                # |α − c| in the block's own contribution map (the block is this loop's): no map more per block
                divergence += contribution.sub_(attention).abs_().sum(-1).sum(-1).cpu()
            columns["layer"] += [layer] * heads
            columns["head"] += list(range(heads))
            columns["sink_attention"] += (sink_attention / count).tolist()
            columns["sink_contribution"] += (sink_contribution / count).tolist()
            columns["divergence"] += (divergence * 0.5 / count).tolist()
            columns["output_norm"] += (output_norm / count).tolist()
    frame = pd.DataFrame(columns)
    frame["rank"] = frame["divergence"].rank(ascending=False, method="first").astype(int)
    return frame


def head_ranking(summary: pd.DataFrame, top: int | None = None) -> pd.DataFrame:
    """Heads sorted by divergence, largest first."""
    ranked = summary.sort_values("divergence", ascending=False, kind="stable").reset_index(drop=True)
    return ranked if top is None else ranked.head(top)


def keys_seen_by(analysis: Analysis, query: int, layer: int | None = None) -> np.ndarray:
    """Keys the query can see: in ``layer``, those its mask lets through (a sliding window hides the far
    ones); with no layer, 0..query in causal models and every position otherwise."""
    if layer is not None:
        query = analysis.check_token(query)
        return torch.nonzero(analysis.key_mask(layer, query, query + 1)[0]).flatten().cpu().numpy()
    return np.arange(query + 1 if analysis.bundle.arch.causal else analysis.num_tokens)


def decomposition(
    analysis: Analysis, layer: int, query: int, head: int | None = None, kind: str = "inter"
) -> pd.DataFrame:
    """The factors of each key's contribution to ``query``: one row per head and key.

    contribution = attention x norm_ratio x cosine, where norm_ratio = value_norm / output_norm and
    output_norm is ‖o_i‖ (``kind="inter"``) or ‖o_i^h‖ (``kind="intra"``). Keys the query cannot
    see in this layer (the model's own mask: the future in causal models, keys outside a sliding
    window) are left out.
    """
    check_kind(kind)
    layer, query = analysis.check_layer(layer), analysis.check_token(query)
    m = analysis.rows(layer, query, query + 1)  # the query's row alone (exact, T times cheaper than the layer)
    heads = range(analysis.num_heads) if head is None else [analysis.check_head(head)]
    keys = keys_seen_by(analysis, query, layer)
    ratio, cosine = _numpy(m.norm_ratio(kind)[:, 0]), _numpy(m.cosine(kind)[:, 0])
    contribution, attention, value_norm = (
        _numpy(m.contribution(kind)[:, 0]),
        _numpy(m.attention[:, 0]),
        _numpy(m.value_norm),
    )
    if kind == "inter":
        output_norm = np.full(analysis.num_heads, float(m.output_norm[0]))
    else:
        output_norm = _numpy(m.head_output_norm[:, 0])
    frames = [
        pd.DataFrame(
            {
                "layer": layer,
                "head": h,
                "query": query,
                "key": keys,
                "token": [analysis.tokens[k] for k in keys],
                "attention": attention[h, keys],
                "value_norm": value_norm[h, keys],
                "output_norm": output_norm[h],
                "norm_ratio": ratio[h, keys],
                "cosine": cosine[h, keys],
                "contribution": contribution[h, keys],
            }
        )
        for h in heads
    ]
    return pd.concat(frames, ignore_index=True)


def token_factors(
    analysis: Analysis,
    layer: int,
    query: int,
    head: int | None,
    kind: str = "inter",
    top: int = TOP_KEYS,
    also: int | None = None,
) -> TokenFactors:
    """contribution = attention × norm_ratio × cosine for each key of ``query`` (one head).

    With ``head=None`` the factorisation does not exist (it is per head): the table has attention
    (mean over heads) and the layer-level contribution only. Only the ``top`` keys by |contribution|,
    the sink and the key ``also`` (the one a page's sentence names) are kept.
    """
    layer = analysis.check_layer(layer)
    query = analysis.check_token(query)
    if head is None:
        per_head = decomposition(analysis, layer, query, None, kind)
        how = LAYER_AGGREGATION[f"contribution_{kind}"]
        wide = per_head.groupby(["key", "token"], as_index=False, sort=True).agg(
            attention=("attention", "mean"), contribution=("contribution", how)
        )
        factors = ("attention", "contribution")
        who = f"all heads (attention averaged over heads, contributions {AGGREGATED[how]})"
    else:
        wide = decomposition(analysis, layer, query, analysis.check_head(head), kind)
        wide = wide[["key", "token", "attention", "norm_ratio", "cosine", "contribution"]]
        factors = ("attention", "norm_ratio", "cosine", "contribution")
        who = f"head {head}"
    n = len(wide)
    magnitude = wide["contribution"].abs().to_numpy()
    keep = set(np.argsort(-magnitude, kind="stable")[:top].tolist()) | {DEFAULT_SINK}
    keep |= set(np.flatnonzero(wide["key"].to_numpy() == also).tolist()) if also is not None else set()
    wide = wide.iloc[sorted(keep)].sort_values("contribution", ascending=False, kind="stable").reset_index(drop=True)
    wide["is_sink"] = wide["key"] == DEFAULT_SINK
    wide["order"] = np.arange(len(wide))
    wide.insert(0, "query", query)
    wide.insert(0, "head", ALL_HEADS if head is None else head)
    wide.insert(0, "layer", layer)
    frame = wide.melt(
        id_vars=["layer", "head", "query", "key", "token", "is_sink", "order"],
        value_vars=list(factors),
        var_name="factor",
        value_name="value",
    )
    shown = (
        f"all {n} keys" if n <= top else f"the {top} of {n} keys with the largest |contribution| plus the first token"
    )
    shown += ", sorted by contribution (largest on top)"
    note = f"layer {layer}, {who}, query {query} {analysis.tokens[query]!r}, {kind}-head; {shown}"
    return TokenFactors(frame=frame, wide=wide, factors=factors, note=note)


def _row(measures: LayerMeasures, name: str, head: int | None) -> np.ndarray:
    """[key] scores of the single query in ``measures``: one head, or the layer-level score."""
    scores = measures.per_head(name)[:, 0] if head is not None else measures.layer_level(name)[0]
    scores = scores[head] if head is not None else scores
    return scores.detach().float().cpu().numpy()


def top_keys_across_layers(
    analysis: Analysis, query: int, head: int | None, kind: str = "inter", k: int = 5, progress: Progress | None = None
) -> pd.DataFrame:
    """For every layer, the ``k`` keys with the largest contribution to ``query``.

    Columns: layer, rank (1 = largest), key, token, contribution, attention. ``head=None`` uses the
    layer-level scores (docs/METHOD.md), one head its own contributions. ``progress`` as :func:`head_summary`.
    """
    query = analysis.check_token(query)
    if head is not None:
        head = analysis.check_head(head)
    rows = []
    for layer in counted(range(analysis.num_layers), analysis.num_layers, progress):
        keys = keys_seen_by(analysis, query, layer)
        measures = analysis.rows(layer, query, query + 1)  # the query's row alone
        contribution = _row(measures, f"contribution_{kind}", head)[keys]
        attention = _row(measures, "raw", head)[keys]
        order = np.argsort(-contribution, kind="stable")[:k]
        for rank, j in enumerate(order, start=1):
            rows.append(
                {
                    "layer": layer,
                    "rank": rank,
                    "key": int(keys[j]),
                    "token": analysis.tokens[int(keys[j])],
                    "contribution": float(contribution[j]),
                    "attention": float(attention[j]),
                }
            )
    return pd.DataFrame(rows)
