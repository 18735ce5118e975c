"""An exclusive lock on an open file: ``fcntl.flock`` (``msvcrt.locking`` on Windows).

The lock belongs to the open file, so the OS drops it when the process ends in any way (SIGKILL included): a crashed
process never leaves it held. It is advisory: cwviz's own writers take it (a results folder's one owner,
:func:`cwviz.analyses.records.folder_lock`; a model's first conversion into the cache,
:mod:`cwviz.core.loading.checkpoints`).
"""

from __future__ import annotations

from typing import BinaryIO


def lock(handle: BinaryIO, wait: bool) -> None:
    """Lock the open file ``handle`` until it is closed. ``wait=False``: OSError at once when another process (or
    another open of the file) holds it; ``wait=True``: block until it is released."""
    try:
        import fcntl
    except ImportError:  # Windows
        import msvcrt

        handle.seek(0)
        msvcrt.locking(handle.fileno(), msvcrt.LK_LOCK if wait else msvcrt.LK_NBLCK, 1)
        return
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
