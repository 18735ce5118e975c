"""Ctrl-C (SIGINT) or SIGTERM during the long CLI commands keeps every finished example: the results of the
finished ones are printed (and written with --out / --csv), and the last stderr line says what was kept;
the exit status is 130. Runs the real command on the embedded model in a subprocess.

Each signal once, each command once: ``cwviz.cli.main`` makes SIGTERM raise KeyboardInterrupt as SIGINT does, and
from there the command's own handling is the same whichever signal came, so faithfulness gets SIGINT and sinks
SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pandas as pd

from tests.helpers import start_command

ROOT = Path(__file__).resolve().parents[2]


def _start(args: list[str]) -> subprocess.Popen:
    return start_command(args)


def _wait_for(predicate, process: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if process.poll() is not None:
            raise AssertionError(f"the command ended early ({process.returncode}): {process.stderr.read()[-2000:]}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError("timed out waiting for the first finished example")
        time.sleep(0.1)


def test_faithfulness_keeps_the_finished_examples_on_sigint(tmp_path, signum=signal.SIGINT):
    out = tmp_path / "summary.csv"
    n = 40
    process = _start(
        [
            "faithfulness",
            "--gsm8k",
            "--n",
            str(n),
            "--max-tokens",
            "24",
            "--rates",
            "50",
            "--measures",
            "raw,random",
            "--out",
            str(out),
        ]
    )
    _wait_for(out.is_file, process)  # the first example is done and written
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr[-2000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("interrupted: kept the ") and f"of {n} (in {out})" in last, last
    kept = int(last.split("kept the ")[1].split()[0])
    assert 1 <= kept < n
    summary = pd.read_csv(out)
    assert set(summary["n"]) == {kept}  # the file holds exactly the examples the line reports
    assert f"{kept} example(s)" in stdout and "comprehensiveness" in stdout


def test_sinks_keeps_the_finished_prompts_on_sigterm(tmp_path, signum=signal.SIGTERM):
    csv = tmp_path / "sinks.csv"
    n = 40
    process = _start(["-v", "sinks", "--gsm8k", "--n", str(n), "--no-ppl", "--csv", str(csv)])
    lines: list[str] = []

    def second_prompt_started() -> bool:
        lines.append(process.stderr.readline())
        return any(line.startswith("prompt 3/") for line in lines)

    _wait_for(second_prompt_started, process)
    process.send_signal(signum)
    stdout, rest = process.communicate(timeout=120)
    stderr = "".join(lines) + rest
    assert process.returncode == 130, stderr[-2000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("interrupted: kept the ") and f"of {n} (in {csv})" in last, last
    kept = int(last.split("kept the ")[1].split()[0])
    assert 2 <= kept < n
    assert f"prompts: {kept} (" in stdout
    assert pd.read_csv(csv)["prompt"].nunique() == kept
