"""Prompts from files: plain UTF-8 text read whole (:func:`read_text_file`), and JSON Lines, one JSON object
a line (:func:`read_texts`).

Hostile files get an InputError that names the file and the fix, never a raw exception: a file that is not
UTF-8 or looks binary (:data:`BINARY_CONTROL_SHARE`), an empty one, one over ``$CWVIZ_MAX_FILE_MB`` (default
:data:`DEFAULT_MAX_FILE_MB`) read whole, a JSONL line over the same size (the file itself is streamed, so
it may be of any length), a line that is not a JSON object, a field that is not a string. A UTF-8 byte
order mark is accepted.

JSONL prompts:

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
import stat
from collections.abc import Iterator
from os import PathLike
from pathlib import Path
from typing import BinaryIO

from .errors import InputError
from .settings import env_int

#: Most megabytes read whole from a prompt file (and most in one JSONL line): ``$CWVIZ_MAX_FILE_MB``.
DEFAULT_MAX_FILE_MB = 16

GSM8K_JOIN = "\n"
"""What sits between a GSM8K question and its answer in the prompt."""

#: The shipped sample: the first 40 GSM8K test items (MIT licence, beside it). In a checkout it is
#: ``data/gsm8k/sample.jsonl``; a wheel carries it as ``cwviz/_data/gsm8k/sample.jsonl``.
_PACKAGE = Path(__file__).resolve().parents[2]  # cwviz/
GSM8K_SAMPLES = (_PACKAGE / "_data" / "gsm8k" / "sample.jsonl", _PACKAGE.parent / "data" / "gsm8k" / "sample.jsonl")


def gsm8k_path() -> Path:
    """The GSM8K file ``--gsm8k`` reads: ``$CWVIZ_GSM8K`` (e.g. the full test split) when set, else the shipped
    sample."""
    chosen = os.environ.get("CWVIZ_GSM8K", "").strip()
    if chosen:
        path = Path(chosen).expanduser()
        if not path.is_file():
            raise InputError(
                f"CWVIZ_GSM8K={chosen!r} is not a file; point it at a GSM8K test.jsonl or unset it to use "
                "the shipped sample"
            )
        return path
    for path in GSM8K_SAMPLES:
        if path.is_file():
            return path
    raise InputError(
        "the GSM8K sample that ships with cwviz is missing; reinstall cwviz, or set CWVIZ_GSM8K to a GSM8K test.jsonl"
    )


def text_of(record: object, line: int, path: str | PathLike, field: str | None = None) -> str:
    """The prompt held by one decoded JSONL record (see the module docstring for the fields read)."""
    where = f"line {line} of {path}"
    if not isinstance(record, dict):
        raise InputError(
            f"{where} is a JSON {type(record).__name__}, not an object; each line must be an object such "
            f'as {{"text": "..."}}'
        )
    if field is not None:
        if field not in record:
            raise InputError(
                f"{where} has no field {field!r} (fields: {', '.join(map(repr, record)) or 'none'}); "
                "choose another field"
            )
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


def check_text(text: str, what: str = "the prompt") -> str:
    """``text`` when it encodes as UTF-8; else InputError naming the position of the first character that does
    not: a lone surrogate, from a JSON escape such as ``"\\ud800"``, or U+DC80..U+DCFF, how Python passes on a
    command-line byte that is not UTF-8 (a surrogate escape). Tokenizers raise a bare TypeError on them."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        code = ord(text[err.start])
        detail = f"a lone surrogate, U+{code:04X}"
        if 0xDC80 <= code <= 0xDCFF:
            detail += f", which stands for the byte 0x{code - 0xDC00:02X} that is not UTF-8"
        raise InputError(
            f"{what} holds a character that is not valid text ({detail}) at position {err.start}; "
            "remove it, or give the text as UTF-8 (a UTF-8 file with --file)"
        ) from None
    return text


def max_file_bytes() -> int:
    """``$CWVIZ_MAX_FILE_MB`` (default :data:`DEFAULT_MAX_FILE_MB`) in bytes."""
    return env_int("CWVIZ_MAX_FILE_MB", DEFAULT_MAX_FILE_MB) * 1_000_000


def _too_large(what: str, limit: int) -> InputError:
    return InputError(
        f"{what}; cwviz reads at most {limit // 1_000_000} MB there (a prompt is a few thousand tokens); "
        "split the file, or set CWVIZ_MAX_FILE_MB to raise the limit"
    )


#: Text whose first 64 k characters are more than a tenth control characters (C0, besides tab, newlines,
#: form feed) is taken for binary data; a prompt with a stray NUL or bell in it is still text.
BINARY_CONTROL_SHARE = 0.1


def decode_text(data: bytes, where: str | PathLike) -> str:
    """``data`` as UTF-8 text (a byte order mark dropped); InputError naming ``where`` (a file, a line of one,
    standard input) for binary data or another encoding."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        if b"\x00" in data:
            raise InputError(
                f"{where} looks binary (it is not UTF-8 and holds NUL bytes); give a UTF-8 text file"
            ) from None
        raise InputError(f"{where} is not UTF-8 text ({err.reason} at byte {err.start}); save it as UTF-8") from None
    sample = text[:65536]
    controls = sum(1 for c in sample if ord(c) < 32 and c not in "\t\n\r\f\v")
    if controls > BINARY_CONTROL_SHARE * len(sample):
        raise InputError(
            f"{where} looks binary ({controls / len(sample):.0%} control characters); give a UTF-8 text file"
        )
    return text


def read_text_stream(stream: BinaryIO, where: str | PathLike) -> str:
    """All of a binary stream (a file, standard input) as UTF-8 text, reading at most :func:`max_file_bytes`."""
    limit = max_file_bytes()
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise _too_large(f"{where} is over {limit // 1_000_000} MB", limit)
    return decode_text(data, where)


def read_standard_input(stream: BinaryIO) -> str:
    """Standard input (``--text -``) as UTF-8 text (:func:`read_text_stream`), less ONE final newline (``\\n`` or
    ``\\r\\n``): ``echo "hi there" | cwviz analyze --text -`` analyses "hi there", as ``"$(echo hi there)"`` would
    (``$(...)`` drops every final newline; cwviz drops only the one ``echo`` or an editor adds)."""
    text = read_text_stream(stream, "standard input")
    return text[:-2] if text.endswith("\r\n") else text.removesuffix("\n")


def check_file(path: Path) -> Path:
    """``path`` when it can be read: a regular file, or a FIFO or character device (``<(cmd)``, ``/dev/stdin``),
    which is read as a stream. InputError saying what it is otherwise (missing, a folder, a socket)."""
    if path.is_dir():
        raise InputError(f"{path} is a folder, not a file; give the path of a text file")
    if not path.exists():
        raise InputError(f"no file at {path}")
    mode = path.stat().st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
        raise InputError(f"{path} is not a regular file; give the path of a text file")
    return path


def write_text_atomic(path: str | PathLike, text: str) -> Path:
    """Replace ``path`` with UTF-8 ``text`` atomically (a ``.tmp`` beside it, then a rename), so a reader or an
    interrupted run never sees half a file (a full disk included); the temporary file is removed when the write or
    the rename fails."""
    path = Path(path)
    if path.exists() and not path.is_file() and not path.is_dir():  # /dev/stdout, a FIFO: written as a stream
        with path.open("w", encoding="utf-8") as handle:
            handle.write(text)
        return path
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())  # on disk before the rename: a crash leaves the old file or the new, never half
        os.replace(tmp, path)
    except BaseException:  # an interrupt too: no .tmp is left behind
        tmp.unlink(missing_ok=True)
        raise
    return path


def read_text_file(path: str | PathLike) -> str:
    """A whole UTF-8 text file (``--file``, a ``.txt`` of examples, an upload), at most :func:`max_file_bytes`;
    a FIFO or character device is read as a stream (:func:`check_file`)."""
    path = check_file(Path(path))
    limit = max_file_bytes()
    size = path.stat().st_size
    if size > limit:  # refused before anything is read (a stream's size is 0: it is bounded while read)
        raise _too_large(f"{path} is {size / 1e6:,.1f} MB", limit)
    with path.open("rb") as handle:
        return read_text_stream(handle, path)  # bounded again: the file may grow while it is read


def iter_jsonl(path: str | PathLike, n: int | None = None, own: bool = False) -> Iterator[tuple[int, object]]:
    """``(line number, decoded JSON value)`` for each non-blank line of a JSONL file, streamed; with ``n``,
    the first ``n`` only (later lines are not read). Raises InputError naming the line for one that is not
    JSON, not UTF-8 or too long, and for a missing file.

    ``own``: a file cwviz appends to itself (a sweep's records, :mod:`cwviz.analyses.records`): its lines are
    not bounded by ``$CWVIZ_MAX_FILE_MB``, and a last line without its newline (a write killed half-way) is
    not yet a line, so it is skipped."""
    if n is not None and n < 1:
        raise InputError(f"--n must be at least 1, not {n}")
    path = check_file(Path(path))
    limit = max_file_bytes()
    yielded = 0
    with path.open("rb") as handle:
        line_number = 0
        while n is None or yielded < n:
            # bounded: one enormous line is never read whole
            raw = handle.readline() if own else handle.readline(limit + 1)
            if not raw or (own and not raw.endswith(b"\n")):
                break
            line_number += 1
            if len(raw) > limit and not own:
                raise _too_large(f"line {line_number} of {path} is longer than {limit // 1_000_000} MB", limit)
            line = decode_text(raw, f"line {line_number} of {path}")
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise InputError(
                    f"line {line_number} of {path} is not valid JSON ({err.msg} at column {err.colno})"
                ) from None
            yielded += 1
            yield line_number, record


def read_texts(path: str | PathLike, n: int | None = None, field: str | None = None) -> list[str]:
    """The prompts of a JSONL file, in file order; with ``n``, only the first ``n`` (later lines are not read).

    Raises :class:`~cwviz.core.util.errors.InputError` for a missing or non-UTF-8 file, a malformed line (naming
    its line number), ``n < 1``, or a file without prompts.
    """
    texts = [text_of(record, line, path, field) for line, record in iter_jsonl(path, n)]
    if not texts:
        raise InputError(f"{Path(path)} holds no prompts (every line is blank)")
    return texts
