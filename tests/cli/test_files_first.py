"""Files first, then print; bad outputs refused before the model loads; messages that name the cause (issue 48).

Every command that writes files writes them before it prints, so a reader that leaves after one line (``| head -1``)
loses none (each command's run is in tests/cli/test_outputs.py). An output path that cannot be written, ``CWVIZ_CACHE``
under a file or in /proc and a small ``CWVIZ_MEMORY_BYTES`` get one ``error:`` line (status 2) naming the path or the
variable; a second Ctrl-C ends the run at once without a traceback; an ``interrupted`` line is on a line of its own."""

from __future__ import annotations

import errno
import io
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from cwviz.cli import analyze as analyze_command
from cwviz.cli import atlas as atlas_command
from cwviz.cli import compare as compare_command
from cwviz.cli import main
from cwviz.core.util.progress import print_line
from cwviz.core.util.settings import os_error_message
from tests.helpers import ENV, save_tiny_model, start_command, write_jsonl

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["The cat sat on the mat.", "A dog ran in the park.", "Birds fly south in winter."]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


def no_model(_args):
    raise AssertionError("the output must be checked before the model is loaded")


def one_error(code: int, capsys) -> str:
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


# -- files first: every command's `| head -1` is tests/cli/test_outputs.py -----------------------------------------


# -- outputs checked before the model loads ----------------------------------------------------------------------
@pytest.fixture
def a_file(tmp_path) -> Path:
    path = tmp_path / "a_file"
    path.write_text("x")
    return path


@pytest.mark.parametrize(
    "where, message", [("under a file", "no folder"), ("in /proc", "no permission"), ("a folder", "is a folder")]
)
def test_analyze_json_that_cannot_be_written_is_refused_before_the_model_loads(
    monkeypatch, capsys, a_file, tmp_path, where, message
):
    monkeypatch.setattr(analyze_command, "load", no_model)
    path = {"under a file": a_file / "a.json", "in /proc": Path("/proc/cwviz-test.json"), "a folder": tmp_path}[where]
    line = one_error(main(["analyze", "--text", "hello", "--json", str(path)]), capsys)
    assert "--json" in line and message in line


@pytest.mark.parametrize("command", ["compare", "atlas"])
@pytest.mark.parametrize(
    "where, message", [("a file", "is a file"), ("under a file", "which is a file"), ("in /proc", "no permission")]
)
def test_out_folders_that_cannot_be_written_are_refused_before_the_model_loads(
    monkeypatch, capsys, a_file, tmp_path, command, where, message
):
    monkeypatch.setattr(atlas_command, "load", no_model)
    monkeypatch.setattr(compare_command, "load_model", lambda *a, **k: no_model(None))
    out = {"a file": a_file, "under a file": a_file / "out", "in /proc": Path("/proc/cwviz-test")}[where]
    data = write_jsonl(tmp_path / "p.jsonl", PROMPTS)
    inputs = ["--text", "a", "--text", "b"] if command == "compare" else ["--jsonl", str(data)]
    line = one_error(main([command, *inputs, "--out", str(out)]), capsys)
    assert "--out" in line and str(out) in line and message in line


def test_a_bad_sink_is_refused_by_the_parser_at_once(capsys):
    with pytest.raises(SystemExit) as done:
        main(["sinks", "--text", "hello", "--sink", "zz"])
    err = capsys.readouterr().err
    assert done.value.code == 2 and "--sink" in err and "'zz'" in err and "Traceback" not in err


# -- messages naming the cause ------------------------------------------------------------------------------------
@pytest.mark.parametrize("where, message", [("under a file", "which is a file"), ("in /proc", "cannot write to")])
def test_cwviz_cache_that_cannot_be_a_folder_is_named(monkeypatch, capsys, a_file, where, message):
    cache = a_file / "cache" if where == "under a file" else Path("/proc/cwviz-cache")
    monkeypatch.setenv("CWVIZ_CACHE", str(cache))
    line = one_error(main(["analyze", "--text", "hello"]), capsys)
    assert "CWVIZ_CACHE" in line and message in line and "unset it" in line


def test_a_small_cwviz_memory_bytes_is_named(monkeypatch, capsys, tiny):
    monkeypatch.setenv("CWVIZ_MEMORY_BYTES", "1000")
    line = one_error(main(["analyze", "--model", str(tiny), "--device", "cpu", "--text", "hello there"]), capsys)
    assert "CWVIZ_MEMORY_BYTES=1000" in line and "0.0 GB" not in line and "1.0 kB" in line


@pytest.mark.parametrize(
    "code, words",
    [
        (errno.EACCES, "no permission to use {path}"),
        (errno.ENOSPC, "no space left on the disk that holds {path}"),
        (errno.EROFS, "read-only"),
    ],
)
def test_os_errors_name_the_users_file_not_the_temporary_one(tmp_path, code, words):
    path = tmp_path / "results" / "manifest.json"
    message = os_error_message(OSError(code, os.strerror(code), str(path) + ".tmp"))
    assert words.format(path=path) in message and ".tmp" not in message and "; " in message


def test_os_errors_in_the_cache_name_cwviz_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CWVIZ_CACHE", str(tmp_path))
    message = os_error_message(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "models" / "x")))
    assert f"CWVIZ_CACHE={tmp_path}" in message and "point CWVIZ_CACHE at a folder" in message


def test_an_os_error_in_a_command_is_one_line_naming_the_file(monkeypatch, capsys, tmp_path, tiny):
    out = tmp_path / "a.json"

    def full_disk(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(out) + ".tmp")

    monkeypatch.setattr(analyze_command, "to_json", full_disk)
    line = one_error(
        main(["analyze", "--model", str(tiny), "--device", "cpu", "--text", "hello there", "--json", str(out)]), capsys
    )
    assert f"no space left on the disk that holds {out};" in line


# -- interrupts ---------------------------------------------------------------------------------------------------
def test_the_interrupted_line_is_a_line_of_its_own_after_a_progress_bar(monkeypatch):
    from tqdm import tqdm

    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    bar = tqdm(total=10, file=log, delay=0)
    bar.update(3)  # drawn, its line not ended
    print_line("interrupted: kept the 3 finished prompt(s) of 10")
    bar.close()
    assert "\ninterrupted: kept the 3 finished prompt(s) of 10\n" in log.getvalue()


def test_a_second_ctrl_c_ends_the_run_at_once_without_a_traceback(tiny, tmp_path):
    data = write_jsonl(tmp_path / "p.jsonl", PROMPTS * 30)
    process = start_command(
        ["-v", "sinks", "--model", str(tiny), "--device", "cpu", "--jsonl", str(data), "--no-ppl"], ENV
    )
    lines = []
    deadline = time.monotonic() + 240
    while not any(line.startswith("prompt 3/") for line in lines):
        assert process.poll() is None and time.monotonic() < deadline, "".join(lines)
        lines.append(process.stderr.readline())
    process.send_signal(signal.SIGINT)
    process.send_signal(signal.SIGINT)
    _, rest = process.communicate(timeout=120)
    assert process.returncode == 130
    assert "Traceback" not in rest and "Exception ignored" not in rest, rest
