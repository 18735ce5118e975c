"""Reading cwviz's settings from the environment, with errors that name the variable."""

from __future__ import annotations

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
    """Where cwviz keeps converted models and spill files: ``$CWVIZ_CACHE`` or the platform's user cache dir."""
    env = os.environ.get("CWVIZ_CACHE")
    if env:
        return Path(env).expanduser()
    import platformdirs  # third-party, needed only when no folder is set

    return Path(platformdirs.user_cache_dir("cwviz"))
