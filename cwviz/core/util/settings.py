"""Reading cwviz's settings from the environment, with errors that name the variable."""

from __future__ import annotations

import errno
import math
import os
from pathlib import Path

from .errors import InputError


def env_int(name: str, default: int) -> int:
    """``$name`` as a whole number of at least 1; ``default`` when unset or blank."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InputError(f"{name} must be a whole number, not {raw!r}") from None
    if value < 1:
        raise InputError(f"{name} must be at least 1, not {value}")
    return value


def cache_dir() -> Path:
    """Where cwviz keeps converted models and spill files: ``$CWVIZ_CACHE`` or the platform's user cache dir.

    InputError naming the variable when it points at something that is not a folder, under a file, or at a folder that
    cannot be made (its folder is not writable, or in /proc), before anything is converted into it."""
    env = os.environ.get("CWVIZ_CACHE")
    if env:
        path = Path(env).expanduser()
        if path.exists() and not path.is_dir():
            raise InputError(
                f"CWVIZ_CACHE is {path}, which is not a folder; point CWVIZ_CACHE at a folder (made if "
                "missing) or unset it"
            )
        made = next(p for p in (path, *path.parents) if p.exists())  # the part of the path that exists
        if not made.is_dir():
            raise InputError(
                f"CWVIZ_CACHE is {path}, under {made}, which is a file; point CWVIZ_CACHE at a folder (made if "
                "missing) or unset it"
            )
        if made != path and not can_write_in(made):  # a cache folder that exists may be read-only (filled once, shared)
            raise InputError(
                f"CWVIZ_CACHE is {path}, in {made}, which you cannot write to; point CWVIZ_CACHE at a folder you can "
                "write to or unset it"
            )
        return path
    import platformdirs  # third-party, needed only when no folder is set

    return Path(platformdirs.user_cache_dir("cwviz"))


#: Folders no cache can be made in, whatever the permissions say (root may "write" /proc; the kernel refuses).
UNWRITABLE = ("/proc", "/sys")


def can_write_in(folder: Path) -> bool:
    """Whether files can be made in the existing ``folder``: its permissions allow it and it is not in /proc or /sys
    (:data:`UNWRITABLE`; there root's permissions say yes and the kernel says no)."""
    real = Path(folder).resolve()
    return os.access(folder, os.W_OK | os.X_OK) and not any(
        real == Path(u) or Path(u) in real.parents for u in UNWRITABLE
    )


def os_error_message(err: OSError) -> str:
    """What went wrong with a file, named as the user named it, and what to do: the file a failed write was replacing
    (not its ``.tmp``), ``CWVIZ_CACHE`` when the file is in that folder, a full disk, a folder without write
    permission or on a read-only system."""
    name = err.filename if isinstance(err.filename, str) else None
    if name is None:
        return f"{err.strerror or err}"
    path = Path(name[: -len(".tmp")] if name.endswith(".tmp") else name)
    env = os.environ.get("CWVIZ_CACHE", "").strip()
    where = str(path)
    fix = "choose a folder you can write to"
    if env and (path == Path(env).expanduser() or Path(env).expanduser() in path.parents):
        where = f"{path} (in CWVIZ_CACHE={env})"
        fix = "point CWVIZ_CACHE at a folder you can write to, or unset it"
    code = err.errno
    if code in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left on the disk that holds {where}; free some space, or {fix}"
    if code in (errno.EACCES, errno.EPERM):
        return f"no permission to use {where}; {fix} (or change its permissions)"
    if code == errno.EROFS:
        return f"{where} is on a read-only file system; {fix}"
    if code == errno.ENOTDIR:
        return f"a part of {where} is a file, not a folder; {fix}"
    if code == errno.ENOENT:
        return f"{where} does not exist; check the path"
    return f"cannot use {where}: {err.strerror or type(err).__name__}; {fix}"


def memory_override() -> int | None:
    """``$CWVIZ_MEMORY_BYTES``, the bytes the memory check assumes free (``8e9`` or ``8000000000``); None when unset."""
    raw = os.environ.get("CWVIZ_MEMORY_BYTES", "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value < 1:
        raise InputError(f"CWVIZ_MEMORY_BYTES must be a number of bytes such as 8e9, not {raw!r}; fix or unset it")
    return int(value)


#: What a launcher (torchrun, accelerate launch) sets in each process beside WORLD_SIZE.
LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def world_size() -> int:
    """``$WORLD_SIZE`` (1 when unset): how many processes a launcher started. InputError when it is not a whole number
    of at least 1, or above 1 without the variables a launcher sets (:data:`LAUNCHER_VARIABLES`)."""
    raw = os.environ.get("WORLD_SIZE", "").strip()
    if not raw:
        return 1
    try:
        count = int(raw)
    except ValueError:
        count = 0
    if count < 1:
        raise InputError(
            f"WORLD_SIZE must be a whole number of at least 1, not {raw!r}; unset it, or let torchrun set it"
        )
    missing = [name for name in LAUNCHER_VARIABLES if not os.environ.get(name, "").strip()]
    if count > 1 and missing:
        raise InputError(
            f"WORLD_SIZE is {count} but {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set: start the "
            f"run with `torchrun --nproc-per-node {count} -m cwviz ...` (or `accelerate launch`), or unset WORLD_SIZE"
        )
    return count


def check_environment() -> None:
    """Check cwviz's own environment variables at once, before any expensive work (the CLI and ``load_model`` call
    it): ``CWVIZ_CACHE`` and ``CWVIZ_MEMORY_BYTES``."""
    cache_dir()
    memory_override()
