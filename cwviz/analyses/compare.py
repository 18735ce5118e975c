"""Two inputs side by side: two prompts on one model, or one prompt on two models that share a tokenizer.

Pure functions of two :class:`~cwviz.Analysis` objects (one forward pass each), used by the Compare page,
``cwviz compare`` and :mod:`cwviz.plot` alike.

* Alignment (:func:`align_tokens`): by position when both inputs have as many tokens, otherwise by a sequence alignment
  of the token ids (``difflib.SequenceMatcher``, no junk heuristic). The first tokens (the sink of both) are always
  paired; after them, equal runs are paired, a replaced run of equal length is paired position by position, and other
  tokens are in one input only and have no cell in the maps. The alignment is a table (one row a step) that the page
  shows.
* Maps (:func:`map_cells`): attention and contribution weights of A and B for the selected layer and head
  (or all heads, docs/METHOD.md layer-level scores) on the aligned grid, and B − A; a long pair is windowed
  around the selected query, as the Heatmaps page does.
* Heads (:func:`head_changes`): every per-head summary of :func:`cwviz.analyses.tables.head_summary`
  (divergence, sink shares, output norm) of A and B and its change B − A, ranked by :func:`rank_changes`.
* Next-token log-probabilities (:func:`logprob_changes`): at each aligned pair, log p(token | the tokens
  before it) in B minus the same in A (the prediction made at the position before; none at position 0).

Identical inputs give exactly zero differences everywhere (tests assert it).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..core.method.analysis import Analysis
from ..core.method.measures import LAYER_AGGREGATION
from ..core.util.errors import InputError
from ..core.util.progress import Progress, phase
from ..core.vocabulary import check_kind
from . import tables
from .schema import ALL_HEADS, HEAD_METRICS, CompareCells

#: Most cells one compared map may have: each of the three views draws them (A, B and B − A).
MAX_CELLS = 1200
#: Alignment methods.
BY_POSITION, BY_SEQUENCE = "position", "sequence"
#: The steps of an alignment (difflib's names): paired equal, paired different, only in A, only in B.
OPS = ("equal", "replace", "delete", "insert")


@dataclass(frozen=True)
class Alignment:
    """How the tokens of A and B are paired.

    ``pairs[p] = (i, j)``: position i of A and position j of B form aligned pair p (increasing in both).
    ``table``: one row a step (step, op, pair, position_a, token_a, position_b, token_b); ``op`` is one of
    :data:`OPS`; a token in one input only has no pair (``pair`` -1) and an empty cell for the other input.
    """

    method: str
    pairs: tuple[tuple[int, int], ...]
    table: pd.DataFrame

    @property
    def changed(self) -> int:
        """Steps that are not ``equal``: tokens replaced, or present in one input only."""
        return int((self.table["op"] != "equal").sum())

    def describe(self, tokens_a: int, tokens_b: int) -> str:
        if self.method == BY_POSITION:
            how = f"aligned by position (both have {tokens_a} tokens)"
        else:
            how = (
                f"aligned by a sequence alignment of the tokens ({tokens_a} and {tokens_b} tokens, {len(self.pairs)} "
                "paired)"
            )
        return f"{how}; {self.changed} step(s) differ"


def _sink_paired(steps: list[tuple[str, int, int]], same: bool) -> list[tuple[str, int, int]]:
    """``steps`` with position 0 of A paired with position 0 of B: the first token is the attention sink of both,
    where most of a layer's attention and contribution usually go, so its column must not drop out of the maps when
    the prompts start differently. A pair that held either first token is split into a deletion and an insertion;
    the other steps are kept."""
    if ("equal" if same else "replace", 0, 0) in steps:
        return steps
    kept: list[tuple[str, int, int]] = []
    for op, i, j in steps:
        if i == 0 or j == 0:
            if i > 0:
                kept.append(("delete", i, -1))
            if j > 0:
                kept.append(("insert", -1, j))
        else:
            kept.append((op, i, j))
    return [("equal" if same else "replace", 0, 0), *kept]


def align_tokens(
    ids_a: list[int], ids_b: list[int], tokens_a: list[str] | None = None, tokens_b: list[str] | None = None
) -> Alignment:
    """Pair the tokens of A and B: by position when the counts match, else by sequence alignment of the ids.

    ``tokens_a``/``tokens_b`` (display strings) fill the table; the ids are what is matched.
    """
    tokens_a = [str(i) for i in ids_a] if tokens_a is None else list(tokens_a)
    tokens_b = [str(i) for i in ids_b] if tokens_b is None else list(tokens_b)
    steps: list[tuple[str, int, int]] = []  # (op, position in A or -1, position in B or -1)
    if len(ids_a) == len(ids_b):
        method = BY_POSITION
        steps = [("equal" if x == y else "replace", i, i) for i, (x, y) in enumerate(zip(ids_a, ids_b))]
    else:
        method = BY_SEQUENCE
        matcher = difflib.SequenceMatcher(None, list(ids_a), list(ids_b), autojunk=False)
        for op, a0, a1, b0, b1 in matcher.get_opcodes():
            if op in ("equal", "replace") and a1 - a0 == b1 - b0:
                steps += [(op, a0 + k, b0 + k) for k in range(a1 - a0)]
            else:  # an unequal replacement is a deletion followed by an insertion
                steps += [("delete", i, -1) for i in range(a0, a1)]
                steps += [("insert", -1, j) for j in range(b0, b1)]
        if ids_a and ids_b:
            steps = _sink_paired(steps, ids_a[0] == ids_b[0])
    pairs, pair_of = [], []
    for _, i, j in steps:
        pair_of.append(len(pairs) if i >= 0 and j >= 0 else -1)
        if i >= 0 and j >= 0:
            pairs.append((i, j))
    table = pd.DataFrame(
        {
            "step": np.arange(len(steps)),
            "op": [op for op, _, _ in steps],
            "pair": pair_of,
            "position_a": pd.array([i if i >= 0 else None for _, i, _ in steps], dtype="Int64"),
            "token_a": [tokens_a[i] if i >= 0 else "" for _, i, _ in steps],
            "position_b": pd.array([j if j >= 0 else None for _, _, j in steps], dtype="Int64"),
            "token_b": [tokens_b[j] if j >= 0 else "" for _, _, j in steps],
        }
    )
    return Alignment(method=method, pairs=tuple(pairs), table=table)


@dataclass(frozen=True)
class Comparison:
    """Two analyses and the alignment of their tokens (:func:`compare`)."""

    a: Analysis
    b: Analysis
    alignment: Alignment

    @property
    def pairs(self) -> tuple[tuple[int, int], ...]:
        return self.alignment.pairs

    def pair_labels(self) -> tuple[str, ...]:
        """Axis labels of the aligned pairs: ``"12 fox"`` when both inputs have that token at that position,
        ``"12/13 fox"`` at different positions, ``"12 fox / 12 cat"`` when the tokens differ."""
        labels = []
        for i, j in self.pairs:
            ta, tb = self.a.tokens[i], self.b.tokens[j]
            if ta == tb:
                labels.append(f"{i} {ta}" if i == j else f"{i}/{j} {ta}")
            else:
                labels.append(f"{i} {ta} / {j} {tb}")
        return tuple(labels)

    def pair_of_query(self, query: int | None) -> int:
        """The pair of A's position ``query`` (None: the last), or of the nearest aligned position before it."""
        if not self.pairs:
            return 0
        query = self.a.num_tokens - 1 if query is None else self.a.check_token(query)
        positions = np.array([i for i, _ in self.pairs])
        return max(0, int(np.searchsorted(positions, query, side="right")) - 1)


def same_tokenizer(tokenizer_a, tokenizer_b) -> bool:
    """Whether two tokenizers map text to the same ids: one object, or equal vocabularies (``get_vocab``),
    or, for tokenizers without one, the same type and vocabulary size."""
    if tokenizer_a is tokenizer_b:
        return True
    vocab_a, vocab_b = getattr(tokenizer_a, "get_vocab", None), getattr(tokenizer_b, "get_vocab", None)
    if callable(vocab_a) and callable(vocab_b):
        return vocab_a() == vocab_b()
    return type(tokenizer_a) is type(tokenizer_b) and getattr(tokenizer_a, "vocab_size", None) == getattr(
        tokenizer_b, "vocab_size", None
    )


def check_comparable(a: Analysis, b: Analysis) -> None:
    """InputError unless A and B can be compared head by head: the same layers and heads, both causal or both
    not, and, for two models, one tokenizer (token ids mean the same token in both)."""
    if (a.num_layers, a.num_heads) != (b.num_layers, b.num_heads):
        raise InputError(
            f"model B ({b.info.id}: {b.num_layers} layers x {b.num_heads} heads) is not shaped like model A "
            f"({a.info.id}: {a.num_layers} x {a.num_heads}); a comparison pairs heads, so pick two models with the "
            "same layers and heads"
        )
    if a.info.causal != b.info.causal:
        raise InputError(
            f"one model is causal and the other an encoder ({a.info.id}, {b.info.id}); compare two causal models or "
            "two encoders"
        )
    if a.bundle is not b.bundle and not same_tokenizer(a.bundle.tokenizer, b.bundle.tokenizer):
        raise InputError(
            f"the tokenizers of {a.info.id} and {b.info.id} differ; one prompt on two models needs one tokenizer "
            "(pick two models of one family, e.g. a base model and its fine-tune), or compare two prompts on one model"
        )


def compare(a: Analysis, b: Analysis) -> Comparison:
    """Align the tokens of two analyses (:func:`align_tokens`) after :func:`check_comparable`."""
    check_comparable(a, b)
    return Comparison(a=a, b=b, alignment=align_tokens(a.input_ids, b.input_ids, a.tokens, b.tokens))


# -- maps ---------------------------------------------------------------------------------------------
def _causal_cells(count: int, causal: bool) -> int:
    return count * (count + 1) // 2 if causal else count * count


def map_cells(
    comparison: Comparison,
    layer: int,
    head: int | None,
    kind: str = "inter",
    query: int | None = None,
    max_cells: int = MAX_CELLS,
) -> CompareCells:
    """Attention and contribution (``kind``) maps of A and B on the aligned grid, and B − A.

    ``head=None`` uses the layer-level scores (attention: mean over heads; contribution: docs/METHOD.md).
    ``query`` is a position of A (default: the last); when the grid has more than ``max_cells`` cells it is a
    window of aligned pairs around that query's pair, plus the first pair (the sink). Only the rows the grid
    shows are computed in each input (:meth:`cwviz.Analysis.rows`).
    """
    a, b, pairs = comparison.a, comparison.b, comparison.pairs
    layer = a.check_layer(layer)
    if head is not None:
        head = a.check_head(head)
    check_kind(kind)
    labels = comparison.pair_labels()
    selected = comparison.pair_of_query(query)
    causal = a.bundle.arch.causal
    count = len(pairs)
    if count == 0:
        raise InputError(
            "no token of A is aligned with a token of B; the inputs have nothing to compare position by position"
        )
    if _causal_cells(count, causal) <= max_cells:
        lo, hi = 0, count - 1
        where = f"all {count} aligned positions"
    else:
        size = 1
        while _causal_cells(size + 1, causal) + size + 1 <= max_cells:
            size += 1
        lo, hi = tables.window_bounds(count, selected, size)
        where = (
            f"window: aligned positions {lo}–{hi} of {count}{' plus the first' if lo > 0 else ''}, around query "
            f"{labels[selected]!r}"
        )
    rows = np.arange(lo, hi + 1)
    keys = np.concatenate([[0], rows]) if lo > 0 else rows
    pa = np.array([i for i, _ in pairs])
    pb = np.array([j for _, j in pairs])
    mats = {}
    for side, analysis, positions in (("a", a, pa), ("b", b, pb)):
        first, last = int(positions[lo]), int(positions[hi])
        # Only the rows between the window's first and last aligned query (W x T a head, not T x T).
        m = tables._layer_matrices(analysis.rows(layer, first, last + 1), head, "raw", kind)
        mats[side] = (m, first)
    q, k = np.meshgrid(rows, keys, indexing="ij")
    keep = (k <= q) if causal else np.ones_like(q, dtype=bool)
    q, k = q[keep], k[keep]
    data: dict[str, object] = {
        "layer": layer,
        "head": ALL_HEADS if head is None else head,
        "query": q.astype(int),
        "key": k.astype(int),
        "query_a": pa[q],
        "key_a": pa[k],
        "query_b": pb[q],
        "key_b": pb[k],
        "query_token": [labels[i] for i in q],
        "key_token": [labels[j] for j in k],
    }
    for name in ("attention", "contribution"):
        (ma, first_a), (mb, first_b) = mats["a"], mats["b"]
        value_a = ma[name][pa[q] - first_a, pa[k]].astype(np.float64)
        value_b = mb[name][pb[q] - first_b, pb[k]].astype(np.float64)
        data[f"{name}_a"], data[f"{name}_b"], data[f"{name}_diff"] = value_a, value_b, value_b - value_a
    frame = pd.DataFrame(data)
    frame["query_position"] = frame["query_a"]
    note = (
        f"layer {layer}, {_heads_note(head, kind)}; {where}; "
        f"{comparison.alignment.describe(a.num_tokens, b.num_tokens)}"
    )
    return CompareCells(frame=frame, labels=labels, kind=kind, note=note, query=selected)


def _heads_note(head: int | None, kind: str) -> str:
    if head is not None:
        return f"head {head}, {kind}-head contributions"
    how = tables.AGGREGATED[LAYER_AGGREGATION[f"contribution_{kind}"]]
    return f"all heads (attention averaged over heads, {kind}-head contributions {how})"


# -- heads --------------------------------------------------------------------------------------------
def summary_changes(summary_a: pd.DataFrame, summary_b: pd.DataFrame) -> pd.DataFrame:
    """Two :func:`cwviz.analyses.tables.head_summary` tables side by side: for each metric of
    :data:`~cwviz.analyses.schema.HEAD_METRICS`, ``<metric>_a``, ``<metric>_b`` and ``<metric>_change`` (B − A),
    one row per (layer, head)."""
    keys = ["layer", "head"]
    metrics = list(HEAD_METRICS)
    merged = summary_a[keys + metrics].merge(
        summary_b[keys + metrics], on=keys, suffixes=("_a", "_b"), validate="one_to_one"
    )
    for metric in metrics:
        merged[f"{metric}_change"] = merged[f"{metric}_b"] - merged[f"{metric}_a"]
    order = keys + [f"{m}{s}" for m in metrics for s in ("_a", "_b", "_change")]
    return merged[order].sort_values(keys, kind="stable").reset_index(drop=True)


def head_changes(comparison: Comparison, progress: Progress | None = None) -> pd.DataFrame:
    """:func:`summary_changes` of the head summaries of A and B (each streamed over row blocks);
    ``progress(done, 2 x layers)``."""
    layers = comparison.a.num_layers
    summary_a = tables.head_summary(comparison.a, progress=phase(progress, 0, 2 * layers))
    summary_b = tables.head_summary(comparison.b, progress=phase(progress, layers, 2 * layers))
    return summary_changes(summary_a, summary_b)


def rank_changes(changes: pd.DataFrame, metric: str = "divergence", top: int | None = None) -> pd.DataFrame:
    """Heads sorted by |change| of ``metric``, largest first, with ``rank`` (1 = largest)."""
    if metric not in HEAD_METRICS:
        raise ValueError(f"metric must be one of {', '.join(HEAD_METRICS)}, not {metric!r}")
    column = f"{metric}_change"
    order = changes[column].abs().sort_values(ascending=False, kind="stable").index
    ranked = changes.loc[order].reset_index(drop=True)
    ranked.insert(0, "rank", np.arange(1, len(ranked) + 1))
    return ranked if top is None else ranked.head(top)


# -- next-token log-probabilities ---------------------------------------------------------------------
def logprob_changes(comparison: Comparison) -> pd.DataFrame:
    """At each aligned pair (i, j): log p_A(token_i | tokens before i), the same in B, and ``change`` (B − A).

    Columns: pair, label, position_a, token_a, position_b, token_b, logprob_a, logprob_b, change. Positions 0
    (nothing predicts them) are NaN. InputError for encoders, which predict no next token.
    """
    a, b = comparison.a, comparison.b
    if not a.info.causal:
        raise InputError(
            f"{a.info.id} is an encoder: it predicts no next token, so there are no log-probabilities to compare"
        )
    logp_a, logp_b = a.next_token_logprobs, b.next_token_logprobs  # [T - 1]: entry t predicts token t + 1
    labels = comparison.pair_labels()
    rows = []
    for p, (i, j) in enumerate(comparison.pairs):
        la = float(logp_a[i - 1]) if i > 0 else np.nan
        lb = float(logp_b[j - 1]) if j > 0 else np.nan
        rows.append(
            {
                "pair": p,
                "label": labels[p],
                "position_a": i,
                "token_a": a.tokens[i],
                "position_b": j,
                "token_b": b.tokens[j],
                "logprob_a": la,
                "logprob_b": lb,
                "change": lb - la,
            }
        )
    return pd.DataFrame(rows)
