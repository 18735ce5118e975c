"""The row-block policy: how many query rows of a T x T map cwviz computes at a time, and why.

Every T x T quantity is made a block of query rows at a time, for one of three reasons, each with its own
constants:

* **Reading a layer** (:meth:`cwviz.Analysis.row_blocks`, the one pass of :func:`cwviz.analyze`): a block bounds
  the working memory, so its height is :func:`read_block_rows`: :func:`row_block_cells` cells a head (T keys a
  row), and in a causal layer at least :data:`READ_MIN_BLOCKS` blocks of at least :data:`READ_MIN_ROWS` rows,
  because block b needs the keys up to its last row only: the more blocks, the closer the keys left out come
  to half the map. :func:`block_groups` then gathers short blocks so that the one pass makes their query side
  in one product.
* **A whole causal map** (:func:`triangle_blocks`: :meth:`cwviz.Analysis.layer`'s attention and contributions):
  the output is the whole [head, T, T] map anyway, so the blocks only skip the upper triangle; each block is a
  few kernel calls, so they are few and tall: at least :data:`TRIANGLE_MIN_ROWS` rows, at most
  :data:`TRIANGLE_MAX_BLOCKS` blocks.
* **The weighted values of the eager path** (interventions, soft-capped or learned-sink layers:
  :func:`weighted_block_rows`): :data:`WEIGHTED_BLOCK_CELLS` cells (batch x heads x rows x keys) at once.

Pure integer arithmetic: nothing here imports the rest of cwviz.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

#: Cells a head's block of query rows holds when a layer is read in blocks: [head, rows, T] at a time, never the
#: layer's T x T maps. No other height made the one pass faster on a two-core CPU (BENCHMARKS.md, "Block heights").
ROW_BLOCK_CELLS = 1 << 18
#: The same on a CUDA device, where a block is a handful of kernel launches and a larger one keeps the device
#: busy: 128 rows a block at 32k tokens (a 32-head block's maps about 6 GB), where 2^18 cells would be 8.
ROW_BLOCK_CELLS_GPU = 1 << 22
#: A causal layer is read in at least this many row blocks, so that the keys its blocks leave out (those after a
#: block's last row) come to about half: reading the layer costs about (1 + 1 / blocks) / 2 of the dense maps.
READ_MIN_BLOCKS = 8
#: ... each of at least this many rows, so that a short prompt's blocks are not so thin that their products are
#: all overhead.
READ_MIN_ROWS = 32
#: A whole causal map's lower triangle is computed in blocks of at least this many rows ...
TRIANGLE_MIN_ROWS = 64
#: ... and at most this many blocks: the map is made whole anyway, so blocks only skip the upper triangle, and
#: fewer, taller blocks mean fewer kernel calls (on a GPU above all).
TRIANGLE_MAX_BLOCKS = 16
#: Attention cells (batch x heads x rows x keys) the eager path's weighted values compute at once: its float32
#: working set stays near 64 MB a block whatever the prompt's length.
WEIGHTED_BLOCK_CELLS = 1 << 24


def row_block_cells(device: torch.device | str) -> int:
    """Cells a head's row block holds on ``device``: :data:`ROW_BLOCK_CELLS_GPU` on CUDA, else :data:`ROW_BLOCK_CELLS`."""
    return ROW_BLOCK_CELLS_GPU if torch.device(device).type == "cuda" else ROW_BLOCK_CELLS


def block_cells(tokens: int, device: torch.device | str = "cpu") -> int:
    """Cells a head's row block of a dense layer holds on ``device``: its rows x the T keys (the memory estimate's
    block, and the most a group of :func:`block_groups` holds)."""
    return tokens * min(tokens, max(1, row_block_cells(device) // tokens))


def read_block_rows(num_tokens: int, causal: bool, device: torch.device | str) -> int:
    """Query rows a block when a layer of ``num_tokens`` tokens is read in row blocks (the module docstring)."""
    rows = max(1, row_block_cells(device) // num_tokens)
    if causal:
        rows = min(rows, max(READ_MIN_ROWS, -(-num_tokens // READ_MIN_BLOCKS)))
    return rows


def triangle_blocks(num_tokens: int, rows: int | None = None) -> list[tuple[int, int]]:
    """[start, end) row blocks of a whole causal T x T map: rows start..end-1 need keys 0..end-1 only.

    Computing each block against its keys only costs (1 + rows / T) / 2 of the dense product. Blocks are
    :data:`TRIANGLE_MIN_ROWS` tall, or taller so that there are at most :data:`TRIANGLE_MAX_BLOCKS`.
    """
    rows = rows or max(TRIANGLE_MIN_ROWS, -(-num_tokens // TRIANGLE_MAX_BLOCKS))
    return [(start, min(start + rows, num_tokens)) for start in range(0, num_tokens, rows)]


def weighted_block_rows(batch: int, heads: int, num_keys: int) -> int:
    """Query rows a block of the eager path's weighted values: :data:`WEIGHTED_BLOCK_CELLS` cells at once."""
    return max(1, WEIGHTED_BLOCK_CELLS // max(1, batch * heads * num_keys))


def block_groups(blocks: Iterable[tuple[int, int, int]], cells: int) -> Iterator[list[tuple[int, int, int]]]:
    """Consecutive ``(first, stop, keys)`` row blocks in groups whose blocks hold at most ``cells`` cells a head
    together (a block larger than that is a group of its own).

    The one pass keeps a group's α while it makes the group's query side in one product instead of one a block:
    a causal layer's short prompt is read in :data:`READ_MIN_BLOCKS` blocks of a few rows, whose query sides are
    small, slow products. With ``cells`` = :func:`block_cells`, a group's α is at most one dense block's map,
    which the memory estimate counts.
    """
    group: list[tuple[int, int, int]] = []
    held = 0
    for first, stop, keys in blocks:
        size = (stop - first) * keys
        if group and held + size > cells:
            yield group
            group, held = [], 0
        group.append((first, stop, keys))
        held += size
    if group:
        yield group
