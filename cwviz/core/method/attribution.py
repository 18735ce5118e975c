"""One registry of input-token attribution methods (docs/METHOD.md section 7.2), each implemented once.

Every member maps a :class:`Request` (an analysis, a position p, a target and an optional foil, all checked) to an
:class:`Attribution`: one score per input token [T] (signed or not), and edges where the method has them. ``cwviz flow
--method``, the Flow page's method picker and ``cwviz flow-faithfulness`` read only :data:`METHODS`; none of them
branches on a method's name. Members that share work share it through the request: the effect flow, its origin
reading and input × gradient come from one backward pass (:attr:`Request.gradients`).

| name               | signed | answers        | edges |
|--------------------|--------|----------------|-------|
| ``effect``         | yes    | relay          | yes   |
| ``effect_origin``  | yes    | origin         | no    |
| ``share_flow``     | yes    | relay          | yes   |
| ``input_x_gradient``| yes   | origin         | no    |
| ``alti``           | no     | relay, origin  | no    |
| ``alti_logit``     | yes    | relay, origin  | no    |
| ``rollout``, ``raw``| no    | relay, origin  | no    |

The random control is not a member: it is the evaluation's control (:mod:`cwviz.analyses.flow_faithfulness`), drawn
per item. AttnLRP waits for an ``lxt`` that imports under transformers 5 (docs/METHOD.md section 7.2).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..defaults import EDGE_LIMIT
from ..loading import architectures
from ..util.errors import InputError
from . import alti_logit, baselines, effect
from .edges import LargestEdges
from .flow import flow, resolve, token_totals
from .flow_tables import Asked, Flow, LayerEdges
from .residual import unknown_row

if TYPE_CHECKING:
    from .analysis import Analysis
    from .flow import FlowBasis

#: The interventions of section 7.3, by name.
RELAY, ORIGIN = "relay", "origin"
INTERVENTIONS = (RELAY, ORIGIN)


@dataclass(frozen=True, eq=False)
class Request:
    """What every method is asked: ``analysis``'s prompt, the position, the target and foil token ids (checked by
    :func:`request`; None for an encoder, and a foil None for the target's logit alone). Work several members share is
    computed once, on first use (:attr:`gradients`, :attr:`share_flow`)."""

    analysis: object
    position: int
    target: int | None
    foil: int | None
    #: :func:`~cwviz.core.method.flow.flow_basis` of this analysis and position, where the caller keeps one (the
    #: dashboard): the share flow then runs no forward pass.
    basis: object | None = None

    @functools.cached_property
    def gradients(self) -> effect.Gradients:
        return effect.gradients(self.analysis, self.position, self.target, self.foil)

    @functools.cached_property
    def share_flow(self) -> Flow:
        """Section 6's flow of the request (no vocabulary): ``share_flow`` reads its totals, ``alti_logit`` its direct
        parts."""
        vocabulary = 0 if self.basis is None else self.basis.count  # a kept basis is checked against its own count
        return flow(self.analysis, self.position, self.target, self.foil, vocabulary=vocabulary, basis=self.basis)


@dataclass(frozen=True)
class Attribution:
    """One method's answer: ``scores`` [T] float64 (each input token's score toward the request's quantity),
    ``quantity`` (LD where the method computes it, else NaN), ``edges`` (per layer, where the method has them),
    ``heads`` [layer, head] (each head's part, where it has them), ``extra``: further tables of the method by name
    (the share flow's nodes, parts and vocabulary). :func:`run` fills in what was asked (``asked``)."""

    method: str
    scores: np.ndarray
    quantity: float = float("nan")
    edges: tuple[LayerEdges, ...] | None = None
    heads: np.ndarray | None = None
    extra: tuple[tuple[str, object], ...] = ()
    asked: Asked | None = None

    def tokens_table(self):
        """One row per input position: ``position, token, score``."""
        import pandas as pd

        return pd.DataFrame(
            {"position": np.arange(len(self.scores)), "token": list(self.asked.token_strings), "score": self.scores}
        )

    def heads_table(self):
        """One row per (layer, head): ``layer, head, part`` (empty for a method without heads)."""
        import pandas as pd

        if self.heads is None:
            return pd.DataFrame(columns=["layer", "head", "part"])
        layers, heads = self.heads.shape
        return pd.DataFrame(
            {
                "layer": np.repeat(np.arange(layers), heads),
                "head": np.tile(np.arange(heads), layers),
                "part": self.heads.reshape(-1),
            }
        )


@dataclass(frozen=True)
class Method:
    """A registry member: ``compute(request) -> Attribution``; ``signed``: its scores have a sign that means something;
    ``answers``: the interventions (section 7.3) whose effects it claims to estimate; ``needs_logits``: it is defined
    for causal LMs only; ``available(bundle)``: None where it runs on this model, else why not (one sentence)."""

    name: str
    label: str
    description: str
    signed: bool
    answers: frozenset[str]
    compute: Callable[[Request], Attribution]
    needs_logits: bool = False
    has_edges: bool = False
    available: Callable[[object], str | None] = field(default=lambda bundle: None)

    @property
    def intervention(self) -> str:
        """The intervention the method is checked against by default: the first it answers, in :data:`INTERVENTIONS`'
        order."""
        return next(i for i in INTERVENTIONS if i in self.answers)


def _effect(request: Request) -> Attribution:
    grads = request.gradients
    analysis = request.analysis
    edges = tuple(
        _kept_edges(layer, effect.edges_of_layer(analysis, grads, layer)) for layer in range(analysis.num_layers)
    )
    return Attribution(
        "effect", grads.totals.astype(np.float64), grads.quantity, edges, effect.head_parts(analysis, grads)
    )


def _effect_origin(request: Request) -> Attribution:
    return Attribution("effect_origin", request.gradients.origin.astype(np.float64), request.gradients.quantity)


def _input_x_gradient(request: Request) -> Attribution:
    return Attribution(
        "input_x_gradient", request.gradients.input_x_gradient.astype(np.float64), request.gradients.quantity
    )


def of_flow(result: Flow) -> Attribution:
    """The share flow's attribution of a :class:`~cwviz.core.method.flow_tables.Flow` already made: its totals, each
    layer's kept edges, each head's routed part, and its nodes and parts as further tables."""
    edges = tuple(
        LayerEdges(
            e.layer, e.weights.astype(np.float64), e.queries.astype(np.int64), e.keys.astype(np.int64), float(e.mass)
        )
        for e in result.kept_edges
    )
    extra = (("nodes", result.node_table), ("parts", result.parts))
    about = result.asked()
    scores = result.totals.astype(np.float64)
    return Attribution("share_flow", scores, result.frozen_logit_difference, edges, result.head_routed, extra, about)


def _share_flow(request: Request) -> Attribution:
    return of_flow(request.share_flow)


def _baseline(name: str) -> Callable[[Request], Attribution]:
    def compute(request: Request) -> Attribution:
        return Attribution(name, baselines.BASELINES[name](request.analysis, request.position).astype(np.float64))

    return compute


def _decoders_only(bundle) -> str | None:
    if (why := unknown_row(bundle)) is not None:
        return why
    if not bundle.arch.causal or architectures.layout_of(bundle.model.config, bundle.arch) == "post_norm":
        return "it is implemented for decoders (causal, pre-norm or sandwich blocks); this model is an encoder"
    return None


def _kept_edges(layer: int, blocks, limit: int = EDGE_LIMIT) -> LayerEdges:
    """The ``limit`` largest |weight| edges of one layer from its row blocks ``(first, stop, weights [rows, keys])``,
    kept as the share flow keeps its own (:class:`cwviz.core.method.edges.LargestEdges`)."""
    largest, mass = LargestEdges(limit), 0.0
    for first, _stop, block in blocks:
        mass += largest.add(block.float(), first)
    weights, queries, keys = largest.result()
    return LayerEdges(layer, weights.double().numpy(), queries.numpy(), keys.numpy(), mass)


#: Every member, in report order (more join from their own modules through :func:`register`).
METHODS: dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add ``method`` to :data:`METHODS` (a name taken twice is a programming error)."""
    if method.name in METHODS:
        raise ValueError(f"attribution method {method.name!r} is registered twice")
    METHODS[method.name] = method
    return method


register(
    Method(
        "effect",
        "effect flow",
        "each contribution vector read against the gradient of the prediction where it lands (METHOD.md 7.1): "
        "the first-order effect of removing the token's value everywhere",
        signed=True,
        answers=frozenset({RELAY}),
        compute=_effect,
        has_edges=True,
        available=unknown_row,
    )
)
register(
    Method(
        "effect_origin",
        "effect flow, origin reading",
        "(input embedding − mean embedding) · gradient: the first-order effect of replacing the token by the mean one",
        signed=True,
        answers=frozenset({ORIGIN}),
        compute=_effect_origin,
        available=unknown_row,
    )
)
register(
    Method(
        "share_flow",
        "share flow",
        "each part's scalar share of the residual it joins, routed down the layers (METHOD.md section 6)",
        signed=True,
        answers=frozenset({RELAY}),
        compute=_share_flow,
        has_edges=True,
        available=unknown_row,
    )
)
register(
    Method(
        "input_x_gradient",
        "input × gradient",
        "input embedding · gradient of the prediction (Shrikumar et al. 2016)",
        signed=True,
        answers=frozenset({ORIGIN}),
        compute=_input_x_gradient,
        available=unknown_row,
    )
)
register(
    Method(
        "alti",
        "ALTI",
        "L1-proximity contributions, clipped at 0 and rolled out (Ferrando et al. 2022)",
        signed=False,
        answers=frozenset(INTERVENTIONS),
        compute=_baseline("alti"),
        available=_decoders_only,
    )
)
register(
    Method(
        "rollout",
        "attention rollout",
        "½ (mean-head attention + I), rolled out (Abnar and Zuidema 2020)",
        signed=False,
        answers=frozenset(INTERVENTIONS),
        compute=_baseline("rollout"),
    )
)
register(
    Method(
        "raw",
        "raw attention",
        "the last layer's attention of the position, averaged over heads",
        signed=False,
        answers=frozenset(INTERVENTIONS),
        compute=_baseline("raw"),
    )
)
# -- alti_logit (cwviz.core.method.alti_logit); AttnLRP waits for an lxt that imports under transformers 5 (METHOD.md
# 7.2) --


def _alti_logit(request: Request) -> Attribution:
    result = alti_logit.alti_logit(request.analysis, request.position, request.target, request.foil, request.share_flow)
    return Attribution("alti_logit", result.scores, result.frozen_logit_difference)


register(
    Method(
        "alti_logit",
        "ALTI-Logit",
        "each layer's attention write at the position, by source token, read through the logit direction and routed to "
        "the input tokens by ALTI's rollout of the layers below (Ferrando et al. 2023)",
        signed=True,
        answers=frozenset(INTERVENTIONS),
        compute=_alti_logit,
        needs_logits=True,
        available=_decoders_only,
    )
)


def check_method(name: str) -> Method:
    """The member called ``name``; InputError naming the choices otherwise."""
    method = METHODS.get(name) if isinstance(name, str) else None
    if method is None:
        raise InputError(f"no attribution method {str(name)[:80]!r}: choose one of {', '.join(METHODS)}")
    return method


def request(
    analysis: Analysis,
    position: int | None = None,
    target: int | str | None = None,
    foil: int | str | None = None,
    basis: FlowBasis | None = None,
) -> Request:
    """A checked :class:`Request`: the position (default: the last; an encoder's 0), and the target (default: the
    model's top next token at the position) and foil as token ids, as :func:`cwviz.core.method.flow.flow` checks them.
    ``basis``: a kept :func:`~cwviz.core.method.flow.flow_basis` of this analysis and position
    (:attr:`Request.basis`)."""
    position, target, foil = resolve(analysis, position, target, foil)
    if analysis.bundle.has_logits and target is None:
        target = effect.top_token(analysis, position, foil)
    return Request(analysis, position, target, foil, basis)


def attribute(
    analysis: Analysis,
    method: str = "effect",
    position: int | None = None,
    target: int | str | None = None,
    foil: int | str | None = None,
) -> Attribution:
    """``method``'s attribution of ``analysis``'s prompt at ``position`` toward ``target`` over ``foil`` (defaults as
    :func:`request`). InputError for an unknown method, one the model does not support, or a bad target/foil."""
    chosen = check_method(method)
    return run(chosen, request(analysis, position, target, foil))


def run(method: Method, asked: Request) -> Attribution:
    """``method`` on an already checked request (several members on one request share its backward pass)."""
    why = method.available(asked.analysis.bundle)
    if why is not None:
        raise InputError(f"{method.label} does not run on this model: {why}")
    analysis = asked.analysis
    if method.needs_logits and not analysis.bundle.has_logits:
        raise InputError(f"{method.label} needs a model with next-token logits; this model is an encoder")
    decode = analysis.bundle.tokenizer.decode
    about = Asked(
        tuple(analysis.tokens),
        asked.position,
        asked.target,
        asked.foil,
        None if asked.target is None else decode([asked.target]),
        None if asked.foil is None else decode([asked.foil]),
    )
    return dataclasses.replace(method.compute(asked), asked=about)


__all__ = [
    "METHODS",
    "Attribution",
    "LayerEdges",
    "Method",
    "Request",
    "attribute",
    "check_method",
    "of_flow",
    "register",
    "request",
    "run",
    "token_totals",
]
