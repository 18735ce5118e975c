"""A sweep's results folder: per-item records as JSON Lines, one file per process, appended durably
(:mod:`cwviz.analyses.sweep` runs the sweep; this module reads and writes its files, and is torch-free).

A results folder holds ``manifest.json`` (how the run was made: :func:`manifest`, :func:`write_manifest`) and one
``records-<process>.jsonl`` per process. Each line is one finished item, in an envelope every record type shares
(:func:`make_record`):

    {"schema": "cwviz.<type>.record", "version": 2, "fingerprint": sha256 of the run's settings,
     "example": index of the item in the run's data, "text_sha256": sha256 of its text, ...the type's payload,
     "checksum": sha256 of the canonical JSON of every other field}

The ``checksum`` (:func:`record_checksum`: the record without it, keys sorted, no spaces) makes a record prove
itself: a line edited by hand, even one whose numbers still agree with each other, is refused on read naming its
file and line. Records of version 1 were written before checksums existed: they are read without one (their
fields and identities are still checked), and a version-1 line that carries a checksum has it checked.

What a payload holds, how it is made from a type's tables and read back into them, is the record type's codec
(:mod:`cwviz.analyses.codecs`); this module knows a type only through :class:`RecordType`, what reading checks.

Each line is written whole, flushed and fsynced before the next item starts (:class:`RecordWriter`), so
a run killed at any moment loses at most the item in progress. A last line without its newline (killed
mid-write) is ignored when read and cut off before the file is appended to again; any other malformed line
is an error naming the file and line. :func:`read_records` is the one place records are read back (and
checked); summaries are always recomputed from the records.

Checked on read (:func:`read_records`, :func:`read_manifest`): every record's checksum, and its type's keys with the
types cwviz writes, their ranges and the identities between them (the codec's ``payload`` and ``validate``), an example
index in the run's range (0 .. the manifest's item count - 1), and every record and the manifest share one fingerprint
and, per example, one text: a folder holding two runs' records (other settings, other data) is refused by every command
that reads it, naming what differs.

One owner at a time (:func:`folder_lock`): the run that writes a folder holds an exclusive ``flock`` on its
``.lock`` file for as long as it runs; a second run on the folder is refused as busy. The OS drops the lock when
its process ends, however it ends (SIGKILL, a crash), so a dead run never leaves the folder stuck.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from os import PathLike
from pathlib import Path
from typing import Protocol

import numpy as np

from ..core.util.errors import InputError
from ..core.util.locks import lock
from ..core.util.texts import write_text_atomic

#: The records' version: 2 carries a checksum (:func:`record_checksum`); 1, written before checksums, is still read.
VERSION = 2
#: The versions :func:`check_record` reads.
READABLE_VERSIONS = (1, 2)
#: The key of a record's checksum (:func:`record_checksum`).
CHECKSUM = "checksum"
MANIFEST = "manifest.json"
RECORD_GLOB = "records-*.jsonl"
SUMMARY = "summary.csv"
#: Beside it, each measure's gap to the random control (``cwviz faithfulness``, with ``random`` among the measures).
GAPS = "gaps.csv"
#: The lock file of a results folder (:func:`folder_lock`); never deleted (deleting a locked file lets a third run
#: lock a new file of the same name while the second still holds the old one).
LOCK = ".lock"


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


def make_record(record_type: RecordType, example: int, text: str, key: str, payload: dict) -> dict:
    """One item's record: the envelope every record type shares (module docstring), then ``payload``, then the
    checksum of both (:func:`record_checksum`)."""
    envelope = {
        "schema": record_type.schema,
        "version": VERSION,
        "fingerprint": key,
        "example": int(example),
        "text_sha256": text_hash(text),
    }
    record = {**envelope, **payload}
    return {**record, CHECKSUM: record_checksum(record)}


def canonical_json(value: object) -> str:
    """The one text of a JSON value the checksum is taken of: keys sorted, no spaces, numpy columns as the file
    holds them (:func:`as_json`), so a record made in memory and the same record read back give the same text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=True, default=as_json)


def record_checksum(record: dict) -> str:
    """sha256 of the canonical JSON (:func:`canonical_json`) of ``record`` without its checksum."""
    content = {k: v for k, v in record.items() if k != CHECKSUM}
    return hashlib.sha256(canonical_json(content).encode("utf-8")).hexdigest()


def as_json(value: object) -> list:
    """A record's numpy column as JSON writes it: a list; float32 as its shortest decimal text, which reads back to the
    same float32 (a sink table restored bit for bit, in a third of the text of its float64 digits)."""
    if not isinstance(value, np.ndarray):
        raise TypeError(f"a record holds a {type(value).__name__}, which JSON cannot write")
    if value.dtype == np.float32:
        return [float(text) for text in value.astype(str)]
    return value.tolist()


class RecordWriter:
    """Appends records to one process's file: each line whole, flushed and fsynced (a killed run keeps them)."""

    def __init__(self, path: str | PathLike):
        self.path = Path(path)
        drop_partial_line(self.path)
        self._handle = self.path.open("a", encoding="utf-8")

    def write(self, record: dict) -> None:
        line = json.dumps(record, allow_nan=True, default=as_json)
        self._handle.write(line + "\n")  # one write: the line and its newline
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
def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:  # NaN included: json writes and reads it (a one-token prompt's cos_sink_rest)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def optional(check: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda value: value is None or check(value)


def list_of(check: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda value: isinstance(value, list) and all(check(v) for v in value)


#: A field's check and what the error says it must be.
Field = tuple[Callable[[object], bool], str]
INT: Field = (is_int, "an integer")
NUMBER: Field = (is_number, "a number")
TEXT: Field = (lambda v: isinstance(v, str), "text")
FLAG: Field = (lambda v: isinstance(v, bool), "true or false")
ENVELOPE: dict[str, Field] = {"fingerprint": TEXT, "text_sha256": TEXT}


class RecordType(Protocol):
    """What reading a folder needs of a record type (its codec, :mod:`cwviz.analyses.codecs`): its name
    (``cwviz.<name>.record``), its payload's keys and types, its manifest's, and the checks beyond types."""

    name: str
    schema: str
    payload: dict[str, Field]
    manifest_fields: dict[str, Field]

    def validate(self, record: dict, where: str, fix: str) -> None:
        """InputError naming ``where`` and ``fix`` unless one record's values hold together (ranges, lengths)."""

    def validate_run(self, records: list[dict], manifest: dict | None, folder: Path, fix: str) -> None:
        """InputError naming ``folder`` and ``fix`` unless a folder's records (of one fingerprint) hold together."""

    def describe(self, records: list[dict]) -> str:
        """What a group of records says of its settings, for an error that names two runs ("" when nothing)."""


def check_fields(value: dict, fields: dict[str, Field], where: str, fix: str) -> dict:
    """``value`` when it has every key of ``fields`` with the type it names; InputError naming ``where``, the first
    key that is missing or wrong, and ``fix`` otherwise."""
    for key, (check, what) in fields.items():
        if key not in value:
            raise InputError(f"{where} has no {key!r}; {fix}")
        if not check(value[key]):
            raise InputError(f"{where}: {key!r} must be {what}, not {shown(value[key])}; {fix}")
    return value


def shown(value) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def check_record(record: object, record_type: RecordType, where: str, examples: int | None = None) -> dict:
    """``record`` when it is a whole record of ``record_type`` of this version (the envelope, the type's payload
    fields and its own checks, an example index in ``0 .. examples - 1``); InputError naming ``where`` (its file and
    line) and the fix otherwise. Every record read back passes here (:func:`read_records`)."""
    fix = "remove the line (the run recomputes it with --resume) or rerun into a fresh folder"
    if not isinstance(record, dict) or record.get("schema") != record_type.schema:
        raise InputError(f"{where} is not a cwviz {command(record_type.name)} record; {fix}")
    if record.get("version") not in READABLE_VERSIONS:
        raise InputError(
            f"{where} is a record of version {shown(record.get('version'))}; this cwviz reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}; {fix}"
        )
    intact = checksum_holds(record)  # before validate, which may fill a key records made before it lack
    example = record.get("example")
    if not is_int(example) or example < 0 or (examples is not None and example >= examples):
        span = f"0..{examples - 1}" if examples is not None else "0 or more"
        raise InputError(
            f"{where}: 'example' must be an example index ({span}) of the run, not {shown(example)}; {fix}"
        )
    check_fields(record, ENVELOPE | record_type.payload, where, fix)
    record_type.validate(record, where, fix)
    if not intact:  # every field is well formed, yet not what was written: a consistent edit by hand
        raise InputError(f"{where} does not match its checksum: the record was edited after it was written; {fix}")
    return record


def checksum_holds(record: dict) -> bool:
    """Does ``record`` match its checksum (:func:`record_checksum`)? A record of version 1 (written before checksums)
    may have none; any other must."""
    stated = record.get(CHECKSUM)
    if stated is None:
        return record.get("version") == 1
    return stated == record_checksum(record)


def read_records(folder: str | PathLike, record_type: RecordType) -> list[dict]:
    """Every complete record of a results folder (all processes' files), by example, checked (module docstring):
    each line (:func:`check_record`; example indices below the manifest's item count), and the folder as a whole
    (:func:`check_one_run`: one fingerprint, one text per example, the manifest's fingerprint). A trailing partial
    line is ignored; an example recorded twice counts once (the first). The one place records are read back."""
    from ..core.util.texts import iter_jsonl

    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"no results folder at {folder}; give the folder a sweep wrote with --results")
    manifest = read_manifest(folder, record_type)
    examples = manifest_items(manifest)
    every: list[dict] = []
    for path in sorted(folder.glob(RECORD_GLOB)):
        if not path.is_file():  # a folder or a socket by a records file's name: no line of it can be read
            raise InputError(
                f"{path} is not a records file but a {'folder' if path.is_dir() else 'special file'}; "
                "move it out of the results folder (a run writes its records file again), or rerun into a fresh folder"
            )
        try:
            lines = list(iter_jsonl(path, own=True))
        except InputError as err:
            raise InputError(f"{err}; remove the line or rerun into a fresh folder") from None
        every += [check_record(record, record_type, f"line {number} of {path}", examples) for number, record in lines]
    check_one_run(every, manifest, folder, record_type)
    seen: dict[int, dict] = {}
    for record in every:
        seen.setdefault(record["example"], record)
    return [seen[i] for i in sorted(seen)]


def _examples(records: list[dict]) -> str:
    found = sorted({r["example"] for r in records})
    return ", ".join(map(str, found[:8])) + (f" and {len(found) - 8} more" if len(found) > 8 else "")


def check_one_run(records: list[dict], manifest: dict | None, folder: Path, record_type: RecordType) -> None:
    """InputError, naming what differs and what to do, unless ``records`` (every line of the folder) come from one
    run: one fingerprint (the settings), the manifest's when it names one, and one text per example."""
    fix = "keep one run's records files (move the others out) or rerun into a fresh --results folder"
    groups: dict[str, list[dict]] = {}
    for record in records:
        groups.setdefault(record["fingerprint"], []).append(record)
    if len(groups) > 1:
        parts = [
            f"examples {_examples(group)} (settings {key[:12]}{record_type.describe(group)})"
            for key, group in groups.items()
        ]
        raise InputError(
            f"{folder} holds records of {len(groups)} runs with different settings: {'; '.join(parts)}; {fix}"
        )
    stated = (manifest or {}).get("fingerprint")
    if groups and stated is not None and stated not in groups:
        (key,) = groups
        raise InputError(
            f"{folder / MANIFEST} names settings {stated[:12]} but the records were made with settings {key[:12]}"
            f"{record_type.describe(records)}; restore the manifest of the run that wrote the records, or {fix}"
        )
    record_type.validate_run(records, manifest, folder, fix)
    texts: dict[int, str] = {}
    for record in records:
        if texts.setdefault(record["example"], record["text_sha256"]) != record["text_sha256"]:
            raise InputError(
                f"{folder} holds two records of example {record['example']} made from different texts "
                f"(other data); {fix}"
            )


def write_manifest(folder: str | PathLike, manifest: dict) -> None:
    write_text_atomic(Path(folder) / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n")


def manifest(record_type: RecordType, settings: dict, provenance: dict, **fields) -> dict:
    """A run's ``manifest.json``: the record type's manifest schema, the run's ``settings`` (what decides its numbers:
    the record type's ``settings``) and their fingerprint, its model
    (:func:`cwviz.core.loading.provenance.model_provenance`), then ``fields`` (the type's own:
    :data:`RecordType.manifest_fields`, and how the run was made). A refused resume names each setting that differs from
    the manifest's (:func:`cwviz.analyses.resume.setting_changes`)."""
    return {
        "schema": f"cwviz.{record_type.name}.manifest",
        "fingerprint": fingerprint(settings),
        "settings": settings,
        "model": provenance,
        **fields,
    }


def read_manifest(folder: str | PathLike, record_type: RecordType) -> dict | None:
    """The folder's ``manifest.json`` (None when there is none), checked: the manifest cwviz writes for ``record_type``,
    with the keys and types of its ``manifest_fields``; InputError naming the key and how to fix it otherwise."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return None
    fix = "restore it, or delete it (the next --resume writes it again)"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InputError(f"{path} is not valid JSON ({getattr(err, 'msg', err)}); {fix}") from None
    other = _other_command(manifest, record_type)
    if other is not None:  # a valid manifest of another command: named as such, and kept
        raise InputError(
            f"{Path(folder)} holds the results of `cwviz {command(other)}`, not of `cwviz "
            f"{command(record_type.name)}`; it is left "
            f"as it is: give the folder a `cwviz {command(record_type.name)} --results` run wrote, or a fresh folder"
        )
    if not isinstance(manifest, dict) or manifest.get("schema") != f"cwviz.{record_type.name}.manifest":
        what = (
            f"a JSON {type(manifest).__name__}"
            if not isinstance(manifest, dict)
            else f"schema {shown(manifest.get('schema'))}"
        )
        raise InputError(f"{path} is not a cwviz {command(record_type.name)} manifest ({what}); {fix}")
    check_fields(manifest, record_type.manifest_fields, str(path), fix)
    if any(isinstance(v, float) and not math.isfinite(v) for v in manifest.values()):
        raise InputError(f"{path} holds a number that is not finite; {fix}")
    return manifest


def command(name: str) -> str:
    """The command a user types for the record type ``name`` (``flow_faithfulness`` -> ``flow-faithfulness``): a record
    type's name is an identifier (its schema, its folder), a command's is spelt with hyphens."""
    return name.replace("_", "-")


def _other_command(manifest: object, record_type: RecordType) -> str | None:
    """The command whose results folder ``manifest`` is (``cwviz.<name>.manifest``, or an atlas ``--out`` folder's
    ``cwviz.atlas``) when it is not ``record_type``'s; None otherwise."""
    schema = manifest.get("schema") if isinstance(manifest, dict) else None
    if not isinstance(schema, str):
        return None
    parts = schema.split(".")
    if parts[0] != "cwviz" or len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] != "manifest"):
        return None
    name = parts[1]
    return name if name != record_type.name and name.isidentifier() else None


def manifest_items(manifest: dict | None) -> int | None:
    """How many items (examples, prompts) the run that wrote ``manifest`` had, when it says."""
    data = (manifest or {}).get("data") or {}
    count = data.get("examples", data.get("prompts"))
    return count if is_int(count) and count >= 1 else None


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
