"""A sweep's results folder: per-item records as JSON Lines, one file per process, appended durably
(:mod:`cwviz.analyses.sweep` runs the sweep; this module reads and writes its files, and is torch-free).

A results folder holds ``manifest.json`` (how the run was made: :func:`write_manifest`) and one
``records-<process>.jsonl`` per process. Each line is one finished item, in an envelope every kind shares
(:func:`make_record`):

    {"schema": "cwviz.<kind>.record", "version": 1, "fingerprint": sha256 of the run's settings,
     "example": index of the item in the run's data, "text_sha256": sha256 of its text, ...the kind's payload}

A faithfulness record's payload (:func:`example_record`) is

    {"task": "text" | "mmlu" | ..., "skipped": bool, "tokens": int, "ppl_clean": float, "correct_clean": 0 | 1 | null,
     "runs": [{"measure", "curve", "rate", "ppl_masked", "delta_ppl", "correct_masked"}, ...],
     "rank_scope": "query" | "token" | "layer"}  (absent in records made before scopes: query)

and those of ``cwviz sinks`` and ``cwviz atlas`` are in :mod:`cwviz.analyses.sweep`.

Each line is written whole, flushed and fsynced before the next item starts (:class:`RecordWriter`), so
a run killed at any moment loses at most the item in progress. A last line without its newline (killed
mid-write) is ignored when read and cut off before the file is appended to again; any other malformed line
is an error naming the file and line. :func:`read_records` is the one place records are read back (and
checked); summaries are always recomputed from the records.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from os import PathLike
from pathlib import Path

import pandas as pd

from ..core.errors import InputError
from ..core.texts import write_text_atomic

#: The record kind of a faithfulness sweep; ``cwviz.<kind>.record`` is a record's schema.
FAITHFULNESS = "faithfulness"
SCHEMA = f"cwviz.{FAITHFULNESS}.record"
VERSION = 1
MANIFEST = "manifest.json"
RECORD_GLOB = "records-*.jsonl"
SUMMARY = "summary.csv"


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def fingerprint(settings: dict) -> str:
    """sha256 of the settings that decide a record's numbers (protocol, model, task), key order ignored."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode("utf-8")).hexdigest()


def records_path(folder: str | PathLike, process: int) -> Path:
    return Path(folder) / f"records-{process:05d}.jsonl"


def schema(kind: str) -> str:
    return f"cwviz.{kind}.record"


def make_record(kind: str, example: int, text: str, key: str, payload: dict) -> dict:
    """One item's record: the envelope every kind shares (module docstring), then ``payload``."""
    envelope = {"schema": schema(kind), "version": VERSION, "fingerprint": key, "example": int(example), "text_sha256": text_hash(text)}
    return {**envelope, **payload}


def example_record(example: int, text: str, key: str, task: str, table: pd.DataFrame | None) -> dict:
    """One faithfulness example's record from its per-example table (None: the example was skipped, too short)."""
    return make_record(FAITHFULNESS, example, text, key, example_payload(task, table))


def example_payload(task: str, table: pd.DataFrame | None) -> dict:
    """The payload of :func:`example_record` (module docstring)."""
    record: dict = {"task": task, "skipped": table is None}
    if table is None:
        return {**record, "tokens": 0, "ppl_clean": None, "correct_clean": None, "runs": []}
    first = table.iloc[0]
    correct = "correct_masked" in table
    runs = [
        {
            "measure": row.measure,
            "curve": row.curve,
            "rate": float(row.rate),
            "ppl_masked": float(row.ppl_masked),
            "delta_ppl": float(row.delta_ppl),
            "correct_masked": int(row.correct_masked) if correct else None,
        }
        for row in table.itertuples(index=False)
    ]
    clean = int(first.correct_clean) if correct else None
    return {**record, "tokens": int(first.tokens), "ppl_clean": float(first.ppl_clean), "correct_clean": clean, "runs": runs}


class RecordWriter:
    """Appends records to one process's file: each line whole, flushed and fsynced (a killed run keeps them)."""

    def __init__(self, path: str | PathLike):
        self.path = Path(path)
        drop_partial_line(self.path)
        self._handle = self.path.open("a", encoding="utf-8")

    def write(self, record: dict) -> None:
        self._handle.write(json.dumps(record, allow_nan=True) + "\n")  # one write: the line and its newline
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def drop_partial_line(path: Path) -> None:
    """Cut a last line that lacks its newline (a write killed half-way) off ``path``."""
    if not path.is_file():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with path.open("r+b") as handle:
            handle.truncate(data.rfind(b"\n") + 1)
            handle.flush()
            os.fsync(handle.fileno())


def read_records(folder: str | PathLike, kind: str = FAITHFULNESS) -> list[dict]:
    """Every complete record of a results folder (all processes' files), by example; a trailing partial line
    is ignored, an example recorded twice counts once (the first). The one place records are read back: a
    line that is not a ``kind`` record of this version is an InputError naming its file and line."""
    from ..core.texts import iter_jsonl

    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"no results folder at {folder}; give the folder a sweep wrote with --results")
    seen: dict[int, dict] = {}
    for path in sorted(folder.glob(RECORD_GLOB)):
        try:
            lines = list(iter_jsonl(path, own=True))
        except InputError as err:
            raise InputError(f"{err}; remove the line or rerun into a fresh folder") from None
        for number, record in lines:
            seen.setdefault(check_record(record, kind, f"line {number} of {path}")["example"], record)
    return [seen[i] for i in sorted(seen)]


def check_record(record: object, kind: str, where: str) -> dict:
    """``record`` when it is a ``kind`` record of this version; InputError naming ``where`` (its file and line)
    otherwise. Every record read back passes here (:func:`read_records`)."""
    if not isinstance(record, dict) or record.get("schema") != schema(kind) or not isinstance(record.get("example"), int):
        raise InputError(f"{where} is not a cwviz {kind} record")
    if record.get("version") != VERSION:
        raise InputError(f"{where} is a record of version {record.get('version')}; this cwviz reads version {VERSION}")
    return record


def check_resumable(records: Iterable[dict], key: str, hashes: Sequence[str], folder: str | PathLike) -> set[int]:
    """The examples already finished, after checking that every record was made by the same settings
    (``key``) on the same texts (``hashes[i]`` of example i); InputError naming the mismatch otherwise."""
    done = set()
    for record in records:
        example = record["example"]
        if record.get("fingerprint") != key:
            raise InputError(
                f"the records in {folder} were made with other settings (protocol, model, task or sink) than this run; "
                "rerun with the same options, or give a fresh --results folder"
            )
        if example >= len(hashes) or record.get("text_sha256") != hashes[example]:
            raise InputError(
                f"example {example} in {folder} was made from another text than this run's example {example}; "
                "the data changed: give the same data, or a fresh --results folder"
            )
        done.add(example)
    return done


def records_table(records: Iterable[dict]) -> pd.DataFrame:
    """The per-example table (one row per example and masked run) of the records that were not skipped:
    the columns of :data:`cwviz.analyses.faithfulness.EXAMPLE_COLUMNS`, plus ``correct_clean`` and
    ``correct_masked`` for multiple-choice tasks."""
    rows = []
    for record in records:
        for run in record["runs"]:
            row = {
                "example": record["example"],
                "measure": run["measure"],
                "curve": run["curve"],
                "rate": run["rate"],
                "tokens": record["tokens"],
                "ppl_clean": record["ppl_clean"],
                "ppl_masked": run["ppl_masked"],
                "delta_ppl": run["delta_ppl"],
            }
            if record.get("correct_clean") is not None:
                row["correct_clean"], row["correct_masked"] = record["correct_clean"], run["correct_masked"]
            rows.append(row)
    columns = ["example", "measure", "curve", "rate", "tokens", "ppl_clean", "ppl_masked", "delta_ppl"]
    frame = pd.DataFrame(rows)
    return frame if len(frame) else pd.DataFrame(columns=columns)


def write_manifest(folder: str | PathLike, manifest: dict) -> None:
    write_text_atomic(Path(folder) / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n")


def read_manifest(folder: str | PathLike) -> dict | None:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise InputError(f"{path} is not valid JSON ({err.msg}); rerun the sweep to write it again") from None
