"""The route into a prediction (cwviz.analyses.route) on hand-built edge sets: every drawn edge lies on a path to the
prediction, the tokens with the largest |score| are connected, the share asked is carried with the fewest edges the
rule allows, the cap holds, self-edges and zero edges are never drawn."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from cwviz.analyses.route import _carried, _cross_edges, reached, route
from cwviz.core.method.attribution import LayerEdges
from cwviz.core.util.errors import InputError


def _layers(rows: list[tuple[int, int, int, float]], layers: int) -> tuple[LayerEdges, ...]:
    """LayerEdges from (layer, key, query, weight) rows, largest |weight| first; mass: Σ |weight| of the rows."""
    out = []
    for layer in range(layers):
        mine = sorted((r for r in rows if r[0] == layer), key=lambda r: -abs(r[3]))
        weights = np.array([r[3] for r in mine], float)
        out.append(
            LayerEdges(
                layer,
                weights,
                np.array([r[2] for r in mine], np.int64),
                np.array([r[1] for r in mine], np.int64),
                float(np.abs(weights).sum()),
            )
        )
    return tuple(out)


def _on_a_path(table: pd.DataFrame, position: int, layers: int) -> bool:
    """Every row (layer, key → query) ends where a path to the prediction continues: query = p, or a drawn edge out of
    the query at a later layer that is itself on a path (checked top down)."""
    good = {position}  # positions with a path from layer l + 1 upward, as l goes down
    ok = True
    for layer in range(layers - 1, -1, -1):
        rows = table[table["layer"] == layer]
        ok &= all(int(i) in good for i in rows["query"])
        good |= set(map(int, rows["key"]))
    return bool(ok)


TOKENS = ("a", "b", "c", "d", "e")


def test_an_edge_into_a_position_the_prediction_never_reads_is_not_drawn_however_large():
    # p = 4, 2 layers. 1 → 3 in the top layer is the largest edge, but nothing leads from 3 to 4 above it.
    rows = [(1, 1, 3, 9.0), (1, 2, 4, 1.0), (0, 0, 2, 0.5), (0, 3, 4, 0.2)]
    drawn = route(_layers(rows, 2), 4, np.zeros(5), TOKENS, kept=1.0)
    pairs = set(zip(drawn.edges["layer"], drawn.edges["key"], drawn.edges["query"], strict=True))
    assert (1, 1, 3) not in pairs
    assert {(1, 2, 4), (0, 0, 2), (0, 3, 4)} <= pairs
    assert _on_a_path(drawn.edges, 4, 2) and drawn.reached() == {0, 2, 3, 4}


def test_a_path_must_climb_an_edge_below_cannot_continue_through_one_in_the_same_or_a_lower_layer():
    # 0 → 1 in layer 1 and 1 → 4 in layer 0: 0's value reaches 1 after layer 1, too late for layer 0's edge out of 1.
    rows = [(1, 0, 1, 5.0), (0, 1, 4, 5.0)]
    drawn = route(_layers(rows, 2), 4, np.zeros(5), TOKENS, kept=1.0)
    assert list(zip(drawn.edges["layer"], drawn.edges["key"], drawn.edges["query"], strict=True)) == [(0, 1, 4)]


def test_self_edges_and_zero_edges_are_never_drawn_and_their_mass_is_counted_apart():
    rows = [(0, 4, 4, 3.0), (0, 1, 4, 1.0), (0, 2, 4, 0.0), (1, 3, 3, 2.0), (1, 3, 4, -1.0)]
    drawn = route(_layers(rows, 2), 4, np.zeros(5), TOKENS, kept=1.0)
    assert not (drawn.edges["key"] == drawn.edges["query"]).any() and not (drawn.edges["weight"] == 0).any()
    assert drawn.self_mass == 5.0 and drawn.cross_mass == 2.0 and drawn.carried == 1.0


def test_both_signs_are_kept_by_size():
    rows = [(1, 0, 4, -3.0), (1, 1, 4, 2.0), (0, 2, 4, 0.1)]
    drawn = route(_layers(rows, 2), 4, np.zeros(5), TOKENS, kept=0.9)
    assert sorted(drawn.edges["weight"]) == [-3.0, 2.0]
    assert drawn.carried == pytest.approx(5 / 5.1)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("share", [0.1, 0.4, 1.0])
def test_on_random_edge_sets_every_drawn_edge_is_on_a_path_the_share_is_carried_and_the_top_tokens_are_connected(
    seed, share
):
    rng = np.random.default_rng(seed)
    size, layers, position = 12, 6, 10  # position 11 comes after p: a causal model writes nothing into it from p's side
    rows = []
    for layer in range(layers):
        for query in range(size):
            for key in range(query + 1):
                if rng.random() < 0.5:
                    rows.append((layer, key, query, float(rng.normal() * rng.exponential())))
    edges = _layers(rows, layers)
    scores = rng.normal(size=size)
    drawn = route(edges, position, scores, tuple("abcdefghijkl"), kept=share)
    assert _on_a_path(drawn.edges, position, layers)
    top3 = [int(k) for k in np.argsort(-np.abs(scores)) if k != position][:3]
    reachable = route(edges, position, scores, tuple("abcdefghijkl"), kept=1.0, connect=0).reached()
    assert set(drawn.connected) == {k for k in top3 if k in reachable}
    assert {k for k in top3 if k in reachable} <= drawn.reached()
    assert drawn.carried >= share * (1 - 1e-9)
    # the threshold is the largest that carries the share: the next |weight| above it would not
    bare = route(edges, position, scores, tuple("abcdefghijkl"), kept=share, connect=0)
    assert bare.threshold == np.abs(bare.edges["weight"]).min()
    cross, _, _ = _cross_edges(edges, position)
    sizes = np.unique(np.concatenate([np.abs(w) for w, _, _ in cross]))
    above = sizes[sizes > bare.threshold]
    if len(above):
        assert _carried(cross, position, size, above[0]) < share * bare.cross_mass
    assert (drawn.edges["query"] <= position).all()


def test_a_top_token_is_connected_by_its_widest_path_even_below_the_threshold():
    # token 0's only way up is a chain of small edges 0 → 1 (layer 0) → 4 (layer 1); the share is met by 3 → 4.
    rows = [(1, 3, 4, 10.0), (0, 0, 1, 0.01), (1, 1, 4, 0.02), (0, 0, 4, 0.005)]
    scores = np.array([5.0, 0, 0, 1.0, 0])
    drawn = route(_layers(rows, 2), 4, scores, TOKENS, kept=0.5, connect=1)
    pairs = set(zip(drawn.edges["layer"], drawn.edges["key"], drawn.edges["query"], strict=True))
    assert pairs == {(1, 3, 4), (0, 0, 1), (1, 1, 4)}, "the widest path 0 → 1 → 4 (bottleneck 0.01), not 0 → 4 (0.005)"
    assert drawn.connected == (0,) and 0 in reached(drawn.edges, 4, 2)


def test_the_cap_raises_the_threshold_and_says_so():
    rows = [(0, k, 4, float(5 - k)) for k in range(4)]
    drawn = route(_layers(rows, 1), 4, np.zeros(5), TOKENS, kept=1.0, connect=0, cap=2)
    assert len(drawn.edges) == 2 and drawn.capped and drawn.carried == pytest.approx(9 / 14)
    assert list(drawn.edges["key"]) == [0, 1]


def test_the_table_names_its_tokens_and_a_bad_share_is_refused():
    drawn = route(_layers([(0, 1, 4, 2.0)], 1), 4, np.zeros(5), TOKENS, kept=0.5)
    assert list(drawn.edges.columns) == ["layer", "key", "query", "weight", "key_token", "query_token"]
    assert drawn.edges.iloc[0][["key_token", "query_token"]].tolist() == ["b", "e"]
    spines = drawn.spines()
    assert spines.to_dict("records") == [{"position": 1, "bottom": 0, "top": 0}, {"position": 4, "bottom": 0, "top": 1}]
    for share in (0, 1.5, "0.5"):
        with pytest.raises(InputError, match="must lie in"):
            route(_layers([], 1), 4, np.zeros(5), TOKENS, kept=share)


def test_the_positions_limit_raises_the_threshold_until_the_route_touches_few_enough_positions():
    # p = 9; ten tokens each send an edge into p, the larger the closer to p: a limit of 4 positions keeps the 3
    # largest.
    rows = [(0, k, 9, float(k + 1)) for k in range(9)]
    drawn = route(_layers(rows, 1), 9, np.zeros(10), tuple("abcdefghij"), kept=1.0, connect=0, positions=4)
    assert drawn.capped and drawn.positions == [6, 7, 8, 9] and len(drawn.edges) == 3


def test_a_method_without_edges_has_an_empty_route():
    drawn = route((), 4, np.array([1.0, 0, 0, 0, 0]), TOKENS, kept=0.5)
    assert drawn.edges.empty and drawn.connected == () and drawn.carried == 0.0 and drawn.positions == [4]
