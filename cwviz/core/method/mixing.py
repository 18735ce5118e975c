"""Each layer's signed token mixing M and the signed rollout (docs/METHOD.md sections 6.1-6.2), read from an analysis's
records in row blocks (:mod:`cwviz.core.method.row_blocks`) against its residual stream
(:mod:`cwviz.core.method.residual`); the flow (:mod:`cwviz.core.method.flow`) routes the logit difference down
through them.

| function                             | returns                                                     |
|--------------------------------------|-------------------------------------------------------------|
| ``mixing(analysis, layer)``          | numpy [query, key + 1]: M of one layer, the bias last       |
| ``rollout(analysis)``                | numpy [query, key + 1]: R = M^{L-1} ⋯ M^0, the bias last    |
| ``mixing_row_blocks(analysis, ...)`` | :class:`MixingRowBlock`: a row block of M, as the flow reads it |
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from . import baselines
from .measures import grouped_matmul
from .residual import Stream, record_stream
from .row_blocks import attention_rows, for_row_blocks, record_row_blocks

if TYPE_CHECKING:
    from .analysis import Analysis


class MixingRowBlock(NamedTuple):
    """One row block of a layer's M (:func:`mixing_row_blocks`): rows ``first..stop-1`` against the keys ``0..keys-1``
    they can see. ``mix`` [rows, keys], ``bias`` the bias column [rows], ``heads`` each head's part of the rows
    [head, rows] (Σ_j of its attention parts). In the row block that holds the stream's position p (else None):
    ``alpha_p`` p's attention [head, keys] and the ``values`` it reads [kv_head, keys, d_head], what the direct parts
    at p need (:func:`cwviz.core.method.flow._attention_parts`)."""

    first: int
    stop: int
    mix: torch.Tensor
    bias: torch.Tensor
    heads: torch.Tensor
    alpha_p: torch.Tensor | None
    values: torch.Tensor | None


def mixing_row_blocks(analysis: Analysis, stream: Stream, layer: int, whole: bool = False) -> Iterator[MixingRowBlock]:
    """Row blocks of layer ``layer``'s M (:class:`MixingRowBlock`), the layer's record read once; ``whole``: one row
    block of every row against every key (0 where a row cannot see a key; [head, T, T] floats at once), fewer, larger
    products for a caller that keeps M of a short prompt."""
    with torch.inference_mode():
        recorded = analysis.layer_record(layer)
        rec = for_row_blocks(recorded)
        part = stream.layers[layer]
        w_o = analysis.w_heads(layer).permute(1, 0, 2).flatten(1)  # (D, H * dh): W_O, head after head
        heads = analysis.num_heads
        device = rec.value.device
        values = rec.value.transpose(-1, -2)  # (kv * copies, dh, T)
        p = stream.position
        tokens = rec.query.shape[-2]
        for first, stop, keys in [(0, tokens, tokens)] if whole else record_row_blocks(rec):
            alpha = attention_rows(rec, first, stop, keys)  # (H, rows, keys)
            direction = part.direction[first:stop].to(device)  # (rows, D): L_iᵀ h_i
            # (H, rows, dh): (W_O^h)ᵀ L_iᵀ h_i
            pulled = (direction @ w_o).view(stop - first, heads, -1).transpose(0, 1).contiguous()
            norm2 = part.norm2[first:stop].to(device)
            dots = grouped_matmul(pulled, values[..., :keys], rec.copies).mul_(alpha)  # (H, rows, keys): α ⟨L ṽ_j, h_i⟩
            mix = dots.sum(0).div_(norm2[:, None])
            # Σ_j α_ij (u_i · v_j) = u_i · z_i: the model's own z, no pass over keys
            if rec.output.dtype == torch.float32:
                per_head = (pulled * rec.output[:, first:stop]).sum(-1) / norm2
            else:
                per_head = dots.sum(-1) / norm2
            rows = torch.arange(stop - first, device=device)
            mix[rows, rows + first] += part.residual[first:stop].to(device) / norm2
            holds_p = first <= p < stop
            yield MixingRowBlock(
                first,
                stop,
                mix,
                part.bias[first:stop].to(device) / norm2,
                per_head,
                alpha[:, p - first].clone() if holds_p else None,  # a copy: the row block's α [H, rows, keys] is let go
                recorded.value[:, :keys].float() if holds_p else None,  # as recorded: each kv head once
            )


def replayed_stream(analysis: Analysis, position: int, replay: Callable[[int], torch.Tensor] | None = None) -> Stream:
    """The prompt's residual stream into ``position`` (:func:`~cwviz.core.method.residual.record_stream`): the one the
    analysis's pass kept (``analyze(stream=True)``, :attr:`Analysis.stream`) when it is into ``position``, else from a
    pass that replays the analysis's own attention outputs (``replay(layer)``, default
    :meth:`Analysis.recorded_outputs`): its pass exactly, without computing attention a second time."""
    kept = analysis.stream
    if kept is not None and kept.position == position:
        return kept
    return record_stream(analysis.bundle, analysis.input_ids, position, replay or analysis.recorded_outputs)


def mixing(analysis: Analysis, layer: int, stream: Stream | None = None) -> np.ndarray:
    """M of layer ``layer`` (docs/METHOD.md section 6.1), float32 [query, key + 1], the last column the bias; every
    row sums to 1. ``stream``: the prompt's :func:`~cwviz.core.method.residual.record_stream` when the caller has it."""
    layer = analysis.check_layer(layer)
    # M is the same for every p
    stream = stream or analysis.stream or replayed_stream(analysis, analysis.num_tokens - 1)
    tokens = analysis.num_tokens
    out = np.zeros((tokens, tokens + 1), dtype=np.float32)
    for rows in mixing_row_blocks(analysis, stream, layer):
        out[rows.first : rows.stop, : rows.mix.shape[1]] = rows.mix.cpu().numpy()
        out[rows.first : rows.stop, tokens] = rows.bias.cpu().numpy()
    return out


def rollout(analysis, stream: Stream | None = None) -> np.ndarray:
    """R = M^{L-1} ⋯ M^0 (docs/METHOD.md section 6.2), float32 [query, key + 1], the bias last: row i is position
    i's signed composition from the input tokens; every row sums to 1. T³ a layer: asked for, never implied. The
    product is :func:`cwviz.core.method.baselines.rollout`'s, of each layer's M augmented with a bias row that keeps
    the bias, one layer at a time."""
    stream = stream or analysis.stream or replayed_stream(analysis, analysis.num_tokens - 1)
    tokens = analysis.num_tokens
    with torch.inference_mode():
        device = analysis.layer_device(0)

        def augmented(layer: int) -> torch.Tensor:  # (T + 1, T + 1): M, and the bias row [0 .. 0, 1]
            square = torch.zeros(tokens + 1, tokens + 1, device=device)
            square[:tokens] = torch.from_numpy(mixing(analysis, layer, stream)).to(device)
            square[tokens, tokens] = 1
            return square

        return baselines.rollout(augmented(layer) for layer in range(analysis.num_layers))[:tokens].cpu().numpy()
