"""The Flow page through AppTest: the graph, the totals and the head map drawn on the embedded model (its numbers in
the caption are the flow's) and on the encoder (the flow into [CLS]); the pickers in the URL and restored from a link;
a target or foil that is not one token gives a message and the default, never a traceback."""

from __future__ import annotations

import pytest

from cwviz.app import flow_services, services, state
from cwviz.app.services import Request
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
        name = "graph" if "click a node" in title else "totals" if "Each token's" in title else "heads" if "head" in title else title
        found[name] = spec
    return found


def _caption(at) -> str:
    return " ".join(c.value for c in at.caption)


@pytest.fixture(scope="module")
def page():
    return run_app(page=PAGE)


def test_the_page_draws_the_graph_the_totals_and_the_heads_with_the_flows_numbers(page):
    assert_clean(page)
    assert not page.warning
    drawn = _drawn(page)
    assert set(drawn) == {"graph", "totals", "heads"}, list(drawn)
    assert all(spec["_rows"] > 0 for spec in drawn.values())
    assert page.selectbox(key="flow_at").value is None  # the default: the prediction after the last token, 29
    choice = flow_services.choose(Request(text=TEXT), 29)
    result = choice.flow
    assert result.target_token == flow_services.predictions(Request(text=TEXT), 29)["token"].iloc[0] and result.foil is None
    said = _caption(page)
    assert f"logit {result.frozen_logit_difference:+.3f}" in said and f"biases' {result.bias_total:+.3f}" in said
    assert "kept at 80% of each layer's |mass|" in said
    assert "Layer 14, head" in " ".join(m.value for m in page.markdown), "the vocabulary of the layer's largest head"
    promoted, suppressed = (frame.value for frame in page.dataframe)  # the head's vocabulary: what its write pushes up and down
    assert len(promoted) == len(suppressed) == 5 and (promoted["logit"] > suppressed["logit"].max()).all()
    links = [button.proto.url for button in page.get("link_button")]
    assert links[0].startswith("./?") and links[1].startswith("token?") and all("layer=14" in url and "token=29" in url for url in links)


def test_the_pickers_are_bound_to_the_url_and_a_link_restores_them(page):
    """Each picker is bound to its URL parameter (Streamlit writes a change to the address bar: the browser test sees
    it); a link holding them restores the pickers and shows the flow they name."""
    bound = {w.proto.query_param_key for kind in ("selectbox", "text_input", "toggle", "slider") for w in page.main.get(kind)}
    assert {"flow_at", "target", "foil_on", "foil", "share"} <= bound
    link = {"target": " He", "foil_on": "true", "foil": " The", "share": "0.5", "flow_at": "20"}
    at = run_app(page=PAGE, params=link)
    assert_clean(at)
    assert not at.warning
    assert at.text_input(key="target").value == " He" and at.toggle(key="foil_on").value is True
    assert at.text_input(key="foil").value == " The" and at.slider(key="share").value == 0.5
    assert at.selectbox(key="flow_at").value == 20
    said = _caption(at)
    assert "toward ' He' over ' The' after 20 " in said and "kept at 50% of each layer's |mass|" in said
    # The position's picker writes its label form ("20: he") on the next run, as every picker bound to the URL does.
    assert {k: v for k, v in link.items() if k != "flow_at"}.items() <= dict(at.query_params).items()


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
    assert "into 0 '\\[CLS\\]'" in _caption(at) and "sum to 1" in _caption(at)
    at.selectbox(key="flow_at").set_value(3).run()
    assert_clean(at)
    assert "into 3 " in _caption(at)


def test_changing_the_share_reads_the_cached_flow(monkeypatch):
    """The pruning share re-prunes the Flow kept for (analysis, position, target, foil): no flow is computed again."""
    at = run_app(page=PAGE)
    calls = []
    real = flow_services.flow
    monkeypatch.setattr(flow_services, "flow", lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs))
    at.slider(key="share").set_value(0.3).run()
    at.slider(key="share").set_value(0.9).run()
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
    assert not at.warning and "toward ' She' over " in _caption(at)
    assert calls == []
    services.get_analysis.clear()
    at.text_input(key="target").input(" They").run()  # asked by no other test: not a cached flow
    assert_clean(at)
    assert calls == [1] and "toward ' They' over " in _caption(at)


def test_the_page_opened_after_the_analysis_runs_no_forward_pass():
    """The dashboard's analysis keeps its pass's residual stream (``services.keeps_stream``): opening the Flow page on
    the analysed prompt makes the basis into its last token from it, with no forward pass of the model."""
    at = run_app()  # Heatmaps: the prompt's analysis
    flow_services.get_basis.clear()
    flow_services.get_flow.clear()
    bundle = services.get_analysis(Request(text=TEXT)).analysis.bundle
    passes = []  # the first layer's calls: any pass, the base model's (the stream's) or the whole model's
    handle = architectures.layer_modules(bundle.model, bundle.arch)[0].register_forward_pre_hook(lambda *_: passes.append(1))
    try:
        at.switch_page(PAGE).run()
    finally:
        handle.remove()
    assert_clean(at)
    assert passes == [] and "logit " in _caption(at)


def test_a_new_prompt_is_explained_after_its_own_last_token():
    """The position picker's default is "the last token", not a number: after Analyze on a longer prompt the flow is
    of the new last token, not of the old one's position."""
    at = run_app(page=PAGE)
    widget(at, "text_area", "Prompt").input("The lamp was lit, and the keeper wrote one line in the logbook again. " * 3)
    at.sidebar.button(key="_cwviz_analyze").click().run()
    assert_clean(at)
    last = widget(at, "selectbox", "Query token").value
    assert last > 29 and f"after {last} " in _caption(at)


def _drawn_foil_named(choice) -> str:
    """The one message of a choice whose typed foil was replaced, checked to name the foil the flow was drawn with."""
    (said,) = choice.problems
    assert said.endswith(f"; showing the foil {choice.flow.foil_token!r} instead"), said
    return said


def _typeable_top(request: Request) -> tuple[int, list[str]]:
    """A position whose top next token can be typed (after the last it is a newline, which reads as an empty foil: the
    default), and its top tokens."""
    return next((p, top) for p in range(28, 0, -1) if (top := flow_services.predictions(request, p)["token"].tolist())[0].strip())


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
