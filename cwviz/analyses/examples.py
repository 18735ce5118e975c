"""Where a run's examples come from: a local file (JSON Lines, or UTF-8 text with one example per paragraph) or a
Hugging Face dataset, streamed (:func:`dataset_rows`, the task items' source too). The texts go to
:func:`cwviz.analyses.faithfulness.iter_examples`; a file's hostile content is :mod:`cwviz.core.util.texts`'s to
refuse."""

from __future__ import annotations

import re
from collections.abc import Iterator
from os import PathLike
from pathlib import Path

from ..core.util.errors import InputError


def split_paragraphs(text: str) -> list[str]:
    """The examples of a plain-text file: paragraphs separated by blank lines (non-empty ones)."""
    return [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]


JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")


def read_examples(path: str | PathLike, n: int | None = None, field: str | None = None) -> list[str]:
    """The first ``n`` examples of a file: JSON Lines (``.jsonl``, ``.json``, ``.ndjson``; read by
    :func:`cwviz.core.util.texts.read_texts`) or UTF-8 text, one example per paragraph."""
    from ..core.util.texts import read_text_file, read_texts

    path = Path(path)
    if path.suffix.lower() in JSONL_SUFFIXES:
        return read_texts(path, n=n, field=field)
    if n is not None and n < 1:
        raise InputError(f"the number of examples must be at least 1, not {n}")
    texts = split_paragraphs(read_text_file(path))
    if not texts:
        raise InputError(f"{path} holds no text")
    return texts[:n]


def dataset_rows(name: str, split: str = "test", n: int | None = None) -> Iterator[tuple[int, dict]]:
    """``(row number, row)`` of a Hugging Face dataset ``NAME`` or ``NAME:CONFIG``, streamed (needs the
    ``datasets`` package and network); with ``n``, the first ``n``. InputError with the offline fix otherwise."""
    try:
        import datasets
    except ImportError:
        raise InputError(
            f"reading the Hugging Face dataset {name!r} needs the `datasets` package (pip install datasets) "
            "and network access; offline, pass a local file instead (--jsonl PATH or --file PATH)"
        ) from None
    path, _, config = name.partition(":")
    try:
        rows = datasets.load_dataset(path, config or None, split=split, streaming=True)
        for index, row in enumerate(rows, start=1):
            yield index, row
            if n is not None and index >= n:
                break
    except InputError:
        raise
    except Exception as err:  # the hub is unreachable, the name or split is unknown, ...
        raise InputError(
            f"could not read the Hugging Face dataset {name!r} (split {split!r}): {err}; offline, pass --jsonl PATH"
        ) from None


def dataset_texts(name: str, split: str = "test", n: int | None = None, field: str | None = None) -> list[str]:
    """Examples from a Hugging Face dataset ``NAME`` or ``NAME:CONFIG`` (needs ``datasets`` and network).

    Fields are read as for JSONL files (:func:`cwviz.core.util.texts.text_of`): ``field``, ``text``, or GSM8K's
    question and answer.
    """
    from ..core.util.texts import text_of

    texts = [text_of(row, index, f"{name}[{split}]", field) for index, row in dataset_rows(name, split, n)]
    if not texts:
        raise InputError(f"the Hugging Face dataset {name!r} (split {split!r}) has no rows")
    return texts
