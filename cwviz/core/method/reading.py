"""A recorded layer read in row blocks (:mod:`cwviz.core.method.blocks` sets their size): the blocks, their attention,
and the layer's record prepared for them. :class:`cwviz.Analysis` reads its layers this way after the pass, and
the one pass (:mod:`cwviz.core.method.stream`) during it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import torch

from .attention import causal_rows
from .blocks import read_block_rows
from .capture import LayerRecord
from .measures import expand_kv, kv_copies


def attention_rows(rec: LayerRecord, start: int, stop: int, keys: int) -> torch.Tensor:
    """α of ``rec``'s query rows ``start..stop-1`` over the keys ``0..keys-1``, float32 [head, rows, keys]."""
    with torch.inference_mode():
        query, key = rec.query[:, start:stop].float(), rec.key[:, :keys].float()
        if rec.mask is None and rec.causal and rec.plain:
            return causal_rows(query, key, rec.scaling, start, rec.copies)
        # The general path: the rows' own mask (causal, sliding window or the model's), soft-capping, learned sinks.
        mask = rec.key_mask(start, stop)[:, :keys] if rec.mask is not None or rec.causal else None  # (W, K)
        return rec.probabilities(query, key[:: rec.copies], mask, False)


def for_blocks(rec: LayerRecord) -> LayerRecord:
    """``rec`` prepared for reading in row blocks: float32 queries, and float32 keys and values that hold each kv
    head :func:`~cwviz.core.method.measures.kv_copies` times in a row (contiguous; O(T d) a layer), so that each of a
    block's batched products (scores, α v, contributions) spreads evenly over the CPU threads (a bmm on the CPU
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


def record_blocks(rec: LayerRecord, start: int = 0) -> Iterator[tuple[int, int, int]]:
    """``(first, stop, keys)`` of the row blocks of the layer ``rec`` records, from row ``start`` on: query rows
    ``first..stop-1`` against the keys ``0..keys-1`` (in a causal layer, the keys they can see)."""
    num_tokens = rec.query.shape[-2]
    block = read_block_rows(num_tokens, rec.causal, rec.query.device)
    for first in range(start, num_tokens, block):
        stop = min(num_tokens, first + block)
        keys = num_tokens
        if rec.causal and (rec.mask is None or not rec.key_mask(first, stop)[:, stop:].any()):
            keys = stop
        yield first, stop, keys
