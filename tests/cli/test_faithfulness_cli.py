"""``python -m cwviz faithfulness``: a real run on two JSONL items, errors that name the line or the fix, and
an interrupted run that keeps what it finished."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from cwviz import cli
from cwviz.analyses import faithfulness, faithfulness_summary
from cwviz.cli import faithfulness as command
from cwviz.core import defaults
from tests.helpers import make_tiny, write_jsonl

ROOT = Path(__file__).resolve().parents[2]


def test_two_items_of_a_small_jsonl_with_the_embedded_model(tmp_path):
    data = write_jsonl(
        tmp_path / "items.jsonl",
        [
            {
                "question": "Tom has 3 apples and buys 4 more. How many apples does he have?",
                "answer": "3 + 4 = 7\n#### 7",
            },
            {"text": "The river flows past the old mill and on towards the sea."},
            {"text": "This third item is beyond --n and must not be read."},
        ],
    )
    out = tmp_path / "results.csv"
    args = [
        "--jsonl",
        str(data),
        "--n",
        "2",
        "--rates",
        "10,50",
        "--measures",
        "raw,value_weighted,random",
        "--max-tokens",
        "16",
        "--out",
        str(out),
        "--device",
        "cpu",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "cwviz", "faithfulness", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(out)
    assert list(table.columns) == [
        "measure",
        "curve",
        "rate",
        "delta_ppl",
        "ci_low",
        "ci_high",
        "n",
        "log_ppl_ratio",
        "log_ci_low",
        "log_ci_high",
    ]
    assert len(table) == 3 * 2 * 2
    assert set(table.n) == {2}
    assert set(table.rate) == {10, 50}
    assert (table.ci_low <= table.delta_ppl + 1e-9).all() and (table.delta_ppl <= table.ci_high + 1e-9).all()
    for curve in faithfulness.CURVES:
        assert f"{curve}: mean ΔPPL over 2 example(s)" in done.stdout
    assert "area" in done.stdout and "paper's order" in done.stdout
    assert "gap to random (3 draw(s) an example" in done.stdout and "comprehensiveness 10% raw:" in done.stdout
    # The control beside the comparison in the files too: each measure's gap to random, per curve and rate, is the
    # paired difference of the summary's mean log-perplexity ratios (every example has both), > 0 better than chance.
    gaps = pd.read_csv(tmp_path / "results-gaps.csv")
    assert list(gaps.columns) == faithfulness_summary.GAP_COLUMNS and len(gaps) == 2 * 2 * 2 and set(gaps.n) == {2}
    assert f"wrote the gaps to random: {tmp_path / 'results-gaps.csv'}" in done.stdout
    means = table.set_index(["curve", "rate", "measure"])["log_ppl_ratio"]
    for row in gaps.itertuples(index=False):
        difference = means[row.curve, row.rate, row.measure] - means[row.curve, row.rate, "random"]
        expected = difference if row.curve == "comprehensiveness" else -difference
        assert row.gap == pytest.approx(expected, abs=1e-4) and row.ci_low <= row.gap + 1e-9 <= row.ci_high + 2e-9
    assert "2/2" in done.stderr  # the progress bar


def test_malformed_jsonl_gets_an_error_with_the_line_number(tmp_path, capsys, monkeypatch):
    def no_model(_args):
        raise AssertionError("the data must be checked before the model is loaded")

    monkeypatch.setattr(command, "load", no_model)
    data = tmp_path / "bad.jsonl"
    data.write_text('{"text": "one"}\n\n{"text": "three", \n', encoding="utf-8")
    assert cli.main(["faithfulness", "--jsonl", str(data)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: line 3 of") and "not valid JSON" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--rates", "10,abc"], "--rates takes comma-separated percentages"),
        (["--rates", "150"], "0..100"),
        (["--measures", "raw,attention"], "choose from"),
        (["--layers", "two"], "--layers takes all or one layer index"),
        (["--layers", "7"], "layers 0..1"),
    ],
)
def test_bad_options_name_the_fix(tmp_path, capsys, monkeypatch, extra, message):
    monkeypatch.setattr(command, "load", lambda _args: make_tiny("llama"))
    data = write_jsonl(tmp_path / "items.jsonl", [{"text": "abcdefgh"}])
    assert cli.main(["faithfulness", "--jsonl", str(data), *extra]) == 2
    assert message in capsys.readouterr().err


def test_a_dataset_name_offline_names_the_fix(capsys):
    try:
        import datasets  # noqa: F401
    except ImportError:
        assert cli.main(["faithfulness", "--dataset", "openai/gsm8k:main"]) == 2
        assert "--jsonl" in capsys.readouterr().err
    else:
        pytest.skip("`datasets` is installed; this checks the offline message")


def test_an_interrupted_run_keeps_the_examples_it_finished(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(command, "load", lambda _args: make_tiny("llama"))
    real = faithfulness.run_example
    calls = []

    def interrupted_on_the_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(faithfulness, "run_example", interrupted_on_the_second)
    data = write_jsonl(
        tmp_path / "items.jsonl", [{"text": "abcdefghij"}, {"text": "klmnopqrst"}, {"text": "uvwxyzabcd"}]
    )
    out = tmp_path / "results.csv"
    assert cli.main(["faithfulness", "--jsonl", str(data), "--rates", "50", "--out", str(out)]) == 130
    table = pd.read_csv(out)
    assert set(table.n) == {1}
    assert len(table) == len(defaults.RANKED_MEASURES) * 2
    assert not (tmp_path / "results.csv.tmp").exists()


def test_a_text_file_gives_one_example_per_paragraph(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(command, "load", lambda _args: make_tiny("llama"))
    text = tmp_path / "notes.txt"
    text.write_text("first paragraph here\n\nsecond one here\n\nthird one here\n", encoding="utf-8")
    out = tmp_path / "results.csv"
    assert (
        cli.main(
            ["faithfulness", "--file", str(text), "--n", "2", "--rates", "50", "--measures", "raw", "--out", str(out)]
        )
        == 0
    )
    assert set(pd.read_csv(out).n) == {2}
