"""The route into a prediction: the edges of an attribution that lie on paths from the input tokens to the predicted
position, the graph the Flow page draws and ``cwviz flow --json/--csv`` export (docs/flow.md, "The route").

Pure numpy and pandas: the edges come in as per-layer arrays (``layer, weights, queries, keys, mass``, as
:class:`cwviz.core.method.attribution.LayerEdges` holds them), the route goes out as one table.

**The graph.** Node (l, i): the residual stream at position i entering layer l (l = L: the final residual, where the
prediction at p is read). The edge (l, k → i), k ≠ i, is layer l's attention moving token k's value into position i:
it joins (l, k) to (l + 1, i). The residual carries a position from one layer to the next (the spine, drawn faint),
so a **path to the prediction** is a chain of edges (l1, k → i1), (l2, i1 → i2), ..., (ln, i_{n−1} → p) with
l1 < l2 < ... < ln. A self-edge (k = i) stays on its own position's spine: it routes nothing and is never drawn.

**The rule.** With the cross-token edges (k ≠ i, weight ≠ 0) of every layer and a threshold τ:

1. Top down, l = L − 1 .. 0: R_L = {p}; the layer's drawn edges are those with |weight| ≥ τ whose query i is in
   R_{l+1} (reached at some layer above l); R_l = R_{l+1} ∪ {their keys}. So every drawn edge lies on a path to the
   prediction, and a smaller τ draws a superset.
2. τ is the largest threshold at which the drawn edges carry at least ``kept`` of the cross-token |weight| on paths
   to the prediction (what step 1 draws at τ = 0; for the effect flow of a causal model that is every cross-token
   edge the method kept, as an edge on no path has no effect on the prediction), then raised while more than ``cap``
   edges would be drawn or they would touch more than ``positions`` positions (the top tokens' paths of step 3 may
   add a few beyond).
3. The ``connect`` input tokens with the largest |score| (a score of 0 excepted, and p itself: it is the prediction's
   own spine) are connected whatever τ is: for each, its widest path (the path to the prediction whose smallest |weight|
   is largest) is drawn too. Each such path ends at p, so the rule's property holds for the union.

Shapes: T positions, L layers, E edges a layer (up to the method's kept limit, largest |weight| first).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pandas as pd

from ..core.method import flow_arguments

#: The most edges a route draws (the threshold rises until no more are drawn): the page's graph and the CLI's table.
ROUTE_CAP = 300
#: The most positions a route's edges touch (the threshold rises until no more are): labels a page can still read.
ROUTE_POSITIONS = 32
#: The columns of :attr:`Route.edges` (the page's graph CSV and ``cwviz flow``'s ``edges`` table).
EDGE_COLUMNS = ("layer", "key", "query", "weight", "key_token", "query_token")


class LayerEdgesLike(Protocol):
    """One layer's edges (:class:`cwviz.core.method.attribution.LayerEdges`): ``weights``, ``queries`` i, ``keys`` k
    [E], the edge (layer, k → i); ``mass``: Σ |weight| over every edge of the layer, kept or not."""

    layer: int
    weights: np.ndarray
    queries: np.ndarray
    keys: np.ndarray
    mass: float


class AskedLike(Protocol):
    """What an attribution answers (:class:`cwviz.core.method.flow_tables.Asked`): the prompt's tokens, the position."""

    token_strings: tuple[str, ...]
    position: int


class Attributed(Protocol):
    """An attribution (:class:`cwviz.core.method.attribution.Attribution`): ``scores`` [T], ``edges`` per layer (None:
    a method without edges) and what it answers."""

    scores: np.ndarray
    edges: Sequence[LayerEdgesLike] | None
    asked: AskedLike


@dataclass(frozen=True)
class Route:
    """The drawn route into position ``position``. ``edges``: :data:`EDGE_COLUMNS`, one row a drawn edge (layer, key →
    query), by layer then |weight| (largest first). ``threshold``: τ of the rule (module docstring); ``carried``: the
    drawn edges' Σ |weight| over ``cross_mass``, the cross-token |weight| on paths to the prediction (step 2); ``kept``:
    the kept fraction the setting asked for; ``capped``: the cap raised τ (``carried`` falls short of ``kept``);
    ``connected``: the input tokens the rule connects through their widest paths (the largest |score| first);
    ``self_mass``: Σ |weight| of the self-edges (a position's own value, not drawn); ``mass``: Σ |weight| of every
    edge."""

    position: int
    layers: int
    edges: pd.DataFrame
    threshold: float
    carried: float
    kept: float
    capped: bool
    connected: tuple[int, ...]
    cross_mass: float
    self_mass: float
    mass: float

    @property
    def positions(self) -> list[int]:
        """The positions the route touches (the prediction's always), in the text's order."""
        return sorted({self.position, *map(int, self.edges["key"]), *map(int, self.edges["query"])})

    def reached(self) -> set[int]:
        """The positions joined to the prediction by drawn paths (p itself included): R_0 of the rule."""
        return reached(self.edges, self.position, self.layers)

    def spines(self) -> pd.DataFrame:
        """``position, bottom, top``: the residual each drawn position rides, from its input (layer 0) to its highest
        drawn edge's source (the prediction's: the final residual, layer L)."""
        rows = [(self.position, 0, self.layers)]
        out = self.edges.groupby("key")["layer"].max()
        rows += [(int(k), 0, int(top)) for k, top in out.items() if k != self.position]
        into = set(map(int, self.edges["query"])) - set(map(int, out.index)) - {self.position}
        rows += [(i, 0, int(self.edges.loc[self.edges["query"] == i, "layer"].max()) + 1) for i in sorted(into)]
        return pd.DataFrame(rows, columns=["position", "bottom", "top"]).sort_values("position", ignore_index=True)


def route(
    edges: Sequence[LayerEdgesLike],
    position: int,
    scores: np.ndarray,
    tokens: Sequence[str],
    kept: float,
    connect: int = 3,
    cap: int | None = None,
    positions: int | None = None,
) -> Route:
    """The route of ``edges`` (one entry a layer, layers 0 .. L − 1 in order) into ``position`` p, by the module
    docstring's rule: the kept fraction ``kept`` in (0, 1] of the cross-token |weight|, at most ``cap`` edges touching
    at most ``positions`` positions by threshold (None: no limit), and the ``connect`` tokens with the largest
    |``scores``| ([T]) joined by their widest paths. ``tokens``: the prompt's token strings [T]. ArgumentError for a
    kept fraction outside (0, 1]."""
    kept = flow_arguments.kept(kept)  # the flow API's one rule (a bool, NaN or text refused too)
    layers = len(edges)
    size = len(tokens)
    cross, self_mass, mass = _cross_edges(edges, position)
    total = _carried(cross, position, size, 0.0)  # the cross-token |weight| on any path to the prediction
    threshold = _threshold(cross, position, size, kept * total)
    capped = False
    cap, positions = len(cross) * size * size if cap is None else cap, size if positions is None else positions
    _, count, touched = _draw(cross, position, size, threshold)
    if count > cap or touched > positions:
        threshold, capped = _cap_threshold(cross, position, size, cap, positions), True
    drawn, _, _ = _draw(cross, position, size, threshold)
    sizes = np.abs(np.asarray(scores, np.float64))
    top = [int(k) for k in np.argsort(-sizes, kind="stable") if k != position and sizes[k] > 0][: max(connect, 0)]
    choice = _widest(cross, position, size)
    connected = []
    for k in top:
        path = _path(choice, cross, position, k)
        connected += [k] if path else []
        for layer, index in path:
            drawn[layer][index] = True
    frames = [
        pd.DataFrame({"layer": layer, "key": keys[keep], "query": queries[keep], "weight": weights[keep]})
        for layer, ((weights, queries, keys), keep) in enumerate(zip(cross, drawn, strict=True))
        if keep.any()
    ]
    table = (
        pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["layer", "key", "query", "weight"])
    )
    table = table.astype({"layer": np.int64, "key": np.int64, "query": np.int64, "weight": np.float64})
    table = (
        table.assign(order=-table["weight"].abs()).sort_values(["layer", "order"], kind="stable").drop(columns="order")
    )
    names = np.asarray(tokens, dtype=object)
    table = table.assign(
        key_token=names[table["key"].to_numpy()], query_token=names[table["query"].to_numpy()]
    ).reset_index(drop=True)
    carried = float(table["weight"].abs().sum() / total) if total > 0 else 0.0
    return Route(
        position, layers, table, float(threshold), carried, kept, capped, tuple(connected), total, self_mass, mass
    )


def reached(edges: pd.DataFrame, position: int, layers: int) -> set[int]:
    """R_0 of the rule for a table of edges (``layer, key, query``): the positions from which drawn edges lead, layer
    above layer, into ``position``'s final residual (``position`` itself included)."""
    found = {position}
    for layer in range(layers - 1, -1, -1):
        rows = edges[edges["layer"] == layer]
        found |= {int(k) for k, i in zip(rows["key"], rows["query"], strict=True) if int(i) in found}
    return found


def _cross_edges(edges: Sequence[LayerEdgesLike], position: int) -> tuple[list[tuple[np.ndarray, ...]], float, float]:
    """Each layer's cross-token edges into positions up to p with a weight (``weights, queries, keys``, largest |weight|
    first), the self-edges' Σ |weight| and every edge's (the layers' ``mass``)."""
    cross, self_mass = [], 0.0
    for layer, e in enumerate(edges):
        if e.layer != layer:
            raise ValueError(
                f"the edges of layer {e.layer} are given in place {layer}: give one entry a layer, in order"
            )
        weights, queries, keys = (
            np.asarray(e.weights, np.float64),
            np.asarray(e.queries, np.int64),
            np.asarray(e.keys, np.int64),
        )
        own = queries == keys
        self_mass += float(np.abs(weights[own]).sum())
        keep = ~own & (weights != 0)
        cross.append((weights[keep], queries[keep], keys[keep]))
    return cross, self_mass, float(sum(e.mass for e in edges))


def _draw(cross, position: int, size: int, threshold: float) -> tuple[list[np.ndarray], int, int]:
    """Step 1 of the rule at ``threshold``: each layer's drawn mask [E], the count drawn and the positions they touch
    (R_0: every drawn edge's query is in it)."""
    reach = np.zeros(size, bool)  # R_{l+1}: positions with a path into the prediction from above layer l
    reach[position] = True
    drawn = [np.zeros(0, bool)] * len(cross)
    count = 0
    for layer in range(len(cross) - 1, -1, -1):
        weights, queries, keys = cross[layer]
        keep = (np.abs(weights) >= threshold) & reach[queries]
        drawn[layer] = keep
        reach[keys[keep]] = True
        count += int(keep.sum())
    return drawn, count, int(reach.sum())


def _carried(cross, position: int, size: int, threshold: float) -> float:
    drawn, _, _ = _draw(cross, position, size, threshold)
    return float(sum(np.abs(w[keep]).sum() for (w, _, _), keep in zip(cross, drawn, strict=True)))


def _candidates(cross) -> np.ndarray:
    """Every threshold worth trying: the distinct |weight|s, largest first."""
    sizes = np.concatenate([np.abs(w) for w, _, _ in cross]) if cross else np.zeros(0)
    return np.unique(sizes)[::-1]


def _threshold(cross, position: int, size: int, wanted: float) -> float:
    """The largest τ among the |weight|s whose drawn edges carry at least ``wanted`` (the drawn set grows as τ falls:
    a binary search). With no edge, +inf (nothing drawn)."""
    candidates = _candidates(cross)
    if len(candidates) == 0:
        return float("inf")
    low, high = 0, len(candidates) - 1  # the answer's index: the first candidate that carries enough
    if _carried(cross, position, size, candidates[high]) < wanted * (1 - 1e-9):
        return float(candidates[high])
    while low < high:
        middle = (low + high) // 2
        if _carried(cross, position, size, candidates[middle]) >= wanted * (1 - 1e-9):
            high = middle
        else:
            low = middle + 1
    return float(candidates[low])


def _cap_threshold(cross, position: int, size: int, cap: int, positions: int) -> float:
    """The smallest τ among the |weight|s at which at most ``cap`` edges are drawn, touching at most ``positions``."""
    candidates = _candidates(cross)
    low, high = 0, len(candidates) - 1  # the last index whose count is within the cap
    while low < high:
        middle = (low + high + 1) // 2
        _, count, touched = _draw(cross, position, size, candidates[middle])
        if count <= cap and touched <= positions:
            low = middle
        else:
            high = middle - 1
    return float(candidates[low])


def _widest(cross, position: int, size: int) -> np.ndarray:
    """For every node (l, i), the edge its widest path to the prediction takes out of it (the path whose smallest
    |weight| is largest), as an index into layer l's cross edges, or −1: ride the spine up to (l + 1, i). [L, T].
    best[i]: the widest bottleneck from (l, i), computed top down (the spine carries a position upward, so best at layer
    l is at least best at l + 1; −inf: no path)."""
    layers = len(cross)
    best = np.full(size, -np.inf)
    best[position] = np.inf
    choice = np.full((layers, size), -1, np.int64)
    for layer in range(layers - 1, -1, -1):
        weights, queries, keys = cross[layer]
        through = np.minimum(np.abs(weights), best[queries])
        improves = np.flatnonzero(through > best[keys])
        if improves.size:
            # per key, its widest edge: sorted by key, then by bottleneck (widest first), the first of each key
            ordered = improves[np.lexsort((-through[improves], keys[improves]))]
            first = ordered[np.r_[True, keys[ordered][1:] != keys[ordered][:-1]]]
            best = best.copy()
            best[keys[first]] = through[first]
            choice[layer, keys[first]] = first
    return choice


def _path(choice: np.ndarray, cross, position: int, start: int) -> list[tuple[int, int]]:
    """The widest path from token ``start``'s input to the prediction (:func:`_widest`), as (layer, index into that
    layer's cross edges) pairs; empty when none exists."""
    path, at = [], start
    for layer in range(len(cross)):
        if at == position:
            break
        taken = choice[layer, at]
        if taken >= 0:
            path.append((layer, int(taken)))
            at = int(cross[layer][1][taken])
    return path if at == position else []


def of(result: Attributed, kept: float, cap: int | None = ROUTE_CAP, positions: int | None = ROUTE_POSITIONS) -> Route:
    """The route of an :class:`~cwviz.core.method.attribution.Attribution` (its edges, position, scores and tokens) at
    the kept fraction ``kept``, capped at ``cap`` edges and ``positions`` positions: the one builder of the Flow page's
    graph and of ``cwviz flow``'s ``edges`` table. A method without edges gives an empty route."""
    asked = result.asked
    return route(
        result.edges or (), asked.position, result.scores, asked.token_strings, kept, cap=cap, positions=positions
    )
