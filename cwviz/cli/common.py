"""What the commands share once their arguments are parsed: reading the prompts, loading the model, the processes of a
sweep and what its manifest records of the command (the options themselves are in :mod:`cwviz.cli.parsers`)."""

from __future__ import annotations

import argparse
import datetime as dt
import shlex
import sys
from pathlib import Path

from ..analyses import records
from ..core.loading.models import load_model
from ..core.loading.provenance import versions
from ..core.util.errors import InputError
from ..core.util.parallel import processes
from ..core.util.progress import print_line
from ..core.util.texts import check_text, gsm8k_path, read_standard_input, read_text_file


def read_text(args: argparse.Namespace) -> str:
    """The prompt from --text, --text - (stdin) or --file (:func:`prompt_text`); InputError when it is empty or not
    valid text (before any model loads)."""
    if getattr(args, "file", None) is not None:
        text, source = prompt_text("file", args.file)
    else:
        text, source = prompt_text("text", args.text)
    if not text.strip():
        raise InputError(f"the prompt is empty{source}; give some text to analyse")
    return text


def prompt_text(how: str, value: str) -> tuple[str, str]:
    """One prompt as the command line gives it, and what an empty one's error adds about where it came from: a file
    (``how`` "file"), standard input (``value`` "-", less one final newline:
    :func:`~cwviz.core.util.texts.read_standard_input`) or the argument itself, checked as text (bytes that were not
    UTF-8 arrive as surrogate escapes: :func:`~cwviz.core.util.texts.check_text`)."""

    if how == "file":
        return read_text_file(value), f" ({value} holds no text)"
    if value == "-":
        return read_standard_input(sys.stdin.buffer), " (standard input held no text)"
    return check_text(value, "--text"), ""


def load(args: argparse.Namespace):

    return load_model(args.model, device=args.device, dtype=args.dtype, trust_remote_code=args.trust_remote_code)


def jsonl_path(args: argparse.Namespace) -> Path | None:
    """The JSON Lines file --jsonl or --gsm8k asked for, None when neither was given."""
    if getattr(args, "gsm8k", False):
        return gsm8k_path()
    return args.jsonl


def report_interrupt(kept: int, total: int, noun: str, written: Path | None = None) -> int:
    """The last line of a long command stopped by Ctrl-C or SIGTERM (:mod:`cwviz.cli.main`): what it kept
    (``noun``: "example", "prompt") and where it wrote it. Returns the exit status, 130."""
    if kept == 0:
        print_line(f"interrupted: no {noun} had finished; nothing kept")
    else:
        where = f" (in {written})" if written is not None else ""
        print_line(f"interrupted: kept the {kept} finished {noun}(s) of {total}{where}")
    return 130


def early_exit(outcome, total: int, nothing: str) -> int | None:
    """Where an item sweep into a folder (``cwviz claims``, ``cwviz flow-faithfulness``) ends before its summary: a
    process other than the main one (0, or 130 when it was interrupted), or a main process with no finished item
    (130 when interrupted, else InputError ``nothing``); None when the main process has items to summarise."""
    if not outcome.is_main:
        return 130 if outcome.interrupted else 0
    if not any(not r["skipped"] for r in outcome.records):
        if outcome.interrupted:
            return report_interrupt(0, total, "item")
        raise InputError(nothing)
    return None


def check_resume(args: argparse.Namespace) -> None:
    """Before anything is read: InputError for ``--resume`` without ``--results``."""
    if args.resume and args.results is None:
        raise InputError("--resume continues a run in a results folder; give it with --results DIR")


def sweep_processes(args: argparse.Namespace):
    """This run's processes (:func:`cwviz.core.util.parallel.processes`); under a launcher each process takes its own
    device (``args.device``), and InputError unless ``--results`` names the folder their records go to."""

    procs = processes(args.device)
    if procs.count > 1 and args.results is None:
        raise InputError(
            f"this run has {procs.count} processes: each writes its records to --results DIR; give the folder"
        )
    if procs.device is not None:
        args.device = procs.device  # one model copy per process, each on its own device
    return procs


def launched_command(made: dict, count: int) -> dict:
    """:func:`how_run`'s record with the launcher in front when ``count`` processes ran."""
    if count > 1:
        made = made | {"command": f"accelerate launch --multi_gpu --num_processes {count} -m {made['command']}"}
    return made


def run_manifest(
    args: argparse.Namespace, record_type: records.RecordType, settings: dict, provenance: dict, count: int, **fields
) -> dict:
    """A results folder's ``manifest.json`` (:func:`cwviz.analyses.records.manifest`): the record type's ``fields``,
    the processes that ran and how the run was made (:func:`how_run`, with the launcher when ``count`` > 1)."""
    return records.manifest(
        record_type, settings, provenance, **fields, processes=count, **launched_command(how_run(args), count)
    )


def how_run(args: argparse.Namespace) -> dict:
    """What a results manifest records of any command: the versions, the command line as typed and the date."""

    argv = list(getattr(args, "argv", None) or sys.argv[1:])
    return {
        "versions": versions(),
        "command": "cwviz " + shlex.join(argv),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
