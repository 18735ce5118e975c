"""The Claims page: a saved results folder of ``cwviz claims`` gives one row per claim; a run here on the sidebar's
model gives the same table the CLI would; an unreadable folder shows an error, not a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from streamlit.dataframe_util import convert_arrow_bytes_to_pandas_df
from streamlit.testing.v1 import AppTest

from cwviz.analyses import claim_runs, claims, records
from cwviz.charts.palette import VERDICT_COLOURS
from cwviz.core.defaults import CLAIMS_MAX_TOKENS
from tests.helpers import ordered, record, save_tiny_model, sinks

PAGE = str(Path(__file__).resolve().parents[2] / "views" / "claims.py")
TIMEOUT = 300


@pytest.fixture
def app() -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=TIMEOUT)
    at.run()
    return at


def saved_folder(tmp_path: Path, scope: str = "token") -> Path:
    """A results folder as ``cwviz claims --results DIR`` leaves it, of constructed records where claim 1 holds
    under ``scope`` (under the query scope it ties by construction), every measure but raw beats the random control,
    and claims 2–5 hold."""
    where = tmp_path / "run" / "claims"
    where.mkdir(parents=True)
    lines = []
    for i in range(12):
        ppl = ordered(i, 1.0, noise=0.1)
        ppl["comprehensiveness", "random"], ppl["sufficiency", "random"] = 1.5, 9.5
        payload = record(i, ppl, sinks(i), scope=scope)
        lines.append(
            json.dumps(
                records.make_record(
                    claims.CLAIMS, i, f"item {i}", "key", {k: v for k, v in payload.items() if k != "example"}
                )
            )
        )
    (where / "records-00000.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return tmp_path / "run"


def test_default_load_offers_a_run_and_shows_no_table(app):
    assert not app.exception and not app.error
    assert app.button(key="claims_run").label == "Run"
    assert app.number_input(key="claims_cap").value == CLAIMS_MAX_TOKENS  # the CLI's cap, one constant
    assert not app.dataframe


def test_a_saved_folder_draws_every_verdict_and_gives_one_row_per_claim_and_the_control(app, tmp_path):
    app.radio(key="claims_source").set_value("saved")
    app.run()
    app.text_input(key="claims_dir").set_value(str(saved_folder(tmp_path)))
    at = app.run()
    assert not at.exception and not at.error
    # the forest plot: one row per verdict (claim 1's two curves, 2, 3, 4, 5a, 5b, 5c), each coloured by its verdict
    (chart,) = at.get("vega_lite_chart")
    drawn = pd.concat([convert_arrow_bytes_to_pandas_df(d.data.data) for d in chart.proto.datasets])
    assert sorted(set(drawn["label"])) == sorted(at.dataframe[0].value.index)
    assert len(at.dataframe[0].value) == 8 and set(at.dataframe[0].value.verdict) == {"holds"}
    assert (
        VERDICT_COLOURS["holds"] in chart.proto.spec
        and "#b2182b" not in chart.proto.spec
        and "#2166ac" not in chart.proto.spec
    )
    overview = at.dataframe[1].value
    assert list(overview.index) == [1, 2, 3, 4, 5]
    assert list(overview.loc[[2, 3, 4], "verdict"]) == ["holds"] * 3
    assert overview.loc[5, "verdict"] == "a: holds; b: holds; c: holds"
    assert overview.loc[1, "verdict"] == "2 holds, 0 fails, 0 unresolved of 2 that can hold"
    control = at.dataframe[2].value.set_index(["curve", "measure"])
    assert len(control) == 8 and control.loc[("comprehensiveness", "CW"), "verdict"] == "holds"
    assert overview.loc[3, "statement"] == claims.STATEMENTS[3]
    assert any("12 item(s)" in c.value for c in at.caption)
    judged = [c.value for c in at.caption if c.value.startswith("Judged on 12 item(s)")]
    assert (
        len(judged) == 1
        and "50-item runs in docs/claims.md" in judged[0]
        and f"fewer than {claims.MIN_ITEMS} items" in judged[0]
    )


def test_query_scope_rows_are_drawn_as_ties_by_construction_and_counted_apart(app, tmp_path):
    app.radio(key="claims_source").set_value("saved")
    app.run()
    app.text_input(key="claims_dir").set_value(str(saved_folder(tmp_path, scope="query")))
    at = app.run()
    assert not at.exception and not at.error
    (chart,) = at.get("vega_lite_chart")
    drawn = pd.concat([convert_arrow_bytes_to_pandas_df(d.data.data) for d in chart.proto.datasets])
    assert set(drawn.loc[drawn["claim"] == 1, "verdict"]) == {claims.TIES}
    assert VERDICT_COLOURS[claims.TIES] in chart.proto.spec and "cannot hold" in chart.proto.spec
    overview = at.dataframe[1].value
    assert overview.loc[1, "verdict"] == (
        "0 holds, 0 fails, 0 unresolved of 0 that can hold; 2 ties by construction (cannot hold)"
    )


def test_a_folder_that_is_not_a_claims_run_shows_an_error(app, tmp_path):
    app.radio(key="claims_source").set_value("saved")
    app.run()
    app.text_input(key="claims_dir").set_value(str(tmp_path / "nowhere"))
    at = app.run()
    assert not at.exception
    assert at.error and "no results folder" in at.error[0].value


def test_a_run_here_judges_every_claim_from_the_records_the_cli_writes(tmp_path):
    """The page's run and ``cwviz claims`` make the same records (fingerprint and numbers) on the sidebar's model,
    here a tiny random model a link names by its folder: that the two agree does not depend on the model, and the
    embedded model's vocabulary made each run 12 s (the output layer of every masked pass), the test 26 s."""
    from cwviz import cli
    from cwviz.analyses.codecs.checks import CLAIMS
    from cwviz.app import run_services

    model = str(save_tiny_model(tmp_path / "model"))
    app = AppTest.from_file(PAGE, default_timeout=TIMEOUT)
    app.query_params["model"] = model
    app.run()
    app.number_input(key="claims_n").set_value(1)
    app.number_input(key="claims_cap").set_value(10)
    app.button(key="claims_run").click()
    at = app.run()
    assert not at.exception and not at.error
    overview = at.dataframe[1].value
    assert list(overview.index) == [1, 2, 3, 4, 5]
    assert set(at.dataframe[2].value["scope"]) == {"query", "token", "layer"}  # the random control under every scope
    made = run_services.finished(run_services.claims_plan(at.session_state["_claims_asked"]))
    args = ["claims", "--gsm8k", "--n", "1", "--max-tokens", "10", "--model", model, "--results", str(tmp_path)]
    assert cli.main(args) == 0
    # The same fingerprint and numbers, compared as the records' JSON: the tiny model has no sink-active head, and its
    # claim 3 and 4 statistics are NaN, which equals itself only as text.
    written = records.read_records(tmp_path / claims.RECORDS_FOLDER, CLAIMS)
    assert json.dumps(made, sort_keys=True) == json.dumps(written, sort_keys=True)


def test_stop_keeps_the_finished_items_and_run_resumes_from_them(app, monkeypatch):
    """Stop (like any click during a run) interrupts the script at its next Streamlit call, as st.stop does here: the
    rerun says how many items are kept, and Run with the same settings computes only the rest."""
    import streamlit as st

    ran: list[int] = []

    def stopped_on_the_second(bundle, text, protocol, scopes, sink, index):
        ran.append(index)
        if len(ran) == 2:
            st.stop()
        payload = record(index, ordered(index, 1.0, noise=0.1), sinks(index))
        return {k: v for k, v in payload.items() if k != "example"}

    monkeypatch.setattr(claim_runs, "item_payload", stopped_on_the_second)
    app.number_input(key="claims_n").set_value(3)
    app.button(key="claims_run").click()
    at = app.run()
    assert not at.exception and not at.dataframe  # stopped: nothing judged
    at.run()
    assert any("Stopped after 1 of 3 items: Run resumes." in c.value for c in at.caption)
    at.button(key="claims_run").click()
    at.run()
    assert not at.exception and not at.error
    assert ran == [0, 1, 1, 2]  # the finished item is not run again
    assert list(at.dataframe[1].value.index) == [1, 2, 3, 4, 5] and any(
        c.value.startswith("3 item(s);") for c in at.caption
    )
