"""Reading prompts from JSON Lines: the fields read, --n, and errors that name the line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cwviz.core.util.errors import InputError
from cwviz.core.util.texts import GSM8K_JOIN, gsm8k_path, read_texts

GSM8K = Path(__file__).resolve().parents[2] / "data" / "gsm8k" / "sample.jsonl"  # shipped with cwviz


def write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_text_field_in_file_order(tmp_path):
    path = write(tmp_path, [json.dumps({"text": f"prompt {i}", "id": i}) for i in range(5)])
    assert read_texts(path) == [f"prompt {i}" for i in range(5)]


def test_gsm8k_question_and_answer_are_joined(tmp_path):
    path = write(tmp_path, [json.dumps({"question": "How many?", "answer": "Three.\n#### 3"})])
    (text,) = read_texts(path)
    assert text == "How many?" + GSM8K_JOIN + "Three.\n#### 3"


def test_text_wins_over_question_and_named_field_wins_over_both(tmp_path):
    path = write(tmp_path, [json.dumps({"text": "T", "question": "Q", "answer": "A", "body": "B"})])
    assert read_texts(path) == ["T"]
    assert read_texts(path, field="body") == ["B"]
    assert read_texts(path, field="question") == ["Q"]


def test_n_takes_the_first_n_and_does_not_read_past_them(tmp_path):
    path = write(tmp_path, [json.dumps({"text": "a"}), json.dumps({"text": "b"}), "{broken"])
    assert read_texts(path, n=2) == ["a", "b"]
    with pytest.raises(InputError, match="line 3"):
        read_texts(path, n=3)


def test_blank_lines_are_skipped_and_line_numbers_stay_physical(tmp_path):
    path = write(tmp_path, [json.dumps({"text": "a"}), "", "   ", json.dumps({"nope": 1})])
    with pytest.raises(InputError, match="line 4 of .*'text'"):
        read_texts(path)


@pytest.mark.parametrize(
    "line, message",
    [
        ("not json", "line 2 .*not valid JSON"),
        ("[1, 2]", "line 2 .*not an object"),
        (json.dumps({"text": 3}), "line 2 .*not a string"),
        (json.dumps({"text": "  "}), "line 2 .*empty prompt"),
        (json.dumps({"question": "Q"}), "line 2 .*neither"),
        (json.dumps({"question": "Q", "answer": None}), "line 2 .*both be strings"),
    ],
)
def test_malformed_lines_raise_input_error_naming_the_line(tmp_path, line, message):
    path = write(tmp_path, [json.dumps({"text": "fine"}), line])
    with pytest.raises(InputError, match=message):
        read_texts(path)


def test_missing_named_field_lists_the_fields(tmp_path):
    path = write(tmp_path, [json.dumps({"text": "a", "id": 1})])
    with pytest.raises(InputError, match="line 1 .*no field 'body'.*'text', 'id'"):
        read_texts(path, field="body")


def test_file_level_errors(tmp_path):
    with pytest.raises(InputError, match="no file"):
        read_texts(tmp_path / "missing.jsonl")
    with pytest.raises(InputError, match="no prompts"):
        read_texts(write(tmp_path, ["", " "]))
    with pytest.raises(InputError, match="at least 1"):
        read_texts(write(tmp_path, [json.dumps({"text": "a"})]), n=0)
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes('{"text": "caf\xe9"}\n'.encode("latin-1"))
    with pytest.raises(InputError, match="not UTF-8"):
        read_texts(bad)


def test_reads_the_shipped_gsm8k_sample():
    texts = read_texts(GSM8K, n=3)
    assert len(texts) == 3
    first = json.loads(GSM8K.open(encoding="utf-8").readline())
    assert texts[0] == first["question"] + GSM8K_JOIN + first["answer"]


def test_gsm8k_path_is_the_shipped_sample_unless_cwviz_gsm8k_says_otherwise(tmp_path, monkeypatch):
    monkeypatch.delenv("CWVIZ_GSM8K", raising=False)
    assert gsm8k_path().resolve() == GSM8K.resolve()
    assert len(read_texts(gsm8k_path())) == 40
    full = write(tmp_path, [json.dumps({"question": "Q", "answer": "A"})])
    monkeypatch.setenv("CWVIZ_GSM8K", str(full))
    assert gsm8k_path() == full
    monkeypatch.setenv("CWVIZ_GSM8K", str(tmp_path / "missing.jsonl"))
    with pytest.raises(InputError, match="CWVIZ_GSM8K"):
        gsm8k_path()
