"""The Atlas page through AppTest on a tiny model: nothing runs before Run; Run pools the file's prompts, draws
the map and lists the picked head's strongest prompts with links to their heatmaps; the saved results reload
to the same map; a bad file gets a message; hosting mode offers only the shipped sample."""

from __future__ import annotations

import json
from urllib.parse import parse_qs, urlparse

import pandas as pd
import pytest
from streamlit.dataframe_util import convert_arrow_bytes_to_pandas_df
from streamlit.testing.v1 import AppTest

from cwviz.app import services
from tests.helpers import tiny_long_bundle
from tests.helpers.app import APP, TIMEOUT, assert_clean, charts, title

PAGE = "views/atlas.py"
PROMPTS = ["the cat sat on the mat", "a b c d e f g h", "hello world, hello again", "one more"]


@pytest.fixture
def tiny_model(monkeypatch):
    bundle = tiny_long_bundle()
    real = services.load_model
    monkeypatch.setattr(services, "load_model", lambda name, **kw: bundle if name == "tiny-long" else real(name, **kw))
    return bundle


def _data(at: AppTest) -> list[pd.DataFrame]:
    """The datasets of the page's first chart."""
    return [convert_arrow_bytes_to_pandas_df(d.data.data) for d in at.get("vega_lite_chart")[0].proto.datasets]


def open_page(params: dict) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    for key, value in {"model": "tiny-long", "prompt": PROMPTS[0], **params}.items():
        at.query_params[key] = value
    at.run()
    at.switch_page(PAGE).run()
    return at


def test_run_draws_the_map_lists_the_strongest_prompts_and_saves_what_reloads(tiny_model, tmp_path):
    source = tmp_path / "prompts.jsonl"
    source.write_text("\n".join(json.dumps({"text": t}) for t in PROMPTS), encoding="utf-8")
    out = tmp_path / "atlas"
    at = open_page(
        {
            "atlas_source": "path",
            "atlas_path": str(source),
            "atlas_n": "3",
            "atlas_out": str(out),
            "layer": "1",
            "head": "2",
        }
    )
    assert_clean(at)
    # nothing runs before Run
    assert not charts(at) and any("Run pools the first 3 prompts" in c.value for c in at.caption)
    at.button(key="atlas_run").click().run()
    assert_clean(at)
    (grid,) = charts(at)
    assert "Mean over 3 prompt(s)" in title(grid) and grid["_rows"] == 2 * 4 + 1  # every head, and the outline
    assert any("3 prompt(s) on tiny-long" in c.value for c in at.caption)
    top = at.dataframe[0].value
    # cos: lowest first
    assert len(top) == 3 and set(top["text"]) == set(PROMPTS[:3]) and top["value"].is_monotonic_increasing
    link = parse_qs(urlparse(top["heatmaps"].iloc[0]).query)
    assert (
        link["prompt"] == [top["text"].iloc[0]]
        and link["layer"] == ["1"]
        and link["head"] == ["2"]
        and link["model"] == ["tiny-long"]
    )
    assert (out / "pooled.csv").is_file()

    at.radio(key="atlas_metric").set_value("negative_share").run()
    assert_clean(at)
    ran = charts(at)[0], _data(at)
    at.radio(key="atlas_source").set_value("saved").run()
    at.text_input(key="atlas_dir").set_value(str(out)).run()
    assert_clean(at)
    reloaded = charts(at)[0], _data(at)
    assert title(reloaded[0]) == title(ran[0]) and len(ran[1]) == len(reloaded[1])  # the same map, no forward pass
    for before, after in zip(ran[1], reloaded[1]):
        pd.testing.assert_frame_equal(before, after)
    assert at.text_input(key="atlas_dir").value == str(out) and at.radio(key="atlas_metric").value == "negative_share"


def test_a_file_that_is_not_there_gets_a_message(tiny_model, tmp_path):
    at = open_page({"atlas_source": "path", "atlas_path": str(tmp_path / "missing.jsonl"), "atlas_n": "2"})
    at.button(key="atlas_run").click().run()
    assert not at.exception
    assert len(at.error) == 1 and "missing.jsonl" in at.error[0].value and not charts(at)


def test_hosting_mode_offers_only_the_shipped_sample(tiny_model, monkeypatch):
    monkeypatch.setenv("CWVIZ_HOSTED", "1")
    monkeypatch.setenv("CWVIZ_ALLOWED_MODELS", "tiny-long")
    at = open_page({"atlas_source": "path", "atlas_path": "/etc/passwd"})
    assert at.radio(key="atlas_source").options == ["GSM8K sample (ships with cwviz)"]
    assert not [w for w in at.text_input if w.key in ("atlas_path", "atlas_out", "atlas_dir")]


def test_a_run_shows_its_progress_and_leaves_no_bar_behind(tiny_model, tmp_path, monkeypatch):
    from streamlit.delta_generator import DeltaGenerator

    texts: list[str] = []
    real = DeltaGenerator.progress
    monkeypatch.setattr(
        DeltaGenerator, "progress", lambda self, value, text=None: (texts.append(text), real(self, value, text))[1]
    )
    monkeypatch.setattr(services, "PROGRESS_AFTER_S", 0.0)
    monkeypatch.setattr(services, "PROGRESS_EVERY_S", 0.0)
    source = tmp_path / "prompts.jsonl"
    source.write_text("\n".join(json.dumps({"text": t + " progress"}) for t in PROMPTS), encoding="utf-8")
    at = open_page({"atlas_source": "path", "atlas_path": str(source), "atlas_n": "2"})
    at.button(key="atlas_run").click().run()
    assert_clean(at)
    # Drawn at once (before any prompt is done), then with an estimate from the measured prompts, then done.
    assert texts[0] == "Atlas on tiny-long: prompt 1 of 2 (an estimate follows the first prompt)"
    assert any(t.startswith("Atlas on tiny-long: prompt 2 of 2, about") for t in texts)
    assert texts[-1] == "Atlas on tiny-long: 2 of 2 prompts done"
    assert not at.get("progress")


def test_stop_keeps_the_finished_prompts_and_run_resumes_from_them(tiny_model, tmp_path, monkeypatch):
    """Stop interrupts the run (a click reruns the page; here st.stop stands for that interruption) and keeps the
    prompts finished; Run then computes only the others."""
    import streamlit as st

    from cwviz.analyses import atlas

    source = tmp_path / "prompts.jsonl"
    source.write_text("\n".join(json.dumps({"text": t + " stop"}) for t in PROMPTS), encoding="utf-8")
    real, ran = atlas.iter_prompt_stats, []

    def stopped_on_the_second(bundle, texts, *args, **kwargs):
        ran.append(texts[0])
        if len(ran) == 2:
            st.stop()
        return real(bundle, texts, *args, **kwargs)

    monkeypatch.setattr(atlas, "iter_prompt_stats", stopped_on_the_second)
    at = open_page({"atlas_source": "path", "atlas_path": str(source), "atlas_n": "3"})
    at.button(key="atlas_run").click().run()
    assert_clean(at)
    assert not charts(at)
    at.button(key="atlas_stop").click().run()
    assert_clean(at)
    assert not charts(at) and any("Run resumes" in c.value for c in at.caption)
    at.button(key="atlas_run").click().run()
    assert_clean(at)
    (grid,) = charts(at)
    assert "Mean over 3 prompt(s)" in title(grid)
    assert ran == [f"{t} stop" for t in (PROMPTS[0], PROMPTS[1], PROMPTS[1], PROMPTS[2])]  # the first prompt ran once


def test_a_sweep_results_folder_loads_as_a_saved_atlas(tiny_model, tmp_path, monkeypatch):
    """`cwviz atlas --results DIR` (the sweep runner) leaves a folder the page reloads as it reloads `--out`'s."""
    from cwviz import cli
    from cwviz.cli import atlas as command

    monkeypatch.setattr(command, "load", lambda _args: tiny_model)
    source = tmp_path / "prompts.jsonl"
    source.write_text("\n".join(json.dumps({"text": t}) for t in PROMPTS), encoding="utf-8")
    results = tmp_path / "results"
    assert cli.main(["atlas", "--jsonl", str(source), "--bootstrap", "20", "--results", str(results)]) == 0
    at = open_page({"atlas_source": "saved", "atlas_dir": str(results), "layer": "1", "head": "2"})
    assert_clean(at)
    (grid,) = charts(at)
    assert f"Mean over {len(PROMPTS)} prompt(s)" in title(grid)
    assert set(at.dataframe[0].value["text"]) <= set(PROMPTS)
