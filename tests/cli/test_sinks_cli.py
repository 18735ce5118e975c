"""``python -m cwviz sinks`` on the embedded model: the per-layer table, the CSV, JSONL input and errors."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from cwviz.analyses import sinks
from cwviz.cli import main

PROMPT = "Tom has 3 apples and buys 4 more. How many apples does he have now?"


@pytest.fixture(autouse=True)
def _embedded_loaded(embedded):
    """Load the embedded model once per session (the CLI then loads from the user cache)."""


def _layer_rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if line.strip() and line.split()[0].isdigit()]


def test_factor_one_changes_nothing_and_raises_ppl_on_no_prompt(capsys):
    """λ = 1 leaves the model as it is: its pass differs from the clean one by float noise only (about 1e-5 of the
    perplexity), which the count of prompts with a raised PPL does not take for a raise."""
    assert main(["sinks", "--text", PROMPT, "--factor", "1"]) == 0
    assert "raised PPL by more than 0.1% of the clean PPL on 0 of 1 prompt(s)" in capsys.readouterr().out


def test_text_prints_one_row_per_layer_with_dppl_and_writes_the_full_table(capsys, tmp_path):
    csv = tmp_path / "sinks.csv"
    assert main(["sinks", "--text", PROMPT, "--csv", str(csv)]) == 0
    out = capsys.readouterr().out
    rows = _layer_rows(out)
    assert [int(r[0]) for r in rows] == list(range(30))
    assert "dPPL" in out.splitlines()[4] and all(len(r) == 6 for r in rows)
    assert "attn_share" not in out  # the sink ratio is the attention share: one column, not two equal ones
    assert "all layers, sink value x0" in out and "raised PPL by more than 0.1% of the clean PPL on" in out
    table = pd.read_csv(csv)
    assert {"prompt", *sinks.TABLE_COLUMNS} <= set(table.columns)
    assert table[["layer", "head"]].drop_duplicates().shape[0] == 30 * 9
    summary = sinks.sink_layer_summary(table)
    shown = [float(r[1]) for r in rows]
    assert shown == pytest.approx(summary["sink_ratio"].round(3).tolist(), abs=1e-3)


def test_jsonl_with_n_pools_the_first_prompts(capsys, tmp_path):
    path = tmp_path / "p.jsonl"
    lines = [{"question": PROMPT, "answer": "7"}, {"text": "The cat sat on the mat."}, {"broken": True}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n", encoding="utf-8")
    csv = tmp_path / "pooled.csv"
    assert main(["sinks", "--jsonl", str(path), "--n", "2", "--sink", "auto", "--no-ppl", "--csv", str(csv)]) == 0
    out = capsys.readouterr().out
    assert "prompts: 2" in out and "detected" in out and "dPPL" not in out
    assert sorted(pd.read_csv(csv)["prompt"].unique()) == [0, 1]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--text", PROMPT, "--n", "2"], "--jsonl only"),
        (["--text", PROMPT, "--sink", "500"], "out of range"),
        (["--text", PROMPT, "--factor", "nan"], "finite"),
    ],
)
def test_user_errors_exit_2_with_one_line(capsys, argv, message):
    assert main(["sinks", "--no-ppl", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and message in err and "\n" not in err


def test_malformed_jsonl_names_the_line(capsys, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"text": "ok"}) + "\n{oops\n", encoding="utf-8")
    assert main(["sinks", "--jsonl", str(path), "--no-ppl"]) == 2
    assert "line 2" in capsys.readouterr().err


def test_gsm8k_reads_the_shipped_sample(embedded, capsys, monkeypatch):
    from cwviz.core.loading.inputs import tokenize
    from cwviz.core.util.texts import gsm8k_path, read_texts

    monkeypatch.delenv("CWVIZ_GSM8K", raising=False)
    assert main(["sinks", "--gsm8k", "--n", "2", "--no-ppl"]) == 0
    out = capsys.readouterr().out
    tokens = sum(len(tokenize(embedded, text)) for text in read_texts(gsm8k_path(), n=2))
    assert f"prompts: 2 ({tokens} tokens)" in out
    assert [int(r[0]) for r in _layer_rows(out)] == list(range(30))
