"""Every dashboard page through ``streamlit.testing.v1.AppTest``: default load, changing selections,
bad inputs, a model that fails to load. The embedded model is loaded once per process (services cache).
"""

from __future__ import annotations

import ast
import json

import pytest
from streamlit.testing.v1 import AppTest

from cwviz.app import services, state
from tests.helpers import LONG_TEXT, ROOT, tiny_long_bundle
from tests.helpers.app import assert_clean, charts, run_app, title, widget

OWN_PAGES = ["views/heatmaps.py", "views/token.py", "views/bertviz_view.py"]


def pair(spec: dict) -> list[dict]:
    """The two views of a heatmap pair, side by side or stacked."""
    return spec.get("hconcat") or spec["vconcat"]


def map_note(at: AppTest) -> str:
    """What the Heatmaps page's caption says the maps show (layer, heads, window or bins)."""
    return next(c.value for c in at.caption if c.value.startswith("layer "))


def view_title(spec: dict) -> str:
    """The title of one map of the Heatmaps page (each map is a chart of its own)."""
    return spec["title"]["text"]


def test_default_load_shows_the_example_analysed(count_forward_passes):
    at = run_app()
    assert_clean(at)
    assert at.title[0].value == "Contribution weights vs attention"
    assert "contributes" in at.markdown[0].value and "negative" in at.expander[0].markdown[0].value
    specs = charts(at)
    assert len(specs) == 3  # the attention map, the contribution map, the all-heads overview
    attention, contribution, overview = specs
    assert view_title(attention) == "Attention weights" and view_title(contribution).startswith("Contribution weight")
    assert "layer 14" in map_note(at) and "all heads" in map_note(at)
    assert overview["_rows"] == 30 * 9 + 0  # one cell per head (no head picked: no outline)
    assert all(spec["_rows"] < 5000 for spec in specs)
    assert {b.label for b in at.get("download_button")} >= {"PNG", "SVG", "CSV", "Analysis as JSON (all layers)"}
    assert len(at.dataframe) == 1  # the ranking of heads
    params = at.query_params
    assert params["model"] == "embedded" and params["prompt"] == state.examples()[0].text
    assert params["layer"] == "14" and params["head"] == "all" and params["token"] == "29"


def test_changing_the_selection_redraws_without_rerunning_the_model(count_forward_passes):
    at = run_app()
    before = len(count_forward_passes)
    widget(at, "slider", "Layer").set_value(3).run()
    widget(at, "selectbox", "Head").set_value(2).run()
    widget(at, "selectbox", "Query token").set_value(5).run()
    assert_clean(at)
    assert "layer 3, head 2" in map_note(at)
    assert len(charts(at)[2]["layer"]) == 2  # the picked head is outlined in the overview
    assert at.query_params["layer"] == "3" and at.query_params["head"] == "2" and at.query_params["token"] == "5"
    at.selectbox(key="kind").set_value("intra").run()
    at.selectbox(key="measure").set_value("raw").run()
    assert_clean(at)
    assert view_title(charts(at)[1]) == "Raw attention"
    assert at.selectbox(key="kind").disabled  # raw attention divides by no output norm
    assert any("repeats the left one" in c.value for c in at.caption)
    at.selectbox(key="measure").set_value("contribution").run()
    assert not at.selectbox(key="kind").disabled
    for layout in ("side", "stacked"):
        at.radio(key="layout").set_value(layout).run()
        assert len(charts(at)) == 3
    at.selectbox(key="range").set_value("full").run()
    assert_clean(at)
    scale = charts(at)[1]["layer"][0]["encoding"]["color"]["scale"]
    assert scale["domain"][1] >= 0.99  # the full range holds the sink's share
    assert len(count_forward_passes) == before


def test_a_link_reproduces_the_view():
    text = state.examples()[1].text
    at = run_app(params={"prompt": text, "layer": "3", "head": "2", "token": "4"})
    assert_clean(at)
    assert widget(at, "slider", "Layer").value == 3
    assert widget(at, "selectbox", "Head").value == 2
    assert widget(at, "selectbox", "Query token").value == 4
    assert widget(at, "text_area", "Prompt").value == text
    assert "layer 3, head 2" in map_note(at)


def test_malformed_link_values_are_clamped_and_explained():
    at = run_app(params={"layer": "999", "head": "-1", "token": "abc", "dtype": "float8"})
    assert not at.exception and not at.error
    warnings = " ".join(w.value for w in at.warning)
    assert "layer=999" in warnings and "0..29" in warnings
    assert "head=-1" in warnings and "all heads" in warnings
    assert "token='abc'" in warnings and "dtype='float8'" in warnings
    assert widget(at, "slider", "Layer").value == 29
    assert widget(at, "selectbox", "Head").value == "all"
    assert widget(at, "selectbox", "Query token").value == 29
    widget(at, "slider", "Layer").set_value(4).run()
    assert not at.warning  # the explanation goes once the user changes the selection


def test_an_empty_prompt_shows_an_error_on_every_page():
    at = run_app()
    widget(at, "text_area", "Prompt").input("   ")
    at.sidebar.button(key="_cwviz_analyze").click().run()
    for page in OWN_PAGES:
        at.switch_page(page).run()
        assert not at.exception
        assert any("empty" in e.value for e in at.error)
        assert not charts(at)
        # The page's title first, then the error (not the error above the title).
        kinds = [node.type for node in at.main.children.values()]
        assert kinds.index("title") < kinds.index("error"), kinds


def test_byte_and_control_labels_are_explained_only_when_the_prompt_has_them():
    at = run_app()
    assert not any("are bytes" in c.value for c in at.caption)  # the example prompt is plain English
    widget(at, "text_area", "Prompt").input("A smile 😀 in שלום")
    at.sidebar.button(key="_cwviz_analyze").click().run()
    assert_clean(at)
    assert any("are bytes" in c.value for c in at.caption)


def test_the_model_picker_offers_the_embedded_models_and_keeps_a_typed_name(tmp_path):
    at = run_app()
    picker = widget(at, "selectbox", "Model")
    assert picker.options[:3] == [
        "embedded · SmolLM2",
        "embedded-gemma · Gemma 3 (Gemma terms)",
        "embedded-encoder · MiniLM",
    ]
    assert picker.value == "embedded"
    typed = str(tmp_path / "my-model")  # a name typed into the picker (or given in a link) is one of its options
    at = run_app(params={"model": typed})
    assert widget(at, "selectbox", "Model").value == typed and typed in widget(at, "selectbox", "Model").options


def test_a_model_that_fails_to_load_shows_the_reason_on_every_page(tmp_path):
    missing = str(tmp_path / "no-such-model")
    at = run_app(params={"model": missing})
    for page in OWN_PAGES:
        at.switch_page(page).run()
        assert not at.exception
        errors = " ".join(e.value for e in at.error)
        assert "could not be loaded" in errors and "no-such-model" in errors
        assert not charts(at)
    widget(at, "selectbox", "Model").select("embedded")
    at.sidebar.button(key="_cwviz_analyze").click().run()
    at.switch_page("views/heatmaps.py").run()
    assert_clean(at)
    assert charts(at)


def test_prompts_over_the_limit_get_a_clear_message(monkeypatch):
    monkeypatch.setenv("CWVIZ_APP_MAX_TOKENS", "20")
    at = run_app()
    widget(at, "text_area", "Prompt").input("A fresh prompt that is clearly longer than twenty tokens, " * 2)
    at.sidebar.button(key="_cwviz_analyze").click().run()
    assert not at.exception
    message = " ".join(e.value for e in at.error)
    assert "limit is 20" in message and "CWVIZ_APP_MAX_TOKENS" in message


def test_the_selection_persists_across_pages():
    at = run_app()
    widget(at, "slider", "Layer").set_value(7).run()
    widget(at, "selectbox", "Head").set_value(1).run()
    at.switch_page("views/token.py").run()
    assert_clean(at)
    assert widget(at, "slider", "Layer").value == 7 and widget(at, "selectbox", "Head").value == 1
    factors, across = charts(at)
    assert len(factors["hconcat"]) == 4 and "layer 7, head 1" in title(factors)
    assert across["_rows"] == 30 * 5
    at.switch_page("views/heatmaps.py").run()
    assert "layer 7, head 1" in map_note(at)


def test_token_page_default_and_changes():
    at = run_app(page="views/token.py")
    assert not at.exception
    assert at.title[0].value == "One query token"
    assert any("per head" in i.value for i in at.info)  # all heads: no factorisation
    factors, across = charts(at)
    assert len(factors["hconcat"]) == 2
    widget(at, "selectbox", "Query token").set_value(3).run()
    at.slider(key="top_k").set_value(2).run()
    at.radio(key="token_kind").set_value("intra").run()
    assert_clean(at)
    factors, across = charts(at)
    assert "query 3" in title(factors) and across["_rows"] == 30 * 2
    # Chart text is drawn literally: the last token ('.') is not Markdown-escaped there.
    widget(at, "selectbox", "Query token").set_value(29).run()
    assert "Query 29 '.'" in title(charts(at)[1]) and "\\" not in title(charts(at)[1])


def test_bertviz_page_renders_both_views_and_says_how_negatives_are_shown():
    at = run_app(page="views/bertviz_view.py")
    assert_clean(at)
    text = " ".join(m.value for m in at.markdown)
    assert "negative contributions are not drawn" in text.replace("**", "")
    for view in ("head", "model"):
        for weights in ("attention", "contribution"):
            at.radio(key="bv_view").set_value(view).run()
            at.radio(key="bv_weights").set_value(weights).run()
            assert_clean(at)
            frame = at.get("iframe")[0].proto
            html = frame.srcdoc or frame.src
            assert "cwviz-bertviz-offline" in html and "could not load its scripts" in html


def test_generated_tokens_are_analysed_with_the_prompt():
    at = run_app()
    widget(at, "number_input", "Tokens to generate").set_value(3)
    at.sidebar.button(key="_cwviz_analyze").click().run()
    assert_clean(at)
    assert any("(3 generated)" in c.value for c in at.sidebar.caption)
    assert widget(at, "selectbox", "Query token").value == 32  # the last generated token
    assert at.query_params["gen"] == "3"


def test_picking_an_example_analyses_it():
    at = run_app()
    example = state.examples()[2]
    widget(at, "selectbox", "Example prompt").set_value(example.name).run()
    assert_clean(at)
    assert widget(at, "text_area", "Prompt").value == example.text
    assert at.query_params["prompt"] == example.text


def test_markup_in_the_prompt_stays_text():
    at = run_app()
    widget(at, "text_area", "Prompt").input("Hello <img src=x onerror=alert(1)> **bold** [link](javascript:alert(1))")
    at.sidebar.button(key="_cwviz_analyze").click().run()
    assert_clean(at)
    at.switch_page("views/token.py").run()
    labels = widget(at, "selectbox", "Query token").options
    position = next(i for i, label in enumerate(labels) if "<" in label)
    widget(at, "selectbox", "Query token").set_value(position).run()
    assert_clean(at)
    page_text = " ".join(m.value for m in at.markdown)
    assert "\\<" in page_text  # the query token, escaped
    assert "<img" not in page_text and "](javascript" not in page_text


@pytest.fixture
def tiny_long_model(monkeypatch):
    bundle = tiny_long_bundle()
    real = services.load_model
    monkeypatch.setattr(services, "load_model", lambda name, **kw: bundle if name == "tiny-long" else real(name, **kw))
    return bundle


def test_a_512_token_prompt_stays_usable(tiny_long_model):
    at = run_app(params={"model": "tiny-long", "prompt": LONG_TEXT, "token": "400"})
    assert_clean(at)
    heatmap = charts(at)[0]
    assert "window" in map_note(at) and heatmap["_rows"] < 5000
    at.radio(key="view").set_value("binned").run()
    assert_clean(at)
    heatmap = charts(at)[0]
    assert "bins" in map_note(at) and heatmap["_rows"] < 5000
    for page in ("views/token.py", "views/bertviz_view.py"):
        at.switch_page(page).run()
        assert_clean(at)
        assert all(spec["_rows"] < 5000 for spec in charts(at))


def test_pages_and_app_do_not_import_torch_or_transformers():
    for path in [ROOT / "app.py", *sorted((ROOT / "views").glob("*.py"))]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            assert not any(n.split(".")[0] in ("torch", "transformers") for n in names), f"{path.name} imports {names}"


def test_navigation_lists_every_page():
    source = (ROOT / "app.py").read_text(encoding="utf-8")
    for page, name in [
        ("heatmaps", "Heatmaps"),
        ("flow", "Flow"),
        ("token", "Token"),
        ("bertviz_view", "bertviz"),
        ("sinks", "Sinks"),
        ("faithfulness", "Faithfulness"),
        ("claims", "Claims"),
        ("compare", "Compare"),
        ("atlas", "Atlas"),
    ]:
        assert f'"views/{page}.py", title="{name}"' in source


def test_long_steps_show_their_progress_and_leave_no_bar_behind(tiny_long_model, monkeypatch):
    """With the bar's delay at 0, every long step draws "…: k of n layers" and removes it when done;
    a rerun replays the cached steps (Streamlit replays their elements) without error or stale bar."""
    from streamlit.delta_generator import DeltaGenerator

    texts: list[str] = []
    real = DeltaGenerator.progress
    monkeypatch.setattr(
        DeltaGenerator, "progress", lambda self, value, text=None: (texts.append(text), real(self, value, text))[1]
    )
    monkeypatch.setattr(services, "PROGRESS_AFTER_S", 0.0)
    monkeypatch.setattr(services, "PROGRESS_EVERY_S", 0.0)
    at = run_app(params={"model": "tiny-long", "prompt": LONG_TEXT + " progress", "token": "40"})
    assert_clean(at)
    layers = tiny_long_model.info.layers
    assert f"Analysing the prompt: {layers} of {layers} layers" in texts
    assert f"Summarising every head: {layers} of {layers} layers" in texts
    at.switch_page("views/token.py").run()
    assert f"Ranking keys in every layer: {layers} of {layers} layers" in texts
    at.switch_page("views/sinks.py").run()
    assert_clean(at)
    assert f"Splitting every head output at the sink: {layers} of {layers} layers" in texts
    for page in ("views/sinks.py", "views/token.py", "views/heatmaps.py"):
        at.switch_page(page).run()  # cache hits: the recorded bars are replayed and end empty
        assert_clean(at)
        assert not at.get("progress")


def test_a_downloaded_chart_draws_the_rows_the_page_sent_as_arrow():
    """The page sends a chart's rows as Arrow bytes (:func:`cwviz.app.widgets._spec`); its PNG and SVG downloads
    write them back out: the rows Altair itself would inline, each drawn as one cell."""
    import re

    import cwviz
    from cwviz.analyses import tables
    from cwviz.app import widgets
    from cwviz.charts import export, heatmaps
    from tests.helpers import TEXT, make_tiny

    cells = tables.heatmap_cells(cwviz.analyze(make_tiny("llama"), TEXT), 0, 0, "contribution_inter", "inter")
    view = heatmaps.heatmap_view(cells, "measure", 3)
    sent = widgets._spec(view)
    assert sent["datasets"] and all(isinstance(data, bytes) for data in sent["datasets"].values())
    inline = widgets._inline(sent)

    def rows(spec: dict) -> list[str]:
        return sorted(json.dumps(values, sort_keys=True) for values in spec["datasets"].values())

    assert rows(inline) == rows(view.to_dict())
    svg = export.render_spec(inline, "svg").decode()
    assert len(re.findall(r'aria-label="[^"]*; contribution: [^"]*"', svg)) == len(cells.frame)


def _font_sizes(node) -> list[float]:
    """Every font size a chart spec sets (``fontSize``, ``labelFontSize``, ...), its datasets left out."""
    if isinstance(node, dict):
        return [
            size
            for key, value in node.items()
            if key != "datasets"
            for size in (
                [value]
                if key.endswith(("fontSize", "FontSize")) and isinstance(value, int | float)
                else _font_sizes(value)
            )
        ]
    return [size for item in node for size in _font_sizes(item)] if isinstance(node, list) else []


@pytest.mark.parametrize(
    "page, params",
    [
        ("views/heatmaps.py", {}),
        ("views/token.py", {}),
        ("views/sinks.py", {}),
        ("views/compare.py", {}),
        ("views/tour.py", {"step": "3"}),
        ("views/tour.py", {"step": "4"}),
        ("views/tour.py", {"step": "6"}),
    ],
    ids=["heatmaps", "token", "sinks", "compare", "tour3", "tour4", "tour6"],
)
def test_presenter_mode_draws_every_chart_text_at_16_px_and_stretches_one_view_charts(page, params):
    """In presenter mode every text a chart sets (axes, legends, titles, numbers written on it, text marks) is 16 px
    or more, and a chart of one view along a continuous axis fills its column (Vega's fit-x autosize)."""
    at = run_app(page=page, params={"presenter": "true", **params})
    at.query_params["presenter"] = "true"  # AppTest's page switch leaves the URL's parameters behind
    at.run()
    assert_clean(at)
    specs = charts(at)
    assert specs
    for spec in specs:
        sizes = _font_sizes(spec)
        assert sizes and min(sizes) >= 16, (spec.get("title"), sorted(set(sizes)))
        assert spec["config"]["text"]["fontSize"] >= 16
    if page == "views/sinks.py":  # (a) and (c): one layered view each, along the sink ratio and the layer
        assert sum(spec["autosize"]["type"] == "fit-x" for spec in specs) >= 2
    if page == "views/compare.py":  # A and B side by side above B − A (30 aligned positions), cells of 16 px or more
        maps = specs[0]
        top, difference = maps["vconcat"]
        assert len(top["hconcat"]) == 2 and all(view["width"] >= 16 * 30 for view in [*top["hconcat"], difference])
