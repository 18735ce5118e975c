"""``cwviz flow`` on the embedded models: what it prints, its JSON and CSV tables, and its errors (exit 2, one line)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import cwviz
from cwviz.analyses import route
from cwviz.analyses.schema import FLOW_METHODS
from cwviz.cli import main
from cwviz.core.defaults import KEPT
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
    assert summary["target_token"] == " France" and summary["foil_token"] == " Germany" and summary["kept"] == KEPT
    tokens = pd.read_csv(out_csv / "tokens.csv")
    assert list(tokens.columns) == ["position", "token", "score"]
    analysis = cwviz.analyze(embedded, PROMPT)
    shown = attribution.attribute(analysis, "effect", target=" France", foil=" Germany")
    expected = route.of(shown, KEPT)
    edges = pd.read_csv(out_csv / "edges.csv", keep_default_na=False)
    assert list(edges.columns) == list(route.EDGE_COLUMNS) and len(edges) == len(expected.edges) > 0
    assert edges[["layer", "key", "query"]].values.tolist() == expected.edges[["layer", "key", "query"]].values.tolist()
    assert np.allclose(edges["weight"], expected.edges["weight"], rtol=1e-5, atol=1e-7)
    assert [row["key"] for row in payload["edges"]] == edges["key"].tolist()
    assert summary["route"]["connected"] == list(expected.connected) and summary["route"]["carried"] >= KEPT - 1e-9
    np.testing.assert_allclose(tokens["score"], shown.scores, rtol=1e-5, atol=1e-6)


def test_every_method_answers_and_the_check_measures_every_input_token(capsys, tmp_path):
    """--method for each registry member gives one score per token; --check writes the measured effects beside the
    scores, equal to a knockout of each token by hand, and prints the statistics the test uses."""
    import numpy as np
    import torch

    import cwviz
    from cwviz.core.method.knockout import last_logits

    for method in FLOW_METHODS:
        assert main(["flow", "--text", "The capital of France is", "--method", method, "--top", "2"]) == 0, method
        assert f"({method})" in capsys.readouterr().out
    out_json = tmp_path / "check.json"
    assert (
        main(["flow", "--text", "The capital of France is", "--method", "effect", "--check", "--json", str(out_json)])
        == 0
    )
    out = capsys.readouterr().out
    assert "check against knockouts: 4 of 4 knockouts (relay)" in out and "top-3 sign agreement" in out
    payload = json.loads(out_json.read_text())
    check = payload["summary"]["check"]
    assert check["complete"] and -1 <= check["rho"] <= 1
    bundle = cwviz.load_model("embedded", device="cpu")
    ids = bundle.tokenizer("The capital of France is")["input_ids"]
    target = payload["summary"]["target"]
    logits = last_logits(bundle, ids, [()] + [(k,) for k in range(len(ids) - 1)])
    by_hand = (logits[0, target] - logits[1:, target]).double().numpy()
    measured = [row["effect"] for row in payload["tokens"]]
    np.testing.assert_allclose(measured[:-1], by_hand, atol=1e-4)
    assert measured[-1] is None  # the position predicted from is never taken away: null in strict JSON
    assert torch.is_grad_enabled()


def test_top_reaches_the_flow_the_heads_vocabulary_is_written_with_top_tokens_each_way(capsys, tmp_path, embedded):
    """``--top`` is the flow's vocabulary count: the ``vocabulary`` table holds each head's ``--top`` most promoted and
    suppressed tokens, those of the library's flow with ``vocabulary=--top``."""
    out_json = tmp_path / "flow.json"
    text = "The capital of France is"
    assert main(["flow", "--text", text, "--method", "share_flow", "--top", "2", "--json", str(out_json)]) == 0
    written = pd.DataFrame(json.loads(out_json.read_text())["vocabulary"])
    expected = cwviz.flow(cwviz.analyze(embedded, text), vocabulary=2).vocabulary_table
    layers, heads = embedded.info.layers, embedded.info.heads
    assert len(written) == len(expected) == layers * heads * 2 * 2
    keys = ["layer", "head", "direction", "rank", "token_id"]
    assert written[keys].values.tolist() == expected[keys].values.tolist()
    np.testing.assert_allclose(written["logit"], expected["logit"], rtol=1e-5, atol=1e-5)


def test_an_encoder_flows_into_cls(capsys):
    for method in ("share_flow", "effect"):
        assert main(["flow", "--model", "embedded-encoder", "--text", PROMPT, "--top", "3", "--method", method]) == 0
        out = capsys.readouterr().out
        assert "from position 0 '[CLS]' toward its final representation" in out, method


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--target", " France Germany"], "not one"),
        (["--position", "500"], "out of range"),
        (["--target", " France", "--foil", " France"], "foil is the target"),
        (["--model", "embedded-encoder", "--target", "paris"], "position's representation"),
        (["--kept", "0"], "--kept"),
        (["--method", "nope"], "no attribution method 'nope'"),
        (["--method", "effect", "--foil", " France", "--target", " France"], "foil is the target"),
        (["--method", "effect", "--target", " France Germany"], "not one"),
    ],
)
def test_user_errors_exit_2_with_one_line(capsys, argv, message):
    assert main(["flow", "--text", PROMPT, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and message in err and "\n" not in err
