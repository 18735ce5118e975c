"""The Flow page through AppTest: the route, the scores and the head map drawn on the embedded model (the route is
``route.of`` of the shown method's attribution, and its CSV is what the graph draws) and on the encoder (the flow into
[CLS]); the default target is a word; the test's sentence for the shown method and model; the check against knockouts,
kept across a change of method; the pickers in the URL and restored from a link; a target or foil that is not one token
gives a message and the default, never a traceback."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from cwviz.analyses import route
from cwviz.app import flow_services, services, state, widgets
from cwviz.app.services import Request
from cwviz.core.defaults import FLOW_METHOD, KEPT
from cwviz.core.loading import architectures
from cwviz.core.util.errors import ArgumentError
from tests.helpers.app import assert_clean, charts, run_app, widget

PAGE = "views/flow.py"
TEXT = state.examples()[0].text


def _drawn(at) -> dict[str, dict]:
    """The page's charts by what they draw: the graph (its edges), the totals' bars and the head map."""
    specs = charts(at)
    titles = [str(spec.get("title")) for spec in specs]
    found = {}
    for spec, title in zip(specs, titles, strict=True):
        name = (
            "graph"
            if "click a node" in title
            else "totals"
            if "Each token's" in title
            else "heads"
            if "head" in title
            else title
        )
        found[name] = spec
    return found


def _caption(at) -> str:
    return " ".join(c.value for c in at.caption)


@pytest.fixture(scope="module")
def page():
    return run_app(page=PAGE)


def test_the_page_draws_the_route_the_scores_and_the_heads_of_the_default_method(page):
    assert_clean(page)
    assert not page.warning
    drawn = _drawn(page)
    assert set(drawn) == {"graph", "totals", "heads"}, list(drawn)
    assert all(spec["_rows"] > 0 for spec in drawn.values())
    assert page.selectbox(key="flow_at").value is None  # the default: the prediction after the last token, 29
    assert page.selectbox(key="method").value == FLOW_METHOD
    result = flow_services.choose(Request(text=TEXT), 29, flow_services.default_target(Request(text=TEXT), 29)).flow
    shown = flow_services.get_attribution(Request(text=TEXT), 29, result.target, result.foil, FLOW_METHOD)
    drawn_route = route.of(shown, KEPT)
    said = _caption(page)
    assert f"Drawn: {len(drawn_route.edges)} edges on paths into the prediction" in said
    assert f"carrying {drawn_route.carried:.0%} of the" in said and f"asked: {KEPT:.0%}" in said
    # the three input tokens with the largest |score| are joined to the prediction by drawn paths
    top3 = [int(k) for k in np.argsort(-np.abs(shown.scores), kind="stable") if k != 29][:3]
    assert list(drawn_route.connected) == top3 and set(top3) <= drawn_route.reached()
    assert all(repr(shown.asked.token_strings[k]) in said.replace("\\", "") for k in top3)
    assert "Layer 14, head" in " ".join(m.value for m in page.markdown), "the vocabulary of the layer's largest head"
    # the head's vocabulary: what its write pushes up and down
    promoted, suppressed = (frame.value for frame in page.dataframe)
    assert len(promoted) == len(suppressed) == 5 and (promoted["logit"] > suppressed["logit"].max()).all()
    links = [button.proto.url for button in page.get("link_button")]
    assert (
        links[0].startswith("./?")
        and links[1].startswith("token?")
        and all("layer=14" in url and "token=29" in url for url in links)
    )


def test_the_default_target_is_the_most_likely_next_word_not_a_line_break():
    """The default prompt's top next token after its final '.' is a line break: the demo starts on the most likely
    next token that is a word, and the caption says so."""
    top = flow_services.predictions(Request(text=TEXT), 29)
    assert not any(c.isalnum() for c in top["token"].iloc[0]), (
        "the prompt this test is about: its top next token is no word"
    )
    word = flow_services.default_target(Request(text=TEXT), 29)
    assert any(c.isalpha() for c in word) and word in list(top["token"])
    assert word == next(t for t in top["token"] if any(c.isalnum() for c in t))
    at = run_app(page=PAGE)
    assert f"from position 29 '.' toward logit({word!r})" in _caption(at).replace("\\", "")
    assert "is the default target" in _caption(at)


@pytest.mark.parametrize("method", ["effect", "share_flow"])
def test_the_graph_draws_exactly_the_route_and_its_csv_is_the_route(monkeypatch, method):
    """The graph's edge layer holds the route's edges, one rule each (key → query at each layer), and the rows the
    graph's CSV download writes are the route's table itself: the table ``cwviz flow --csv`` writes at that share."""
    shown = {}
    real = widgets.node_graph
    monkeypatch.setattr(
        widgets,
        "node_graph",
        lambda chart, data, *a, **k: shown.update(chart=chart, data=data) or real(chart, data, *a, **k),
    )
    at = run_app(page=PAGE, params={"method": method, "kept": "0.3"})
    assert_clean(at)
    result = flow_services.choose(Request(text=TEXT), 29, flow_services.default_target(Request(text=TEXT), 29)).flow
    expected = route.of(
        flow_services.get_attribution(Request(text=TEXT), 29, result.target, result.foil, method), 0.3
    ).edges
    pd.testing.assert_frame_equal(shown["data"], expected)
    spec = shown["chart"].to_dict()
    (rules,) = [view for view in spec["layer"] if view["encoding"].get("x2", {}).get("field") == "query_label"]
    rows = pd.DataFrame(spec["datasets"][rules["data"]["name"]])
    assert sorted(zip(rows["layer"], rows["key"], rows["query"], strict=True)) == sorted(
        zip(expected["layer"], expected["key"], expected["query"], strict=True)
    )
    assert {"adds", "subtracts"} == set(rows["sign"]), "both signs are drawn on this prompt"


def test_the_first_screen_says_how_faithful_the_shown_method_was_in_the_test(monkeypatch, tmp_path):
    """From the test's table (a fixture here, with made-up numbers: the real one is committed with the runs): ρ with its
    interval and the top-3 sign agreement of the shown method on this model; a method without a row: not tested."""
    table = pd.DataFrame(
        [
            ("embedded", "relay", "effect", "rho", 0.41, 0.35, 0.47, 100),
            ("embedded", "relay", "effect", "sign_agreement", 0.7, 0.64, 0.76, 100),
            ("embedded-gemma", "relay", "share_flow", "rho", 0.2, 0.1, 0.3, 100),
        ],
        columns=list(flow_services.TEST_COLUMNS),
    )
    table.to_csv(tmp_path / "flow_test.csv", index=False)
    monkeypatch.setattr(flow_services, "TEST_RESULTS", tmp_path / "flow_test.csv")
    flow_services.tested.clear()
    try:
        at = run_app(page=PAGE, params={"method": "effect"})
        said = " ".join(m.value for m in at.markdown)
        assert "Tested on 100 GSM8K items: ρ 0.41 [0.35, 0.47] against the relay knockouts' size" in said
        assert "top-3 signs right 70%" in said
        at.selectbox(key="method").set_value("share_flow").run()
        said = " ".join(m.value for m in at.markdown)
        assert "This method (share flow) was not tested on this model" in said and "ρ 0.20" not in said
    finally:
        flow_services.tested.clear()


def test_the_check_measures_every_knockout_once_and_keeps_it_across_a_change_of_method(monkeypatch):
    """Check against knockouts: one forward pass a batch, the test's statistics printed with the scatter; a method
    that answers the same intervention reads the kept effects (no knockout again)."""
    calls = []
    real = flow_services.check.effects
    monkeypatch.setattr(flow_services.check, "effects", lambda *a, **k: calls.append(1) or real(*a, **k))
    at = run_app(page=PAGE, params={"method": "effect", "prompt": "The capital of France is"})
    assert_clean(at)
    at.button(key="flow_check").click().run()
    assert_clean(at)
    said = " ".join(m.value for m in at.markdown).replace("\\", "")  # the page escapes markdown
    assert "4 of 4 knockouts (relay)" in said and "ρ(|score|, |effect|)" in said and calls == [1]
    assert any("measured effect" in str(spec) for spec in charts(at))
    at.selectbox(key="method").set_value("share_flow").run()
    said = " ".join(m.value for m in at.markdown).replace("\\", "")
    assert "4 of 4 knockouts (relay)" in said and "share flow" in said and calls == [1]
    kept = flow_services.measured(
        Request(text="The capital of France is"), 4, *_ids("The capital of France is", 4), "relay"
    )
    assert kept.complete and np.isfinite(kept.effects).all() and len(kept.effects) == 4


def _ids(text: str, position: int) -> tuple[int, int | None]:
    result = flow_services.choose(
        Request(text=text), position, flow_services.default_target(Request(text=text), position)
    ).flow
    return result.target, result.foil


def test_the_pickers_are_bound_to_the_url_and_a_link_restores_them(page):
    """Each picker is bound to its URL parameter (Streamlit writes a change to the address bar: the browser test sees
    it); a link holding them restores the pickers and shows the flow they name."""
    bound = {
        w.proto.query_param_key for kind in ("selectbox", "text_input", "toggle", "slider") for w in page.main.get(kind)
    }
    assert {"flow_at", "method", "target", "foil_on", "foil", "kept"} <= bound
    link = {"target": " He", "foil_on": "true", "foil": " The", "kept": "0.5", "flow_at": "20"}
    at = run_app(page=PAGE, params=link)
    assert_clean(at)
    assert not at.warning
    assert at.text_input(key="target").value == " He" and at.toggle(key="foil_on").value is True
    assert at.text_input(key="foil").value == " The" and at.slider(key="kept").value == 0.5
    assert at.selectbox(key="flow_at").value == 20
    said = _caption(at)
    assert "from position 20 ' line' toward logit(' He') - logit(' The')" in said.replace("\\", "")
    assert "asked: 50%" in said
    # The position's picker writes its label form ("20: he") on the next run, as every picker bound to the URL does.
    assert {k: v for k, v in link.items() if k != "flow_at"}.items() <= dict(at.query_params).items()


def test_a_link_made_before_share_was_renamed_kept_still_opens_its_route():
    """``?share=`` (the kept fraction's URL key before the glossary, docs/METHOD.md): an old link draws the route it
    named, and the view's link then says ``kept`` alone."""
    at = run_app(page=PAGE, params={"share": "0.5", "flow_at": "20"})
    assert_clean(at)
    assert not at.warning and at.slider(key="kept").value == 0.5 and "asked: 50%" in _caption(at)
    assert dict(at.query_params).get("kept") == "0.5" and "share" not in dict(at.query_params)


@pytest.mark.parametrize(
    ("params", "said"),
    [
        ({"target": "lighthouse keeper"}, "the target 'lighthouse keeper' is"),
        ({"foil_on": "true", "foil": "xyzzy plugh"}, "the foil 'xyzzy plugh' is"),
        ({"target": " He", "foil_on": "true", "foil": " He"}, "the foil is the target"),
    ],
    ids=["target", "foil", "foil-is-target"],
)
def test_a_target_or_foil_that_is_not_one_token_gives_a_message_and_the_default(params, said):
    at = run_app(page=PAGE, params=params)
    assert_clean(at)
    warnings = " ".join(w.value for w in at.warning)
    assert said in warnings and "instead" in warnings, warnings
    assert set(_drawn(at)) == {"graph", "totals", "heads"}


def test_an_encoder_shows_the_flow_into_cls_and_a_chosen_position():
    at = run_app(page=PAGE, params={"model": "embedded-encoder", "prompt": TEXT})
    assert_clean(at)
    assert "encoder" in " ".join(m.value for m in at.markdown)
    assert not [w for w in at.text_input if w.key == "target"], "an encoder has no target to pick"
    drawn = _drawn(at)
    assert set(drawn) == {"graph", "totals", "heads"}
    assert "from position 0 '\\[CLS\\]' toward its final representation" in _caption(at)
    at.selectbox(key="flow_at").set_value(3).run()
    assert_clean(at)
    assert "from position 3 " in _caption(at)


def test_changing_the_share_reads_the_cached_attribution(monkeypatch):
    """The route's share re-draws the attribution kept for (analysis, position, target, foil, method): no method and no
    flow runs again."""
    at = run_app(page=PAGE)
    calls = []
    real, real_run = flow_services.flow, flow_services.attribution.run
    monkeypatch.setattr(flow_services, "flow", lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs))
    monkeypatch.setattr(
        flow_services.attribution, "run", lambda *args, **kwargs: calls.append(2) or real_run(*args, **kwargs)
    )
    at.slider(key="kept").set_value(0.3).run()
    at.slider(key="kept").set_value(0.9).run()
    assert_clean(at)
    assert calls == [], "".join(calls[0])


def test_a_new_target_or_foil_routes_again_from_the_prompts_kept_stream(monkeypatch):
    """What does not depend on the target (``flow_basis``: the stream's forward pass, the logits the pickers and the
    caption read, the heads' vocabulary) is made once per prompt and position: a new target and a foil only route
    again. An analysis made again (its cache let it go) gets a basis of its own, never the old one's."""
    at = run_app(page=PAGE)
    at.text_input(key="target").input(" It").run()  # a flow not cached before: the basis is made (or was kept)
    calls = []
    real = flow_services.flow_basis
    monkeypatch.setattr(flow_services, "flow_basis", lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs))
    at.text_input(key="target").input(" She").run()
    at.toggle(key="foil_on").set_value(True).run()
    assert_clean(at)
    assert not at.warning and "toward logit(' She') - logit(" in _caption(at).replace("\\", "")
    assert calls == []
    services.get_analysis.clear()
    at.text_input(key="target").input(" They").run()  # asked by no other test: not a cached flow
    assert_clean(at)
    assert calls == [1] and "toward logit(' They') - logit(" in _caption(at).replace("\\", "")


def test_the_page_opened_after_the_analysis_runs_no_forward_pass():
    """The dashboard's analysis keeps its pass's residual stream (``services.keeps_stream``): opening the Flow page on
    the analysed prompt makes the basis into its last token from it, with no forward pass of the model."""
    at = run_app()  # Heatmaps: the prompt's analysis
    flow_services.get_basis.clear()
    flow_services.get_flow.clear()
    flow_services.get_request.clear()
    flow_services.get_attribution.clear()
    # the method read from the kept stream (the effect flow needs a backward pass)
    at.session_state["method"] = "share_flow"
    bundle = services.get_analysis(Request(text=TEXT)).analysis.bundle
    passes = []  # the first layer's calls: any pass, the base model's (the stream's) or the whole model's
    handle = architectures.layer_modules(bundle.model, bundle.arch)[0].register_forward_pre_hook(
        lambda *_: passes.append(1)
    )
    try:
        at.switch_page(PAGE).run()
    finally:
        handle.remove()
    assert_clean(at)
    assert passes == [] and "The share flow from position" in _caption(at) and "Drawn: " in _caption(at)


def test_a_new_prompt_is_explained_after_its_own_last_token():
    """The position picker's default is "the last token", not a number: after Analyze on a longer prompt the flow is
    of the new last token, not of the old one's position."""
    at = run_app(page=PAGE)
    widget(at, "text_area", "Prompt").input(
        "The lamp was lit, and the keeper wrote one line in the logbook again. " * 3
    )
    at.sidebar.button(key="_cwviz_analyze").click().run()
    assert_clean(at)
    last = widget(at, "selectbox", "Query token").value
    assert last > 29 and f"from position {last} " in _caption(at)


def _drawn_foil_named(choice) -> str:
    """The one message of a choice whose typed foil was replaced, checked to name the foil the flow was drawn with."""
    (said,) = choice.problems
    assert said.endswith(f"; showing the foil {choice.flow.foil_token!r} instead"), said
    return said


def _typeable_top(request: Request) -> tuple[int, list[str]]:
    """A position whose top next token can be typed (after the last it is a newline, which reads as an empty foil: the
    default), and its top tokens."""
    return next(
        (p, top)
        for p in range(28, 0, -1)
        if (top := flow_services.predictions(request, p)["token"].tolist())[0].strip()
    )


def test_a_foil_equal_to_the_target_names_the_foil_drawn_instead():
    """The issue: with target = foil = the top token (' Paris') the page said "showing the foil ' Paris' instead" and
    drew the next token."""
    request = Request(text=TEXT)
    position, top = _typeable_top(request)
    choice = flow_services.choose(request, position, top[0], top[0])
    said = _drawn_foil_named(choice)
    assert "the foil is the target" in said and choice.flow.foil_token == top[1]


def test_a_foil_equal_to_the_models_top_token_names_the_foil_drawn_instead():
    request = Request(text=TEXT)
    position, top = _typeable_top(request)
    choice = flow_services.choose(request, position, "", top[0])
    said = _drawn_foil_named(choice)
    assert "the model's top next token" in said and choice.flow.foil_token == top[1]


def test_a_foil_of_several_tokens_names_the_one_token_drawn():
    choice = flow_services.choose(Request(text=TEXT), 29, "", " 50,000 lighthouse")
    said = _drawn_foil_named(choice)
    assert "is 4 tokens" in said or "tokens [" in said
    assert choice.flow.foil_token == flow_services.predictions(Request(text=TEXT), 29)["token"].iloc[1]


def test_which_argument_was_refused_is_read_from_the_error_not_its_message(monkeypatch):
    """An ArgumentError of the foil whose message says nothing of a foil is still the foil's (control flow reads the
    field)."""
    real = flow_services.get_flow
    refused = []

    def once(request, position, target, foil):
        if not refused:
            refused.append(foil)
            raise ArgumentError("foil", "no such token")
        return real(request, position, target, foil)

    monkeypatch.setattr(flow_services, "get_flow", once)
    choice = flow_services.choose(Request(text=TEXT), 29, "", "anything")
    assert refused == ["anything"] and choice.problems[0].startswith("no such token; showing the foil")


def test_a_check_interrupted_by_stop_keeps_the_passes_it_finished():
    """The page's Stop reruns the script, which Streamlit interrupts at its next call (the progress bar): the passes
    finished before it are kept, and the check then reads them as a stopped one."""
    text = "The lamp was lit, and the keeper wrote one line in the logbook again. " * 3  # over 32 tokens: two passes
    request = Request(text=text)
    position = services.get_analysis(request).analysis.num_tokens - 1
    target, foil = _ids(text, position)

    class Interrupted(Exception):
        pass

    def progress(done: int, total: int) -> None:
        assert total == 2
        raise Interrupted  # as Streamlit's rerun interrupts the script at the progress bar

    with pytest.raises(Interrupted):
        flow_services.measure(request, position, target, foil, "relay", progress=progress)
    kept = flow_services.measured(request, position, target, foil, "relay")
    assert not kept.complete and np.isfinite(kept.effects[:32]).all() and np.isnan(kept.effects[32:]).all()
    checked = flow_services.checked(request, position, target, foil, "effect", "relay", kept.effects)
    assert not checked.complete and "stopped" in checked.sentence()
