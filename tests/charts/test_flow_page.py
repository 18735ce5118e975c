"""The Flow page's chart builders (cwviz.charts.flow): the graph draws exactly the route's edges (one rule each, its
sign and weight), a spine per drawn position and the nodes at the edges' ends; red adds and blue subtracts; the totals'
bars are the tokens' scores. The route of a tiny model's effect flow, no downloads."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import cwviz
from cwviz.analyses import route
from cwviz.charts import flow as charts
from cwviz.charts.palette import NEGATIVE, POSITIVE
from cwviz.core.method import attribution
from tests.helpers import TEXT, make_tiny


@pytest.fixture(scope="module")
def shown():
    analysis = cwviz.analyze(make_tiny("llama"), TEXT[:40])
    return attribution.attribute(analysis, "effect", target=11, foil=60)


def _layer_rows(spec: dict, mark: str, field: str | None = None) -> list[dict]:
    """The rows of the graph's layer drawn with ``mark`` (and, for rules, its x2 ``field``: the edges' query_label)."""
    views = [
        view
        for view in spec["layer"]
        if (view["mark"]["type"] if isinstance(view["mark"], dict) else view["mark"]) == mark
    ]
    if field is not None:
        views = [view for view in views if view["encoding"].get("x2", {}).get("field") == field]
    (view,) = views
    return spec["datasets"][view["data"]["name"]]


@pytest.mark.parametrize("share", [0.2, 0.6, 1.0])
def test_the_graph_draws_exactly_the_routes_edges_with_their_signs_spines_and_ends(shown, share):
    drawn = route.of(shown, share)
    layers = len(shown.edges)
    tables = charts.route_tables(drawn, shown.asked.token_strings)
    spec = charts.route_graph(tables, layers, "graph").to_dict()
    rules = pd.DataFrame(_layer_rows(spec, "rule", "query_label"))
    assert len(rules) == len(drawn.edges) > 0
    merged = rules.merge(drawn.edges, on=["layer", "key", "query"], suffixes=("_drawn", ""), validate="one_to_one")
    assert len(merged) == len(drawn.edges) and np.allclose(merged["weight_drawn"], merged["weight"])
    assert (merged["sign"] == np.where(merged["weight"] >= 0, "adds", "subtracts")).all()
    assert (merged["top"] == merged["layer"] + 1).all()
    nodes = pd.DataFrame(_layer_rows(spec, "circle"))
    ends = {
        *zip(rules["layer"], rules["key"]),
        *zip(rules["top"], rules["query"]),
        *((0, p) for p in drawn.positions),
        (layers, drawn.position),
    }
    assert set(zip(nodes["layer"], nodes["position"])) == ends
    assert nodes.loc[nodes["role"] == "prediction", ["layer", "position"]].values.tolist() == [[layers, drawn.position]]
    spines = pd.DataFrame(spec["datasets"][spec["layer"][0]["data"]["name"]])  # the first layer: the spines
    assert set(spines["position"]) == set(drawn.positions) and (spines["bottom"] == 0).all()
    top = spines.set_index("position")["top"]
    assert top[drawn.position] == layers
    for key, layer in drawn.edges.groupby("key")["layer"].max().items():
        assert key == drawn.position or top[key] == layer, "a position's spine reaches its highest edge out"


def test_the_graph_colours_adds_red_and_subtracts_blue_and_a_click_picks_a_node(shown):
    tables = charts.route_tables(route.of(shown, 0.8), shown.asked.token_strings)
    spec = charts.route_graph(tables, len(shown.edges), "graph").to_dict()
    edges = next(view for view in spec["layer"] if view["encoding"].get("x2", {}).get("field") == "query_label")
    assert edges["encoding"]["color"]["scale"] == {"domain": ["adds", "subtracts"], "range": [POSITIVE, NEGATIVE]}
    assert edges["encoding"]["strokeWidth"]["scale"]["range"][0] >= 1.5, (
        "the thinnest edge is still wide enough to show its colour"
    )
    params = spec.get("params", []) + [p for view in spec["layer"] for p in view.get("params", [])]
    assert any(p.get("name") == charts.NODE_PICK and p["select"]["fields"] == ["layer", "position"] for p in params)


def test_the_totals_bars_are_the_tokens_scores_largest_first_when_there_are_many(shown):
    tokens = shown.tokens_table()
    rows = charts.total_rows(tokens, "score", rows=8)
    largest = tokens.loc[tokens["score"].abs().nlargest(8).index]
    assert sorted(rows["position"]) == sorted(largest["position"]) and list(rows["position"]) == sorted(
        rows["position"]
    )
    spec = charts.totals_bars(rows, "scores", "the 8 largest", "score").to_dict()
    drawn = pd.DataFrame(next(data for data in spec["datasets"].values() if len(data) == 8))
    assert np.allclose(drawn["score"], rows["score"])
    assert (drawn["sign"] == np.where(drawn["score"] >= 0, "adds", "subtracts")).all()


def test_the_sidebars_node_is_ringed_where_the_graph_has_it(shown):
    drawn = route.of(shown, 0.8)
    tables = charts.route_tables(drawn, shown.asked.token_strings)
    layer, position = int(drawn.edges["layer"].iloc[0]), int(drawn.edges["key"].iloc[0])
    spec = charts.route_graph(tables, len(shown.edges), "graph", selected=(layer, position)).to_dict()
    (ring,) = [view for view in spec["layer"] if view["mark"]["type"] == "point"]
    assert spec["datasets"][ring["data"]["name"]] == [
        {"layer": layer, "label": f"{position} {shown.asked.token_strings[position]}"}
    ]
    unringed = charts.route_graph(tables, len(shown.edges), "graph", selected=(99, 99)).to_dict()
    assert len(unringed["layer"]) == 3
