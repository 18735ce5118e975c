"""Every file a command writes goes through here: one output path for every command (issue 58).

* :func:`check_file` and :func:`check_folder`: an output that cannot be written is refused before any model loads
  (a missing folder, a file where a folder goes, a folder you may not write in, /proc), with one line naming the flag.
* :func:`write`: a file replaced whole (:func:`~cwviz.core.util.texts.write_text_atomic`); a failed write (a full disk,
  ``/dev/full``) is an InputError naming the file, never an OSError without one.
* :func:`json_text`: strict JSON, a number that is not finite written as ``null`` (bare ``NaN`` is not JSON).
* :func:`csv_text`: the dashboard's CSV (:func:`cwviz.charts.export.csv_text`): a text cell that starts like a
  spreadsheet formula is neutralised.

A command writes its files before it prints anything (:mod:`cwviz.cli.main`): a reader that leaves early
(``| head -1``) loses no file.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path

import numpy as np
import pandas as pd

from ..charts.export import csv_text as _dashboard_csv
from ..core.util.errors import InputError
from ..core.util.settings import can_write_in, os_error_message
from ..core.util.texts import write_text_atomic

#: The number format of the commands' CSV files.
FLOAT_FORMAT = "%.6g"


def check_file(path: Path | None, flag: str, example: str) -> None:
    """Before any model loads, InputError unless the file ``path`` given with ``flag`` (None: not asked for) can be
    written: its folder exists and you may write in it, and it is not a folder itself (``example``, a file name, is
    what the error suggests there). A device or a pipe (``/dev/stdout``) is checked for writing itself."""
    if path is None:
        return
    path = Path(path)
    if path.is_dir():
        file_type = Path(example).suffix.lstrip(".").upper()
        raise InputError(f"{flag} {path} is a folder; give the {file_type} file to write, e.g. {path / example}")
    if path.exists() and not stat.S_ISREG(path.stat().st_mode):  # /dev/stdout, a FIFO: written as a stream
        if not os.access(path, os.W_OK):
            raise InputError(f"cannot write {flag} {path}: you have no permission to write to it")
        return
    if not path.parent.is_dir():
        raise InputError(f"no folder {path.parent} for {flag}; create it first")
    _check_writable(path.parent, flag, path)


def check_folder(path: Path | None, flag: str) -> None:
    """Before any model loads, InputError unless the folder ``path`` given with ``flag`` (None: not asked for) can be
    written, or made where it does not exist yet: not a file, and in a folder you may write to (not /proc)."""
    if path is None:
        return
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InputError(f"{flag} {path} is a file; give a folder to write the results into")
    made = next(p for p in (path, *path.parents) if p.exists())  # the part of the path that exists
    if not made.is_dir():
        raise InputError(f"{flag} {path} is under {made}, which is a file; give a folder to write the results into")
    _check_writable(made, flag, path)


def _check_writable(folder: Path, flag: str, path: Path) -> None:
    """InputError unless ``folder`` (where ``path`` of ``flag`` goes) can be written to."""
    if not can_write_in(folder):
        raise InputError(
            f"cannot write {flag} {path}: you have no permission to write in {folder}; choose a folder you can write to"
        )


def make_folder(path: Path) -> Path:
    """``path`` made (with its parents) when missing; InputError naming it when it cannot be."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError(_named(err, path)) from None
    return path


def write(path: Path, text: str) -> Path:
    """Replace ``path`` with ``text`` whole (a temporary file renamed; a device or pipe written as a stream); returns
    ``path``. InputError naming ``path`` and the fix when it cannot be written, and no part of it is left."""
    try:
        return write_text_atomic(path, text)
    except OSError as err:
        raise InputError(_named(err, path)) from None


def _named(err: OSError, path: Path) -> str:
    """:func:`~cwviz.core.util.settings.os_error_message` of ``err``, naming ``path`` where the error names no file (a
    device's write fails at its close, without one)."""
    if not isinstance(err.filename, str):
        err = OSError(err.errno, err.strerror, str(path))
    return os_error_message(err)


def strict(value: object) -> object:
    """``value`` (dicts, lists, tuples, numbers, numpy scalars) with every number that is not finite as None, so that
    it is JSON (``json.dumps`` writes ``NaN``, which JSON parsers refuse)."""
    if isinstance(value, dict):
        return {key: strict(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [strict(item) for item in value]
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        return float(value) if math.isfinite(value) else None
    return value


def json_text(value: object) -> str:
    """Strict JSON of ``value`` (:func:`strict`: NaN and infinities as null)."""
    return json.dumps(strict(value), ensure_ascii=False, allow_nan=False)


def table_records(frame: pd.DataFrame) -> list[dict]:
    """A table as JSON records: one dict per row, NaN as None."""
    return json.loads(frame.to_json(orient="records"))


def csv_text(frame: pd.DataFrame, float_format: str | None = FLOAT_FORMAT) -> str:
    """A table as the commands write it: the dashboard's neutralised CSV, numbers as ``float_format`` (None: every
    digit)."""
    return _dashboard_csv(frame, float_format)
