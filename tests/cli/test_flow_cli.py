"""``cwviz flow`` on the embedded models: what it prints, its JSON and CSV tables, and its errors (exit 2, one line)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import cwviz
from cwviz.analyses import route
from cwviz.analyses.schema import FLOW_SHARE
from cwviz.cli import main
from cwviz.core.method import attribution

PROMPT = "The quick brown fox jumps over the lazy dog. Paris is the capital of"


@pytest.fixture(autouse=True)
def _embedded_loaded(embedded):
    """Load the embedded model once per session (the CLI then loads from the user cache)."""


def test_flow_prints_tokens_and_heads_and_writes_json_and_csv_with_the_pages_route(capsys, tmp_path, embedded):
    """The tables: tokens (position, token, score), heads, and edges that are the route the Flow page draws at the
    same share (``route.of``: one builder), in both the JSON and the CSV."""
    out_json, out_csv = tmp_path / "flow.json", tmp_path / "tables"
    argv = ["flow", "--text", PROMPT, "--method", "effect", "--target", " France", "--foil", " Germany"]
    assert main([*argv, "--json", str(out_json), "--csv", str(out_csv)]) == 0
    out = capsys.readouterr().out
    assert "toward logit(' France') - logit(' Germany')" in out
    assert "input tokens supporting" in out and "heads supporting (part)" in out
    payload = json.loads(out_json.read_text())
    summary = payload["summary"]
    assert summary["target_token"] == " France" and summary["foil_token"] == " Germany" and summary["edge_share"] == FLOW_SHARE
    tokens = pd.read_csv(out_csv / "tokens.csv")
    assert list(tokens.columns) == ["position", "token", "score"]
    analysis = cwviz.analyze(embedded, PROMPT)
    shown = attribution.attribute(analysis, "effect", target=" France", foil=" Germany")
    expected = route.of(shown, FLOW_SHARE)
    edges = pd.read_csv(out_csv / "edges.csv", keep_default_na=False)
    assert list(edges.columns) == list(route.EDGE_COLUMNS) and len(edges) == len(expected.edges) > 0
    assert edges[["layer", "key", "query"]].values.tolist() == expected.edges[["layer", "key", "query"]].values.tolist()
    assert np.allclose(edges["weight"], expected.edges["weight"], rtol=1e-5, atol=1e-7)
    assert [row["key"] for row in payload["edges"]] == edges["key"].tolist()
    assert summary["route"]["connected"] == list(expected.connected) and summary["route"]["carried"] >= FLOW_SHARE - 1e-9
    np.testing.assert_allclose(tokens["score"], shown.scores, rtol=1e-5, atol=1e-6)


def test_an_encoder_flows_into_cls(capsys):
    assert main(["flow", "--model", "embedded-encoder", "--text", PROMPT, "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "from position 0 '[CLS]' toward its final representation" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--target", " France Germany"], "not one"),
        (["--position", "500"], "out of range"),
        (["--target", " France", "--foil", " France"], "foil is the target"),
        (["--model", "embedded-encoder", "--target", "paris"], "position's representation"),
        (["--share", "0"], "--share"),
    ],
)
def test_user_errors_exit_2_with_one_line(capsys, argv, message):
    assert main(["flow", "--text", PROMPT, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and message in err and "\n" not in err
