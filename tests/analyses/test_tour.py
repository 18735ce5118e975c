"""The guided tour's picks (cwviz.analyses.tour): each step shows what the analysis says it should, on any model
and prompt; and the links to the full pages (cwviz.app.links) carry the pages' own URL parameters."""

from __future__ import annotations

import math
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pandas as pd
import pytest

from cwviz import analyze
from cwviz.analyses import sinks, tables, tour
from cwviz.app import links, state
from cwviz.app.services import Request
from cwviz.core.method import blocks
from tests.helpers import TEXT, make_tiny


def _plan(analysis) -> tour.TourPlan:
    table = sinks.sink_table(analysis, sinks.DEFAULT_SINK)
    return tour.plan(analysis, tables.head_summary(analysis), sinks.sink_layer_summary(table), sinks.sink_head_summary(table))


def _most_negative(analysis, layer: int, head: int) -> float:
    """The smallest intra-head contribution of ``head`` off the sink column, over queries that see two keys or more
    (the whole map at once, as the tour's row blocks must agree with)."""
    contribution = analysis.contributions(layer, tour.KIND)[head]  # (query, key)
    visible = analysis.key_mask(layer).cpu().numpy()
    cells = visible & (visible.sum(-1, keepdims=True) > 1)
    cells[:, sinks.DEFAULT_SINK] = False
    return float(np.where(cells, contribution, np.inf).min())


@pytest.fixture(scope="module", params=["llama", "gpt2", "bert"])
def tiny_plan(request):
    analysis = analyze(make_tiny(request.param), TEXT)
    return analysis, _plan(analysis)


def test_the_layer_is_where_attention_overstates_the_sink_most(tiny_plan):
    analysis, plan = tiny_plan
    layers = sinks.sink_layer_summary(sinks.sink_table(analysis, sinks.DEFAULT_SINK))
    gap = layers["sink_attention_share"] - layers["sink_contribution_share"]
    assert plan.layer.layer == int(layers.loc[gap.idxmax(), "layer"])
    assert plan.layer.attention_share - plan.layer.contribution_share == pytest.approx(gap.max())
    assert plan.sink == 0 and plan.sink_token == analysis.tokens[0]
    assert plan.causal == analysis.info.causal


def test_the_head_has_the_largest_sink_attention_of_its_layer(tiny_plan):
    analysis, plan = tiny_plan
    summary = tables.head_summary(analysis)
    rows = summary[summary["layer"] == plan.layer.layer]
    assert plan.head_sink_attention == pytest.approx(rows["sink_attention"].max())
    assert rows.loc[rows["head"] == plan.head, "sink_attention"].item() == rows["sink_attention"].max()


def test_the_negative_key_is_the_most_negative_cell_and_its_factors_multiply_out(tiny_plan):
    analysis, plan = tiny_plan
    neg, layer = plan.negative, plan.layer.layer
    contribution = analysis.contributions(layer, tour.KIND)[neg.head]
    assert neg.key != sinks.DEFAULT_SINK and neg.query >= 1
    assert analysis.key_mask(layer)[neg.query, neg.key]  # a key the query can see
    assert neg.contribution == pytest.approx(float(contribution[neg.query, neg.key]), abs=1e-6)
    assert neg.contribution == pytest.approx(_most_negative(analysis, layer, neg.head), abs=1e-6)
    least = [_most_negative(analysis, layer, h) for h in range(analysis.num_heads)]
    if least[plan.head] < 0 or min(least) >= 0:  # the sink head, where it has a negative key or no head has one
        assert neg.head == plan.head
    else:  # else the layer's most negative key, in another head
        assert neg.contribution == pytest.approx(min(least), abs=1e-6) < 0
    assert neg.attention * neg.norm_ratio * neg.cosine == pytest.approx(neg.contribution, rel=1e-4, abs=1e-6)


def test_the_anti_aligned_head_is_the_most_negative_cosine_among_heads_that_attend_to_the_sink(tiny_plan):
    analysis, plan = tiny_plan
    heads = sinks.sink_head_summary(sinks.sink_table(analysis, sinks.DEFAULT_SINK))
    candidates = heads[heads["sink_ratio"] >= heads["sink_ratio"].median()]
    assert plan.anti.cos == pytest.approx(candidates["cos_sink_rest"].min())
    row = heads[(heads["layer"] == plan.anti.layer) & (heads["head"] == plan.anti.head)].iloc[0]
    assert row["cos_sink_rest"] == pytest.approx(plan.anti.cos) and row["sink_ratio"] >= heads["sink_ratio"].median()


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_the_negative_key_read_in_row_blocks_equals_the_whole_map(arch, monkeypatch):
    """Blocks of two rows (and a sliding window, mistral): the pick crosses block edges and still finds the map's
    minimum."""
    monkeypatch.setattr(blocks, "ROW_BLOCK_CELLS", 2 * len(TEXT))
    analysis = analyze(make_tiny(arch), TEXT)
    for layer in range(analysis.num_layers):
        least = [_most_negative(analysis, layer, head) for head in range(analysis.num_heads)]
        neg = tour.negative_key(analysis, layer, layer)  # one head a layer: heads 0 and 1
        assert neg.head == layer and neg.contribution == pytest.approx(least[layer], abs=1e-6)
        anywhere = tour.negative_key(analysis, layer, None)
        assert anywhere.contribution == pytest.approx(min(least), abs=1e-6) and least[anywhere.head] == min(least)


def test_a_one_token_prompt_still_gives_a_plan():
    analysis = analyze(make_tiny("llama"), "a")
    plan = _plan(analysis)
    assert plan.negative is None and plan.anti is None
    assert 0 <= plan.layer.layer < analysis.num_layers and 0 <= plan.head < analysis.num_heads
    assert math.isnan(plan.layer.contribution_share)


def test_a_two_token_prompt_falls_back_to_the_sink_column():
    """Query 1 sees the sink and itself; the pick leaves the sink out while another key is there (itself)."""
    analysis = analyze(make_tiny("llama"), "ab")
    neg = tour.negative_key(analysis, 0, 0)
    assert (neg.query, neg.key) == (1, 1)


def test_picks_from_hand_made_tables():
    layers = pd.DataFrame(
        {"layer": [0, 1, 2, 3], "sink_attention_share": [0.9, 0.8, 0.5, np.nan], "sink_contribution_share": [0.9, 0.2, 0.1, 0.0]}
    )
    assert tour.overstated_layer(layers) == tour.SinkLayer(1, 0.8, 0.2)  # gap 0.6, not the most attended layer 0
    assert tour.most_attended_layer(layers).layer == 0
    assert tour.overstated_layer(layers.iloc[:0]) is None and tour.most_attended_layer(layers.iloc[:0]) is None
    summary = pd.DataFrame({"layer": [1, 1, 1, 2], "head": [0, 1, 2, 0], "sink_attention": [0.5, 0.9, 0.9, 1.0]})
    assert tour.sink_head(summary, 1) == (1, 0.9)  # ties: the first head
    heads = pd.DataFrame(
        {
            "layer": [0, 0, 1, 1],
            "head": [0, 1, 0, 1],
            "sink_ratio": [0.05, 0.6, 0.7, 0.8],
            "cos_sink_rest": [-0.9, -0.3, -0.5, np.nan],
            "minimising_ratio": [0.1, 0.2, 0.3, np.nan],
        }
    )
    # Head (0, 0) is the most anti-aligned but barely attends to the sink: below the median ratio, it is passed over.
    assert tour.anti_aligned_head(heads) == tour.AntiAligned(1, 0, -0.5, 0.7, 0.3)
    assert tour.anti_aligned_head(heads.assign(cos_sink_rest=np.nan)) is None


def test_the_embedded_model_shows_the_story(embedded):
    """On the real model every step has something to show: a head that gives most of its attention to the first
    token, a key with a negative contribution, an anti-aligned sink, and attention that overstates the sink."""
    analysis = analyze(embedded, state.examples()[0].text)
    plan = _plan(analysis)
    assert plan.layer.attention_share > 2 * plan.layer.contribution_share
    assert plan.head_sink_attention > 0.5
    assert plan.negative.contribution < 0 and plan.negative.cosine < 0
    assert plan.anti.cos < 0 and 0 < plan.anti.minimising_ratio < 1


# -- links ---------------------------------------------------------------------------------------------
REQUEST = Request("embedded", "cpu", "float32", "A prompt (with) [brackets] & an ampersand?", 2)


def _parsed(url: str) -> tuple[str, dict[str, str]]:
    parts = urlsplit(url)
    return parts.path, {name: values[0] for name, values in parse_qs(parts.query, keep_blank_values=True).items()}


def test_a_link_carries_the_sidebar_parameters_and_the_page_ones():
    path, params = _parsed(links.page_url("token", REQUEST, 3, 2, 5, token_kind="intra"))
    assert path == "token"
    assert params == {
        "model": "embedded",
        "device": "cpu",
        "dtype": "float32",
        "gen": "2",
        "layer": "3",
        "head": "2",
        "token": "5",
        "prompt": REQUEST.text,
        "token_kind": "intra",
    }
    assert set(params) - {"token_kind"} == set(state.URL_KEYS)


def test_a_link_to_the_default_page_goes_to_the_root_and_all_heads_is_spelled_all():
    url = links.page_url("heatmaps", REQUEST, 3, None, measure="contribution")
    path, params = _parsed(url)
    assert path == "./" and params["head"] == "all" and "token" not in params and params["measure"] == "contribution"
    assert ")" not in url and " " not in url  # safe inside Markdown and HTML attributes
    with pytest.raises(ValueError, match="heatmaps, token, sinks"):
        links.page_url("nowhere", REQUEST, 0, None)
