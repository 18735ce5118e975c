"""The largest edges of one layer of a flow, kept as its row blocks stream (:mod:`cwviz.core.method.flow`'s share flow
and :mod:`cwviz.core.method.attribution`'s effect flow keep theirs with it): an edge k → i runs from its start, key
position k, to its end, query position i (docs/METHOD.md, the glossary)."""

from __future__ import annotations

import numpy as np
import torch


class LargestEdges:
    """The ``limit`` largest |weight| edges of one layer, kept as its row blocks stream: a block's entries above the
    running threshold (the limit-th largest |weight| so far) join a buffer, cut back to the limit when it doubles."""

    def __init__(self, limit: int) -> None:
        self.limit, self.threshold, self.size = limit, 0.0, 0
        self.weights: list[torch.Tensor] = []
        self.ends: list[torch.Tensor] = []  # query positions i
        self.starts: list[torch.Tensor] = []  # key positions k

    def add(self, flows: torch.Tensor, first: int) -> float:
        """Offer a row block's edges ``flows`` [rows, keys] (rows from ``first``); returns their total |weight|."""
        size = flows.abs()
        picked = size > self.threshold
        where = picked.nonzero()  # (n, 2): the edge's end (a row), its start (a key)
        if len(where):
            self.weights.append(flows[picked].cpu())
            self.ends.append(where[:, 0].cpu() + first)
            self.starts.append(where[:, 1].cpu())
            self.size += len(where)
            if self.size > 2 * self.limit:
                self._cut()
        return float(size.sum())

    def _cut(self, ordered: bool = False) -> None:
        """Keep the ``limit`` largest; sorted, largest first, when ``ordered`` (sorting is most of a cut's cost)."""
        empty = torch.zeros(0, dtype=torch.long)
        weights = torch.cat(self.weights) if self.weights else torch.zeros(0)
        ends = torch.cat(self.ends) if self.ends else empty
        starts = torch.cat(self.starts) if self.starts else empty
        size = -weights.abs().numpy()  # the buffers are on the CPU; numpy's partition and sort are the fastest there
        keep = min(self.limit, len(size))
        order = np.argpartition(size, keep - 1)[:keep] if 0 < keep < len(size) else np.arange(keep)
        if ordered:
            order = order[np.argsort(size[order])]
        order = torch.from_numpy(order)
        self.weights, self.ends, self.starts = [weights[order]], [ends[order]], [starts[order]]
        self.size = len(order)
        if self.limit and self.size == self.limit:
            self.threshold = float(-size[order].max())

    def result(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(weights, ends i, starts k), largest |weight| first."""
        self._cut(ordered=True)
        return self.weights[0], self.ends[0], self.starts[0]
