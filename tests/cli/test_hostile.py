"""Hostile files: binary, invalid UTF-8, empty, 50 MB, one enormous line, JSONL with wrong types.

Through every reader a user reaches: the CLI's ``--file`` (analyze, sinks, faithfulness) and ``--jsonl``
(sinks, faithfulness) exit with status 2 and one ``error:`` line naming the file; the dashboard's Sinks
(pooled prompts) and Faithfulness (a file on this machine) pages show the message and keep working.
The readers refuse before a model is loaded, so the CLI cases need none. The browser test uploads a
binary file to the live server (tests/browser/test_browser.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from cwviz.cli.main import main
from cwviz.core.util.errors import InputError
from cwviz.core.util.texts import read_text_file, read_texts
from tests.helpers import PNG

ROOT = Path(__file__).resolve().parents[2]
BIG = 50_000_000


def hostile(tmp_path: Path, kind: str, suffix: str) -> tuple[Path, str]:
    """A hostile file of ``kind`` and the words its error must contain."""
    path = tmp_path / f"{kind}{suffix}"
    if kind == "binary":
        path.write_bytes(PNG)
        return path, "binary"
    if kind == "nul":  # valid UTF-8 that is still binary: mostly control characters
        path.write_bytes(b"\x00\x01\x02\x03\x00\x00 abc\x00\x10\x11\n")
        return path, "binary"
    if kind == "latin1":
        path.write_bytes(('{"text": "café"}\n' if suffix == ".jsonl" else "café au lait").encode("latin-1"))
        return path, "not UTF-8"
    if kind == "empty":
        path.write_bytes(b"")
        return path, "empty" if suffix == ".txt" else "no prompts"
    if kind == "huge":  # 50 MB of text, many lines
        with path.open("wb") as out:
            line = (
                (json.dumps({"text": "word " * 100}) + "\n").encode() if suffix == ".jsonl" else b"word " * 100 + b"\n"
            )
            out.write(line * (BIG // len(line) + 1))
        return path, "MB" if suffix == ".txt" else ""  # a streamed JSONL file of short lines is fine
    if kind == "one_line":  # one enormous line
        with path.open("wb") as out:
            out.write(b'{"text": "' if suffix == ".jsonl" else b"")
            out.write(b"x" * BIG)
            out.write(b'"}\n' if suffix == ".jsonl" else b"\n")
        return path, "MB"
    if kind == "wrong_types":
        path.write_text('{"text": 5}\n' if suffix == ".jsonl" else "fine text", encoding="utf-8")
        return path, "not a string" if suffix == ".jsonl" else ""
    raise ValueError(kind)


KINDS = ["binary", "nul", "latin1", "empty", "huge", "one_line", "wrong_types"]


@pytest.mark.parametrize("kind", KINDS)
def test_text_files_read_whole_are_refused_with_a_clear_message(tmp_path, kind):
    path, words = hostile(tmp_path, kind, ".txt")
    if not words or kind == "empty":  # readable text (empty text is refused where a prompt is needed)
        assert read_text_file(path) == path.read_text(encoding="utf-8")  # the file's text, whole and unchanged
        return
    with pytest.raises(InputError, match=words) as err:
        read_text_file(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("kind", KINDS)
def test_jsonl_files_are_refused_with_a_clear_message_naming_the_line(tmp_path, kind):
    path, words = hostile(tmp_path, kind, ".jsonl")
    if not words:
        assert len(read_texts(path, n=3)) == 3  # streamed: only what is needed is read
        return
    with pytest.raises(InputError, match=words) as err:
        read_texts(path)
    assert str(path) in str(err.value)
    if kind not in ("empty",):
        assert "line 1" in str(err.value) or kind == "huge"


def test_the_size_limit_follows_the_environment(tmp_path, monkeypatch):
    path = tmp_path / "two.txt"
    path.write_bytes(b"a" * 2_000_001)
    monkeypatch.setenv("CWVIZ_MAX_FILE_MB", "1")
    with pytest.raises(InputError, match="at most 1 MB.*CWVIZ_MAX_FILE_MB"):
        read_text_file(path)
    monkeypatch.setenv("CWVIZ_MAX_FILE_MB", "3")
    assert len(read_text_file(path)) == 2_000_001


def test_a_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"text": "hello"}).encode() + b"\n")
    assert read_texts(path) == ["hello"]


CLI_CASES = [
    ("analyze", "--file", ".txt"),
    ("sinks", "--file", ".txt"),
    ("sinks", "--jsonl", ".jsonl"),
    ("faithfulness", "--file", ".txt"),
    ("faithfulness", "--jsonl", ".jsonl"),
]


@pytest.mark.parametrize(
    "command, flag, suffix, kind",
    # wrong types exist only in JSONL (a text file of the right type is a valid prompt)
    [
        (*case, kind)
        for case in CLI_CASES
        for kind in ("binary", "nul", "latin1", "empty", "one_line", "wrong_types")
        if kind != "wrong_types" or case[2] == ".jsonl"
    ],
    ids=lambda v: str(v),
)
def test_the_cli_exits_2_with_one_line(tmp_path, capsys, command, flag, suffix, kind):
    path, _ = hostile(tmp_path, kind, suffix)
    code = main([command, flag, str(path), "--model", str(tmp_path / "no-model")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert "Traceback" not in err[0]
    # The file's problem is named, not the (missing) model: the file is read first.
    assert "no model" not in err[0]


@pytest.fixture
def sinks_page() -> AppTest:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=180)
    at.switch_page("views/sinks.py").run()
    return at


@pytest.mark.parametrize("kind", ["binary", "latin1", "empty", "one_line", "wrong_types"])
def test_the_sinks_page_names_the_problem_and_keeps_working(sinks_page, tmp_path, kind):
    path, words = hostile(tmp_path, kind, ".jsonl")
    at = sinks_page
    at.text_input(key="sinks_pool_path").set_value(str(path))
    at.number_input(key="sinks_pool_n").set_value(2).run()
    assert not at.exception
    assert words in at.error[0].value
    at.text_input(key="sinks_pool_path").set_value("").run()  # back to the sidebar prompt alone
    assert not at.exception and not at.error
    assert at.get("vega_lite_chart")


@pytest.mark.parametrize("kind", ["binary", "nul", "latin1", "one_line"])
def test_the_faithfulness_page_names_the_problem_and_keeps_working(tmp_path, kind):
    path, words = hostile(tmp_path, kind, ".txt")
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=180)
    at.switch_page("views/faithfulness.py").run()
    at.radio(key="source").set_value("path").run()
    at.text_input(key="path").set_value(str(path))
    at.button(key="faith_run").click().run()
    assert not at.exception
    assert words in at.error[0].value
    at.radio(key="source").set_value("prompt").run()
    at.number_input(key="cap").set_value(12)
    at.multiselect(key="rates").set_value([50.0])
    at.button_group(key="measures").set_value(["raw"])
    at.button(key="faith_run").click().run()
    assert not at.exception and not at.error
    assert len(at.get("vega_lite_chart")) == 2
