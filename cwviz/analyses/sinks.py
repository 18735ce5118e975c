"""Attention sinks as active suppressors (docs/METHOD.md section 4): pure analyses on an :class:`Analysis`.

Notation. For a sink position σ (the first token by default), head h and query i:

* s = α_iσ^h, the **sink ratio**;
* ṽ_σ^h = W_O^h v_σ^h, the sink's projected value [d_model];
* m_i^h = Σ_{j≠σ} α_ij^h ṽ_j^h / (1 − s), the attention-weighted mean of the other keys' projected values;

so that o_i^h = s ṽ_σ + (1 − s) m_i and

    ‖o_i^h‖² = s²‖ṽ_σ‖² + 2s(1 − s)⟨ṽ_σ, m_i⟩ + (1 − s)²‖m_i‖²,

a convex function of s (:class:`SinkCurve`). m_i is undefined (NaN) where the query sees no key but the
sink (query 0 when the sink is token 0); it is computed from Σ_{j≠σ} α_ij v_j directly, not as
(o − s ṽ_σ)/(1 − s), so it stays accurate when s is close to 1.

Choices (also in docs/sinks.md):

* Queries that cannot see the sink (before it, in causal models) have no row in :func:`sink_table`.
* Summaries average over the rows whose query sees at least one key besides the sink (``other_keys > 0``).
* Layer-level shares follow docs/METHOD.md's layer-level scores: attention is averaged over heads, the
  contribution is the inter-head C summed over heads; both then averaged over queries.
* Interventions (λ scales the sink's value) run forward passes of their own: :mod:`cwviz.analyses.sink_interventions`.
* The semantic cone of a head is the mean pairwise cosine between its outputs o_i^h over the positions
  i that see the sink and another key.

Nothing here builds a [query, key, d_model] tensor: the largest is [head, query, d_model].
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ..core.defaults import DEFAULT_SINK
from ..core.loading.inputs import integer_index
from ..core.method.analysis import Analysis
from ..core.method.measures import LayerMeasures, head_grams
from ..core.util.errors import InputError, SelectionError
from ..core.util.progress import Progress, counted
from .schema import AUTO

#: Columns of :func:`sink_table`, in order.
TABLE_COLUMNS: tuple[str, ...] = (
    "layer",
    "head",
    "query",
    "token",
    "sink",
    "sink_ratio",
    "output_norm",
    "sink_value_norm",
    "rest_norm",
    "cos_sink_rest",
    "sink_attention_share",
    "sink_contribution_share",
    "sink_contribution_inter",
    "learned_sink_share",
    "other_keys",
)


# -- sink choice ------------------------------------------------------------------------------------
def detect_sink(analysis: Analysis) -> int:
    """The key with the largest mean attention received, averaged over layers, heads and the queries
    that can see it."""
    received = torch.zeros(analysis.num_tokens, dtype=torch.float64)
    seen_by = torch.zeros(analysis.num_tokens, dtype=torch.float64)
    with torch.inference_mode():
        for layer in range(analysis.num_layers):
            for start, stop, alpha in analysis.attention_row_blocks(layer):  # (H, rows, keys), never T x T
                keys = alpha.shape[-1]
                visible = analysis.key_mask(layer, start, stop)[:, :keys].cpu()
                received[:keys] += alpha.sum(dim=(0, 1)).double().cpu()
                seen_by[:keys] += visible.sum(dim=0).double() * alpha.shape[0]
    mean = torch.where(seen_by > 0, received / seen_by.clamp_min(1), torch.zeros_like(received))
    return int(torch.argmax(mean))


def resolve_sink(analysis: Analysis, sink: int | str = DEFAULT_SINK) -> int:
    """The sink position: an int (or its digits) as given, ``"auto"`` for :func:`detect_sink`."""
    if isinstance(sink, str):
        if sink.strip().lower() == AUTO:
            return detect_sink(analysis)
        try:
            sink = int(sink.strip())
        except ValueError:
            raise InputError(f"the sink must be a token position (0, 1, ...) or 'auto', not {sink!r}") from None
    sink = integer_index(sink, "the sink (a token position or 'auto')")
    tokens = analysis.num_tokens
    if not -tokens <= sink < tokens:  # the value given is named, not what a negative one counts back to
        raise SelectionError(
            f"token {sink} is out of range; the prompt has tokens 0..{tokens - 1} (or -{tokens}..-1 from the end)"
        )
    return sink % tokens  # -1 is the last token, as in Python


# -- the split o = s ṽ_σ + (1 − s) m, in each head's value space ------------------------------------
@dataclass(frozen=True)
class SinkNorms:
    """A row block's :class:`SinkSplit` as the sinks table reads it: norms and a cosine, made in each head's value
    space (no d_model vector), float32.

    | field           | shape          | meaning                                                    |
    |-----------------|----------------|------------------------------------------------------------|
    | sink_ratio      | [head, rows]   | s = α_iσ^h                                                 |
    | sink_value_norm | [head]         | ‖ṽ_σ^h‖                                                    |
    | rest_norm       | [head, rows]   | ‖m_i^h‖ (NaN where the query sees no other key)            |
    | cos_sink_rest   | [head, rows]   | cos(ṽ_σ^h, m_i^h) (NaN there too, or where a vector is 0)  |
    | other_keys      | [rows]         | keys besides σ the query can see                           |
    | sees_sink       | [rows]         | bool: the query can see σ                                  |
    """

    sink_ratio: torch.Tensor
    sink_value_norm: torch.Tensor
    rest_norm: torch.Tensor
    cos_sink_rest: torch.Tensor
    other_keys: torch.Tensor
    sees_sink: torch.Tensor


def head_space(analysis: Analysis, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What :func:`sink_norms` reads of ``layer``, made once for its blocks: the values per head, float32
    [head, T, d_head], and G^h (:func:`cwviz.core.method.measures.head_grams`) on their device."""
    with torch.inference_mode():
        value = analysis.values(layer)
        return value, head_grams(analysis.bundle.gram(layer).to(value.device), analysis.num_heads)


def sink_norms(
    alpha: torch.Tensor, value: torch.Tensor, grams: torch.Tensor, sink: int, visible: torch.Tensor
) -> SinkNorms:
    """:class:`SinkNorms` of a row block, through G^h = (W_O^h)ᵀ W_O^h instead of W_O^h itself.

    With r_i^h = Σ_{j≠σ} α_ij^h v_j^h (one [rows, keys] x [keys, d_head] product a head), W_O^h r_i^h = (1 − s) m_i^h,
    so ‖m_i‖ = sqrt(r_iᵀ G^h r_i) / (1 − s), ‖ṽ_σ‖ = sqrt(v_σᵀ G^h v_σ) and cos(ṽ_σ, m_i) = v_σᵀ G^h r_i / (‖ṽ_σ‖ ‖W_O^h
    r_i‖): products d_head wide, never a d_model vector (tests/sink_reference.py projects to d_model: the same numbers
    to float32 rounding). 1 − s is summed from the other keys' α directly, so it stays accurate when s is close to 1.

    | arg     | shape                                                        |
    |---------|--------------------------------------------------------------|
    | alpha   | [head, rows, keys] (a causal block: keys 0..stop-1 suffice; the sink among them) |
    | value   | [head, T or keys, d_head], per head, float32                 |
    | grams   | [head, d_head, d_head] (:func:`cwviz.core.method.measures.head_grams`) |
    | visible | [rows, T], the rows' key mask (:meth:`cwviz.core.method.capture.LayerRecord.key_mask`) |
    """
    keys = alpha.shape[-1]
    value = value[:, :keys]
    visible = visible[:, :keys].to(alpha.device)
    rest = alpha.clone()
    rest[:, :, sink] = 0
    rest_mass = rest.sum(-1)  # (H, rows)  1 − s
    rest_z = rest @ value  # (H, rows, d)  r_i
    projected = ((rest_z @ grams) * rest_z).sum(-1).clamp_min(0).sqrt()  # (H, rows)  ‖W_O^h r_i‖
    sink_pulled = (value[:, sink, None, :] @ grams)[:, 0]  # (H, d)  G^h v_σ
    sink_norm = (sink_pulled * value[:, sink]).sum(-1).clamp_min(0).sqrt()  # (H,)
    other_keys = visible.sum(-1) - visible[:, sink].long()  # (rows,)
    defined = (other_keys > 0)[None, :] & (rest_mass > 0)
    norms = sink_norm[:, None] * projected
    cos = (rest_z * sink_pulled[:, None, :]).sum(-1) / norms.clamp_min(1e-38)
    return SinkNorms(
        sink_ratio=alpha[:, :, sink],
        sink_value_norm=sink_norm,
        rest_norm=torch.where(defined, projected / rest_mass.clamp_min(1e-38), torch.nan),
        cos_sink_rest=torch.where(defined & (norms > 0), cos, torch.nan),
        other_keys=other_keys.cpu(),
        sees_sink=visible[:, sink].cpu(),
    )


# -- the table --------------------------------------------------------------------------------------


def sink_table(
    analysis: Analysis,
    sink: int | str = DEFAULT_SINK,
    layers: Iterable[int] | None = None,
    progress: Progress | None = None,
) -> pd.DataFrame:
    """One row per layer, head and query that sees the sink (columns :data:`TABLE_COLUMNS`).

    | column | meaning |
    | --- | --- |
    | sink_ratio | s = α_iσ^h |
    | output_norm | ‖o_i^h‖ (the head's output) |
    | sink_value_norm | ‖ṽ_σ^h‖ |
    | rest_norm | ‖m_i^h‖ (NaN where the query sees no other key) |
    | cos_sink_rest | cos(ṽ_σ^h, m_i^h); < 0: the sink subtracts the semantic direction |
    | sink_attention_share | α_iσ^h, the sink's share under attention (= sink_ratio, named for the comparison) |
    | sink_contribution_share | c_iσ^h, its intra-head contribution weight (sums to 1 with the other keys) |
    | sink_contribution_inter | C_iσ^h, its inter-head contribution (summed over heads: the layer-level share) |
    | learned_sink_share | the learned sink (gpt-oss): 1 − Σ_j α_ij^h, attention that writes nothing; 0 elsewhere |
    | other_keys | keys besides the sink that the query can see |

    ``progress(done, len(layers))`` (:mod:`cwviz.core.util.progress`) is called after each layer. Each layer is
    read in blocks of query rows (:meth:`cwviz.Analysis.row_blocks`), and each block's norms and cosine are made
    in the heads' value spaces (:func:`sink_norms`), so the working memory is O(block x T).
    """
    sink = resolve_sink(analysis, sink)
    layers = range(analysis.num_layers) if layers is None else [analysis.check_layer(l) for l in layers]
    frames = []
    for layer in counted(layers, len(layers), progress):
        parts = []
        learned_sinks = analysis.learned_sink_logits(layer) is not None
        value, grams = head_space(analysis, layer)  # made once a layer, shared by its blocks
        for start, stop, measures in analysis.row_blocks(layer):  # [head, block, T] maps at a time, never T x T
            if sink >= measures.attention.shape[-1]:
                continue  # a causal block before the sink: none of its rows sees it (the last block always does)
            with torch.inference_mode():
                split = sink_norms(measures.attention, value, grams, sink, analysis.key_mask(layer, start, stop))
            parts.append(_block_rows(analysis, layer, sink, start, measures, split, learned_sinks))
        # Rows ordered head by head, then query, as one whole-layer block gives them; blocks whose queries
        # do not see the sink (outside a sliding window) add nothing.
        parts = [part for part in parts if len(part)] or parts[-1:]
        frames.append(pd.concat(parts, ignore_index=True).sort_values(["head", "query"], kind="stable"))
    return pd.concat(frames, ignore_index=True)[list(TABLE_COLUMNS)]


def _block_rows(
    analysis: Analysis,
    layer: int,
    sink: int,
    start: int,
    measures: LayerMeasures,
    split: SinkNorms,
    learned_sinks: bool,
) -> pd.DataFrame:
    """The rows of :func:`sink_table` of one row block (queries ``start`` on) of ``layer``: one per head and query that
    sees the sink, head by head."""
    with torch.inference_mode():
        if not learned_sinks:
            learned = torch.zeros_like(split.sink_ratio)
        else:  # the learned sink's column of the softmax, dropped by the model: what the real keys' α leave
            learned = (1 - measures.attention.sum(-1)).clamp_(min=0)
        columns = {
            "sink_ratio": split.sink_ratio,
            "output_norm": measures.head_output_norm,
            "sink_value_norm": split.sink_value_norm[:, None].expand_as(split.sink_ratio),
            "rest_norm": split.rest_norm,
            "cos_sink_rest": split.cos_sink_rest,
            "sink_attention_share": split.sink_ratio,
            "sink_contribution_share": measures.contribution("intra")[:, :, sink],
            "sink_contribution_inter": measures.contribution("inter")[:, :, sink],
            "learned_sink_share": learned,
        }
        rows = torch.nonzero(split.sees_sink).flatten().numpy()  # within the block
        columns = {name: values.float().cpu().numpy()[:, rows] for name, values in columns.items()}  # (H, rows')
    heads, row_grid = np.meshgrid(np.arange(analysis.num_heads), rows, indexing="ij")  # (H, rows')
    query_grid = row_grid + start
    return pd.DataFrame(
        {
            "layer": layer,
            "head": heads.ravel(),
            "query": query_grid.ravel(),
            "token": np.asarray(analysis.tokens, dtype=object)[query_grid.ravel()],
            "sink": sink,
            **{name: values.ravel() for name, values in columns.items()},
            "other_keys": split.other_keys.numpy()[row_grid.ravel()],
        }
    )


def pool_tables(tables: Sequence[pd.DataFrame]) -> pd.DataFrame:
    r"""Several prompts' :func:`sink_table`\ s as one table with a leading ``prompt`` column (their index).

    The one place a pooled table is built (the CLI, the sinks page and :func:`pooled_sink_table`), so
    callers can make each prompt's table and drop its analysis before the next one is run."""
    if not tables:
        raise InputError("no prompts to pool; give at least one")
    table = pd.concat([t.assign(prompt=i) for i, t in enumerate(tables)], ignore_index=True)
    return table[["prompt", *TABLE_COLUMNS]]


def pooled_sink_table(analyses: Sequence[Analysis], sink: int | str = DEFAULT_SINK) -> pd.DataFrame:
    """:func:`sink_table` of several prompts, with a ``prompt`` column (its index); ``"auto"`` picks
    each prompt's own sink."""
    return pool_tables([sink_table(a, sink) for a in analyses])


#: Columns the summaries average.
_MEANS = ["sink_ratio", "output_norm", "sink_value_norm", "rest_norm", "cos_sink_rest"]


def _defined(table: pd.DataFrame) -> pd.DataFrame:
    return table[table["other_keys"] > 0]


def _learned(table: pd.DataFrame) -> list[str]:
    """``["learned_sink_share"]`` when the table has it (a table saved before it existed has not)."""
    return ["learned_sink_share"] if "learned_sink_share" in table.columns else []


def _by_prompt(table: pd.DataFrame) -> list[str]:
    return ["prompt"] if "prompt" in table.columns else []


def sink_layer_summary(table: pd.DataFrame) -> pd.DataFrame:
    """One row per layer from :func:`sink_table` (or :func:`pooled_sink_table`, rows pooled).

    Means over heads and the queries that see another key besides the sink. ``sink_attention_share``
    is the head-averaged attention on the sink, ``sink_contribution_share`` the layer-level contribution
    Σ_h C_iσ^h, both averaged over queries; ``negative_cos_share`` is the share of (head, query) rows
    with cos(ṽ_σ, m) < 0; ``learned_sink_share`` the head-averaged share of the model's learned sink (0 for a
    model without one).
    """
    rows = _defined(table)
    keys = _by_prompt(table)
    per_query = rows.groupby([*keys, "layer", "query"], sort=False)["sink_contribution_inter"].sum()
    contribution = per_query.groupby(level="layer").mean()
    summary = rows.groupby("layer")[[*_MEANS, "sink_attention_share", *_learned(rows)]].mean()
    summary["sink_contribution_share"] = contribution
    summary["negative_cos_share"] = rows.assign(neg=rows["cos_sink_rest"] < 0).groupby("layer")["neg"].mean()
    return summary.reset_index()


def sink_head_summary(table: pd.DataFrame) -> pd.DataFrame:
    """One row per layer and head: means over the queries that see another key besides the sink, and
    the sink ratio minimising the head's typical output norm (:func:`head_curve`)."""
    rows = _defined(table)
    summary = rows.groupby(["layer", "head"])[[*_MEANS, "sink_contribution_share", *_learned(rows)]].mean()
    medians = rows.groupby(["layer", "head"])[["sink_value_norm", "rest_norm", "cos_sink_rest"]].median()
    summary["minimising_ratio"] = [
        SinkCurve(a, b, c).minimiser for a, b, c in medians.itertuples(index=False, name=None)
    ]
    return summary.reset_index()


def most_anti_aligned_head(heads: pd.DataFrame, layer: int) -> int:
    """The head of ``layer`` with the lowest mean cos(ṽ_σ, m) in :func:`sink_head_summary` ``heads`` (0 when no
    head has one): the head the Sinks page and :func:`cwviz.plot.sink_ratio` show for "all heads"."""
    rows = heads[heads["layer"] == layer]
    return int(rows.loc[rows["cos_sink_rest"].idxmin(), "head"]) if rows["cos_sink_rest"].notna().any() else 0


# -- the convex relation ----------------------------------------------------------------------------
@dataclass(frozen=True)
class SinkCurve:
    """‖s ṽ_σ + (1 − s) m‖ as a function of s, for ‖ṽ_σ‖ = ``sink_value_norm``, ‖m‖ = ``rest_norm``
    and cos(ṽ_σ, m) = ``cos``."""

    sink_value_norm: float
    rest_norm: float
    cos: float

    def norm(self, ratio: np.ndarray | float) -> np.ndarray:
        """The head-output norm at sink ratio(s) ``ratio``."""
        s = np.asarray(ratio, dtype=np.float64)
        a, b, c = self.sink_value_norm, self.rest_norm, self.cos
        squared = s**2 * a**2 + 2 * s * (1 - s) * a * b * c + (1 - s) ** 2 * b**2
        return np.sqrt(np.clip(squared, 0, None))

    @property
    def minimiser(self) -> float:
        """The sink ratio in [0, 1] with the smallest norm: s* = b(b − ac) / ‖ṽ_σ − m‖², clipped.

        Inside (0, 1) exactly when b > ac and a > bc (e.g. whenever cos < 0). NaN if undefined.
        """
        a, b, c = self.sink_value_norm, self.rest_norm, self.cos
        if not all(math.isfinite(x) for x in (a, b, c)):
            return math.nan
        distance2 = a * a - 2 * a * b * c + b * b  # ‖ṽ_σ − m‖²
        if distance2 <= 1e-12 * max(a * a + b * b, 1e-30):
            return 0.0  # ṽ_σ = m: the norm does not depend on s
        return float(np.clip(b * (b - a * c) / distance2, 0.0, 1.0))

    @property
    def minimum(self) -> float:
        """The smallest norm over s in [0, 1]."""
        return float(self.norm(self.minimiser))

    def table(self, points: int = 101) -> pd.DataFrame:
        """The curve sampled at ``points`` ratios in [0, 1]: columns ``sink_ratio, output_norm``."""
        s = np.linspace(0.0, 1.0, points)
        return pd.DataFrame({"sink_ratio": s, "output_norm": self.norm(s)})


def head_curve(table: pd.DataFrame, layer: int, head: int) -> SinkCurve:
    """The typical curve of one head: medians of ‖ṽ_σ‖, ‖m‖ and cos over its queries (and prompts)."""
    layer, head = integer_index(layer, "a layer"), integer_index(head, "a head")
    for name, value in (("layer", layer), ("head", head)):
        present = sorted(int(v) for v in table[name].unique())
        if value not in present:
            span = f"{present[0]}..{present[-1]}" if present else "none"
            raise SelectionError(f"{name} {value} is out of range; the table has {name}s {span}")
    rows = _defined(table)
    rows = rows[(rows["layer"] == layer) & (rows["head"] == head)].dropna(subset=["rest_norm", "cos_sink_rest"])
    if rows.empty:
        raise SelectionError(
            f"layer {layer}, head {head} has no query that sees a key besides the sink; pick another head or a longer "
            "prompt"
        )
    return SinkCurve(
        float(rows["sink_value_norm"].median()),
        float(rows["rest_norm"].median()),
        float(rows["cos_sink_rest"].median()),
    )
