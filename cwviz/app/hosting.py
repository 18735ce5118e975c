"""Hosting mode: what a shared server (a classroom, a public demo) allows.

Turned on with ``CWVIZ_HOSTED=1``; then, from the environment:

| variable                 | meaning                                                  | hosted default |
|--------------------------|----------------------------------------------------------|----------------|
| ``CWVIZ_ALLOWED_MODELS`` | comma-separated model names users may pick               | ``embedded``   |
| ``CWVIZ_APP_MAX_TOKENS`` | longest prompt (plus generated tokens) analysed          | 512            |
| ``CWVIZ_MAX_CONCURRENT`` | analyses running at once; others wait, then are refused  | 2              |
| ``CWVIZ_QUEUE_SECONDS``  | how long a request waits for a free slot                 | 30             |

In hosting mode local paths and ``.gguf`` files are refused as models, pages do not read files by a
path on the server (uploads still work), and ``trust_remote_code`` is never on
(cwviz turns it on nowhere unless a library caller asks). Outside hosting mode nothing is restricted
except that ``CWVIZ_MAX_CONCURRENT`` still applies when set.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from ..core.util.errors import InputError, ModelLoadError
from ..core.util.settings import env_int

HOSTED_MAX_TOKENS = 512


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Policy:
    """What this server allows (see the module docstring)."""

    hosted: bool = False
    allowed_models: tuple[str, ...] | None = None  # None: any model
    max_tokens: int | None = None  # None: the dashboard's own default
    max_concurrent: int | None = None  # None: no limit
    queue_seconds: float = 30.0

    def check_model(self, name: str) -> None:
        """Raise ModelLoadError if ``name`` may not be loaded here."""
        if not self.hosted:
            return
        if self.allowed_models is not None and name not in self.allowed_models:
            raise ModelLoadError(
                f"model {name!r} is not available on this server; choose one of: {', '.join(self.allowed_models)}"
            )

    @property
    def server_files(self) -> bool:
        """Whether pages may read files by a path on the server (off in hosting mode; uploads still work)."""
        return not self.hosted

    def check_server_file(self, path: str) -> None:
        """Raise InputError if reading ``path`` on the server is not allowed here."""
        if not self.server_files:
            raise InputError(f"this server does not read files by path ({path!r}); upload the file instead")


def policy_from_env() -> Policy:
    """The policy the environment asks for (read at each call, so tests and restarts see changes)."""
    concurrent = env_int("CWVIZ_MAX_CONCURRENT", 0) or None  # 0: unset
    queue = float(env_int("CWVIZ_QUEUE_SECONDS", 30))
    if not _flag("CWVIZ_HOSTED"):
        return Policy(max_concurrent=concurrent, queue_seconds=queue)
    raw = os.environ.get("CWVIZ_ALLOWED_MODELS", "embedded")
    allowed = tuple(m.strip() for m in raw.split(",") if m.strip()) or ("embedded",)
    local = [m for m in allowed if m != "embedded" and (m.startswith((".", "/", "~")) or m.endswith(".gguf"))]
    if local:
        raise InputError(f"CWVIZ_ALLOWED_MODELS may not name local paths in hosting mode: {', '.join(local)}")
    return Policy(
        hosted=True,
        allowed_models=allowed,
        max_tokens=env_int("CWVIZ_APP_MAX_TOKENS", HOSTED_MAX_TOKENS),
        max_concurrent=concurrent or 2,
        queue_seconds=queue,
    )


@functools.cache
def _semaphore(limit: int) -> threading.BoundedSemaphore:
    return threading.BoundedSemaphore(limit)


@contextlib.contextmanager
def analysis_slot(policy: Policy) -> Iterator[None]:
    """Hold one of the ``max_concurrent`` analysis slots for the duration of the block.

    Waits up to ``queue_seconds`` for a free slot, then raises InputError saying the server is busy.
    """
    if policy.max_concurrent is None:
        yield
        return
    slots = _semaphore(policy.max_concurrent)
    if not slots.acquire(timeout=policy.queue_seconds):
        raise InputError(
            f"the server is busy: {policy.max_concurrent} analyses are running (CWVIZ_MAX_CONCURRENT); "
            "try again in a moment"
        )
    try:
        yield
    finally:
        slots.release()
