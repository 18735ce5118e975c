"""What the dashboard's guided tour says: every step's sentences, written from the plan's numbers as named facts.

The steps (:func:`step1` ... :func:`step8`, :func:`story`) read the picks of :mod:`cwviz.analyses.tour`
(:class:`~cwviz.analyses.tour.TourPlan`, :class:`~cwviz.analyses.tour.FlowStory`, :class:`~cwviz.analyses.tour.Removal`,
:class:`~cwviz.analyses.tour.Encoder`) and print each number as a named fact (:data:`FACTS`, :class:`Fact`): one format
a fact, so that two steps that state the same fact print it alike (and so do the bars beside step 3,
:func:`scale_table`), and a sentence that refers to another step for a number names the fact it cites (:class:`Cite`),
which tests/analyses/test_tour.py checks against what that step shows.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from .tour import Encoder, FlowStory, HeadScale, NegativeKey, Removal, TourPlan

# -- the story: every number a step prints, with its named meaning -------------------------------------------------
#: Every kind of number the tour prints: its meaning and its one format, so that two steps that state the same fact
#: print it alike. A fact's subject says what it is of (model, layer, head, query, key), see :class:`Fact`.
FACTS: dict[str, tuple[str, str]] = {
    "layer_attention": ("the first token's share of a layer's attention, averaged over heads and queries", ".0%"),
    "layer_share": (
        "the first token's share of a layer's output, all heads, averaged over queries (inter-head)",
        ".0%",
    ),
    "head_attention": ("the first token's share of one head's attention, averaged over queries", ".0%"),
    "head_share": ("the first token's share of one head's output for one query (intra-head contribution)", ".0%"),
    "head_layer_share": (
        "the first token's share of the layer's output through one head, for one query (inter-head)",
        ".0%",
    ),
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
    "cone_change": (
        "the mean change of the head outputs' mean pairwise cosine when the sink's value is removed",
        "+.3f",
    ),
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


def scale_table(scale: HeadScale, layer: int, head: int) -> pd.DataFrame:
    """The absolute scale of ``scale`` (:class:`~cwviz.analyses.tour.HeadScale`, of ``head`` in ``layer``) as four bars,
    in the model's stream (lengths of d_model vectors), top to bottom: the head's output ‖o^h‖, the sink's part of it
    (c_intra ‖o^h‖, the length of α ṽ_sink along o^h), the layer's output ‖o‖ and the sink's part of it through this
    head (c_inter ‖o‖). Its labels print the shares as the steps' sentences do (:data:`FACTS`). Columns: ``row`` (0..3),
    ``part`` ("output" or "first token"), ``length``, ``share`` (a sink part's share of the output above it; 1 for an
    output), ``text`` (the bar's length, and for a part its share as the tour's sentence prints it: a label on an axis
    of lengths states a length) and ``label`` (the bar's name and that text: what the chart writes beside it)."""
    head_part, layer_part = scale.sink_intra * scale.head_norm, scale.sink_inter * scale.layer_norm
    rows = [
        (f"head {head}", "output", scale.head_norm, 1.0, f"‖o‖ = {scale.head_norm:.1f}"),
        (
            "first token",
            "first token",
            head_part,
            scale.sink_intra,
            f"{head_part:.1f} ({fact_text('head_share', scale.sink_intra)} of it)",
        ),
        (f"layer {layer}", "output", scale.layer_norm, 1.0, f"‖o‖ = {scale.layer_norm:.1f}"),
        (
            "first token",
            "first token",
            layer_part,
            scale.sink_inter,
            f"{layer_part:.1f} ({fact_text('head_layer_share', scale.sink_inter)} of it)",
        ),
    ]
    frame = pd.DataFrame(rows, columns=["name", "part", "length", "share", "text"])
    frame["label"] = frame["name"] + ": " + frame["text"]
    return frame.assign(row=range(len(frame)))[["row", "label", "part", "length", "share", "text"]]


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
        head_share, layer_share = (
            Fact("head_share", what, scale.sink_intra),
            Fact("head_layer_share", what, scale.sink_inter),
        )
        states += [head_share, layer_share]
        if not scale.sink_dominates:
            text += (
                f" Here the first token makes {head_share.text} of this head's output for the query, and "
                f"{layer_share.text} of the layer's output through this head."
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
                f" Both pictures are true: the first token makes {head_share.text} of this head's output, {part} (its "
                f"red column), but {why}, so through this head it adds only {layer_share.text} of the layer's output "
                f"for this query. Step 2's {overall.text} is its share of layer {layer}'s output over all heads and "
                "queries; the bars below show the lengths."
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
        f"Every contribution is the product of three numbers, drawn here for query {label(neg.query)} in head "
        f"{neg.head} "
        f"of layer {layer}: the attention, the norm ratio (how long the key's projected value is compared with the "
        f"head's output) and the cosine (its direction). For key {label(neg.key)}: {attention.text} × {ratio.text} × "
        f"{cosine.text} = {contribution.text} (▶, outlined). Only the cosine can be negative, so it alone decides the "
        "sign. The bars are linear, each with its number beside it, so a short bar is read as the small number it is."
    )
    cites = ()
    if neg.scale is not None:
        share = Fact("head_share", _what(neg, plan.model, layer), neg.scale.sink_intra)
        cites = (Cite(share, 3),)
        text += (
            f" The first token's bars are purple; its contribution is {share.text} of this head's output, as in step 3."
        )
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
        effect = (
            f"Perplexity needs a causal language model, and {removal.model} is an encoder: only its head outputs are "
            "compared. "
        )
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
            f"An encoder predicts no next token, so here the final representation of {label(0)} is followed back "
            f"through all {layers} layers and split into a signed share from every input token (with the biases they "
            "add up to 1)."
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
