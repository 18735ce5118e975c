"""``cwviz flow`` on the embedded models: what it prints, its JSON and CSV tables, and its errors (exit 2, one line)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from cwviz.cli import main
from cwviz.cli.flow import CSV_TABLES

PROMPT = "The quick brown fox jumps over the lazy dog. Paris is the capital of"


@pytest.fixture(autouse=True)
def _embedded_loaded(embedded):
    """Load the embedded model once per session (the CLI then loads from the user cache)."""


def test_flow_prints_tokens_and_heads_and_writes_json_and_csv(capsys, tmp_path):
    out_json, out_csv = tmp_path / "flow.json", tmp_path / "tables"
    assert (
        main(["flow", "--text", PROMPT, "--target", " France", "--foil", " Germany", "--json", str(out_json), "--csv", str(out_csv)]) == 0
    )
    out = capsys.readouterr().out
    assert "toward logit(' France') - logit(' Germany')" in out
    assert "input tokens supporting" in out and "heads supporting (direct)" in out
    payload = json.loads(out_json.read_text())
    summary = payload["summary"]
    assert summary["target_token"] == " France" and summary["foil_token"] == " Germany"
    assert abs(sum(row["value"] for row in payload["parts"]) - summary["frozen_logit_difference"]) < 1e-3
    assert abs(summary["frozen_logit_difference"] - summary["logit_difference"]) < 1e-3
    for name in CSV_TABLES:
        assert (out_csv / f"{name}.csv").is_file()
    tokens = pd.read_csv(out_csv / "tokens.csv")
    assert list(tokens.columns) == ["position", "token", "total", "share"]
    assert abs(tokens["total"].sum() + summary["bias_total"] - summary["frozen_logit_difference"]) < 1e-3
    edges = pd.read_csv(out_csv / "edges.csv")
    assert list(edges.columns) == ["layer", "source", "target", "weight"] and len(edges) > 0


def test_an_encoder_flows_into_cls(capsys):
    assert main(["flow", "--model", "embedded-encoder", "--text", PROMPT, "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "flow into position 0 '[CLS]'" in out and "sum to 1" in out


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
