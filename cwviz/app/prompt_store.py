"""Long prompts kept on the server under their sha256, so that a link stays short (``?prompt_sha=…``).

A link carries a prompt in its URL up to :data:`INLINE_CHARS` characters (URL-encoded); a longer one is written
to ``<cache dir>/prompts/<sha256>.txt`` (:func:`cwviz.core.util.settings.cache_dir`) and the link names its hash. The
folder keeps the :data:`MAX_KEPT` prompts used last (the oldest files are removed), so a link to a long prompt works
on the server that made it for a while, and says so plainly when the prompt is gone (:func:`cwviz.app.state.parse_url`).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from urllib.parse import quote

from ..core.util.settings import cache_dir
from ..core.util.texts import write_text_atomic

#: Longest URL-encoded prompt a link carries itself: with the other parameters a link stays well under 8 kB.
INLINE_CHARS = 4000
#: Long prompts the server keeps (a file each, the least recently used removed first).
MAX_KEPT = 500
_SHA = re.compile(r"[0-9a-f]{64}")


def folder() -> Path:
    return cache_dir() / "prompts"


def fits_inline(text: str) -> bool:
    """Whether ``text`` goes into a link as it is (its URL-encoded form within :data:`INLINE_CHARS`)."""
    return len(quote(text, safe="")) <= INLINE_CHARS


def keep(text: str) -> str:
    """Keep ``text`` on the server; its sha256 (hex), what a link names it by."""
    sha = hashlib.sha256(text.encode("utf-8")).hexdigest()
    path = folder() / f"{sha}.txt"
    if path.is_file():
        path.touch()  # used again: the last to be removed
        return sha
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, text)
    kept = sorted(path.parent.glob("*.txt"), key=lambda p: p.stat().st_mtime)
    for old in kept[: max(0, len(kept) - MAX_KEPT)]:
        old.unlink(missing_ok=True)
    return sha


def find(sha: str) -> str | None:
    """The prompt kept under ``sha``, or None when this server does not have it (never kept, or removed since)."""
    sha = sha.strip().lower()
    if not _SHA.fullmatch(sha):
        return None
    path = folder() / f"{sha}.txt"
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def link_params(text: str) -> dict[str, str]:
    """The URL parameter that names ``text``: ``prompt`` itself when short, else ``prompt_sha`` (kept by
    :func:`keep`)."""
    return {"prompt": text} if fits_inline(text) else {"prompt_sha": keep(text)}
