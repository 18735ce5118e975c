"""The faithfulness page: it loads, a tiny run draws both curves and the table, bad input shows an error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from cwviz.core.defaults import RANKED_MEASURES

PAGE = str(Path(__file__).resolve().parents[2] / "views" / "faithfulness.py")
TIMEOUT = 180


@pytest.fixture
def app() -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT)
    at.run()
    return at


def tiny_run(at: AppTest) -> AppTest:
    at.number_input(key="cap").set_value(12)
    at.multiselect(key="rates").set_value([50.0])
    at.button_group(key="measures").set_value(["raw", "random"])
    at.button(key="faith_run").click()
    return at.run()


def test_default_load_shows_the_settings_and_no_results(app):
    assert not app.exception
    assert not app.error
    assert app.button(key="faith_run").label == "Run"
    assert "a file on this machine" in app.radio(key="source").options
    assert app.button_group(key="measures").value == list(RANKED_MEASURES)  # the CLI's default too
    assert not app.get("vega_lite_chart")


def test_a_tiny_run_on_the_sidebar_prompt_draws_both_curves_and_the_table(app):
    at = tiny_run(app)
    assert not at.exception
    assert not at.error
    assert len(at.get("vega_lite_chart")) == 2
    table = at.dataframe[0].value
    assert set(table.index) == {"raw", "random"}
    assert not any(column.startswith("area") for column in table.columns)  # one rate: no area to show
    assert any("no area under the curves" in m.value for m in at.markdown)
    assert any("1 of 1 examples" in caption.value for caption in at.caption)


def test_the_two_measures_that_rank_alike_are_said_to_coincide(app):
    """Value-weighted attention and its inter-head output-normalised form give the same curves (one ‖o_i‖ divides
    every key of a query); the page says so, since one line then hides the other."""
    app.number_input(key="cap").set_value(12)
    app.multiselect(key="rates").set_value([10.0, 50.0])
    app.button_group(key="measures").set_value(["value_weighted", "value_weighted_output_normalized"])
    app.button(key="faith_run").click()
    at = app.run()
    assert not at.exception and not at.error
    table = at.dataframe[0].value
    assert table.loc["value_weighted"].equals(table.loc["value_weighted_output_normalized"])
    assert {"area comprehensiveness", "area sufficiency"} <= set(table.columns)
    assert any("from 0.1 to 0.5" in m.value for m in at.markdown)
    assert any("coincide" in caption.value for caption in at.caption)


def test_two_examples_from_a_jsonl_path_and_a_malformed_file(app, tmp_path):
    good = tmp_path / "items.jsonl"
    good.write_text("\n".join(json.dumps({"question": f"What is {i} + {i}?", "answer": f"{2 * i}"}) for i in range(3)))
    app.radio(key="source").set_value("path").run()
    app.text_input(key="path").set_value(str(good))
    app.number_input(key="n").set_value(2)
    at = tiny_run(app)
    assert not at.exception and not at.error
    assert any("2 of 2 examples" in caption.value for caption in at.caption)

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": \n')
    at.text_input(key="path").set_value(str(bad))
    at.button(key="faith_run").click()
    at.run()
    assert not at.exception
    assert "line 2" in at.error[0].value


def test_hosting_mode_offers_no_server_paths(monkeypatch):
    monkeypatch.setenv("CWVIZ_HOSTED", "1")
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT)
    at.run()
    assert not at.exception
    options = at.radio(key="source").options
    assert "a file on this machine" not in options
    assert "an uploaded file (.txt or .jsonl)" in options


def test_the_page_runs_through_the_sweep_runner_and_records_what_the_cli_records(app, tmp_path):
    """The page's run goes through the shared sweep runner: its records (fingerprint, envelope and numbers) are the
    records `cwviz faithfulness --results DIR` writes for the same example and protocol, and so is its summary."""
    from cwviz import cli
    from cwviz.analyses import records
    from cwviz.analyses.codecs.sweeps import FAITHFULNESS
    from cwviz.app import run_services

    at = tiny_run(app)
    assert not at.exception and not at.error
    asked = at.session_state["_faithfulness_asked"]
    results = tmp_path / "results"
    argv = ["faithfulness", "--text", asked.texts[0], "--max-tokens", "12", "--rates", "50", "--measures", "raw,random"]
    assert cli.main([*argv, "--results", str(results)]) == 0
    assert run_services.finished(run_services.faithfulness_plan(asked)) == records.read_records(results, FAITHFULNESS)
    shown = at.dataframe[0].value
    summary = FAITHFULNESS.summary(records.read_records(results, FAITHFULNESS))
    assert (
        shown.loc["raw", "comp. 50%"]
        == summary.query("measure == 'raw' and curve == 'comprehensiveness'")["delta_ppl"].item()
    )


def test_a_stopped_run_keeps_its_finished_examples_and_run_resumes_it(app, tmp_path, monkeypatch):
    """Stop (like any click during a run) interrupts the script at its next Streamlit call, as st.stop does: the
    rerun that follows shows the examples finished before, and Run with the same settings computes only the rest."""
    import streamlit as st

    from cwviz.analyses import faithfulness

    good = tmp_path / "items.jsonl"
    good.write_text("\n".join(json.dumps({"text": f"Example {i} is about the number {i}."}) for i in range(3)))
    app.radio(key="source").set_value("path").run()
    app.text_input(key="path").set_value(str(good))
    app.number_input(key="n").set_value(3)
    real, ran = faithfulness.run_example, []

    def stopped_on_the_second(*args, **kwargs):
        ran.append(kwargs["example"])
        if len(ran) == 2:
            st.stop()
        return real(*args, **kwargs)

    monkeypatch.setattr(faithfulness, "run_example", stopped_on_the_second)
    at = tiny_run(app)
    assert not at.exception and not at.error and not at.dataframe  # stopped: nothing drawn after the run
    at.run()
    assert any("1 of 3 examples (stopped early" in caption.value for caption in at.caption)
    at.button(key="faith_run").click()
    at.run()
    assert not at.exception and not at.error
    assert ran == [0, 1, 1, 2]  # the finished example is not run again
    assert any(caption.value.startswith("3 of 3 examples;") for caption in at.caption)
