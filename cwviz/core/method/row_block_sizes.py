"""The row-block policy: how many query rows of a T x T map cwviz computes at a time, and why.

Every T x T quantity is made a row block (a contiguous range of query rows) at a time, for one of three reasons,
each with its own constants:

* **Reading a layer** (:meth:`cwviz.Analysis.row_blocks`, the one pass of :func:`cwviz.analyze`): a row block bounds
  the working memory, so its height is :func:`row_block_height`: :func:`cell_budget` cells a head (T keys a row),
  and in a causal layer at least :data:`READ_MIN_ROW_BLOCKS` row blocks of at least :data:`READ_MIN_ROWS` rows,
  because row block b needs the keys up to its last row only: the more row blocks, the closer the keys left out come
  to half the map. :func:`row_block_groups` then gathers short row blocks so that the one pass makes their query side
  in one product.
* **A whole causal map** (:func:`triangle_row_blocks`: :meth:`cwviz.Analysis.layer`'s attention and contributions):
  the output is the whole [head, T, T] map anyway, so the row blocks only skip the upper triangle; each is a few
  kernel calls, so they are few and tall: at least :data:`TRIANGLE_MIN_ROWS` rows, at most
  :data:`TRIANGLE_MAX_ROW_BLOCKS` row blocks.
* **The weighted values of the eager path** (interventions, soft-capped or learned-sink layers:
  :func:`weighted_row_block_height`): :data:`WEIGHTED_ROW_BLOCK_CELLS` cells (batch x heads x rows x keys) at once.

Pure integer arithmetic: nothing here imports the rest of cwviz.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple

import torch

#: Cells a head's row block holds when a layer is read in row blocks: [head, rows, T] at a time, never the layer's
#: T x T maps. No other height made the one pass faster on a two-core CPU (BENCHMARKS.md, "Block heights").
ROW_BLOCK_CELLS = 1 << 18
#: The same on a CUDA device, where a row block is a handful of kernel launches and a larger one keeps the device
#: busy: 128 rows a row block at 32k tokens (a 32-head row block's maps about 6 GB), where 2^18 cells would be 8.
ROW_BLOCK_CELLS_GPU = 1 << 22
#: A causal layer is read in at least this many row blocks, so that the keys they leave out (those after a row
#: block's last row) come to about half: reading the layer costs about (1 + 1 / row blocks) / 2 of the dense maps.
READ_MIN_ROW_BLOCKS = 8
#: ... each of at least this many rows, so that a short prompt's row blocks are not so thin that their products are
#: all overhead.
READ_MIN_ROWS = 32
#: A whole causal map's lower triangle is computed in row blocks of at least this many rows ...
TRIANGLE_MIN_ROWS = 64
#: ... and at most this many row blocks: the map is made whole anyway, so they only skip the upper triangle, and
#: fewer, taller row blocks mean fewer kernel calls (on a GPU above all).
TRIANGLE_MAX_ROW_BLOCKS = 16
#: Attention cells (batch x heads x rows x keys) the eager path's weighted values compute at once: its float32
#: working set stays near 64 MB a row block whatever the prompt's length.
WEIGHTED_ROW_BLOCK_CELLS = 1 << 24


class RowBlock(NamedTuple):
    """Query rows ``first..stop-1`` of a layer read against the keys ``0..keys-1`` (in a causal layer, the keys
    those rows can see; else all T). A named tuple rather than a dataclass: three integers that every reader
    unpacks as ``first, stop, keys``."""

    first: int
    stop: int
    keys: int


def cell_budget(device: torch.device | str) -> int:
    """Cells a head's row block may hold on ``device``: :data:`ROW_BLOCK_CELLS_GPU` on CUDA, else
    :data:`ROW_BLOCK_CELLS`."""
    return ROW_BLOCK_CELLS_GPU if torch.device(device).type == "cuda" else ROW_BLOCK_CELLS


def row_block_cells(tokens: int, device: torch.device | str = "cpu") -> int:
    """Cells a head's row block of a dense layer of ``tokens`` tokens holds on ``device``: its rows x the T keys
    (the memory estimate's row block, and the most a group of :func:`row_block_groups` holds)."""
    return tokens * min(tokens, max(1, cell_budget(device) // tokens))


def row_block_height(num_tokens: int, causal: bool, device: torch.device | str) -> int:
    """Query rows a row block holds when a layer of ``num_tokens`` tokens is read in row blocks (the module
    docstring)."""
    rows = max(1, cell_budget(device) // num_tokens)
    if causal:
        rows = min(rows, max(READ_MIN_ROWS, -(-num_tokens // READ_MIN_ROW_BLOCKS)))
    return rows


def triangle_row_blocks(num_tokens: int, rows: int | None = None) -> list[tuple[int, int]]:
    """[start, end) row blocks of a whole causal T x T map: rows start..end-1 need keys 0..end-1 only.

    Computing each against its keys only costs (1 + rows / T) / 2 of the dense product. Row blocks are
    :data:`TRIANGLE_MIN_ROWS` tall, or taller so that there are at most :data:`TRIANGLE_MAX_ROW_BLOCKS`.
    """
    rows = rows or max(TRIANGLE_MIN_ROWS, -(-num_tokens // TRIANGLE_MAX_ROW_BLOCKS))
    return [(start, min(start + rows, num_tokens)) for start in range(0, num_tokens, rows)]


def weighted_row_block_height(batch: int, heads: int, num_keys: int) -> int:
    """Query rows a row block of the eager path's weighted values: :data:`WEIGHTED_ROW_BLOCK_CELLS` cells at
    once."""
    return max(1, WEIGHTED_ROW_BLOCK_CELLS // max(1, batch * heads * num_keys))


def row_block_groups(row_blocks: Iterable[RowBlock], cells: int) -> Iterator[list[RowBlock]]:
    """Consecutive row blocks in groups that hold at most ``cells`` cells a head together (a row block larger than
    that is a group of its own).

    The one pass keeps a group's α while it makes the group's query side in one product instead of one a row block:
    a causal layer's short prompt is read in :data:`READ_MIN_ROW_BLOCKS` row blocks of a few rows, whose query sides
    are small, slow products. With ``cells`` = :func:`row_block_cells`, a group's α is at most one dense row block's
    map, which the memory estimate counts.
    """
    group: list[RowBlock] = []
    held = 0
    for block in row_blocks:
        size = (block.stop - block.first) * block.keys
        if group and held + size > cells:
            yield group
            group, held = [], 0
        group.append(block)
        held += size
    if group:
        yield group
