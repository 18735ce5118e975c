"""Prompts from a JSON Lines file: one JSON object a line.

Each object gives one prompt, taken from (in this order)

- ``field`` when the caller names one (its value must be a string);
- a ``text`` field;
- GSM8K's ``question`` and ``answer`` fields, joined by :data:`GSM8K_JOIN`.

Blank lines are skipped; line numbers in errors are the file's own (1-based), so the user can open the
file at the line that failed.
"""

from __future__ import annotations

import json
import os
from os import PathLike
from pathlib import Path

from .errors import InputError

GSM8K_JOIN = "\n"
"""What sits between a GSM8K question and its answer in the prompt."""

#: The shipped sample: the first 40 GSM8K test items (MIT licence, beside it). In a checkout it is
#: ``data/gsm8k/sample.jsonl``; a wheel carries it as ``cwviz/_data/gsm8k/sample.jsonl``.
_PACKAGE = Path(__file__).resolve().parent.parent
GSM8K_SAMPLES = (_PACKAGE / "_data" / "gsm8k" / "sample.jsonl", _PACKAGE.parent / "data" / "gsm8k" / "sample.jsonl")


def gsm8k_path() -> Path:
    """The GSM8K file ``--gsm8k`` reads: ``$CWVIZ_GSM8K`` (e.g. the full test split) when set, else the shipped sample."""
    chosen = os.environ.get("CWVIZ_GSM8K", "").strip()
    if chosen:
        path = Path(chosen).expanduser()
        if not path.is_file():
            raise InputError(f"CWVIZ_GSM8K={chosen!r} is not a file; point it at a GSM8K test.jsonl or unset it to use the shipped sample")
        return path
    for path in GSM8K_SAMPLES:
        if path.is_file():
            return path
    raise InputError("the GSM8K sample that ships with cwviz is missing; reinstall cwviz, or set CWVIZ_GSM8K to a GSM8K test.jsonl")


def text_of(record: object, line: int, path: str | PathLike, field: str | None = None) -> str:
    """The prompt held by one decoded JSONL record (see the module docstring for the fields read)."""
    where = f"line {line} of {path}"
    if not isinstance(record, dict):
        raise InputError(f'{where} is a JSON {type(record).__name__}, not an object; each line must be an object such as {{"text": "..."}}')
    if field is not None:
        if field not in record:
            raise InputError(f"{where} has no field {field!r} (fields: {', '.join(map(repr, record)) or 'none'}); choose another field")
        text = record[field]
        if not isinstance(text, str):
            raise InputError(f"{where}: field {field!r} is a {type(text).__name__}, not a string")
    elif "text" in record:
        text = record["text"]
        if not isinstance(text, str):
            raise InputError(f"{where}: field 'text' is a {type(text).__name__}, not a string")
    elif "question" in record and "answer" in record:
        question, answer = record["question"], record["answer"]
        if not isinstance(question, str) or not isinstance(answer, str):
            raise InputError(f"{where}: fields 'question' and 'answer' must both be strings")
        text = question + GSM8K_JOIN + answer
    else:
        raise InputError(
            f"{where} has neither a 'text' field nor GSM8K's 'question' and 'answer' "
            f"(fields: {', '.join(map(repr, record)) or 'none'}); name the field to read"
        )
    if not text.strip():
        raise InputError(f"{where} holds an empty prompt")
    return text


def read_texts(path: str | PathLike, n: int | None = None, field: str | None = None) -> list[str]:
    """The prompts of a JSONL file, in file order; with ``n``, only the first ``n`` (later lines are not read).

    Raises :class:`~cwviz.core.errors.InputError` for a missing or non-UTF-8 file, a malformed line (naming
    its line number), ``n < 1``, or a file without prompts.
    """
    if n is not None and n < 1:
        raise InputError(f"--n must be at least 1, not {n}")
    path = Path(path)
    if not path.is_file():
        raise InputError(f"no file at {path}")
    texts: list[str] = []
    try:
        with path.open(encoding="utf-8") as handle:
            for line_number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    raise InputError(f"line {line_number} of {path} is not valid JSON ({err.msg} at column {err.colno})") from None
                texts.append(text_of(record, line_number, path, field))
                if n is not None and len(texts) == n:
                    break
    except UnicodeDecodeError as err:
        raise InputError(f"{path} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    if not texts:
        raise InputError(f"{path} holds no prompts (every line is blank)")
    return texts
