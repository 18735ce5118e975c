"""What the dashboard's guided tour shows: the layer, head, query and key of each step, picked from an analysis.

The tour tells docs/METHOD.md's story on whatever model and prompt the user analysed, so nothing here is a
constant: every pick is an arg-max or arg-min over the analysis's own tables.

| pick | rule | read from |
|---|---|---|
| layer | where attention overstates the sink most: the largest layer-level sink share under attention minus under contribution | :func:`cwviz.analyses.sinks.sink_layer_summary` |
| head | in that layer, the head with the largest sink attention (mean over queries 1..T-1) | :func:`cwviz.analyses.tables.head_summary` |
| negative key | in that head, the (query, key) cell with the most negative intra-head contribution, the sink column and queries that see one key only left out; if none is negative there, the most negative cell of any head of the layer | the layer, read in row blocks |
| anti-aligned head | the most negative mean cos(ṽ_sink, m) among heads whose mean sink ratio is at least the median over heads | :func:`cwviz.analyses.sinks.sink_head_summary` |
| encoder layer | where the first token ([CLS]) takes the largest share of attention | :func:`cwviz.analyses.sinks.sink_layer_summary` |
| flow tokens (step 8) | the input tokens with the largest and the most negative signed total toward the model's top next token | :func:`cwviz.flow` |

The sink is the first position (docs/METHOD.md section 4; :data:`cwviz.analyses.sinks.DEFAULT_SINK`), as on the Sinks page's default.

Every step's sentences are written here too (:func:`step1` ... :func:`step8`, :func:`story`), from the plan's numbers as
named facts (:data:`FACTS`, :class:`Fact`): one format a fact, so that two steps that state the same fact print it
alike, and a sentence that refers to another step for a number names the fact it cites (:class:`Cite`), which
tests/analyses/test_tour.py checks against what that step shows.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
import torch

from ..core.method.analysis import Analysis
from ..core.method.flow_tables import Flow
from .sinks import DEFAULT_SINK
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

    def table(self, layer: int, head: int) -> pd.DataFrame:
        """The absolute scale as four bars, in the model's stream (lengths of d_model vectors), top to bottom: the
        head's output ‖o^h‖, the sink's part of it (c_intra ‖o^h‖, the length of α ṽ_sink along o^h), the layer's
        output ‖o‖ and the sink's part of it through this head (c_inter ‖o‖). Columns: ``row`` (0..3), ``part``
        ("output" or "first token"), ``length``, ``share`` (a sink part's share of the output above it; 1 for an
        output), ``text`` (the bar's length, and for a part its share as the tour's sentence prints it: a label on an
        axis of lengths states a length) and ``label`` (the bar's name and that text: what the chart writes beside it)."""
        head_part, layer_part = self.sink_intra * self.head_norm, self.sink_inter * self.layer_norm
        rows = [
            (f"head {head}", "output", self.head_norm, 1.0, f"‖o‖ = {self.head_norm:.1f}"),
            (
                "first token",
                "first token",
                head_part,
                self.sink_intra,
                f"{head_part:.1f} ({fact_text('head_share', self.sink_intra)} of it)",
            ),
            (f"layer {layer}", "output", self.layer_norm, 1.0, f"‖o‖ = {self.layer_norm:.1f}"),
            (
                "first token",
                "first token",
                layer_part,
                self.sink_inter,
                f"{layer_part:.1f} ({fact_text('head_layer_share', self.sink_inter)} of it)",
            ),
        ]
        frame = pd.DataFrame(rows, columns=["name", "part", "length", "share", "text"])
        frame["label"] = frame["name"] + ": " + frame["text"]
        return frame.assign(row=range(len(frame)))[["row", "label", "part", "length", "share", "text"]]


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


def negative_key(analysis: Analysis, layer: int, head: int | None, kind: str = KIND, sink: int = DEFAULT_SINK) -> NegativeKey | None:
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
    """The most negative key of ``head``; where that head has none, of the layer's head that has the most negative one."""
    pick = negative_key(analysis, layer, head)
    if pick is not None and pick.contribution >= 0:
        other = negative_key(analysis, layer, None)
        pick = other if other is not None and other.contribution < 0 else pick
    return pick


def plan(analysis: Analysis, summary: pd.DataFrame, layers: pd.DataFrame, heads: pd.DataFrame) -> TourPlan:
    """Every pick of the tour (:class:`TourPlan`) from an analysis and its tables, the sink at position
    :data:`~cwviz.analyses.sinks.DEFAULT_SINK`: ``summary`` from :func:`cwviz.analyses.tables.head_summary`, ``layers`` and ``heads`` from
    :func:`cwviz.analyses.sinks.sink_layer_summary` and :func:`~cwviz.analyses.sinks.sink_head_summary`."""
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
    return FlowStory(flow.target_token, flow.frozen_logit_difference, support, against, float(totals[DEFAULT_SINK]), flow.encoder)


# -- the story: every number a step prints, with its named meaning -------------------------------------------------
#: Every kind of number the tour prints: its meaning and its one format, so that two steps that state the same fact
#: print it alike. A fact's subject says what it is of (model, layer, head, query, key), see :class:`Fact`.
FACTS: dict[str, tuple[str, str]] = {
    "layer_attention": ("the first token's share of a layer's attention, averaged over heads and queries", ".0%"),
    "layer_share": ("the first token's share of a layer's output, all heads, averaged over queries (inter-head)", ".0%"),
    "head_attention": ("the first token's share of one head's attention, averaged over queries", ".0%"),
    "head_share": ("the first token's share of one head's output for one query (intra-head contribution)", ".0%"),
    "head_layer_share": ("the first token's share of the layer's output through one head, for one query (inter-head)", ".0%"),
    "head_norm": ("the length ‖o^h‖ of one head's output for one query", ".1f"),
    "layer_norm": ("the length ‖o‖ of the layer's output for one query", ".1f"),
    "key_attention": ("one key's attention weight in one head for one query", ".3f"),
    "key_norm_ratio": ("one key's norm ratio ‖ṽ_k‖ / ‖o^h‖", ".2f"),
    "key_cosine": ("one key's cosine cos(o^h, ṽ_k)", "+.2f"),
    "key_contribution": ("one key's contribution to one head's output for one query (intra-head)", "+.3f"),
    "anti_cosine": ("a head's mean cos(ṽ_sink, m) over its queries", "+.2f"),
    "minimising_ratio": ("the sink ratio at which a head's output is shortest", ".0%"),
    "perplexity": ("the perplexity of the prompt (clean, or with the sink's value removed)", ".1f"),
    "norm_change": ("the mean change of the head outputs' length when the sink's value is removed", "+.2f"),
    "cone_change": ("the mean change of the head outputs' mean pairwise cosine when the sink's value is removed", "+.3f"),
    "logit": ("the logit of the model's most likely next word, as the flow splits it", "+.2f"),
    "flow_total": ("one input token's signed flow total toward the prediction, over every layer and head", "+.2f"),
}


def fact_text(name: str, value: float) -> str:
    """``value`` as the tour prints a fact called ``name`` (:data:`FACTS`)."""
    return format(value, FACTS[name][1])


@dataclass(frozen=True)
class Fact:
    """One number a step prints: its named meaning (a key of :data:`FACTS`), what it is of (``subject``: the model and
    the layer, head, query or key it describes, e.g. ``("embedded", 20)`` for a layer's share) and its value. Two facts
    of the same name and subject are the same fact, and must print alike."""

    name: str
    subject: tuple
    value: float

    @property
    def text(self) -> str:
        """The value as every step prints it."""
        return fact_text(self.name, self.value)


@dataclass(frozen=True)
class Cite:
    """A sentence's reference to another step for a fact (``"step 2's 27%"``): that step must show the same fact."""

    fact: Fact
    step: int


@dataclass(frozen=True)
class Step:
    """One step's sentences (Markdown) and the facts they print (``states``) or take from another step (``cites``).
    ``text`` holds every stated and cited fact's :attr:`Fact.text`."""

    number: int
    text: str
    states: tuple[Fact, ...] = ()
    cites: tuple[Cite, ...] = ()


@dataclass(frozen=True)
class Removal:
    """Step 6's numbers: λ = 0 in every layer (:func:`cwviz.analyses.sinks.intervene_on_sink`); perplexities NaN for
    an encoder (``model`` names it)."""

    model: str
    causal: bool
    perplexity_clean: float
    perplexity: float
    norm_change: float
    cone_change: float

    @classmethod
    def of(cls, model: str, causal: bool, result) -> Removal:
        """From a :class:`~cwviz.analyses.sinks.SinkIntervention` of λ = 0 in every layer."""
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


Label = Callable[[int], str]
Quote = Callable[[str], str]


def _what(neg: NegativeKey, model: str, layer: int) -> tuple:
    """The subject of a fact about ``neg``'s head and query."""
    return (model, layer, neg.head, neg.query)


def step1(plan: TourPlan) -> Step:
    """Attention piles onto the first token: the layer's and the head's attention on it."""
    layer, head = plan.layer.layer, plan.head
    at_layer = Fact("layer_attention", (plan.model, layer), plan.layer.attention_share)
    at_head = Fact("head_attention", (plan.model, layer, head), plan.head_sink_attention)
    text = (
        "Each cell is one head of one layer, coloured by the share of its attention that goes to the first token. "
        f"In layer {layer} the heads give it {at_layer.text} of their attention on average, and head {head} (outlined) "
        f"gives it {at_head.text}. Judged by attention alone, this token would be the most important one in the text."
    )
    return Step(1, text, (at_layer, at_head))


def step2(plan: TourPlan) -> Step:
    """…but it writes little: the layer's attention on the first token against its share of the layer's output."""
    layer = plan.layer.layer
    attention = Fact("layer_attention", (plan.model, layer), plan.layer.attention_share)
    share = Fact("layer_share", (plan.model, layer), plan.layer.contribution_share)
    text = (
        "A contribution weight measures how much of what the layer writes comes from a token: attention × the length "
        f"of the token's projected value × its direction. In layer {layer} (dashed line) the first token gets "
        f"{attention.text} of the attention but makes {'only ' if plan.layer.writes_little else ''}{share.text} of the "
        "layer's output, all heads counted: the gap between the two lines is how far attention overstates it."
    )
    return Step(2, text, (attention, share))


def step3(plan: TourPlan, label: Label) -> Step:
    """A key that writes against the output; where the first token is most of this head's output, why step 2's small
    share still holds (the head's and the layer's shares and lengths)."""
    neg, layer = plan.negative, plan.layer.layer
    key = (plan.model, layer, neg.head, neg.query, neg.key)
    attention, contribution = Fact("key_attention", key, neg.attention), Fact("key_contribution", key, neg.contribution)
    states, cites = [attention, contribution], []
    if neg.contribution < 0:
        text = (
            f"Head {neg.head} of layer {layer}, query {label(neg.query)} (outlined row)"
            + ("" if neg.head == plan.head else f"; head {plan.head} has no negative contribution here")
            + f". Key {label(neg.key)} has an attention weight of {attention.text}, yet its contribution is "
            f"**{contribution.text}** (ringed): its value points against the head's output and takes something away "
            "from it (blue subtracts, red adds)."
        )
    else:
        text = (
            f"Layer {layer}: no key writes against its heads' outputs on this prompt; the smallest contribution is key "
            f"{label(neg.key)}'s (ringed), {contribution.text} (attention weight {attention.text}), for query "
            f"{label(neg.query)}. Try a longer prompt, or another head on the Heatmaps page."
        )
    scale = neg.scale
    if scale is not None:
        what = _what(neg, plan.model, layer)
        head_share, layer_share = Fact("head_share", what, scale.sink_intra), Fact("head_layer_share", what, scale.sink_inter)
        states += [head_share, layer_share]
        if not scale.sink_dominates:
            text += (
                f" Here the first token makes {head_share.text} of this head's output for the query, and {layer_share.text} "
                "of the layer's output through this head."
            )
        else:
            if scale.small_head:
                head_norm = Fact("head_norm", what, scale.head_norm)
                layer_norm = Fact("layer_norm", (plan.model, layer, neg.query), scale.layer_norm)
                states += [head_norm, layer_norm]
                why = (
                    f"this head's output is short (‖o‖ = {head_norm.text} against the layer's {layer_norm.text}, "
                    f"{scale.head_fraction:.0%} of it)"
                )
            else:
                why = "this head's output points largely away from the layer's"
            part = "nearly all of it" if scale.sink_intra >= 0.9 else "the largest part"
            overall = Fact("layer_share", (plan.model, layer), plan.layer.contribution_share)
            cites.append(Cite(overall, 2))
            text += (
                f" Both pictures are true: the first token makes {head_share.text} of this head's output, {part} (its red "
                f"column), but {why}, so through this head it adds only {layer_share.text} of the layer's output for this "
                f"query. Step 2's {overall.text} is its share of layer {layer}'s output over all heads and queries; the "
                "bars below show the lengths."
            )
    return Step(3, text, tuple(states), tuple(cites))


def step4(plan: TourPlan, label: Label) -> Step:
    """The marked key's contribution as attention × norm ratio × cosine; the first token's bar is step 3's share."""
    neg, layer = plan.negative, plan.layer.layer
    key = (plan.model, layer, neg.head, neg.query, neg.key)
    facts = (
        Fact("key_attention", key, neg.attention),
        Fact("key_norm_ratio", key, neg.norm_ratio),
        Fact("key_cosine", key, neg.cosine),
        Fact("key_contribution", key, neg.contribution),
    )
    attention, ratio, cosine, contribution = facts
    text = (
        f"Every contribution is the product of three numbers, drawn here for query {label(neg.query)} in head {neg.head} "
        f"of layer {layer}: the attention, the norm ratio (how long the key's projected value is compared with the "
        f"head's output) and the cosine (its direction). For key {label(neg.key)}: {attention.text} × {ratio.text} × "
        f"{cosine.text} = {contribution.text} (▶, outlined). Only the cosine can be negative, so it alone decides the "
        "sign. The bars are linear, each with its number beside it, so a short bar is read as the small number it is."
    )
    cites = ()
    if neg.scale is not None:
        share = Fact("head_share", _what(neg, plan.model, layer), neg.scale.sink_intra)
        cites = (Cite(share, 3),)
        text += f" The first token's bars are purple; its contribution is {share.text} of this head's output, as in step 3."
    return Step(4, text, facts, cites)


def step5(plan: TourPlan) -> Step:
    """The sink's value opposes the rest: the most anti-aligned of the heads that attend to it most."""
    anti = plan.anti
    head = (plan.model, anti.layer, anti.head)
    cosine, ratio = Fact("anti_cosine", head, anti.cos), Fact("minimising_ratio", head, anti.minimising_ratio)
    against = anti.cos < 0
    text = (
        "A head's output mixes the sink's projected value with the mean of the other keys' values. In blue heads they "
        "point in opposite directions: the sink cancels part of what the others write. The most "
        f"{'anti-' if against else ''}aligned of the heads that attend to it most is head {anti.head} of layer "
        f"{anti.layer} (outlined, cosine {cosine.text}); its output is shortest when the sink takes about {ratio.text} "
        "of its attention." + ("" if against else " On this prompt no such head points against the rest on average.")
    )
    return Step(5, text, (cosine, ratio))


def step6(removal: Removal) -> Step:
    """Remove the sink's value (λ = 0): perplexity, the head outputs' length and their semantic cone."""
    subject = (removal.model, "λ = 0")
    norm, cone = Fact("norm_change", subject, removal.norm_change), Fact("cone_change", subject, removal.cone_change)
    states = [norm, cone]
    if removal.causal:
        clean = Fact("perplexity", (removal.model, "clean"), removal.perplexity_clean)
        removed = Fact("perplexity", subject, removal.perplexity)
        states = [clean, removed, *states]
        worse = removal.perplexity > removal.perplexity_clean
        effect = f"Perplexity on this prompt goes from {clean.text} to {removed.text}" + (
            " (the model predicts the text worse). " if worse else ". "
        )
    else:
        effect = f"Perplexity needs a causal language model, and {removal.model} is an encoder: only its head outputs are compared. "
    text = (
        f"Here the first token's value is set to zero in every layer (λ = 0), its attention left as it was. {effect}"
        f"Head outputs change length by {norm.text} on average, and their mean pairwise cosine by {cone.text}: "
        + (
            "they crowd into a narrower semantic cone."
            if removal.cone_change > 0
            else "on this prompt they spread out rather than crowd into a narrower cone."
        )
    )
    return Step(6, text, tuple(states))


def step7(encoder: Encoder, quote: Quote) -> Step:
    """An encoder's [CLS] token: much attention, little of the layer's output."""
    layer = encoder.layer.layer
    attention = Fact("layer_attention", (encoder.model, layer), encoder.layer.attention_share)
    share = Fact("layer_share", (encoder.model, layer), encoder.layer.contribution_share)
    what = "This model is an encoder" if encoder.own else f"The same prompt in {encoder.model}, a BERT encoder"
    text = (
        f"{what}: every token sees every other, and the first is the special token {quote(encoder.sink_token)}. In "
        f"layer {layer} it takes {attention.text} of the attention, yet it makes only {share.text} of the layer's "
        "output: a sink again, looked at a lot and writing almost nothing."
    )
    return Step(7, text, (attention, share))


def step8(plan: TourPlan, story: FlowStory, layers: int, label: Label, quote: Quote) -> Step:
    """Where the answer came from: the logit split over the input tokens, and the first token's total reconciled with
    step 2's small share of one layer (a small write can still matter to one prediction)."""
    target = (plan.model, "flow", story.target)
    support = Fact("flow_total", (*target, story.support[0]), story.support[2])
    states, cites = [support], []
    if story.encoder:
        text = (
            f"An encoder predicts no next token, so here the final representation of {label(0)} is followed back through "
            f"all {layers} layers and split into a signed share from every input token (with the biases they add up to 1)."
        )
    else:
        logit = Fact("logit", target, story.logit)
        states.append(logit)
        text = (
            f"Followed back through all {layers} layers, the logit of the model's most likely next word here, "
            f"{quote(story.target)}, {logit.text}, splits into a signed share from every input token (the biases take "
            "the rest): red adds, blue subtracts."
        )
    text += f" Token {label(story.support[0])} adds the most ({support.text})"
    if story.against is None:
        text += "; on this prompt no token works against it."
    else:
        against = Fact("flow_total", (*target, story.against[0]), story.against[2])
        states.append(against)
        text += f", and {label(story.against[0])} works most against it ({against.text}, blue)."
    shown = plan.negative is not None and math.isfinite(plan.layer.contribution_share)  # step 2 drew its shares
    if not story.encoder and shown and math.isfinite(story.first):
        first = Fact("flow_total", (*target, plan.sink), story.first)
        overall = Fact("layer_share", (plan.model, plan.layer.layer), plan.layer.contribution_share)
        states.append(first)
        cites.append(Cite(overall, 2))
        role = "works against this prediction" if story.first < 0 else "adds to this prediction"
        text += (
            f" The first token, {label(plan.sink)}, makes only {overall.text} of layer {plan.layer.layer}'s output in "
            f"step 2, yet its total here is {first.text}: it {role}. Both hold: step 2 counts its share of one layer's "
            "output, averaged over every query, while this total adds up what it writes through every layer and head "
            "toward one token's logit. A small write can still matter to one prediction."
        )
    return Step(8, text, tuple(states), tuple(cites))


def story(
    plan: TourPlan,
    label: Label,
    quote: Quote,
    flow: FlowStory | None = None,
    layers: int = 0,
    removal: Removal | None = None,
    encoder: Encoder | None = None,
) -> tuple[Step, ...]:
    """Every step the plan (and the flow, removal and encoder, where given) has numbers for, in order: the sentences
    the Tour page prints (views/tour.py calls the same ``stepN``). ``label`` writes a position (``12 'fox'``) and
    ``quote`` a token, both as the page shows them."""
    steps = [step1(plan)]
    if plan.negative is not None:
        steps += [step2(plan), step3(plan, label), step4(plan, label)]
    if plan.anti is not None:
        steps.append(step5(plan))
    if removal is not None:
        steps.append(step6(removal))
    if encoder is not None:
        steps.append(step7(encoder, quote))
    if flow is not None:
        steps.append(step8(plan, flow, layers, label, quote))
    return tuple(steps)
