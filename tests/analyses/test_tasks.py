"""Downstream multiple-choice tasks under masking (cwviz.analyses.tasks, ``cwviz faithfulness --task``):
the readers on files the tests write, malformed lines named by number, accuracy with nothing masked equal to
the clean accuracy, the paired bootstrap, and resumable records; tiny random models only."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from cwviz import cli
from cwviz.analyses import faithfulness, faithfulness_summary, records, tasks
from cwviz.cli import faithfulness as command
from cwviz.core.util.errors import InputError
from tests.helpers import BOOLQ, make_tiny, write_jsonl

MMLU = [
    {"question": "What is 2 + 2?", "choices": ["3", "4", "5", "22"], "answer": 1, "subject": "elementary_mathematics"},
    {"question": "Which is a colour?", "choices": ["red", "dog", "run", "six"], "answer": "A"},
    {"question": "Sky?", "choices": ["green", "blue"], "answer": 1},
]
WINOGRANDE = [
    {
        "sentence": "The trophy does not fit in the case because _ is too big.",
        "option1": "trophy",
        "option2": "case",
        "answer": "1",
    },
    {
        "sentence": "Anna lent Mary a book because _ had finished it.",
        "option1": "Anna",
        "option2": "Mary",
        "answer": "1",
    },
    {
        "sentence": "The cup fell off the table because _ was tilted.",
        "option1": "cup",
        "option2": "table",
        "answer": "2",
    },
]
ROWS = {"mmlu": MMLU, "boolq": BOOLQ, "winogrande": WINOGRANDE}


@pytest.fixture(scope="module")
def llama():
    return make_tiny("llama")


def test_mmlu_reader_follows_the_harness_template(tmp_path):
    items = tasks.read_items(write_jsonl(tmp_path / "mmlu.jsonl", MMLU), "mmlu")
    first = items[0]
    assert first.contexts[0] == (
        "The following are multiple choice questions (with answers) about elementary mathematics.\n\n"
        "What is 2 + 2?\nA. 3\nB. 4\nC. 5\nD. 22\nAnswer:"
    )
    assert first.continuations == (" A", " B", " C", " D") and first.answer == 1
    assert items[1].answer == 0 and not items[1].contexts[0].startswith("The following")  # letter answer; no subject
    assert len(items[2].contexts) == 2 and items[2].continuations == (" A", " B")
    assert len(tasks.read_items(tmp_path / "mmlu.jsonl", "mmlu", n=2)) == 2


def test_boolq_reader(tmp_path):
    items = tasks.read_items(write_jsonl(tmp_path / "boolq.jsonl", BOOLQ), "boolq")
    assert (
        items[0].contexts
        == ("The sun is a star at the centre of the solar system.\nQuestion: is the sun a star?\nAnswer:",) * 2
    )
    assert items[0].continuations == (" no", " yes")
    assert [i.answer for i in items] == [1, 0]


def test_winogrande_reader_uses_partial_evaluation(tmp_path):
    items = tasks.read_items(write_jsonl(tmp_path / "wino.jsonl", WINOGRANDE), "winogrande")
    first = items[0]
    assert first.contexts == (
        "The trophy does not fit in the case because trophy",
        "The trophy does not fit in the case because case",
    )
    assert first.continuations == (" is too big.", " is too big.")
    assert [i.answer for i in items] == [0, 0, 1]


@pytest.mark.parametrize(
    "task, bad, message",
    [
        ("mmlu", {"question": "q", "choices": ["a", "b"], "answer": 2}, "not a choice's index"),
        ("mmlu", {"question": "q", "choices": "ab", "answer": 0}, "'choices' is a str, not a list"),
        ("mmlu", {"question": "q", "choices": ["a", "b"], "answer": "AB"}, "letter"),
        ("mmlu", {"choices": ["a", "b"], "answer": 0}, "no field 'question'"),
        ("boolq", {"passage": "p", "question": "q", "answer": "yes"}, "'answer' is a str, not a bool"),
        ("winogrande", {"sentence": "no blank", "option1": "a", "option2": "b", "answer": "1"}, "exactly one '_'"),
        ("winogrande", {"sentence": "a _ b", "option1": "a", "option2": "b", "answer": ""}, "unlabelled"),
        ("boolq", ["a", "list"], "not an object"),
    ],
)
def test_malformed_lines_are_named_by_number(tmp_path, task, bad, message):
    path = tmp_path / f"{task}.jsonl"
    good = ROWS[task][0]
    path.write_text(json.dumps(good) + "\n\n" + json.dumps(bad) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match=f"line 3 of {path}") as err:
        tasks.read_items(path, task)
    assert message in str(err.value)
    path.write_text(json.dumps(good) + "\n{not json\n", encoding="utf-8")
    with pytest.raises(InputError, match="line 2 of .* is not valid JSON"):
        tasks.read_items(path, task)


def test_an_item_checks_its_choices_and_answer():
    with pytest.raises(InputError, match="two or more choices"):
        tasks.Item(("a",), (" b",), 0)
    with pytest.raises(InputError, match="index 0..1"):
        tasks.Item(("a", "a"), (" b", " c"), 2)


def test_datasets_offline_is_a_clear_error():
    with pytest.raises(InputError, match="--jsonl PATH"):
        tasks.dataset_items("boolq", "google/boolq", n=2)


@pytest.mark.parametrize("task", tasks.TASKS)
def test_accuracy_with_nothing_masked_equals_the_clean_accuracy(llama, tmp_path, task):
    items = tasks.read_items(write_jsonl(tmp_path / "items.jsonl", ROWS[task]), task)
    protocol = faithfulness.Protocol(rates=(0, 50), measures=("raw", "contribution_inter", "random"), batch_size=4)
    tables = [table for _, table in tasks.iter_items(llama, items, protocol)]
    table = pd.concat(tables, ignore_index=True)
    assert list(table.columns) == tasks.TASK_COLUMNS
    zero = table[table.rate == 0]
    assert (zero.correct_masked == zero.correct_clean).all()
    assert (zero.delta_ppl == 0).all()  # the clean pass itself, not a pass that masks nothing
    summary = faithfulness_summary.summarize(table)
    assert set(faithfulness_summary.ACCURACY_COLUMNS) <= set(summary.columns)
    at_zero = summary[summary.rate == 0]
    assert (at_zero.accuracy_masked == at_zero.accuracy_clean).all() and (at_zero.delta_accuracy == 0).all()
    assert (at_zero.accuracy_ci_low == 0).all() and (at_zero.accuracy_ci_high == 0).all()


def test_a_choice_is_scored_by_its_continuations_log_likelihood(llama):
    # An item whose two choices are identical sequences: the first wins the tie, so answer 0 is right, 1 wrong.
    protocol = faithfulness.Protocol(rates=(50,), measures=("raw",))
    right = tasks.run_item(llama, tasks.Item(("Say", "Say"), (" yes", " yes"), 0), protocol)
    wrong = tasks.run_item(llama, tasks.Item(("Say", "Say"), (" yes", " yes"), 1), protocol)
    assert right.correct_clean.eq(1).all() and right.correct_masked.eq(1).all()
    assert wrong.correct_clean.eq(0).all() and wrong.correct_masked.eq(0).all()
    # the harness's tokenisation: the context's trailing space moves to the continuation
    ids, start = tasks.choice_ids(llama, "Answer: ", "yes", max_tokens=100)
    assert start == len("Answer:") and len(ids) == len("Answer: yes")
    ids, start = tasks.choice_ids(llama, "x" * 50, " yes", max_tokens=10)  # cut from the left, continuation kept
    assert len(ids) == 10 and start == 6
    assert tasks.choice_ids(llama, "context", " a long continuation", max_tokens=5) is None
    with pytest.raises(InputError, match="not valid text.*position 8"):  # a lone surrogate from a JSON escape
        tasks.choice_ids(llama, "Answer: \ud800", "yes", max_tokens=100)


def test_paired_bootstrap_of_the_accuracy_change():
    rows = [
        {"example": i, "measure": "raw", "curve": "comprehensiveness", "rate": 50.0, "delta_ppl": 0.0}
        | {"correct_clean": 1, "correct_masked": int(i % 2 == 0)}
        for i in range(10)
    ]
    summary = faithfulness_summary.summarize(pd.DataFrame(rows), seed=1)
    row = summary.iloc[0]
    assert row.accuracy_clean == 1.0 and row.accuracy_masked == 0.5 and row.delta_accuracy == -0.5
    assert row.accuracy_ci_low < -0.5 < row.accuracy_ci_high <= 0
    interval = faithfulness_summary.bootstrap_ci(np.array([0, -1] * 5), seed=1)
    np.testing.assert_allclose((row.accuracy_ci_low, row.accuracy_ci_high), interval)


def run_cli(tmp_path, monkeypatch, task: str, *extra: str) -> int:
    monkeypatch.setattr(command, "load", lambda _args: make_tiny("llama"))
    data = write_jsonl(tmp_path / f"{task}.jsonl", ROWS[task])
    args = ["faithfulness", "--task", task, "--jsonl", str(data), "--rates", "0,50", "--measures", "raw,random", *extra]
    return cli.main(args)


def test_cli_task_prints_accuracy_and_writes_resumable_records(tmp_path, monkeypatch, capsys):
    assert run_cli(tmp_path, monkeypatch, "boolq", "--out", str(tmp_path / "single.csv")) == 0
    out = capsys.readouterr().out
    assert "accuracy: clean" in out and "comprehensiveness:" in out
    single = pd.read_csv(tmp_path / "single.csv")
    assert set(faithfulness_summary.ACCURACY_COLUMNS) <= set(single.columns)

    whole = tmp_path / "whole"
    assert run_cli(tmp_path, monkeypatch, "mmlu", "--results", str(whole)) == 0
    written = [json.loads(line) for line in (whole / "records-00000.jsonl").read_text().splitlines()]
    assert [r["task"] for r in written] == ["mmlu"] * 3 and all(r["correct_clean"] in (0, 1) for r in written)
    assert all(run["correct_masked"] in (0, 1) for r in written for run in r["runs"])
    assert json.loads((whole / records.MANIFEST).read_text())["task"] == "mmlu"
    part = tmp_path / "part"
    part.mkdir()
    (part / "records-00000.jsonl").write_text(json.dumps(written[0]) + "\n")
    assert run_cli(tmp_path, monkeypatch, "mmlu", "--results", str(part), "--resume") == 0
    assert (part / records.SUMMARY).read_text() == (whole / records.SUMMARY).read_text()
    # the same folder with another task is another run
    capsys.readouterr()
    assert run_cli(tmp_path, monkeypatch, "mmlu", "--results", str(part), "--resume", "--seed", "2") == 2
    assert "other settings" in capsys.readouterr().err


def test_cli_task_needs_a_jsonl_file_or_a_dataset(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(command, "load", lambda _args: make_tiny("llama"))
    assert cli.main(["faithfulness", "--task", "mmlu", "--text", "hello"]) == 2
    assert "--jsonl PATH" in capsys.readouterr().err
    assert cli.main(["faithfulness", "--task", "winogrande", "--dataset", "allenai/winogrande:winogrande_xl"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "offline" in err


def test_embedded_model_answers_mmlu_items_clean_and_masked(embedded, tmp_path):
    items = tasks.read_items(write_jsonl(tmp_path / "mmlu.jsonl", MMLU), "mmlu")
    protocol = faithfulness.Protocol(rates=(0, 100), measures=("contribution_inter", "random"))
    table = pd.concat([t for _, t in tasks.iter_items(embedded, items, protocol)], ignore_index=True)
    zero, full = table[table.rate == 0], table[table.rate == 100]
    assert (zero.correct_masked == zero.correct_clean).all() and (zero.delta_ppl == 0).all()
    assert (full.delta_ppl > 0).all()  # every key of every query removed: the model is lost
    summary = faithfulness_summary.summarize(table)
    assert summary.accuracy_clean.between(0, 1).all() and summary.n.eq(len(MMLU)).all()
