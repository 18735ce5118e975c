"""Caches that prove themselves: what a converted model's folder records of its files when it is written, and the
checks a load makes of it (docs/reliability.md).

* :func:`record_files`: each file's size, modification time and SHA-256 in :data:`FILES_RECORD`, written with the
  conversion (:func:`cwviz.core.loading.checkpoints.written_once`).
* :func:`changed`: what of the folder is not as recorded (a file cut, changed or missing), in one phrase; the checksum
  is read again only for a file whose modification time changed.
* :func:`discard`: the folder removed so that it is converted again; :func:`check_space`: a disk too small for a
  conversion refused before anything is written, naming CWVIZ_CACHE and the space needed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

from ..util.errors import ModelLoadError
from ..util.settings import os_error_message

#: The file of a converted model's folder that records every other file's size and SHA-256, written at conversion.
FILES_RECORD = "cwviz-files.json"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def record_files(folder: Path) -> None:
    """Record each file of ``folder`` (a conversion's output, before it is renamed into place) in
    :data:`FILES_RECORD`: its size, modification time (ns) and SHA-256."""
    files = {}
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.name != FILES_RECORD and not path.name.startswith("."):
            done = path.stat()
            files[path.name] = {"size": done.st_size, "mtime_ns": done.st_mtime_ns, "sha256": _sha256(path)}
    # A file of its own, then renamed: two processes that record an older cache at once never leave half a record.
    handle, tmp = tempfile.mkstemp(prefix=f".{FILES_RECORD}-", dir=folder)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(json.dumps({"files": files}, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, folder / FILES_RECORD)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def changed(folder: Path) -> str | None:
    """What of the converted model in ``folder`` is not as its conversion wrote it (one phrase: a file missing, of
    another size, or with another SHA-256), None when every file is as recorded. A file's SHA-256 is read again only
    when its modification time changed (a load of an untouched cache reads no weights for this).

    A folder converted by a cwviz that kept no record is checked for what it can prove without one (each safetensors
    file as long as its own header says) and recorded when whole."""
    record = folder / FILES_RECORD
    try:
        files = json.loads(record.read_text(encoding="utf-8"))["files"]
        if not isinstance(files, dict):
            raise TypeError
    except FileNotFoundError:
        problem = next(filter(None, (_cut_safetensors(path) for path in sorted(folder.glob("*.safetensors")))), None)
        if problem is None:
            with contextlib.suppress(OSError):  # a read-only cache, filled once and shared: checked each load
                record_files(folder)
        return problem
    except (OSError, ValueError, KeyError, TypeError):
        return f"{FILES_RECORD} is not readable"
    for name, made in files.items():
        path = folder / name
        try:
            now = path.stat()
        except OSError:
            return f"{name} is missing"
        if now.st_size != made["size"]:
            return f"{name} is {now.st_size:,} bytes, {made['size']:,} when converted"
        if now.st_mtime_ns != made["mtime_ns"] and _sha256(path) != made["sha256"]:
            return f"{name} has changed since it was converted (its SHA-256 differs)"
    return None


def _cut_safetensors(path: Path) -> str | None:
    """Why the safetensors file ``path`` is cut (its length is not the 8 + header + data bytes its header declares),
    None when it is whole."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as handle:
            length = struct.unpack("<Q", handle.read(8))[0]
            if length > size:
                raise ValueError
            header = json.loads(handle.read(length))
        end = max((entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"), default=0)
    except (struct.error, ValueError, KeyError, TypeError, IndexError):
        return f"{path.name} has no whole safetensors header"
    if size != 8 + length + end:
        return f"{path.name} is {size:,} bytes, {8 + length + end:,} by its header"
    return None


def discard(target: Path) -> None:
    """Remove the cache folder ``target`` (renamed aside first, so that no reader finds half of it); ModelLoadError
    saying to delete it by hand when it cannot be removed."""
    aside = target.with_name(f".stale-{target.name}-{os.getpid()}")
    try:
        target.rename(aside)
    except OSError as err:
        raise ModelLoadError(f"{os_error_message(err)}; delete {target} and load the model again") from None
    shutil.rmtree(aside, ignore_errors=True)


def check_space(folder: Path, needed: int) -> None:
    """ModelLoadError naming CWVIZ_CACHE and the space needed when the disk of the cache folder ``folder`` has fewer
    than ``needed`` bytes free: refused before anything is written."""
    free = free_bytes(folder)
    if free < needed:
        raise ModelLoadError(
            f"the converted model needs about {needed / 1e6:,.0f} MB in {_cache_named(folder)}, and its disk has "
            f"{free / 1e6:,.0f} MB free; free some space, or point CWVIZ_CACHE at a disk with room"
        )


def free_bytes(folder: Path) -> int:
    """The bytes free on the disk that holds ``folder``."""
    return shutil.disk_usage(folder).free


def _cache_named(folder: Path) -> str:
    """``folder`` with the variable that chose it: CWVIZ_CACHE, set or not."""
    chosen = os.environ.get("CWVIZ_CACHE", "").strip()
    return (
        f"{folder} (CWVIZ_CACHE={chosen})"
        if chosen
        else f"{folder} (the default cache folder; CWVIZ_CACHE chooses another)"
    )


def write_error(err: BaseException) -> str:
    """What stopped the writing of a converted model: the OS's reason, or the safetensors writer's type (its message
    holds the OS error's text: it is shown, never read)."""
    if isinstance(err, OSError):
        return os_error_message(err)
    return (
        f"{type(err).__name__}: {' '.join(str(err).split())[:200]}; free some space, or point CWVIZ_CACHE at a disk "
        "with room"
    )
