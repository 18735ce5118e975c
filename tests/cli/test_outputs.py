"""One output path for every command (issue 58), each case of the issue replayed.

Every command, run as ``cwviz ... | head -1`` (a subprocess on a tiny saved model whose standard output is closed after
its first line), has written every file it was asked for. Each file output on ``/dev/full`` is one ``error:`` line
naming it, with no "wrote" line and no traceback; each output in an unwritable folder (``/proc/x``) and each folder
output on a file is refused before any model loads. The JSON is strict (the encoder's NaN is null), CSV cells that
start like a formula are neutralised as the dashboard's are, and the smaller refusals of the issue (``--seed -1``,
``--kept 0`` before torch, ``report`` on a flow-faithfulness folder, faithfulness's "wrote" line, ``%%`` in help,
command names a user can type) each have their test."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from cwviz.analyses import records
from cwviz.analyses.codecs import checks, sweeps
from cwviz.cli import build_parser
from cwviz.cli import common as common_command
from cwviz.cli import compare as compare_command
from tests.helpers import ENV, call, refused, save_tiny_model, start_command, write_jsonl

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["The cat sat on the mat.", "A dog ran in the park.", "Birds fly south in winter."]
COMMANDS = sorted(next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("data") / "p.jsonl", PROMPTS)


@pytest.fixture(scope="module")
def made_results(tiny, data, tmp_path_factory) -> Path:
    """A faithfulness results folder (what ``report`` reads)."""
    folder = tmp_path_factory.mktemp("made") / "results"
    argv = [
        "faithfulness",
        "--model",
        tiny,
        "--device",
        "cpu",
        "--jsonl",
        data,
        "--n",
        "2",
        "--rates",
        "50",
        "--draws",
        "1",
    ]
    from cwviz import cli

    assert cli.main([str(a) for a in [*argv, "--results", folder]]) == 0
    return folder


def model(tiny: Path) -> list[str]:
    return ["--model", str(tiny), "--device", "cpu"]


#: Each command that writes files: its arguments (``{tiny}``, ``{data}``, ``{made}`` filled in) and its outputs, each
#: a flag, whether it is a file or a folder, and what it holds once written (a file's name within a folder output).
RUNS = {
    "analyze": (["--text", "hello there"], {"--json": ("file", None)}),
    "flow": (["--text", "hello there"], {"--json": ("file", None), "--csv": ("folder", "tokens.csv")}),
    "sinks": (
        ["--jsonl", "{data}", "--no-ppl"],
        {"--csv": ("file", None), "--results": ("folder", "sinks/layers.csv")},
    ),
    "faithfulness": (
        ["--jsonl", "{data}", "--n", "2", "--rates", "50", "--draws", "1"],
        {"--out": ("file", None), "--results": ("folder", "summary.csv")},
    ),
    "claims": (
        ["--jsonl", "{data}", "--n", "3", "--rates", "50", "--draws", "1"],
        {"--results": ("folder", "claims.csv")},
    ),
    "flow-faithfulness": (
        ["--jsonl", "{data}", "--n", "3", "--draws", "2"],
        {"--results": ("folder", "flow_faithfulness.csv")},
    ),
    "report": (["--results", "{made}"], {"--out": ("file", None)}),
    "compare": (["--text", "hello there", "--text", "hello world"], {"--out": ("folder", "heads.csv")}),
    "atlas": (
        ["--jsonl", "{data}", "--bootstrap", "50"],
        {"--out": ("folder", "pooled.csv"), "--results": ("folder", "pooled.csv")},
    ),
}


def test_every_command_that_writes_files_is_in_the_table():
    assert set(RUNS) == set(COMMANDS) - {"app"}


def argv_of(command: str, tiny: Path, data: Path, made: Path | None, outputs: dict[str, Path]) -> list[str]:
    args, _ = RUNS[command]
    filled = [a.format(data=data, made=made) for a in args]
    with_model = [] if command == "report" else model(tiny)
    return [command, *filled, *with_model, *(part for flag, path in outputs.items() for part in (flag, str(path)))]


def where_written(command: str, flag: str, path: Path) -> Path:
    kind, inside = RUNS[command][1][flag]
    return path if kind == "file" else path / inside


# -- files first: | head -1 ------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", sorted(RUNS))
def test_every_command_writes_every_file_before_a_reader_that_leaves_early(command, tiny, data, made_results, tmp_path):
    """``cwviz COMMAND ... | head -1``: status 0 or 141 (the broken pipe), no traceback, every file written."""
    outputs = {flag: tmp_path / flag.strip("-") for flag in RUNS[command][1]}
    process = start_command(argv_of(command, tiny, data, made_results, outputs), ENV)
    process.stdout.readline()
    process.stdout.close()  # the reader leaves
    stderr = process.stderr.read()
    code = process.wait(timeout=300)
    assert code in (0, 141) and "Traceback" not in stderr and "error" not in stderr, stderr
    for flag, path in outputs.items():
        assert where_written(command, flag, path).is_file(), f"{command} {flag}: nothing written"


# -- /dev/full and unwritable folders --------------------------------------------------------------------------
FILE_OUTPUTS = [(c, f) for c, (_, outs) in RUNS.items() for f, (kind, _) in outs.items() if kind == "file"]
FOLDER_OUTPUTS = [(c, f) for c, (_, outs) in RUNS.items() for f, (kind, _) in outs.items() if kind == "folder"]


@pytest.mark.parametrize("command, flag", FILE_OUTPUTS, ids=lambda v: str(v))
def test_a_file_output_on_a_full_disk_is_one_line_naming_it(command, flag, tiny, data, made_results, capsys):
    """``/dev/full`` accepts the open and fails the write (ENOSPC, an error without a file name): the one error line
    names the file, and nothing says it was written."""
    code, out, err = call(argv_of(command, tiny, data, made_results, {flag: Path("/dev/full")}), capsys)
    assert refused(code, err), err
    assert "/dev/full" in err and "no space" in err.lower(), err
    assert "wrote" not in out


@pytest.mark.parametrize("command, flag", FOLDER_OUTPUTS, ids=lambda v: str(v))
def test_a_folder_output_on_a_device_is_refused_before_the_model_loads(
    command, flag, tiny, data, made_results, capsys, monkeypatch
):
    monkeypatch.setattr(common_command, "load_model", no_model)
    monkeypatch.setattr(compare_command, "load_model", no_model)
    code, _, err = call(argv_of(command, tiny, data, made_results, {flag: Path("/dev/full")}), capsys)
    assert refused(code, err) and "/dev/full" in err and "is a file" in err, err


def no_model(*_args, **_kwargs):
    raise AssertionError("the output must be checked before the model is loaded")


@pytest.mark.parametrize("command, flag", FILE_OUTPUTS + FOLDER_OUTPUTS, ids=lambda v: str(v))
def test_an_output_in_an_unwritable_folder_is_refused_before_the_model_loads(
    command, flag, tiny, data, made_results, capsys, monkeypatch
):
    """``/proc/x`` (root's permissions say yes there, the kernel no): refused up front, the flag and path named; the
    issue's ``--csv /proc/x`` ran the whole flow, then said the folder did not exist."""
    monkeypatch.setattr(common_command, "load_model", no_model)
    monkeypatch.setattr(compare_command, "load_model", no_model)
    code, _, err = call(argv_of(command, tiny, data, made_results, {flag: Path("/proc/x")}), capsys)
    assert refused(code, err), err
    assert flag in err and "/proc/x" in err and "no permission" in err, err


# -- what the files hold ---------------------------------------------------------------------------------------
def test_the_encoders_flow_json_is_strict_json_with_null_for_nan(tmp_path, capsys):
    """The encoder has no logit difference (NaN in the Flow): the file is JSON a strict parser reads, null there."""
    out = tmp_path / "flow.json"
    code, _, err = call(["flow", "--model", "embedded-encoder", "--text", "Paris is a city.", "--json", out], capsys)
    assert code == 0, err

    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    payload = json.loads(out.read_text(), parse_constant=refuse)
    assert payload["summary"]["target"] is None and all(row["score"] is not None for row in payload["tokens"])


def test_json_text_writes_every_number_that_is_not_finite_as_null():
    """What every command's JSON goes through (the flow's file above, whatever its summary holds)."""
    import math

    import numpy as np

    from cwviz.cli.outputs import json_text

    value = {
        "nan": math.nan,
        "inf": [math.inf, -math.inf, np.float32("nan")],
        "kept": (np.int64(3), np.float64(0.5), True, "=x"),
    }
    assert json.loads(json_text(value)) == {"nan": None, "inf": [None, None, None], "kept": [3, 0.5, True, "=x"]}


def test_flow_csv_cells_that_start_like_a_formula_are_neutralised_as_the_dashboards(tiny, tmp_path, capsys):
    """One token a character: the prompt's ``=``, ``+``, ``-`` and ``@`` are token cells of their own."""
    from cwviz.charts.export import FORMULA_STARTS, neutralise

    out = tmp_path / "tables"
    code, _, err = call(["flow", *model(tiny), "--text", "a=1+2-3@b", "--csv", out], capsys)
    assert code == 0, err
    for name in ("tokens", "heads", "edges"):
        assert (out / f"{name}.csv").is_file()
    cells = pd.read_csv(out / "tokens.csv", keep_default_na=False)["token"].tolist()
    assert {"'=", "'+", "'-", "'@"} <= set(cells), cells
    assert not [c for c in cells if c.startswith(FORMULA_STARTS)]
    assert cells == [neutralise(t) for t in "a=1+2-3@b"]  # the dashboard's rule, cell by cell


# -- refusals before torch, and the smaller cases ------------------------------------------------------------------
REFUSED_AT_ONCE = [
    ["flow", "--text", "hi", "--kept", "0"],
    ["flow", "--text", "hi", "--kept", "nan"],
    ["flow", "--text", "hi", "--kept", "-1"],
    ["flow", "--text", "hi", "--kept", "2"],
    ["flow", "--text", "hi", "--top", "0"],
    ["flow-faithfulness", "--gsm8k", "--results", "/tmp/cwviz-unused", "--seed", "-1"],
    ["flow-faithfulness", "--gsm8k", "--results", "/tmp/cwviz-unused", "--max-tokens", "2"],
]


@pytest.mark.parametrize("argv", REFUSED_AT_ONCE, ids=lambda argv: " ".join(argv[-2:]))
def test_values_that_need_no_model_are_refused_at_once_without_torch(argv):
    """The issue's ``--share 0`` waited 10-27 s for torch, and ``flow-faithfulness --seed -1`` ended in a numpy
    traceback after the model loaded; now each is refused in under a second of the process's own time (CPU time: the
    suite shares its cores with other work), one ``error:`` line naming the option."""
    code = (
        "import sys, time; start = time.process_time()\nfrom cwviz.cli import main\nstatus = "
        f"main({argv!r})\nprint(status, time.process_time() - start, 'torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=60)
    status, seconds, torch_loaded = done.stdout.split()
    assert status == "2" and torch_loaded == "False", done.stderr
    assert float(seconds) < 1.0, seconds
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and argv[-2] in lines[0] and argv[-1] in lines[0], (
        done.stderr
    )


def test_a_renamed_flag_still_works_and_names_its_new_name(capsys):
    """``cwviz flow --share`` (now ``--kept``, docs/METHOD.md "Glossary"): an old script runs with the same value,
    stderr says the new name once, and ``--help`` shows only the new one."""
    parser = build_parser()
    old = parser.parse_args(["flow", "--text", "hi", "--share", "0.3"])
    warned = capsys.readouterr().err
    new = parser.parse_args(["flow", "--text", "hi", "--kept", "0.3"])
    assert vars(old) == vars(new) and new.kept == 0.3 and capsys.readouterr().err == ""
    assert warned.count("\n") == 1 and "--share is deprecated; use --kept" in warned
    with pytest.raises(SystemExit):
        parser.parse_args(["flow", "--help"])
    flow_help = capsys.readouterr().out
    assert "--kept" in flow_help and "--share" not in flow_help


def test_faithfulness_without_out_or_results_says_it_wrote_nothing(tiny, data, capsys):
    code, out, err = call(
        ["faithfulness", *model(tiny), "--jsonl", data, "--n", "2", "--rates", "50", "--draws", "1"], capsys
    )
    assert code == 0, err
    assert "gap to random" in out and "wrote" not in out


def test_report_on_a_flow_faithfulness_folder_says_it_does_not_cover_it(tmp_path, capsys):
    folder = tmp_path / "results"
    (folder / "flow_faithfulness").mkdir(parents=True)
    code, _, err = call(["report", "--results", folder, "--out", tmp_path / "r.html"], capsys)
    assert refused(code, err) and "`cwviz flow-faithfulness`" in err and "does not cover" in err, err
    assert "holds no results" not in err


@pytest.mark.parametrize("command", ["flow-faithfulness", "claims", "faithfulness"])
def test_help_shows_percent_signs_as_typed(command, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    shown = capsys.readouterr().out
    assert "%%" not in shown


def _named_commands() -> set[str]:
    """Every command a message of the package names: ```cwviz NAME`` and ``cwviz NAME --option`` in the source, and the
    command of each record type (a results folder's messages name it from the type)."""
    pattern = re.compile(r"`cwviz ([a-z][a-z_-]*)|cwviz ([a-z][a-z_-]*) --[a-z]")
    named = set()
    for path in [*(ROOT / "cwviz").rglob("*.py"), *(ROOT / "views").rglob("*.py")]:
        for match in pattern.finditer(path.read_text(encoding="utf-8")):
            named.add(match.group(1) or match.group(2))
    record_types = [
        value
        for value in [*vars(sweeps).values(), *vars(checks).values()]
        if isinstance(getattr(value, "name", None), str) and hasattr(value, "schema")
    ]
    assert len(record_types) >= 5
    return named | {records.command(t.name) for t in record_types}


def test_every_command_a_message_names_is_one_a_user_can_type(capsys):
    """The issue's ``cwviz flow_faithfulness`` (a record type's name, not a command): each named command's
    ``--help``."""
    named = _named_commands()
    assert "flow-faithfulness" in named and "flow_faithfulness" not in named
    for command in sorted(named):
        with pytest.raises(SystemExit) as done:
            build_parser().parse_args([command, "--help"])
        assert done.value.code == 0, f"`cwviz {command}` is named in a message but is no command"
    capsys.readouterr()


def test_a_folder_of_another_command_names_it_as_typed(tiny, tmp_path, capsys, data):
    """A claims run into a flow-faithfulness results folder (DIR/claims/manifest.json of another command)."""
    folder = tmp_path / "results" / "claims"
    folder.mkdir(parents=True)
    (folder / records.MANIFEST).write_text(json.dumps({"schema": "cwviz.flow_faithfulness.manifest"}))
    code, _, err = call(
        ["claims", *model(tiny), "--jsonl", data, "--results", tmp_path / "results", "--resume"], capsys
    )
    assert code == 2 and "`cwviz flow-faithfulness`" in err and "flow_faithfulness`" not in err, err
