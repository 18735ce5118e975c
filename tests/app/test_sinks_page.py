"""The sinks page: default load draws its four charts, the sink and λ controls work, pooling reads JSONL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

PAGE = str(Path(__file__).resolve().parents[2] / "views" / "sinks.py")
TIMEOUT = 240


@pytest.fixture
def app() -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT)
    at.run()
    return at


def _charts(at: AppTest):
    return at.get("vega_lite_chart")


def _title(chart) -> str:
    spec = json.loads(chart.proto.spec)
    title = spec.get("title") or (spec.get("vconcat") or [{}])[0].get("title", "")
    return title if isinstance(title, str) else title.get("text", "")


def test_default_load_draws_the_ratio_map_share_and_intervention_charts(app):
    assert not app.exception
    assert not app.error
    titles = [_title(chart) for chart in _charts(app)]
    assert len(titles) == 4
    assert titles[1].startswith("Anti-alignment") and titles[2] == "How far attention overstates the sink"
    assert titles[3] == "Change in head-output norm"
    assert '"mark": {"type": "line"' in _charts(app)[0].proto.spec  # the analytic curve over the points
    titles = [s.value for s in app.subheader]
    assert titles[:3] == [
        "(a) Sink ratio against head output norm",
        "(b) Anti-alignment",
        "(c) Attention vs contribution share",
    ]
    assert any("Sink: position 0" in c.value for c in app.caption)
    delta = [m for m in app.metric if m.label == "PPL intervened"][0]
    assert float(delta.delta) > 0  # removing the sink's value in every layer raises perplexity


def test_lambda_one_changes_nothing_and_the_sink_can_be_moved(app):
    app.slider(key="lambda").set_value(1.0)
    app.button(key="sinks_lambda_apply").click().run()  # λ is in a form: it applies with Apply λ
    assert not app.exception
    delta = [m for m in app.metric if m.label == "PPL intervened"][0]
    assert float(delta.delta) == 0.0
    # No empty chart of zero changes: the page says there is nothing to show.
    assert any("changes nothing" in i.value for i in app.info)
    assert "Change in head-output norm" not in [_title(chart) for chart in _charts(app)]
    app.radio(key="sink").set_value("position").run()
    app.number_input(key="sink_pos").set_value(2).run()
    assert not app.exception and not app.error
    assert any("Sink: position 2" in c.value for c in app.caption)


def test_pooling_from_jsonl_and_a_malformed_file(app, tmp_path):
    good = tmp_path / "items.jsonl"
    good.write_text("\n".join(json.dumps({"question": f"What is {i} + {i}?", "answer": f"{2 * i}"}) for i in range(3)))
    app.text_input(key="sinks_pool_path").set_value(str(good))
    app.number_input(key="sinks_pool_n").set_value(2).run()
    assert not app.exception and not app.error
    assert any("pooled over 3 prompts" in c.value for c in app.caption)
    assert [b for b in app.button if b.key == "sinks_pool_stop"] == [], "the Stop goes once the prompts are pooled"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": \n')
    app.text_input(key="sinks_pool_path").set_value(str(bad)).run()
    assert not app.exception
    assert "line 2" in app.error[0].value


def test_a_model_with_learned_sinks_reports_their_share(monkeypatch):
    import cwviz
    from cwviz.app import services
    from tests.helpers import CharTokenizer, family_model

    bundle = cwviz.bundle_from_model(family_model("gpt_oss"), CharTokenizer(100), model_id="tiny-gpt-oss")
    real = services.load_model
    monkeypatch.setattr(
        services, "load_model", lambda name, **kw: bundle if name == "tiny-gpt-oss" else real(name, **kw)
    )
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT)
    at.query_params["model"] = "tiny-gpt-oss"
    at.query_params["prompt"] = "The quick brown fox jumps."
    at.run()
    assert not at.exception and not at.error, [e.value for e in [*at.exception, *at.error]]
    (line,) = [i.value for i in at.info if "learned attention sinks" in i.value]
    assert "% of the attention on average" in line and "in layer 0" in line
    assert "contributions still sum to 1" in line


def test_the_layer_by_layer_delta_ppl_runs_a_few_layers_a_pass_and_resumes_after_a_stop(monkeypatch):
    """Issue 56: the layer-by-layer ΔPPL ran 123 s in one pass with no Stop. It runs a few layers a pass, keeps each
    pass's layers as it ends, and a run stopped part-way (here: the first layers already kept) computes only the rest;
    its table is the library's, every layer in order. The page draws a Stop while it runs, and the table after."""
    from cwviz.analyses import sink_interventions
    from cwviz.app import services, sink_services

    request = services.Request(text="The quick brown fox jumps over the lazy dog.")
    analysis = services.get_analysis(request).analysis
    passes: list[list[int]] = []
    real = sink_interventions.removal_perplexity

    def counted(analysis, layer_sets, sink, factor, **kwargs):
        passes.append([next(iter(s)) for s in layer_sets])
        return real(analysis, layer_sets, sink, factor, **kwargs)

    monkeypatch.setattr(sink_interventions, "removal_perplexity", counted)
    kept = sink_services.layerwise_done(request, 0, 0.5)
    kept.clear()
    first = list(range(sink_services.LAYERWISE_CHUNK))
    # a run stopped after one pass
    kept.update(zip(first, real(analysis, [[layer] for layer in first], 0, 0.5).tolist()))
    table = sink_services.layerwise(request, 0, 0.5)
    assert all(len(chunk) <= sink_services.LAYERWISE_CHUNK for chunk in passes)
    assert sorted(layer for chunk in passes for layer in chunk) == list(range(len(first), analysis.num_layers)), (
        "only the rest"
    )
    whole = sink_interventions.layerwise_removal(analysis, 0, 0.5)
    assert table["layer"].tolist() == whole["layer"].tolist()
    assert table["perplexity"].to_numpy() == pytest.approx(whole["perplexity"].to_numpy(), rel=1e-4)

    at = AppTest.from_file(str(Path(PAGE).parents[1] / "app.py"), default_timeout=TIMEOUT)
    at.query_params["prompt"], at.query_params["layerwise"], at.query_params["lambda"] = request.text, "true", "0.5"
    at.run()
    at.switch_page("views/sinks.py").run()
    assert not at.exception and not at.error
    assert [b for b in at.button if b.key == "sinks_layerwise_stop"] == [], "the Stop goes once the passes end"
    per_layer = next(frame.value for frame in at.dataframe if "delta_ppl" in frame.value.columns)
    assert per_layer["layer"].tolist() == list(range(analysis.num_layers))


def test_pooled_prompts_are_kept_as_each_ends_so_a_stopped_run_resumes(monkeypatch, tmp_path):
    """Pooling runs through the one runner with the records kept in the server process: a run interrupted after its
    first prompt (a Stop click interrupts the page between two Streamlit calls) keeps that prompt, and asked again runs
    only the rest."""
    from cwviz.app import services, sink_services

    path = tmp_path / "items.jsonl"
    path.write_text("\n".join(json.dumps({"text": f"Prompt number {i} is here."}) for i in range(3)))
    request = services.Request(text="The sidebar prompt.")
    runs: list[str] = []
    real = sink_services.analyze

    class Stopped(Exception):
        pass

    def analyze(bundle, text, **kwargs):
        if text.endswith("1 is here.") and not any(r.endswith("1 is here.") for r in runs):
            runs.append(text)
            raise Stopped  # the first time: the page is interrupted while prompt 1 runs
        runs.append(text)
        return real(bundle, text, **kwargs)

    monkeypatch.setattr(sink_services, "analyze", analyze)
    with pytest.raises(Stopped):
        sink_services.pooled_tables(request, "0", str(path), 2)
    assert runs == ["Prompt number 0 is here.", "Prompt number 1 is here."]
    tables = sink_services.pooled_tables(request, "0", str(path), 2)
    assert len(tables) == 2 and runs[2:] == ["Prompt number 1 is here."], "prompt 0 was kept, only prompt 1 runs again"
