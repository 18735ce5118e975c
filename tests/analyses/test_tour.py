"""The guided tour's picks (cwviz.analyses.tour) and sentences (cwviz.analyses.tour_story): each step shows what the
analysis says it should, on any model and prompt, and its steps agree on every fact they print; and the links to the
full pages (cwviz.app.links) carry the pages' own URL parameters."""

from __future__ import annotations

import json
import math
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pandas as pd
import pytest

from cwviz import analyze
from cwviz import flow as cwviz_flow
from cwviz.analyses import sink_interventions, sinks, tables, tour, tour_story
from cwviz.app import links, state
from cwviz.app.services import Request
from cwviz.core import defaults
from cwviz.core.method import row_block_sizes
from tests.helpers import TEXT, make_tiny


def _plan(analysis) -> tour.TourPlan:
    table = sinks.sink_table(analysis, defaults.DEFAULT_SINK)
    return tour.plan(
        analysis, tables.head_summary(analysis), sinks.sink_layer_summary(table), sinks.sink_head_summary(table)
    )


def _most_negative(analysis, layer: int, head: int) -> float:
    """The smallest intra-head contribution of ``head`` off the sink column, over queries that see two keys or more
    (the whole map at once, as the tour's row blocks must agree with)."""
    contribution = analysis.contributions(layer, tour.KIND)[head]  # (query, key)
    visible = analysis.key_mask(layer).cpu().numpy()
    cells = visible & (visible.sum(-1, keepdims=True) > 1)
    cells[:, defaults.DEFAULT_SINK] = False
    return float(np.where(cells, contribution, np.inf).min())


@pytest.fixture(scope="module", params=["llama", "gpt2", "bert"])
def tiny_plan(request):
    analysis = analyze(make_tiny(request.param), TEXT)
    return analysis, _plan(analysis)


def test_the_layer_is_where_attention_overstates_the_sink_most(tiny_plan):
    analysis, plan = tiny_plan
    layers = sinks.sink_layer_summary(sinks.sink_table(analysis, defaults.DEFAULT_SINK))
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
    assert neg.key != defaults.DEFAULT_SINK and neg.query >= 1
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
    heads = sinks.sink_head_summary(sinks.sink_table(analysis, defaults.DEFAULT_SINK))
    candidates = heads[heads["sink_ratio"] >= heads["sink_ratio"].median()]
    assert plan.anti.cos == pytest.approx(candidates["cos_sink_rest"].min())
    row = heads[(heads["layer"] == plan.anti.layer) & (heads["head"] == plan.anti.head)].iloc[0]
    assert row["cos_sink_rest"] == pytest.approx(plan.anti.cos) and row["sink_ratio"] >= heads["sink_ratio"].median()


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_the_negative_key_read_in_row_blocks_equals_the_whole_map(arch, monkeypatch):
    """Blocks of two rows (and a sliding window, mistral): the pick crosses block edges and still finds the map's
    minimum."""
    monkeypatch.setattr(row_block_sizes, "ROW_BLOCK_CELLS", 2 * len(TEXT))
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
        {
            "layer": [0, 1, 2, 3],
            "sink_attention_share": [0.9, 0.8, 0.5, np.nan],
            "sink_contribution_share": [0.9, 0.2, 0.1, 0.0],
        }
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


def _embedded_prompts() -> list[str]:
    """Prompts of different lengths: the dashboard's first two examples (about 30 and 44 tokens) and a ~300-token
    text of a researcher's own (the examples repeated)."""
    texts = [example.text for example in state.examples()[:2]]
    return [*texts, " ".join(texts * 4)]


@pytest.fixture(scope="module")
def embedded_model():
    from cwviz import load_model

    return load_model("embedded")


@pytest.mark.parametrize("prompt", range(3), ids=["short", "medium", "long"])
def test_each_steps_printed_numbers_are_what_its_chart_draws_and_its_claims_hold(embedded_model, prompt):
    """On the embedded model and prompts of three lengths: step 2's shares are the share chart's points at its layer;
    step 3's contribution is the contribution map's cell (query, key), ringed, and the sink's share its sink cell;
    step 4's factors are the bars of the marked key; the sentences' claims ("writes little", "writes against", "both
    are true") hold for the numbers printed."""
    from cwviz.charts import heatmaps, palette, token
    from cwviz.charts import sinks as sink_charts

    analysis = analyze(embedded_model, _embedded_prompts()[prompt])
    table = sinks.sink_table(analysis, defaults.DEFAULT_SINK)
    layers = sinks.sink_layer_summary(table)
    plan = tour.plan(analysis, tables.head_summary(analysis), layers, sinks.sink_head_summary(table))
    neg, scale = plan.negative, plan.negative.scale

    # Step 2: the printed shares are the chart's two points at the dashed layer; "only" is printed when it holds.
    drawn = sink_charts.share_chart(layers, plan.layer.layer).layer[0].data
    at = dict(drawn.loc[drawn["layer"] == plan.layer.layer, ["measure", "share"]].itertuples(index=False))
    assert f"{at['attention']:.0%}" == f"{plan.layer.attention_share:.0%}"
    assert f"{at['contribution weight']:.0%}" == f"{plan.layer.contribution_share:.0%}"
    assert plan.layer.writes_little == (plan.layer.contribution_share < 0.5 * plan.layer.attention_share)
    assert plan.layer.contribution_share < plan.layer.attention_share, (
        "attention overstates the sink in the tour's layer"
    )

    # Step 3: the map the step draws holds the printed cell, and rings it; the sink cell is the printed share.
    cells = tables.heatmap_cells(
        analysis,
        plan.layer.layer,
        neg.head,
        "contribution_intra",
        tour.KIND,
        neg.query,
        "window",
        max_cells=tables.screen_cells(True),
    )
    frame = cells.frame.set_index(["query", "key"])
    assert f"{frame.loc[(neg.query, neg.key), 'value']:+.3f}" == f"{neg.contribution:+.3f}"
    assert f"{frame.loc[(neg.query, defaults.DEFAULT_SINK), 'value']:.0%}" == f"{scale.sink_intra:.0%}"
    assert neg.contribution < 0, "the key printed as writing against the output has a negative contribution"
    view = heatmaps.heatmap_view(cells, "measure", neg.query, key=neg.key).to_dict()
    assert any(layer.get("name") == "marked_cell" for layer in view["layer"]), "the step's key is ringed on the map"

    # Step 4: the marked key's bars are the printed factors, and they multiply out to the printed contribution.
    factors = tables.token_factors(analysis, plan.layer.layer, neg.query, neg.head, tour.KIND, also=neg.key)
    row = factors.wide[factors.wide["key"] == neg.key].iloc[0]
    printed = f"{neg.attention:.3f} × {neg.norm_ratio:.2f} × {neg.cosine:+.2f} = {neg.contribution:+.3f}"
    assert printed == (
        f"{row['attention']:.3f} × {row['norm_ratio']:.2f} × {row['cosine']:+.2f} = {row['contribution']:+.3f}"
    )
    assert row["attention"] * row["norm_ratio"] * row["cosine"] == pytest.approx(
        row["contribution"], rel=1e-3, abs=1e-6
    )
    sink_row = factors.wide[factors.wide["is_sink"]].iloc[0]
    assert f"{sink_row['contribution']:.0%}" == f"{scale.sink_intra:.0%}"
    bars = token.factor_bars(factors, mark=neg.key).to_dict()
    first_bars = bars["hconcat"][0]["layer"][0]
    label = first_bars["encoding"]["y"]["axis"]["labelExpr"]  # the labels as a JSON list, in ASCII
    assert json.dumps(token.MARKED)[1:-1] in label and first_bars["encoding"]["stroke"]

    # "Both are true": the sink's share of this head's output, of the layer's output, and the two lengths that reconcile
    # them.
    head = tables.decomposition(analysis, plan.layer.layer, neg.query, neg.head, "inter")
    assert scale.sink_inter == pytest.approx(
        float(head.loc[head["key"] == defaults.DEFAULT_SINK, "contribution"].iloc[0])
    )
    assert scale.layer_norm > 0 and scale.head_norm > 0
    if scale.sink_dominates:
        assert scale.sink_intra > 0.5 and scale.sink_inter < 0.5 * scale.sink_intra
        # The reconciliation: the sink's share of the layer is its share of the head, scaled by the head's length.
        assert abs(scale.sink_inter) <= abs(scale.sink_intra) * scale.head_fraction * (1 + 1e-4)
        # The absolute scale drawn beside the sentence: its bars are the printed lengths, each labelled with its length
        # (an axis of lengths) and the share the sentence prints.
        bars = sink_charts.scale_bars(tour_story.scale_table(scale, plan.layer.layer, neg.head), "query")
        drawn = bars.data.set_index("row")
        head_part, layer_part = scale.sink_intra * scale.head_norm, scale.sink_inter * scale.layer_norm
        assert drawn["label"].tolist() == [
            f"head {neg.head}: ‖o‖ = {scale.head_norm:.1f}",
            f"first token: {head_part:.1f} ({scale.sink_intra:.0%} of it)",
            f"layer {plan.layer.layer}: ‖o‖ = {scale.layer_norm:.1f}",
            f"first token: {layer_part:.1f} ({scale.sink_inter:.0%} of it)",
        ]
        assert drawn["length"].tolist() == pytest.approx([scale.head_norm, head_part, scale.layer_norm, layer_part])
        assert json.dumps(drawn["label"].tolist()) in bars.to_dict()["encoding"]["y"]["axis"]["labelExpr"]
        # What the bars show: the first token's part is most of the head's bar and a small part of the layer's.
        assert (
            drawn.loc[1, "length"] > 0.5 * drawn.loc[0, "length"]
            and drawn.loc[3, "length"] < 0.5 * drawn.loc[2, "length"]
        )
        fill = bars.to_dict()["transform"][0]["calculate"]  # outputs grey, the sink's part by its sign
        assert all(colour in fill for colour in (palette.MUTED, palette.POSITIVE, palette.NEGATIVE))


# -- one tour, one set of facts ------------------------------------------------------------------------------------
def _label(position: int) -> str:
    return f"[{position}]"


def _story(embedded_model, prompt: int) -> tuple[tour.TourPlan, tuple[tour_story.Step, ...]]:
    """Every step of the tour on the embedded model and one of three prompts, as the Tour page writes it: the plan, the
    flow into the last position, λ = 0 in every layer and the embedded encoder's layer where [CLS] takes most
    attention."""
    from cwviz import load_model

    text = _embedded_prompts()[prompt]
    analysis = analyze(embedded_model, text)
    plan = _plan(analysis)
    removed = sink_interventions.intervene_on_sink(analysis, plan.sink, 0.0)
    removal = tour.Removal.of(analysis.info.id, plan.causal, removed)
    encoder_analysis = analyze(load_model("embedded-encoder"), text)
    layers = sinks.sink_layer_summary(sinks.sink_table(encoder_analysis, defaults.DEFAULT_SINK))
    encoder = tour.Encoder(
        encoder_analysis.info.id, False, encoder_analysis.tokens[0], tour.most_attended_layer(layers)
    )
    flow = tour.flow_story(cwviz_flow(analysis))
    steps = tour_story.story(plan, _label, repr, flow, analysis.num_layers, removal, encoder)
    return plan, steps


def check_facts(steps: tuple[tour_story.Step, ...]) -> list[str]:
    """What is wrong with a tour's facts: a stated or cited fact its sentence does not print, two steps that print
    different values for one fact (same name and subject), a citation of a step that does not show that fact or shows
    another value, a fact whose name has no meaning in :data:`cwviz.analyses.tour_story.FACTS`. Empty when all agree."""
    problems: list[str] = []
    shown: dict[tuple, dict[int, str]] = {}  # (name, subject) -> {step: printed value}
    for step in steps:
        for fact in step.states:
            if fact.name not in tour_story.FACTS:
                problems.append(f"step {step.number}: {fact.name!r} has no named meaning")
                continue
            if fact.text not in step.text:
                problems.append(f"step {step.number} states {fact.name} {fact.text} but does not print it")
            shown.setdefault((fact.name, fact.subject), {})[step.number] = fact.text
    for key, printed in shown.items():
        if len(set(printed.values())) > 1:
            problems.append(f"{key[0]} of {key[1]}: steps print {printed}")
    for step in steps:
        for cite in step.cites:
            fact = cite.fact
            if fact.text not in step.text:
                problems.append(f"step {step.number} cites {fact.name} {fact.text} but does not print it")
            there = shown.get((fact.name, fact.subject), {}).get(cite.step)
            if there is None:
                problems.append(
                    f"step {step.number} cites step {cite.step} for {fact.name}, which that step does not show"
                )
            elif there != fact.text:
                problems.append(
                    f"step {step.number} cites step {cite.step}'s {fact.name} as {fact.text}; that step prints {there}"
                )
    return problems


@pytest.mark.parametrize("prompt", range(3), ids=["short", "medium", "long"])
def test_the_tours_steps_agree_on_every_fact(embedded_model, prompt):
    """On three prompts, every step's printed numbers come from one plan with a named meaning: no two steps print
    different values for the same fact, every sentence that cites another step cites a fact that step shows with the
    value it shows, and step 8 reconciles the first token's flow total with step 2's share in words."""
    plan, steps = _story(embedded_model, prompt)
    assert [step.number for step in steps] == list(range(1, 9))
    assert check_facts(steps) == []
    by = {step.number: step for step in steps}
    # Step 3 names the head's share and the layer's share through it, and cites step 2 for the layer's whole share.
    names = {fact.name for fact in by[3].states}
    assert {"head_share", "head_layer_share", "key_contribution"} <= names
    # Step 8: the first token's total with step 2's share beside it, and why both hold.
    first = [fact for fact in by[8].states if fact.subject[-1] == plan.sink and fact.name == "flow_total"]
    assert first and any(cite.step == 2 and cite.fact.name == "layer_share" for cite in by[8].cites)
    assert "A small write can still matter to one prediction" in by[8].text
    # No paragraph is said twice: every sentence of every step is its own.
    sentences = [s.strip() for step in steps for s in step.text.split(". ") if len(s.strip()) > 40]
    assert len(sentences) == len(set(sentences)), [s for s in sentences if sentences.count(s) > 1]


def test_the_fact_check_fails_on_the_contradictions_of_issue_56():
    """The check itself: step 3 citing step 2 for the head's 5% as "the layer's output" (step 2 prints 27%), a step that
    cites a step that does not show the fact, and two steps that print one fact differently, are each caught."""
    layer = ("m", 20)
    two = tour_story.Step(2, "makes 27% of the layer", (tour_story.Fact("layer_share", layer, 0.27),))
    three = tour_story.Step(
        3,
        "adds only 5% of the layer's output, as step 2 says",
        (),
        (tour_story.Cite(tour_story.Fact("layer_share", layer, 0.05), 2),),
    )
    assert any("that step prints 27%" in p for p in check_facts((two, three)))
    four = tour_story.Step(4, "its 27%", (), (tour_story.Cite(tour_story.Fact("layer_share", layer, 0.27), 1),))
    assert any("does not show" in p for p in check_facts((two, four)))
    five = tour_story.Step(5, "makes 30% of the layer", (tour_story.Fact("layer_share", layer, 0.3),))
    assert any("steps print" in p for p in check_facts((two, five)))
    assert check_facts((two,)) == []


@pytest.mark.parametrize("prompt", range(3), ids=["short", "medium", "long"])
def test_the_flow_steps_numbers_are_what_its_bars_draw(embedded_model, prompt):
    """Step 8 on the embedded model and prompts of three lengths: the target and logit it prints are the flow's, the
    token that "adds the most" and the one that "works most against it" are the largest and the most negative totals,
    and both are among the bars, with those values and colours."""
    from cwviz.charts import flow as flow_charts

    analysis = analyze(embedded_model, _embedded_prompts()[prompt])
    result = cwviz_flow(analysis)
    story = tour.flow_story(result)
    assert story.target == result.target_token and story.logit == result.frozen_logit_difference
    assert story.support[2] == pytest.approx(float(result.totals.max())) and story.support[2] > 0
    assert (
        story.against is not None
        and story.against[2] == pytest.approx(float(result.totals.min()))
        and story.against[2] < 0
    )
    rows = flow_charts.total_rows(result.tokens, "total", keep=[story.support[0], story.against[0]])
    bars = flow_charts.totals_bars(rows, "totals").to_dict()
    drawn = pd.DataFrame(next(data for data in bars["datasets"].values() if len(data) == len(rows))).set_index(
        "position"
    )
    for position, _, total in (story.support, story.against):
        assert f"{drawn.loc[position, 'total']:+.2f}" == f"{total:+.2f}"
    assert drawn.loc[story.support[0], "sign"] == "adds" and drawn.loc[story.against[0], "sign"] == "subtracts"
