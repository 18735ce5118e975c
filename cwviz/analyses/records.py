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

Checked on read (:func:`read_records`, :func:`read_manifest`): every record has its kind's keys with the types
cwviz writes (:data:`PAYLOADS`), an example index in the run's range (0 .. the manifest's item count - 1), and
every record and the manifest share one fingerprint and, per example, one text: a folder holding two runs' records
(other settings, other data) is refused by every command that reads it, naming what differs.

One owner at a time (:func:`folder_lock`): the run that writes a folder holds an exclusive ``flock`` on its
``.lock`` file for as long as it runs; a second run on the folder is refused as busy. The OS drops the lock when
its process ends, however it ends (SIGKILL, a crash), so a dead run never leaves the folder stuck.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from os import PathLike
from pathlib import Path

import pandas as pd

from ..core.util.errors import InputError
from ..core.util.locks import lock
from ..core.util.texts import write_text_atomic
from .schema import ATLAS_METRICS, RANK_SCOPES

#: The record kind of a faithfulness sweep; ``cwviz.<kind>.record`` is a record's schema.
FAITHFULNESS, SINKS, ATLAS, CLAIMS = "faithfulness", "sinks", "atlas", "claims"
SCHEMA = f"cwviz.{FAITHFULNESS}.record"
VERSION = 1
MANIFEST = "manifest.json"
RECORD_GLOB = "records-*.jsonl"
SUMMARY = "summary.csv"
#: The lock file of a results folder (:func:`folder_lock`); never deleted (deleting a locked file lets a third run
#: lock a new file of the same name while the second still holds the old one).
LOCK = ".lock"
#: The integer and float columns of a sinks record's table (:func:`cwviz.analyses.sweep.sinks_payload`): float32,
#: shortest text; ``sink_attention_share`` is ``sink_ratio`` by definition, ``token`` and ``sink`` come from the record.
SINK_INTS = ("layer", "head", "query", "other_keys")
SINK_FLOATS = (
    "sink_ratio",
    "output_norm",
    "sink_value_norm",
    "rest_norm",
    "cos_sink_rest",
    "sink_contribution_share",
    "sink_contribution_inter",
    "learned_sink_share",
)


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def file_sums(files: dict[str, str]) -> dict[str, str]:
    """The sha256 of each file's text (name -> text), as a manifest names them so that a reader can tell a file
    edited, cut or copied from another run (:func:`changed_files`)."""
    return {name: hashlib.sha256(text.encode("utf-8")).hexdigest() for name, text in files.items()}


def changed_files(folder: str | PathLike, sums: object) -> list[str]:
    """The files of ``folder`` that differ from the sha256 ``sums`` names for them (:func:`file_sums`); every name
    when ``sums`` is not such an object (a manifest edited by hand)."""
    if not isinstance(sums, dict) or not all(isinstance(v, str) for v in sums.values()):
        return ["(the manifest's 'files')"]
    folder = Path(folder)
    return [
        name
        for name, sum_ in sums.items()
        if not (folder / name).is_file() or hashlib.sha256((folder / name).read_bytes()).hexdigest() != sum_
    ]


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


# -- checking what is read back -------------------------------------------------------------------------
def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value) -> bool:  # NaN included: json writes and reads it (a one-token prompt's cos_sink_rest)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _optional(check: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda value: value is None or check(value)


def _list_of(check: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda value: isinstance(value, list) and all(check(v) for v in value)


#: A field's check and what the error says it must be.
Field = tuple[Callable[[object], bool], str]
INT: Field = (_int, "an integer")
NUMBER: Field = (_number, "a number")
TEXT: Field = (lambda v: isinstance(v, str), "text")
FLAG: Field = (lambda v: isinstance(v, bool), "true or false")
ENVELOPE: dict[str, Field] = {"fingerprint": TEXT, "text_sha256": TEXT}
RUN: dict[str, Field] = {
    "measure": TEXT,
    "curve": TEXT,
    "rate": NUMBER,
    "ppl_masked": NUMBER,
    "delta_ppl": NUMBER,
    "correct_masked": (_optional(_int), "an integer or null"),
}
#: The keys and types of each kind's payload, as :func:`example_payload` and :mod:`cwviz.analyses.sweep` write them.
PAYLOADS: dict[str, dict[str, Field]] = {
    FAITHFULNESS: {
        "task": TEXT,
        "skipped": FLAG,
        "tokens": INT,
        "ppl_clean": (_optional(_number), "a number or null"),
        "correct_clean": (_optional(_int), "an integer or null"),
        "runs": (_list_of(lambda v: isinstance(v, dict)), "a list of runs"),
    },
    SINKS: {
        "sink": INT,
        "tokens": (_list_of(lambda v: isinstance(v, str)), "a list of token texts"),
        "ppl": (_optional(_list_of(_number)), "a list of numbers or null"),
        "ppl_clean": (_optional(_number), "a number or null"),
        "table": ((lambda v: isinstance(v, dict)), "an object of columns"),
    },
    ATLAS: {
        "tokens": INT,
        "layer": (_list_of(_int), "a list of integers"),
        "head": (_list_of(_int), "a list of integers"),
        **{name: (_list_of(_number), "a list of numbers") for name in ATLAS_METRICS},
    },
}


def check_fields(value: dict, fields: dict[str, Field], where: str, fix: str) -> dict:
    """``value`` when it has every key of ``fields`` with the type it names; InputError naming ``where``, the first
    key that is missing or wrong, and ``fix`` otherwise."""
    for key, (check, what) in fields.items():
        if key not in value:
            raise InputError(f"{where} has no {key!r}; {fix}")
        if not check(value[key]):
            raise InputError(f"{where}: {key!r} must be {what}, not {_shown(value[key])}; {fix}")
    return value


def _shown(value) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def check_record(record: object, kind: str, where: str, examples: int | None = None) -> dict:
    """``record`` when it is a whole ``kind`` record of this version (the envelope and :data:`PAYLOADS`, an example
    index in ``0 .. examples - 1``, columns of one length); InputError naming ``where`` (its file and line) and
    the fix otherwise. Every record read back passes here (:func:`read_records`)."""
    fix = "remove the line (the run recomputes it with --resume) or rerun into a fresh folder"
    if not isinstance(record, dict) or record.get("schema") != schema(kind):
        raise InputError(f"{where} is not a cwviz {kind} record; {fix}")
    if record.get("version") != VERSION:
        raise InputError(f"{where} is a record of version {record.get('version')}; this cwviz reads version {VERSION}")
    example = record.get("example")
    if not _int(example) or example < 0 or (examples is not None and example >= examples):
        span = f"0..{examples - 1}" if examples is not None else "0 or more"
        raise InputError(f"{where}: 'example' must be an example index ({span}) of the run, not {_shown(example)}; {fix}")
    check_fields(record, ENVELOPE | PAYLOADS.get(kind, {}), where, fix)
    if kind == FAITHFULNESS:
        for number, run in enumerate(record["runs"], start=1):
            check_fields(run, RUN, f"{where}, run {number}", fix)
        if not record["skipped"] and not _number(record["ppl_clean"]):
            raise InputError(f"{where}: a finished example's 'ppl_clean' must be a number, not null; {fix}")
        scope = record.setdefault("rank_scope", RANK_SCOPES[0])  # absent in records made before scopes: query
        if scope not in RANK_SCOPES:
            raise InputError(f"{where}: 'rank_scope' must be one of {', '.join(RANK_SCOPES)}, not {_shown(scope)}; {fix}")
    columns = record["table"] if kind == SINKS else {k: record[k] for k in ("layer", "head", *ATLAS_METRICS)} if kind == ATLAS else {}
    if kind == SINKS:
        for name in (*SINK_INTS, *SINK_FLOATS):
            check_fields(columns, {name: (_list_of(_int if name in SINK_INTS else _number), "a list of numbers")}, f"{where}, table", fix)
        queries = columns["query"]
        if not 0 <= record["sink"] < len(record["tokens"]) or any(not 0 <= q < len(record["tokens"]) for q in queries):
            raise InputError(f"{where}: its sink or queries lie outside its {len(record['tokens'])} tokens; {fix}")
    if len({len(v) for v in columns.values()}) > 1:
        raise InputError(f"{where}: its columns differ in length (a cut or edited record); {fix}")
    return record


def read_records(folder: str | PathLike, kind: str = FAITHFULNESS) -> list[dict]:
    """Every complete record of a results folder (all processes' files), by example, checked (module docstring):
    each line (:func:`check_record`; example indices below the manifest's item count), and the folder as a whole
    (:func:`check_one_run`: one fingerprint, one text per example, the manifest's fingerprint). A trailing partial
    line is ignored; an example recorded twice counts once (the first). The one place records are read back."""
    from ..core.util.texts import iter_jsonl

    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"no results folder at {folder}; give the folder a sweep wrote with --results")
    manifest = read_manifest(folder, kind)
    examples = manifest_items(manifest)
    every: list[dict] = []
    for path in sorted(folder.glob(RECORD_GLOB)):
        try:
            lines = list(iter_jsonl(path, own=True))
        except InputError as err:
            raise InputError(f"{err}; remove the line or rerun into a fresh folder") from None
        every += [check_record(record, kind, f"line {number} of {path}", examples) for number, record in lines]
    check_one_run(every, manifest, folder, kind)
    seen: dict[int, dict] = {}
    for record in every:
        seen.setdefault(record["example"], record)
    return [seen[i] for i in sorted(seen)]


def _settings_of(records: list[dict], kind: str) -> str:
    """What a group of records says of its settings: a faithfulness record's rates and measures (from its runs)."""
    if kind != FAITHFULNESS:
        return ""
    runs = [run for record in records for run in record["runs"]]
    rates = sorted({run["rate"] for run in runs})
    measures = sorted({run["measure"] for run in runs})
    return f"; rates {', '.join(f'{r:g}' for r in rates)}; measures {', '.join(measures)}" if runs else ""


def _examples(records: list[dict]) -> str:
    found = sorted({r["example"] for r in records})
    return ", ".join(map(str, found[:8])) + (f" and {len(found) - 8} more" if len(found) > 8 else "")


def check_one_run(records: list[dict], manifest: dict | None, folder: Path, kind: str) -> None:
    """InputError, naming what differs and what to do, unless ``records`` (every line of the folder) come from one
    run: one fingerprint (the settings), the manifest's when it names one, and one text per example."""
    fix = "keep one run's records files (move the others out) or rerun into a fresh --results folder"
    groups: dict[str, list[dict]] = {}
    for record in records:
        groups.setdefault(record["fingerprint"], []).append(record)
    if len(groups) > 1:
        parts = [f"examples {_examples(group)} (settings {key[:12]}{_settings_of(group, kind)})" for key, group in groups.items()]
        raise InputError(f"{folder} holds records of {len(groups)} runs with different settings: {'; '.join(parts)}; {fix}")
    stated = (manifest or {}).get("fingerprint")
    if groups and stated is not None and stated not in groups:
        (key,) = groups
        raise InputError(
            f"{folder / MANIFEST} names settings {stated[:12]} but the records were made with settings {key[:12]}"
            f"{_settings_of(records, kind)}; restore the manifest of the run that wrote the records, or {fix}"
        )
    if kind == FAITHFULNESS:
        scopes = {r["rank_scope"] for r in records}
        if len(scopes) > 1:  # the query scope is left out of the fingerprint, so the fingerprint alone cannot tell
            raise InputError(f"{folder} holds records of different rank scopes ({', '.join(sorted(scopes))}); {fix}")
        check_runs(records, manifest, folder, fix)
    if kind == ATLAS and len({(tuple(r["layer"]), tuple(r["head"])) for r in records}) > 1:
        raise InputError(f"{folder} holds atlas records of different (layer, head) grids (another model's, or edited); {fix}")
    texts: dict[int, str] = {}
    for record in records:
        if texts.setdefault(record["example"], record["text_sha256"]) != record["text_sha256"]:
            raise InputError(f"{folder} holds two records of example {record['example']} made from different texts (other data); {fix}")


def check_runs(records: list[dict], manifest: dict | None, folder: Path, fix: str) -> None:
    """InputError unless every finished faithfulness record holds the same masked runs (measure, curve, rate), once
    each, and those are the manifest's measures and rates when it names them."""
    grids = {}
    for record in records:
        if record["skipped"]:
            continue
        runs = [(run["measure"], run["curve"], run["rate"]) for run in record["runs"]]
        if len(set(runs)) != len(runs) or not runs:
            raise InputError(f"{folder}: the record of example {record['example']} holds a masked run twice, or none; {fix}")
        grids.setdefault(frozenset(runs), record["example"])
    if len(grids) > 1:
        first, second = list(grids.values())[:2]
        raise InputError(f"{folder}: examples {first} and {second} hold different masked runs (measures, curves or rates); {fix}")
    if grids and manifest is not None:
        (grid,) = grids
        measures, rates = {m for m, _, _ in grid}, {float(r) for _, _, r in grid}
        if measures != set(manifest["measures"]) or rates != {float(r) for r in manifest["rates"]}:
            raise InputError(
                f"{folder / MANIFEST} names measures {', '.join(manifest['measures'])} at rates "
                f"{', '.join(f'{r:g}' for r in manifest['rates'])}, but the records hold measures {', '.join(sorted(measures))} "
                f"at rates {', '.join(f'{r:g}' for r in sorted(rates))}; restore the manifest of the run that wrote the records, or {fix}"
            )


def check_resumable(records: Iterable[dict], key: str, hashes: Sequence[str], folder: str | PathLike) -> set[int]:
    """The examples already finished, after checking that every record was made by the same settings
    (``key``) on the same texts (``hashes[i]`` of example i); InputError naming the mismatch otherwise. Records
    beyond this run's examples mean a smaller ``--n`` than the run's, not other data: that is what it says."""
    records = list(records)
    beyond = sorted(r["example"] for r in records if r["example"] >= len(hashes))
    done = set()
    for record in records:
        example = record["example"]
        if record["fingerprint"] != key:
            raise InputError(
                f"the records in {folder} were made with other settings (protocol, model, task or sink) than this run; "
                "rerun with the same options, or give a fresh --results folder"
            )
        if example < len(hashes) and record["text_sha256"] != hashes[example]:
            raise InputError(
                f"example {example} in {folder} was made from another text than this run's example {example}; "
                "the data changed: give the same data, or a fresh --results folder"
            )
        done.add(example)
    if beyond:
        raise InputError(
            f"{folder} holds records of {beyond[-1] + 1} examples but this run has {len(hashes)} (a smaller --n); "
            f"resume with --n {beyond[-1] + 1} or more, or give a fresh --results folder"
        )
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


#: What :func:`read_manifest` checks of each kind's manifest (the rest is shown, never computed with).
_COUNT: Field = (lambda v: _int(v) and v >= 1, "a positive integer")
_NUMBERS: Field = (_list_of(_number), "a list of numbers")
_NAMES: Field = (_list_of(lambda v: isinstance(v, str)), "a list of names")


def _data_count(key: str) -> Field:
    """The manifest's ``data`` object, with its positive ``key`` count (the run's examples or prompts)."""
    return (lambda v: isinstance(v, dict) and _COUNT[0](v.get(key)), f"an object with its '{key}' count")


MANIFESTS: dict[str, dict[str, Field]] = {
    FAITHFULNESS: {"fingerprint": TEXT, "seed": INT, "rates": _NUMBERS, "measures": _NAMES, "data": _data_count("examples")},
    SINKS: {"fingerprint": TEXT, "factor": NUMBER},
    ATLAS: {
        "fingerprint": TEXT,
        "bootstrap": _COUNT,
        "confidence": (lambda v: _number(v) and 0 < v < 1, "a number between 0 and 1"),
        "seed": INT,
        "data": _data_count("prompts"),
    },
    CLAIMS: {"fingerprint": TEXT, "seed": INT, "rates": _NUMBERS, "scopes": _NAMES, "data": _data_count("examples")},
}


def read_manifest(folder: str | PathLike, kind: str = FAITHFULNESS) -> dict | None:
    """The folder's ``manifest.json`` (None when there is none), checked: the ``kind`` manifest cwviz writes, with
    the keys and types of :data:`MANIFESTS`; InputError naming the key and how to fix it otherwise."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return None
    fix = "restore it, or delete it (the next --resume writes it again)"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InputError(f"{path} is not valid JSON ({getattr(err, 'msg', err)}); {fix}") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != f"cwviz.{kind}.manifest":
        what = f"a JSON {type(manifest).__name__}" if not isinstance(manifest, dict) else f"schema {_shown(manifest.get('schema'))}"
        raise InputError(f"{path} is not a cwviz {kind} manifest ({what}); {fix}")
    check_fields(manifest, MANIFESTS.get(kind, {}), str(path), fix)
    if any(isinstance(v, float) and not math.isfinite(v) for v in manifest.values()):
        raise InputError(f"{path} holds a number that is not finite; {fix}")
    return manifest


def manifest_items(manifest: dict | None) -> int | None:
    """How many items (examples, prompts) the run that wrote ``manifest`` had, when it says."""
    data = (manifest or {}).get("data") or {}
    count = data.get("examples", data.get("prompts"))
    return count if _int(count) and count >= 1 else None


@contextmanager
def folder_lock(folder: str | PathLike) -> Iterator[None]:
    """Hold ``folder`` (a results folder that exists) for one run: an exclusive, non-blocking ``flock`` on its
    :data:`LOCK` file, held until the block ends; InputError ("busy") when another run holds it.

    :func:`cwviz.core.util.locks.lock`, not a lock file's mere existence nor a library's protocol: the OS drops it when
    the process ends in any way (SIGKILL included), so a crashed run never leaves the folder stuck. It is advisory:
    cwviz's own runs take it (:mod:`cwviz.analyses.sweep` takes it in the main process of a data-parallel run, whose
    other processes follow the main one)."""
    path = Path(folder) / LOCK
    try:
        handle = path.open("a+b")
    except OSError as err:
        raise InputError(f"cannot lock {folder} ({err.strerror or err}); give a folder you can write to") from None
    try:
        try:
            lock(handle, wait=False)
        except OSError:
            raise InputError(
                f"{folder} is busy: another cwviz run is writing into it; wait for that run to finish "
                "(then add --resume to continue it), or give another --results folder"
            ) from None
        yield
    finally:
        handle.close()  # closing the file releases the lock
