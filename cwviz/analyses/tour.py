"""What the dashboard's guided tour shows: the layer, head, query and key of each step, picked from an analysis.

The tour tells docs/METHOD.md's story on whatever model and prompt the user analysed, so nothing here is a
constant: every pick is an arg-max or arg-min over the analysis's own tables.

The picks, each with the table it is read from:

- **layer**: where attention overstates the sink most: the largest layer-level sink share under attention minus under
  contribution (read from :func:`cwviz.analyses.sinks.sink_layer_summary`)
- **head**: in that layer, the head with the largest sink attention (mean over queries 1..T-1) (read from
  :func:`cwviz.analyses.tables.head_summary`)
- **negative key**: in that head, the (query, key) cell with the most negative intra-head contribution, the sink column
  and queries that see one key only left out; if none is negative there, the most negative cell of any head of the layer
  (read from the layer, read in row blocks)
- **anti-aligned head**: the most negative mean cos(ṽ_sink, m) among heads whose mean sink ratio is at least the median
  over heads (read from :func:`cwviz.analyses.sinks.sink_head_summary`)
- **encoder layer**: where the first token ([CLS]) takes the largest share of attention (read from
  :func:`cwviz.analyses.sinks.sink_layer_summary`)
- **flow tokens (step 8)**: the input tokens with the largest and the most negative signed total toward the model's top
  next token (read from :func:`cwviz.flow`)

The sink is the first position (docs/METHOD.md section 4; :data:`cwviz.core.defaults.DEFAULT_SINK`), as on the Sinks
page's default.

The numbers of steps 6 and 7 (:class:`Removal`, :class:`Encoder`) are kept here too. What each step says about these
numbers, its sentences and the named facts they print, is :mod:`cwviz.analyses.tour_story`'s job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
import torch

from ..core.defaults import DEFAULT_SINK
from ..core.method.analysis import Analysis
from ..core.method.flow_tables import Flow
from .tables import decomposition

#: Contribution kind of the head-level steps (3 and 4): shares of the head's own output, which sum to 1 per head.
KIND = "intra"


@dataclass(frozen=True)
class SinkLayer:
    """A layer and the sink's layer-level shares there (attention averaged over heads, inter-head contribution
    summed over heads; both averaged over queries)."""

    layer: int
    attention_share: float
    contribution_share: float

    @property
    def writes_little(self) -> bool:
        """Whether step 2's "writes little" holds: the sink's contribution share is under half its attention share."""
        return self.contribution_share < 0.5 * self.attention_share


@dataclass(frozen=True)
class NegativeKey:
    """One cell of one head: key ``key``'s contribution to query ``query`` in head ``head`` and its three factors
    (``kind``), contribution = attention × norm_ratio × cosine."""

    head: int
    query: int
    key: int
    attention: float
    norm_ratio: float
    cosine: float
    contribution: float
    kind: str = KIND
    scale: HeadScale | None = None


#: Below this ratio of the head's output to the layer's (‖o^h‖ / ‖o‖), steps 3 and 4 call the head's output small.
SMALL_HEAD = 0.5


@dataclass(frozen=True)
class HeadScale:
    """Why the sink can be a head's largest contribution and still write little (steps 3 and 4): the absolute scale of
    one query of one head. ``sink_intra`` is the sink's share of the head's output o^h (what the tour's maps and bars
    draw), ``sink_inter`` its share of the layer's output o (what step 2 counts), ``head_norm`` ‖o^h‖ and
    ``layer_norm`` ‖o‖; sink_inter = sink_intra × cos(o^h, o) ‖o^h‖ / ‖o‖ up to rounding."""

    sink_attention: float
    sink_intra: float
    sink_inter: float
    head_norm: float
    layer_norm: float

    @property
    def head_fraction(self) -> float:
        """‖o^h‖ / ‖o‖: how long the head's output is against the layer's."""
        return self.head_norm / self.layer_norm if self.layer_norm > 0 else math.nan

    @property
    def small_head(self) -> bool:
        """Whether the sentence may call the head's output small (:data:`SMALL_HEAD`)."""
        return self.head_fraction < SMALL_HEAD

    @property
    def sink_dominates(self) -> bool:
        """Whether the sink is the head's largest positive share while its share of the layer is much smaller: the case
        where the head's map seems to refute step 2, and the step must say why both hold."""
        return self.sink_intra > 0.5 and self.sink_inter < 0.5 * self.sink_intra


def head_scale(analysis: Analysis, layer: int, head: int, query: int, sink: int = DEFAULT_SINK) -> HeadScale | None:
    """The :class:`HeadScale` of ``query`` in ``head`` of ``layer``, the sink at ``sink``; None where the query does
    not see the sink (a sliding window that has left it behind): there is no sink share to reconcile."""
    intra = decomposition(analysis, layer, query, head, "intra")
    inter = decomposition(analysis, layer, query, head, "inter")
    if not (intra["key"] == sink).any():
        return None
    at_intra, at_inter = intra[intra["key"] == sink].iloc[0], inter[inter["key"] == sink].iloc[0]
    return HeadScale(
        sink_attention=float(at_intra["attention"]),
        sink_intra=float(at_intra["contribution"]),
        sink_inter=float(at_inter["contribution"]),
        head_norm=float(at_intra["output_norm"]),
        layer_norm=float(at_inter["output_norm"]),
    )


@dataclass(frozen=True)
class AntiAligned:
    """The head whose sink value points most against the rest of its output (means over its queries)."""

    layer: int
    head: int
    cos: float
    sink_ratio: float
    minimising_ratio: float


@dataclass(frozen=True)
class TourPlan:
    """Every pick of the tour for one analysis (see the module's table). ``negative`` is None when no query
    sees a key besides itself (a one-token prompt); ``anti`` is None when no head has a defined cosine."""

    sink: int
    sink_token: str
    causal: bool
    layer: SinkLayer
    head: int
    head_sink_attention: float
    negative: NegativeKey | None
    anti: AntiAligned | None
    model: str = ""  # the analysis's model id: the subject of every fact (:class:`Fact`)


def overstated_layer(layers: pd.DataFrame) -> SinkLayer | None:
    """The layer where the sink's attention share exceeds its contribution share most (ties: the first).

    ``layers``: :func:`cwviz.analyses.sinks.sink_layer_summary`. None when it has no row (no query sees a key
    besides the sink: a one-token prompt)."""
    defined = layers.dropna(subset=["sink_attention_share", "sink_contribution_share"])
    if defined.empty:
        return None
    gap = defined["sink_attention_share"] - defined["sink_contribution_share"]
    row = defined.loc[gap.idxmax()]
    return SinkLayer(int(row["layer"]), float(row["sink_attention_share"]), float(row["sink_contribution_share"]))


def most_attended_layer(layers: pd.DataFrame) -> SinkLayer | None:
    """The layer where the sink takes the largest share of attention (ties: the first); None as
    :func:`overstated_layer`."""
    defined = layers.dropna(subset=["sink_attention_share", "sink_contribution_share"])
    if defined.empty:
        return None
    row = defined.loc[defined["sink_attention_share"].idxmax()]
    return SinkLayer(int(row["layer"]), float(row["sink_attention_share"]), float(row["sink_contribution_share"]))


def sink_head(summary: pd.DataFrame, layer: int) -> tuple[int, float]:
    """The head of ``layer`` with the largest mean attention on the sink, and that share (ties: the first head).

    ``summary``: :func:`cwviz.analyses.tables.head_summary`."""
    rows = summary[summary["layer"] == layer].sort_values("head", kind="stable")
    row = rows.loc[rows["sink_attention"].idxmax()]
    return int(row["head"]), float(row["sink_attention"])


def negative_key(
    analysis: Analysis, layer: int, head: int | None, kind: str = KIND, sink: int = DEFAULT_SINK
) -> NegativeKey | None:
    """The (query, key) of ``head`` in ``layer`` (None: of any head of the layer) with the most negative ``kind``
    contribution.

    Queries that see a single key (their contribution is 1) are left out, and so is the sink's column unless no
    other key is visible anywhere; when no cell is negative, the smallest one is returned (its contribution is
    then >= 0, and the caller says so). None when no query sees two keys. The layer is read in row blocks
    (:meth:`cwviz.Analysis.row_blocks`), so a long prompt never holds its T x T maps.
    """
    layer = analysis.check_layer(layer)
    heads = list(range(analysis.num_heads)) if head is None else [analysis.check_head(head)]
    best: dict[bool, tuple[float, int, int, int]] = {}  # sink column or not -> (contribution, head, query, key)
    with torch.inference_mode():
        for first, stop, m in analysis.row_blocks(layer, kinds=(kind,)):
            c = m.contribution(kind)[heads].float().cpu()  # (heads, rows, keys)
            visible = analysis.key_mask(layer, first, stop)[:, : c.shape[-1]].cpu()  # (rows, keys)
            usable = visible & (visible.sum(-1, keepdim=True) > 1)
            at_sink = torch.zeros_like(usable)
            at_sink[:, sink] = usable[:, sink]
            for is_sink, cells in ((False, usable & ~at_sink), (True, at_sink)):
                if not cells.any():
                    continue
                masked = torch.where(cells, c, torch.inf)  # (heads, rows, keys)
                index = int(torch.argmin(masked))
                h, rest = divmod(index, c.shape[-2] * c.shape[-1])
                row, key = divmod(rest, c.shape[-1])
                value = float(masked[h, row, key])
                if is_sink not in best or value < best[is_sink][0]:
                    best[is_sink] = (value, heads[h], first + row, key)
    if not best:
        return None
    _, head, query, key = best.get(False) or best[True]
    factors = decomposition(analysis, layer, query, head, kind)
    cell = factors[factors["key"] == key].iloc[0]
    return NegativeKey(
        head=head,
        query=query,
        key=key,
        attention=float(cell["attention"]),
        norm_ratio=float(cell["norm_ratio"]),
        cosine=float(cell["cosine"]),
        contribution=float(cell["contribution"]),
        kind=kind,
        scale=head_scale(analysis, layer, head, query, sink),
    )


def anti_aligned_head(heads: pd.DataFrame) -> AntiAligned | None:
    """The head with the most negative mean cos(ṽ_sink, m) among those whose mean sink ratio is at least the
    median over heads (a head that barely attends to the sink cancels little, whatever its cosine).

    ``heads``: :func:`cwviz.analyses.sinks.sink_head_summary`. None when no head has a defined cosine."""
    defined = heads.dropna(subset=["cos_sink_rest", "sink_ratio"])
    if defined.empty:
        return None
    candidates = defined[defined["sink_ratio"] >= defined["sink_ratio"].median()]
    row = candidates.sort_values(["cos_sink_rest", "layer", "head"], kind="stable").iloc[0]
    return AntiAligned(
        layer=int(row["layer"]),
        head=int(row["head"]),
        cos=float(row["cos_sink_rest"]),
        sink_ratio=float(row["sink_ratio"]),
        minimising_ratio=float(row["minimising_ratio"]),
    )


def _negative(analysis: Analysis, layer: int, head: int) -> NegativeKey | None:
    """The most negative key of ``head``; where that head has none, of the layer's head that has the most negative
    one."""
    pick = negative_key(analysis, layer, head)
    if pick is not None and pick.contribution >= 0:
        other = negative_key(analysis, layer, None)
        pick = other if other is not None and other.contribution < 0 else pick
    return pick


def plan(analysis: Analysis, summary: pd.DataFrame, layers: pd.DataFrame, heads: pd.DataFrame) -> TourPlan:
    """Every pick of the tour (:class:`TourPlan`) from an analysis and its tables, the sink at position
    :data:`~cwviz.core.defaults.DEFAULT_SINK`: ``summary`` from :func:`cwviz.analyses.tables.head_summary`, ``layers``
    and ``heads`` from :func:`cwviz.analyses.sinks.sink_layer_summary` and
    :func:`~cwviz.analyses.sinks.sink_head_summary`."""
    layer = overstated_layer(layers)
    if layer is None:  # no query sees a key besides the sink: the layer whose heads attend to it most
        means = summary.groupby("layer")["sink_attention"].mean()
        layer = SinkLayer(int(means.idxmax()), float(means.max()), math.nan)
    head, share = sink_head(summary, layer.layer)
    return TourPlan(
        sink=DEFAULT_SINK,
        sink_token=analysis.tokens[DEFAULT_SINK],
        causal=bool(analysis.info.causal),
        layer=layer,
        head=head,
        head_sink_attention=share,
        negative=_negative(analysis, layer.layer, head),
        anti=anti_aligned_head(heads),
        model=analysis.info.id,
    )


@dataclass(frozen=True)
class FlowStory:
    """Step 8's numbers, from the signed flow into the prediction's position (:func:`cwviz.flow`): the target and its
    logit (an encoder: None and nan), and the input tokens that add most to it and work most against it, each
    ``(position, token, total)``; ``against`` is None when no token's total is negative. ``first``: the first token's
    (the sink's) total, which step 8 reconciles with step 2's share; ``encoder``: the flow is into [CLS]'s
    representation, its totals shares that add up to 1 with the biases."""

    target: str | None
    logit: float
    support: tuple[int, str, float]
    against: tuple[int, str, float] | None
    first: float = math.nan
    encoder: bool = False


def flow_story(flow: Flow) -> FlowStory:
    """The largest and the most negative input-token totals of ``flow`` (ties: the first position)."""
    totals = flow.totals
    best, worst = int(totals.argmax()), int(totals.argmin())
    support = (best, flow.token_strings[best], float(totals[best]))
    against = (worst, flow.token_strings[worst], float(totals[worst])) if totals[worst] < 0 else None
    return FlowStory(
        flow.target_token, flow.frozen_logit_difference, support, against, float(totals[DEFAULT_SINK]), flow.encoder
    )


@dataclass(frozen=True)
class Removal:
    """Step 6's numbers: λ = 0 in every layer (:func:`cwviz.analyses.sink_interventions.intervene_on_sink`);
    perplexities NaN for an encoder (``model`` names it)."""

    model: str
    causal: bool
    perplexity_clean: float
    perplexity: float
    norm_change: float
    cone_change: float

    @classmethod
    def of(cls, model: str, causal: bool, result) -> Removal:
        """From a :class:`~cwviz.analyses.sink_interventions.SinkIntervention` of λ = 0 in every layer."""
        table = result.table
        return cls(
            model,
            causal,
            float(result.perplexity_clean),
            float(result.perplexity),
            float(table["output_norm_change"].mean()),
            float(table["cone_change"].mean()),
        )


@dataclass(frozen=True)
class Encoder:
    """Step 7's numbers: the encoder shown (the sidebar's model, ``own``, or the embedded one), its first token and the
    layer where that token takes most attention."""

    model: str
    own: bool
    sink_token: str
    layer: SinkLayer
