"""A recorded layer read in row blocks (contiguous ranges of query rows; :mod:`cwviz.core.method.row_block_sizes` sets
their height): the row blocks, their attention, the layer's record prepared for them, and the one pass.

:class:`cwviz.Analysis` reads its layers this way after the pass (:mod:`cwviz.core.method.records_reader`); the one
pass (:func:`row_block_attend`, ``analyze(each_row_block=...)``) does during it, so that reading every layer costs no
second round of scores and softmax.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import torch

from ..loading.models import Bundle
from .attention import causal_rows
from .capture import Attend, LayerRecord
from .measures import (
    LayerMeasures,
    check_kinds,
    expand_kv,
    grouped_matmul,
    kv_copies,
    layer_measures,
    query_side,
    value_norms,
)
from .row_block_sizes import RowBlock, row_block_cells, row_block_groups, row_block_height

#: What :func:`cwviz.analyze` calls for each row block of each layer during the pass: ``(layer, first, stop,
#: measures)``.
RowBlockConsumer = Callable[[int, int, int, LayerMeasures], None]


def attention_rows(rec: LayerRecord, first: int, stop: int, keys: int) -> torch.Tensor:
    """α of ``rec``'s query rows ``first..stop-1`` over the keys ``0..keys-1``, float32 [head, rows, keys]."""
    with torch.inference_mode():
        query, key = rec.query[:, first:stop].float(), rec.key[:, :keys].float()
        if rec.mask is None and rec.causal and rec.plain:
            return causal_rows(query, key, rec.scaling, first, rec.copies)
        # The general path: the rows' own mask (causal, sliding window or the model's), soft-capping, learned sinks.
        mask = rec.key_mask(first, stop)[:, :keys] if rec.mask is not None or rec.causal else None  # (rows, keys)
        return rec.probabilities(query, key[:: rec.copies], mask, False)


def for_row_blocks(rec: LayerRecord) -> LayerRecord:
    """``rec`` prepared for reading in row blocks: float32 queries, and float32 keys and values that hold each kv
    head :func:`~cwviz.core.method.measures.kv_copies` times in a row (contiguous; O(T d) a layer), so that each of a
    row block's batched products (scores, α v, contributions) spreads evenly over the CPU threads (a bmm on the CPU
    hands whole batch entries to its threads). The other fields are ``rec``'s."""
    heads, kv_heads = rec.query.shape[0], rec.key.shape[0]
    copies = kv_copies(kv_heads, heads, rec.query.device)
    held = kv_heads * copies  # expand_kv repeats each kv head held / kv_heads times in a row
    return dataclasses.replace(
        rec,
        query=rec.query.float().contiguous(),
        key=expand_kv(rec.key.float(), held).contiguous(),
        value=expand_kv(rec.value.float(), held).contiguous(),
        copies=copies,
    )


def record_row_blocks(rec: LayerRecord, start: int = 0) -> Iterator[RowBlock]:
    """The row blocks of the layer ``rec`` records, from query row ``start`` on, each against the keys its rows can
    see in a causal layer (else all T)."""
    num_tokens = rec.query.shape[-2]
    height = row_block_height(num_tokens, rec.causal, rec.query.device)
    for first in range(start, num_tokens, height):
        stop = min(num_tokens, first + height)
        keys = num_tokens
        if rec.causal and (rec.mask is None or not rec.key_mask(first, stop)[:, stop:].any()):
            keys = stop
        yield RowBlock(first, stop, keys)


def row_block_attend(bundle: Bundle, each_row_block: RowBlockConsumer | None, kinds: tuple[str, ...]) -> Attend | None:
    """The :class:`~cwviz.core.method.capture.Attend` of the one pass: a layer's z from its row blocks, each row
    block's measures (the contribution ``kinds``) handed to ``each_row_block`` on the way; None without
    ``each_row_block``.

    Each row block's α is computed once, for the measures and for z = α v (float32, then the model's dtype), which
    the model continues with instead of SDPA's: equal to rounding. The row blocks of a group
    (:func:`~cwviz.core.method.row_block_sizes.row_block_groups`) make their query side in one product.
    """
    kinds = check_kinds(kinds)
    if each_row_block is None:
        return None

    def attend(layer: int, rec: LayerRecord) -> torch.Tensor:
        gram = bundle.gram(layer).to(rec.value.device)
        norms = value_norms(rec.value, gram, bundle.info.heads)  # (H, T)
        rec = for_row_blocks(rec)
        heads, num_tokens, _ = rec.query.shape
        z = rec.value.new_empty(heads, num_tokens, rec.value.shape[-1])  # (H, T, d), float32 as for_row_blocks made v
        for group in row_block_groups(record_row_blocks(rec), row_block_cells(num_tokens, rec.value.device)):
            alphas = []
            for first, stop, keys in group:
                alphas.append(alpha := attention_rows(rec, first, stop, keys))  # (H, rows, keys)
                z[:, first:stop] = grouped_matmul(alpha, rec.value[:, :keys], rec.copies)
            start = group[0].first
            side = query_side(z[:, start : group[-1].stop], gram)  # one product for the group's rows
            for (first, stop, keys), alpha in zip(group, alphas):
                measures = layer_measures(
                    alpha,
                    rec.value[:, :keys],
                    gram=gram,
                    value_norm=norms[:, :keys],
                    side=side.rows(first - start, stop - start),
                    kinds=kinds,
                    copies=rec.copies,
                )
                each_row_block(layer, first, stop, measures)
        return z

    return attend
