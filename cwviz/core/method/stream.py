"""The one pass: :func:`cwviz.analyze` with ``each_block`` computes each attention layer's output from its row
blocks, handing each block's measures to the caller on the way, so that reading every layer costs no second
round of scores and softmax."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..loading.models import Bundle
from .blocks import block_cells, block_groups
from .capture import Attend, LayerRecord
from .measures import LayerMeasures, check_kinds, grouped_matmul, layer_measures, query_side, value_norms
from .reading import attention_rows, for_blocks, record_blocks

#: What :func:`cwviz.analyze` calls for each row block of each layer during the pass: ``(layer, first, stop, measures)``.
BlockConsumer = Callable[[int, int, int, LayerMeasures], None]


def block_streamer(bundle: Bundle, each_block: BlockConsumer | None, kinds: tuple[str, ...]) -> Attend | None:
    """The :class:`~cwviz.core.method.capture.Attend` of the one pass: a layer's z from its row blocks, each block's
    measures (the contribution ``kinds``) handed to ``each_block`` on the way; None without ``each_block``.

    Each block's α is computed once, for the measures and for z = α v (float32, then the model's dtype), which
    the model continues with instead of SDPA's: equal to rounding. The blocks of a group
    (:func:`~cwviz.core.method.blocks.block_groups`) make their query side in one product.
    """
    kinds = check_kinds(kinds)
    if each_block is None:
        return None

    def attend(layer: int, rec: LayerRecord) -> torch.Tensor:
        gram = bundle.gram(layer).to(rec.value.device)
        norms = value_norms(rec.value, gram, bundle.info.heads)
        rec = for_blocks(rec)
        heads, num_tokens, _ = rec.query.shape
        z = torch.empty(heads, num_tokens, rec.value.shape[-1], dtype=torch.float32, device=rec.value.device)  # (H, T, d)
        for group in block_groups(record_blocks(rec), block_cells(num_tokens, rec.value.device)):
            alphas = []
            for first, stop, keys in group:
                alphas.append(alpha := attention_rows(rec, first, stop, keys))
                z[:, first:stop] = grouped_matmul(alpha, rec.value[:, :keys], rec.copies)
            start = group[0][0]
            side = query_side(z[:, start : group[-1][1]], gram)  # one product for the group's rows
            for (first, stop, keys), alpha in zip(group, alphas):
                rows_side = side.rows(first - start, stop - start)
                measures = layer_measures(
                    alpha, rec.value[:, :keys], gram=gram, value_norm=norms[:, :keys], side=rows_side, kinds=kinds, copies=rec.copies
                )
                each_block(layer, first, stop, measures)
        return z

    return attend
