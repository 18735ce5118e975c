"""Prior input-token attribution methods the signed flow is compared with (docs/METHOD.md section 6.5).

Each scores the input tokens j for the prediction made at one position t, from a recorded pass
(:class:`cwviz.core.method.analysis.Analysis`); none is signed:

| function | score of token j | source |
| --- | --- | --- |
| :func:`raw_attention` | mean_h α_tj^{L,h}: the last layer's attention, averaged over heads | – |
| :func:`attention_rollout` | R_tj, R = Â^L ⋯ Â^1, Â^l = ½ mean_h α^{l,h} + ½ I, rows normalised | Abnar, Zuidema 2020 |
| :func:`alti` | R_tj, R = C^L ⋯ C^1, C^l the layer's ALTI map (:func:`alti_contributions`) | Ferrando et al. 2022 |

The math is in pure functions of small tensors (:func:`residual_attention`, :func:`rollout`,
:func:`transformed_vectors`, :func:`alti_contributions`), tested on 3-token cases worked by hand.

ALTI needs, besides the recorded attention and values, the residual stream entering each layer and the map its
attention write lands through (the frozen norm of a "sandwich" layout, Gemma 2 and 3 and OLMo 2; Granite's residual
multiplier): :func:`alti` reads both from the residual recorder (:mod:`cwviz.core.method.residual`, the signed flow's
own, one pass that replays the analysis's attention outputs), so the block layout is read in one place. Shapes:

| tensor | shape |
|---|---|
| α (one layer) | [head, query, key] |
| ṽ, the projected values | [head, key, d_model] |
| transformed vectors T_i(x_j) | [query, key, d_model] (a row block of queries at a time) |
| x, the residual entering a layer; y, after its attention | [query, d_model] |
| R, a rollout | [query, key]: R[i, k], row i the query position, column k the key position |
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from ..loading import architectures
from ..util.errors import InputError
from .analysis import Analysis
from .frozen_norm import FrozenNorm
from .residual import record

#: The query rows of ALTI's transformed vectors built at once: [rows, T, d_model] floats per row block.
ALTI_ROWS = 32


# -- pure math on small tensors ---------------------------------------------------------------------------
def residual_attention(alpha: torch.Tensor) -> torch.Tensor:
    """Rollout's per-layer map from one layer's α [head, query, key] (query = key = T): ½ mean_h α + ½ I, each row
    divided by its sum (a row of α sums to less than 1 under learned sinks), float32 [T, T]."""
    mean = alpha.float().mean(0)
    mixed = 0.5 * mean + 0.5 * torch.eye(mean.shape[0], dtype=mean.dtype, device=mean.device)
    return mixed / mixed.sum(-1, keepdim=True)


def rollout(maps: Iterable[torch.Tensor]) -> torch.Tensor:
    """R = M^L ⋯ M^2 M^1 of per-layer maps [T, T] in layer order (first layer first), float32: R[i, k], rows query
    positions and columns key positions, as each map's own M[i, j]; row i says how much of position i's state after the
    last layer comes from each input position k. The one rollout of cwviz: attention rollout, ALTI and the signed
    rollout (:func:`cwviz.core.method.mixing.rollout`) are this product of their own maps. ``maps`` is read once, one
    map at a time (a generator holds one layer's map)."""
    out = None
    for step in maps:
        out = step.float() if out is None else step.float() @ out
    if out is None:
        raise InputError("rollout needs at least one layer")
    return out


def transformed_vectors(
    alpha: torch.Tensor,
    projected: torch.Tensor,
    residual: torch.Tensor,
    rows: slice | None = None,
    landing: FrozenNorm | None = None,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ALTI's transformed vectors and their sum for the query ``rows`` (default all) of one layer.

    T_i(x_j) = L_i(Σ_h α_ij^h ṽ_j^h) for j ≠ i, plus the residual x_i when j = i; y_i = Σ_j T_i(x_j) + L_i(b_O).
    L_i is the map the write lands through at position i (``landing``, the layout's: a multiple, or the norm on the
    attention output frozen at position i; None: the identity). Shapes: ``alpha`` [head, T, T], ``projected`` ṽ
    [head, T, d_model], ``residual`` x [T, d_model], ``landing`` over all T positions, ``bias`` [d_model]. Returns
    (T [rows, T, d_model], y [rows, d_model]).
    """
    rows = rows if rows is not None else slice(0, alpha.shape[1])
    writes = torch.einsum("hij,hjd->ijd", alpha[:, rows].float(), projected.float())  # (rows, key, d_model)
    count = writes.shape[0]
    bias = torch.zeros(writes.shape[-1], device=writes.device) if bias is None else bias.float()
    bias = bias.expand(count, -1)  # (rows, d_model)
    if landing is not None:
        here = landing.rows(rows.start, rows.start + count)
        writes = here.apply(writes.transpose(0, 1)).transpose(0, 1)  # L_i of every write to query row i
        bias = here.apply(bias)
    positions = torch.arange(rows.start, rows.start + count)
    writes[torch.arange(count), positions] += residual[rows].float()
    return writes, writes.sum(1) + bias


def alti_contributions(transformed: torch.Tensor, resultant: torch.Tensor) -> torch.Tensor:
    """ALTI's contributions [query, key] from transformed vectors [query, key, d_model] and their resultant y
    [query, d_model]: c_ij = max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁), each row divided by its sum (a row whose every c is 0
    stays 0). A source that pushes y_i away from itself scores 0 (clipped)."""
    size = resultant.abs().sum(-1, keepdim=True)  # (query, 1)
    distance = (resultant[:, None, :] - transformed).abs().sum(-1)  # (query, key)
    c = (size - distance).clamp(min=0)
    total = c.sum(-1, keepdim=True)
    return torch.where(total > 0, c / total.clamp(min=torch.finfo(c.dtype).tiny), c)


# -- the model's side -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AltiLayer:
    """What ALTI reads of one layer's residual stream (:func:`alti_layers`): ``residual`` x [T, d_model], the
    residual entering the layer, and ``landing`` L, the map its attention write lands through, over all T positions."""

    residual: torch.Tensor
    landing: FrozenNorm


def alti_layers(analysis: Analysis) -> list[AltiLayer]:
    """Each layer's :class:`AltiLayer`, from the residual recorder (one pass that replays the analysis's own attention
    outputs, so it is the analysis's pass)."""
    recorder, _ = record(
        analysis.bundle,
        analysis.input_ids,
        lambda layout, layer, slots: AltiLayer(slots.residual_in, layout.landing(layer, slots)),
        outputs=analysis.recorded_outputs,
    )
    return recorder.layers


def projected_values(analysis: Analysis, layer: int) -> torch.Tensor:
    """ṽ_j^h = W_O^h v_j^h of one layer, float32 [head, key, d_model]."""
    value = analysis.values(layer)  # (head, key, d_head)
    return torch.einsum("hdk,hjk->hjd", analysis.w_heads(layer), value)


def check_decoder(analysis: Analysis) -> None:
    """InputError for an encoder (ALTI is implemented for decoders: their layouts leave the residual unnormed)."""
    bundle = analysis.bundle
    if not bundle.arch.causal or architectures.layout_of(bundle.model.config, bundle.arch) == "post_norm":
        raise InputError(
            "ALTI is implemented for pre-norm decoders; this model is an encoder (post-norm): choose a causal model"
        )


def alti_maps(analysis: Analysis) -> list[torch.Tensor]:
    """ALTI's per-layer contribution maps C^l [T, T] (:func:`alti_contributions`), layer by layer."""
    check_decoder(analysis)
    projections = analysis.bundle.out_projections
    maps = []
    for layer, part in enumerate(alti_layers(analysis)):
        with torch.inference_mode():
            alpha = analysis.attention_tensor(layer)  # (head, T, T)
            projected = projected_values(analysis, layer)  # (head, T, d_model)
            bias = getattr(projections[layer], "bias", None)
            bias = None if bias is None else bias.detach().float().to(projected.device)
            x = part.residual.to(projected.device)
            rows = []
            for start in range(0, alpha.shape[1], ALTI_ROWS):
                row_block = slice(start, min(start + ALTI_ROWS, alpha.shape[1]))
                vectors = transformed_vectors(alpha, projected, x, row_block, part.landing, bias)
                rows.append(alti_contributions(*vectors))
            maps.append(torch.cat(rows))
    return maps


# -- one position's scores --------------------------------------------------------------------------------
def raw_attention(analysis: Analysis, position: int) -> np.ndarray:
    """The last layer's attention of ``position`` on each token, averaged over heads, float32 [T]."""
    position = analysis.check_token(position)
    with torch.inference_mode():
        alpha = analysis.attention_tensor(analysis.num_layers - 1)  # (head, T, T)
        return alpha[:, position].mean(0).cpu().numpy().astype(np.float32)


def attention_rollout(analysis: Analysis, position: int) -> np.ndarray:
    """Attention rollout's row of ``position`` (Abnar and Zuidema 2020), float32 [T]."""
    position = analysis.check_token(position)
    with torch.inference_mode():
        maps = [residual_attention(analysis.attention_tensor(layer)).cpu() for layer in range(analysis.num_layers)]
        return rollout(maps)[position].numpy().astype(np.float32)


def alti(analysis: Analysis, position: int) -> np.ndarray:
    """ALTI's rolled-out row of ``position`` (Ferrando et al. 2022), float32 [T]."""
    position = analysis.check_token(position)
    with torch.inference_mode():
        return rollout([m.cpu() for m in alti_maps(analysis)])[position].numpy().astype(np.float32)


#: The baselines by name, each ``(analysis, position) -> scores [T]``.
BASELINES = {"raw": raw_attention, "rollout": attention_rollout, "alti": alti}
