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
from os import PathLike
from pathlib import Path

from .errors import InputError

GSM8K_JOIN = "\n"
"""What sits between a GSM8K question and its answer in the prompt."""


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
