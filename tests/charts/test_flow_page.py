"""The Flow page's chart builders (cwviz.charts.flow): the graph draws exactly the pruned edge table (counts and
signs), pruning keeps at least the asked share of each layer's |mass|, the cap and the positions limit keep the
largest edges, the totals' bars are the tokens' totals, red adding and blue subtracting. A tiny model, no downloads."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import cwviz
from cwviz.charts import flow as charts
from cwviz.charts.palette import NEGATIVE, POSITIVE
from tests.helpers import TEXT, make_tiny


@pytest.fixture(scope="module")
def result():
    analysis = cwviz.analyze(make_tiny("llama"), TEXT[:40])
    return cwviz.flow(analysis, target=11, foil=60)


def _graph(result, share: float, **limits) -> charts.Graph:
    return charts.graph_tables(
        result.node_table, result.edges(share), result.tokens, float(result.edge_mass.sum()), result.position, **limits
    )


def _layer_rows(spec: dict, mark: str) -> list[dict]:
    """The rows of the layer of the graph's spec drawn with ``mark`` (rule: the edges, circle: the nodes)."""
    (layer,) = [view for view in spec["layer"] if (view["mark"]["type"] if isinstance(view["mark"], dict) else view["mark"]) == mark]
    return spec["datasets"][layer["data"]["name"]]


@pytest.mark.parametrize("share", [0.3, 0.8, 1.0])
def test_pruning_keeps_at_least_the_asked_share_of_each_layers_mass_and_no_more_edges_than_needed(result, share):
    edges = result.edges(share)
    assert result.edges_complete(share)
    for layer, mass in enumerate(result.edge_mass):
        kept = np.sort(edges.loc[edges["layer"] == layer, "weight"].abs().to_numpy())
        assert kept.sum() >= share * mass * (1 - 1e-6), (layer, kept.sum(), mass)
        assert kept[1:].sum() < share * mass, "without its smallest edge the layer would fall short: no edge more than needed"


@pytest.mark.parametrize("share", [0.3, 0.8])
def test_the_drawn_edges_are_exactly_the_pruned_edge_table(result, share):
    """Without the page's limits, every pruned edge is drawn once, with its sign and weight; every node drawn is an end
    of a drawn edge (or the prediction's), coloured by its value's sign."""
    pruned = result.edges(share)
    graph = _graph(result, share, cap=10**6, positions=10**6)
    spec = charts.route_graph(graph, int(result.nodes.shape[0]) - 1, "graph").to_dict()
    drawn = pd.DataFrame(_layer_rows(spec, "rule"))
    assert len(drawn) == len(pruned) and not graph.capped
    key = ["layer", "source", "target"]
    merged = drawn.merge(pruned, on=key, suffixes=("_drawn", ""), validate="one_to_one")
    assert len(merged) == len(pruned)
    assert np.allclose(merged["weight_drawn"], merged["weight"])
    assert (merged["sign"] == np.where(merged["weight"] >= 0, "adds", "subtracts")).all()
    assert (drawn["sign"] == "subtracts").sum() == (pruned["weight"] < 0).sum()
    assert graph.drawn_mass == pytest.approx(graph.pruned_mass)
    nodes = pd.DataFrame(_layer_rows(spec, "circle"))
    ends = {*zip(drawn["layer"], drawn["source"]), *zip(drawn["layer"] + 1, drawn["target"]), (result.nodes.shape[0] - 1, result.position)}
    assert set(zip(nodes["layer"], nodes["position"])) == ends
    values = result.nodes[nodes["layer"], nodes["position"]]
    assert np.allclose(nodes["value"], values) and (nodes["sign"] == np.where(values >= 0, "adds", "subtracts")).all()


def test_the_cap_and_the_positions_keep_the_largest_edges_among_the_heaviest_positions(result):
    pruned = result.edges(1.0)
    graph = _graph(result, 1.0, cap=25, positions=6)
    edges = graph.edges
    assert len(edges) == 25 and graph.capped and graph.pruned == len(pruned)
    kept = set(edges["source"]) | set(edges["target"])
    assert len(kept) <= 6 and result.position in set(graph.nodes["position"])
    inside = pruned[pruned["source"].isin(kept) & pruned["target"].isin(kept)]
    assert edges["weight"].abs().min() >= inside["weight"].abs().nlargest(25).min() - 1e-9, "the largest edges are drawn"
    assert graph.drawn_mass <= graph.pruned_mass <= graph.mass * (1 + 1e-6)


def test_the_graph_colours_adds_red_and_subtracts_blue_and_a_click_picks_a_node(result):
    spec = charts.route_graph(_graph(result, 0.8), int(result.nodes.shape[0]) - 1, "graph").to_dict()
    for view in spec["layer"]:
        assert view["encoding"]["color"]["scale"] == {"domain": ["adds", "subtracts"], "range": [POSITIVE, NEGATIVE]}
    rule = next(view for view in spec["layer"] if view["mark"]["type"] == "rule")
    assert rule["encoding"]["strokeWidth"]["scale"]["range"][0] >= 1.5, "the thinnest edge is still wide enough to show its colour"
    params = spec.get("params", []) + [p for view in spec["layer"] for p in view.get("params", [])]
    assert any(p.get("name") == charts.NODE_PICK and p["select"]["fields"] == ["layer", "position"] for p in params)


def test_the_totals_bars_are_the_tokens_totals_largest_first_when_there_are_many(result):
    rows = charts.total_rows(result.tokens, "total", rows=8)
    largest = result.tokens.loc[result.tokens["total"].abs().nlargest(8).index]
    assert sorted(rows["position"]) == sorted(largest["position"]) and list(rows["position"]) == sorted(rows["position"])
    spec = charts.totals_bars(rows, "totals", "the 8 largest").to_dict()
    drawn = pd.DataFrame(next(data for data in spec["datasets"].values() if len(data) == 8))
    assert np.allclose(drawn["total"], rows["total"])
    assert (drawn["sign"] == np.where(drawn["total"] >= 0, "adds", "subtracts")).all()
    every = charts.total_rows(result.tokens, "total", rows=len(result.tokens))
    assert len(every) == len(result.tokens)


def test_the_sidebars_node_is_ringed_where_the_graph_has_it(result):
    graph = _graph(result, 0.8)
    layer, position = int(graph.edges["layer"].iloc[-1]), int(graph.edges["source"].iloc[-1])
    spec = charts.route_graph(graph, int(result.nodes.shape[0]) - 1, "graph", selected=(layer, position)).to_dict()
    (ring,) = [view for view in spec["layer"] if view["mark"]["type"] == "point"]
    assert spec["datasets"][ring["data"]["name"]] == [{"layer": layer, "label": f"{position} {result.token_strings[position]}"}]
    unringed = charts.route_graph(graph, int(result.nodes.shape[0]) - 1, "graph", selected=(99, 99)).to_dict()
    assert len(unringed["layer"]) == 2
