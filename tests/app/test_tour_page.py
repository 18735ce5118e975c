"""The Tour page through AppTest: every step draws its chart with Back and Next, its link opens the full page on the
same view, the step lives in the URL (a malformed one gives step 1), and an encoder gets the steps that need a
causal language model explained."""

from __future__ import annotations

import json
from urllib.parse import parse_qs, urlsplit

import pytest

from cwviz.analyses import tour_story
from cwviz.app import flow_services, services, sink_services, state
from cwviz.app.services import Request
from cwviz.app.sidebar import escape_markdown
from tests.helpers.app import assert_clean, charts, run_app, widget

PAGE = "views/tour.py"
STEPS = 8
TEXT = state.examples()[0].text
#: The page a link's path opens (the default page, Heatmaps, is the app's root).
TARGETS = {"./": "views/heatmaps.py", "token": "views/token.py", "sinks": "views/sinks.py", "flow": "views/flow.py"}


def link(at) -> tuple[str, dict[str, str]]:
    """The step's "Open in …" link: its path and parameters."""
    (button,) = at.get("link_button")
    parts = urlsplit(button.proto.url)
    return parts.path, {name: values[0] for name, values in parse_qs(parts.query).items()}


def expected_links(plan) -> dict[int, tuple[str, dict[str, str]]]:
    """What each step's link must hold (beside the sidebar's inputs), from the plan the page draws."""
    neg, anti = plan.negative, plan.anti
    layer, head = str(plan.layer.layer), str(plan.head)
    return {
        1: ("./", {"layer": layer, "head": head, "colour": "sink_attention"}),
        2: ("sinks", {"layer": layer, "head": head, "sink": "first"}),
        3: (
            "./",
            {
                "layer": layer,
                "head": str(neg.head),
                "token": str(neg.query),
                "measure": "contribution",
                "kind": "intra",
                "range": "full",
            },
        ),
        4: ("token", {"layer": layer, "head": str(neg.head), "token": str(neg.query), "token_kind": "intra"}),
        5: ("sinks", {"layer": str(anti.layer), "head": str(anti.head), "sink": "first"}),
        6: (
            "sinks",
            {"layer": str(anti.layer), "head": str(anti.head), "sink": "first", "lambda": "0", "scope": "all"},
        ),
        7: ("sinks", {"model": "embedded-encoder", "head": "all", "sink": "first"}),
        8: ("flow", {"model": "embedded", "token": "29"}),
    }


#: Charts a step draws where it is not one: none; step 3's contribution map is its one chart (step 1 showed attention).
CHARTS: dict[int, int] = {}


def expected_charts(step: int, plan) -> int:
    """Charts ``step`` draws: :data:`CHARTS`, and under step 3's sentence the absolute scale where the head's picture
    and step 2's seem to disagree (the default prompt's case). Step 4 does not repeat it."""
    scale = plan.negative.scale if plan.negative is not None else None
    return CHARTS.get(step, 1) + (step == 3 and scale is not None and scale.sink_dominates)


@pytest.fixture(scope="module")
def walk() -> dict[int, tuple[str, dict[str, str]]]:
    """Walk the tour forward with Next and back with Back; each step's link, as drawn."""
    at = run_app(page=PAGE)
    plan = sink_services.tour_plan(Request(text=TEXT))
    wanted = expected_links(plan)
    tokens = services.get_analysis(Request(text=TEXT)).analysis.tokens

    def label(position: int) -> str:  # as the sidebar's Selection.token_label writes a position
        return escape_markdown(f"{position} {tokens[position]!r}")

    # The sentences of the steps drawn from the plan alone: the page prints them as cwviz.analyses.tour_story writes
    # them.
    printed = {
        1: tour_story.step1(plan),
        2: tour_story.step2(plan),
        3: tour_story.step3(plan, label),
        4: tour_story.step4(plan, label),
        5: tour_story.step5(plan),
    }
    drawn = {}
    for step in range(1, STEPS + 1):
        assert_clean(at)
        assert at.subheader[0].value.startswith(f"{step}. ")
        if step in printed:
            assert printed[step].text in [m.value for m in at.markdown], f"step {step} prints the plan's sentences"
        if step == 3:  # the map's colour domain covers what it shows: the first token's +1.03 is not painted as +0.01
            (colour,) = [
                spec["layer"][0]["encoding"]["color"]
                for spec in charts(at)
                if "layer" in spec and "heatmap" in json.dumps(spec)
            ]
            assert colour["scale"]["domain"][1] >= abs(plan.negative.scale.sink_intra) - 1e-6, colour["scale"]["domain"]
        specs = charts(at)
        assert len(specs) == expected_charts(step, plan) and all(spec["_rows"] > 0 for spec in specs), (
            f"step {step} draws its chart"
        )
        path, params = drawn[step] = link(at)
        assert params["prompt"] == TEXT and params["model"] in ("embedded", "embedded-encoder")
        assert path == wanted[step][0] and params.items() >= wanted[step][1].items(), (step, params)
        if step != 7:  # the sidebar follows the step, so the other pages open on it in this session too
            assert (at.query_params["layer"], at.query_params["head"]) == (params["layer"], params["head"])
        assert at.query_params.get("step", "1") == str(step)
        assert at.button(key="tour_next").disabled == (step == STEPS)
        if step < STEPS:
            at.button(key="tour_next").click().run()
    for step in range(STEPS - 1, 0, -1):
        at.button(key="tour_back").click().run()
        assert_clean(at)
        assert at.subheader[0].value.startswith(f"{step}. ") and len(charts(at)) == expected_charts(step, plan)
    assert at.button(key="tour_back").disabled
    return drawn


def test_every_step_draws_its_chart_and_its_link(walk):
    assert sorted(walk) == list(range(1, STEPS + 1))


@pytest.mark.parametrize("step", [3, 4, 6, 7, 8])
def test_a_step_link_opens_the_full_page_on_its_view(walk, step):
    path, params = walk[step]
    at = run_app(page=TARGETS[path], params=params)
    assert_clean(at)
    assert widget(at, "slider", "Layer").value == int(params["layer"])
    assert widget(at, "selectbox", "Head").value == (params["head"] if params["head"] == "all" else int(params["head"]))
    assert widget(at, "text_area", "Prompt").value == TEXT
    if "token" in params:
        assert widget(at, "selectbox", "Query token").value == int(params["token"])
    if step == 3:
        assert at.selectbox(key="measure").value == "contribution" and at.selectbox(key="kind").value == "intra"
        assert at.selectbox(key="range").value == "full"
    if step == 4:
        assert at.radio(key="token_kind").value == "intra"
    if step == 6:
        assert at.slider(key="lambda").value == 0.0 and at.radio(key="scope").value == "all"
    if step == 7:
        assert widget(at, "selectbox", "Model").value == "embedded-encoder"
        assert "encoder" in " ".join(i.value for i in at.info)
    if step == 8:
        assert at.title[0].value == "Where the prediction came from" and len(charts(at)) == 3


@pytest.mark.parametrize(("raw", "step"), [("5", 5), ("abc", 1), ("99", 1), ("0", 1), ("2.5", 1)])
def test_the_step_is_in_the_url_and_a_malformed_one_gives_step_one(raw, step):
    at = run_app(page=PAGE, params={"step": raw})
    assert_clean(at)
    assert not at.warning
    assert at.subheader[0].value.startswith(f"{step}. ") and len(charts(at)) == 1


def test_an_encoder_gets_the_causal_steps_explained():
    at = run_app(page=PAGE, params={"model": "embedded-encoder", "prompt": TEXT, "step": "6"})
    assert_clean(at)
    text = " ".join(m.value for m in at.markdown)
    assert "needs a causal language model" in text and len(charts(at)) == 1
    at.button(key="tour_next").click().run()
    assert_clean(at)
    text = " ".join(m.value for m in at.markdown)
    assert "This model is an encoder" in text and "CLS" in text and len(charts(at)) == 1
    path, params = link(at)
    assert params["model"] == "embedded-encoder" and at.query_params["layer"] == params["layer"]  # the sidebar followed
    at.button(key="tour_next").click().run()  # step 8: the flow into [CLS], its own question
    assert_clean(at)
    text = " ".join(m.value for m in at.markdown)
    assert "An encoder predicts no next token" in text and "adds the most" in text and len(charts(at)) == 1
    assert link(at)[0] == "flow" and at.query_params["token"] == "0"


def test_a_one_token_prompt_says_what_each_step_needs():
    at = run_app(page=PAGE, params={"prompt": "x"})
    for step in range(1, STEPS + 1):
        assert_clean(at)
        drawn, said = len(charts(at)), " ".join(i.value for i in at.info)
        assert (drawn == CHARTS.get(step, 1) and not said) or (drawn == 0 and "two tokens or more" in said), (
            step,
            said,
        )
        if step < STEPS:
            at.button(key="tour_next").click().run()


def test_an_encoder_that_cannot_be_loaded_is_explained_at_the_last_step(monkeypatch, tmp_path):
    """A server that cannot load the encoder (not offered in hosting mode, say): the step says why instead of
    failing."""
    missing = str(tmp_path / "no-such-encoder")
    monkeypatch.setattr(sink_services, "EMBEDDED_ENCODER", missing)
    at = run_app(page=PAGE, params={"step": "7"})
    assert_clean(at)
    said = " ".join(i.value for i in at.info)
    assert "could not be done here" in said and "no-such-encoder" in said
    assert not charts(at) and not at.get("link_button")


def test_the_last_step_follows_a_word_not_a_line_break():
    """Step 8 on the default prompt (whose top next token after its final '.' is a line break) follows the Flow page's
    default target: the most likely next word (issue 55)."""
    word = flow_services.default_target(Request(text=TEXT), 29)
    assert any(c.isalpha() for c in word)
    at = run_app(page=PAGE, params={"step": "8"})
    assert_clean(at)
    text = " ".join(m.value for m in at.markdown).replace("\\", "")
    assert f"the model's most likely next word here, {word!r}" in text and len(charts(at)) == 1
