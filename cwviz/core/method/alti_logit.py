"""ALTI-Logit (Ferrando, Gállego, Tsiamas and Costa-jussà, ACL 2023; docs/METHOD.md section 7.2): each layer's
attention write at p, decomposed by source token and read through the logit direction, routed to the input tokens by
ALTI's rollout of the layers below, summed over layers.

The two halves are existing code: the direct parts d^l_j = Σ_h α_pj^{lh} ⟨L_p^l(ṽ_j^{lh}), w⟩ with w the logit direction
pulled back through the final norm frozen at p are section 6.3's (:func:`cwviz.core.method.flow.flow`'s
``attention_parts``), ALTI's per-layer maps C^l section 6.5's (:func:`cwviz.core.method.baselines.alti_maps`). This
module routes one through the other:

    score_k = Σ_l Σ_j d^l_j R^{<l}_jk + [k = p] ⟨x_p^0, w⟩,   R^{<l} = C^{l−1} ⋯ C^0,  R^{<0} = I

(the last term: p's own embedding, read directly through the residual, is p's: the authors' notebook adds it so,
citing the paper's Eq. 7; their evaluation script leaves it out).

| tensor | shape |
|---|---|
| d, the attention parts by source | [layer, key] |
| C^l, one layer's ALTI map | [query, key] (T x T) |
| scores | [T] |

The MLPs and the biases are given to no token (the paper routes the attention writes alone): they are
:attr:`AltiLogit.rest`, so Σ_k score_k + rest is the frozen-norm logit difference wherever every row of every ALTI
map sums to 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from . import baselines
from .flow import flow as share_flow
from .flow_tables import Flow


@dataclass(frozen=True)
class AltiLogit:
    """ALTI-Logit of one position, target and foil: ``scores`` [T] float64; ``parts`` [layer, key] float64, each
    layer's attention parts by source before routing; ``embedding``: ⟨x_p^0, w⟩, in p's score; ``rest``: the
    frozen-norm logit difference's part no token is given (the MLPs, the attention and final biases);
    ``frozen_logit_difference`` (section 6.3's Δ)."""

    scores: np.ndarray
    parts: np.ndarray
    embedding: float
    rest: float
    frozen_logit_difference: float


def route(parts: np.ndarray, maps: Sequence[torch.Tensor]) -> np.ndarray:
    """Σ_l parts[l] · R^{<l} with R^{<l} = maps[l−1] ⋯ maps[0] (R^{<0} = I), float64 [T], by Horner's rule from the
    top layer down (a vector times each map: T² a layer, never the rollout itself). ``parts`` [layer, T], ``maps``
    one [T, T] per layer (row i: position i's composition after the layer, over its input)."""
    vector = torch.zeros(parts.shape[1], dtype=torch.float64)
    for layer in reversed(range(parts.shape[0])):
        vector = vector + torch.from_numpy(np.asarray(parts[layer], np.float64))
        if layer:
            vector = vector @ maps[layer - 1].double().cpu()
    return vector.numpy()


def alti_logit(analysis, position: int, target: int, foil: int | None = None, flow: Flow | None = None) -> AltiLogit:
    """ALTI-Logit of ``analysis``'s prompt at ``position`` toward logit(``target``) − logit(``foil``) (the target's
    logit alone without a foil); ``flow``: the share flow of the same request where the caller has it (its direct
    parts are the ones routed here), else computed. A decoder's analysis (ALTI's maps refuse an encoder)."""
    baselines.check_decoder(analysis)
    if flow is None:
        flow = share_flow(analysis, position, target, foil, vocabulary=0)
    elif (flow.position, flow.target, flow.foil) != (position, target, foil):
        raise ValueError(
            f"this flow is of position {flow.position}, target {flow.target}, foil {flow.foil}, not of this request"
        )
    parts = flow.attention_parts.sum(1).astype(np.float64)  # (layer, key): heads summed
    with torch.inference_mode():
        scores = route(parts, baselines.alti_maps(analysis))
    other = flow.other_parts
    scores[flow.position] += other.embedding
    rest = float(other.mlp.sum()) + float(other.attention_bias.sum()) + other.final_bias
    return AltiLogit(scores, parts, float(other.embedding), rest, float(flow.frozen_logit_difference))
