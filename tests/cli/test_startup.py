"""The command line starts at once: help, argument errors and ``cwviz app`` import neither torch nor transformers
(:mod:`cwviz.cli.parsers` builds every parser; :mod:`cwviz.cli.main` imports only the command's own module), and
``--sink`` has one rule in every command that takes it."""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cwviz.cli import build_parser
from cwviz.cli.options import parse_sink

ROOT = Path(__file__).resolve().parents[2]
#: What a start that reads no model must not import: torch and transformers take seconds, and pandas (most of a
#: second) would spend the budget of ``cwviz --help`` alone.
HEAVY = ("torch", "transformers", "pandas")
COMMANDS = sorted(next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices)


def _start(argv: list[str], before: str = "") -> dict:
    """``cwviz argv`` in a fresh interpreter: its exit status, stdout, stderr and the heavy packages it imported."""
    code = (
        "import contextlib, io, json, sys\n"
        f"{before}\n"
        "from cwviz.cli import main\n"
        "out, err = io.StringIO(), io.StringIO()\n"
        "with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):\n"
        "    try:\n"
        f"        status = main({argv!r})\n"
        "    except SystemExit as exit_:\n"
        "        status = exit_.code\n"
        f"heavy = sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))\n"
        "print(json.dumps({'status': status, 'out': out.getvalue(), 'err': err.getvalue(), 'heavy': heavy}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize(
    "argv", [["--help"], *([name, "--help"] for name in COMMANDS)], ids=lambda argv: " ".join(argv)
)
def test_help_imports_neither_torch_nor_transformers(argv):
    started = _start(argv)
    assert started["status"] == 0 and "usage: cwviz" in started["out"]
    assert started["heavy"] == [], f"cwviz {' '.join(argv)} imported {started['heavy']}"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["analyze"], "one of the arguments --text --file is required"),
        (["sinks", "--text", "hi", "--sink", "first"], "--sink takes a token position"),
        (["faithfulness", "--text", "hi", "--batch-size", "0"], "positive integer or auto"),
        (["flow", "--text", "hi", "--top", "many"], "invalid int value"),
        (["flow-faithfulness", "--gsm8k"], "the following arguments are required: --results"),
        (["nonsense"], "invalid choice"),
    ],
)
def test_an_argument_error_imports_neither_torch_nor_transformers(argv, message):
    started = _start(argv)
    assert started["status"] == 2 and message in started["err"]
    assert started["heavy"] == [], f"cwviz {' '.join(argv)} imported {started['heavy']}"


def test_cwviz_app_starts_without_torch():
    """The dashboard's launcher runs in the command's process; the server (a child process) imports what it needs."""
    started = _start(
        ["app", "--server.headless", "true"], "import cwviz.app.launch as launch; launch.run = lambda extra=None: 0"
    )
    assert started["status"] == 0
    assert started["heavy"] == [], f"cwviz app imported {started['heavy']}"


def test_every_command_names_a_module_that_runs_it():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, child in sub.choices.items():
        module = child.get_default("command_module")
        path = ROOT / (module.replace(".", "/") + ".py")
        assert module.startswith("cwviz.cli.") and path.is_file(), (
            f"`cwviz {name}` names {module}, which does not exist"
        )
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assert any(isinstance(node, ast.FunctionDef) and node.name == "run" for node in tree.body), (
            f"{module} has no run(args)"
        )


def test_the_command_modules_import_at_their_top():
    """No import inside a function of cwviz.cli: a command's module imports what it needs when main imports it."""
    inside = []
    for path in sorted((ROOT / "cwviz" / "cli").glob("*.py")):
        for function in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inside += [
                    f"{path.name}:{node.lineno}"
                    for node in ast.walk(function)
                    if isinstance(node, (ast.Import, ast.ImportFrom))
                ]
    assert not inside, f"imports inside functions: {inside}"


@pytest.mark.parametrize(("value", "sink"), [("0", 0), ("3", 3), ("-1", -1), (" auto ", "auto"), ("AUTO", "auto")])
def test_sink_takes_a_position_counted_from_either_end_or_auto(value, sink):
    assert parse_sink(value) == sink


@pytest.mark.parametrize("value", ["first", "", "1.5", "last"])
def test_sink_refuses_anything_else(value):
    with pytest.raises(argparse.ArgumentTypeError, match="--sink takes a token position"):
        parse_sink(value)


def test_every_command_that_takes_sink_reads_it_alike():
    """One rule for every command: -1 (the last token, BERT's [SEP]) and auto are accepted by each, the default is
    the first token."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    taking = {name: child for name, child in sub.choices.items() if "--sink" in child._option_string_actions}
    assert {"sinks", "claims"} <= set(taking)
    required = {"sinks": ["--text", "hi"], "claims": ["--gsm8k", "--results", "out"]}
    for name, child in taking.items():
        action = child._option_string_actions["--sink"]
        assert action.type is parse_sink and action.default == 0, name
        for value, sink in (("-1", -1), ("auto", "auto")):
            assert parser.parse_args([name, *required.get(name, []), "--sink", value]).sink == sink
