"""Data: pretraining corpora and masking, and the fine-tuning task readers.

pretraining: corpus.py (readers, token cache, streaming), masking.py (MLM masking and collator),
pretraining.py (MLM / NSP datasets, resumable samplers, loaders).
tasks: tables.py (TSV/CSV/JSONL rows as users have them), classification.py, ner.py, squad.py,
sts.py.

Every reader takes files as editors and spreadsheets write them: UTF-8 with or without a
byte-order mark, LF or CRLF line ends. A file that is not UTF-8 text is an error naming the file
and the line of the first bad byte, never a decode traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Iterator

BOM = "\ufeff"


def decode_error(path: str | Path, data: bytes, err: UnicodeDecodeError, first_line: int = 1) -> ValueError:
    """The one-line error for bytes that are not UTF-8, naming the file, line and bad byte.

    data: the bytes that failed to decode (err.start indexes into them); first_line: the line
    of the file that data starts on."""
    line = first_line + data.count(b"\n", 0, err.start)
    column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
    return ValueError(f"{path}:{line}: not UTF-8 text (byte 0x{data[err.start]:02x} at column {column}); "
                      "save the file as UTF-8")


def decode_text(data: bytes, path: str | Path, first_line: int = 1) -> str:
    """UTF-8 bytes of a file (from line `first_line` on) -> str without a leading byte-order
    mark. Invalid UTF-8 or a NUL byte (a binary file) raises ValueError naming file and line."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise decode_error(path, data, e, first_line) from None
    nul = text.find("\x00")
    if nul >= 0:
        raise ValueError(f"{path}:{first_line + text.count(chr(10), 0, nul)}: NUL byte: this is a binary file, "
                         "not UTF-8 text")
    return text.removeprefix(BOM)


def read_text(path: str | Path, what: str = "data file") -> str:
    """The whole text of a UTF-8 file (see `decode_text`); a missing file or a folder is a
    FileNotFoundError naming `what` and the path."""
    path = Path(path)
    if not path.is_file():
        kind = "is a folder, not a file" if path.is_dir() else "not found"
        raise FileNotFoundError(f"{what} {kind}: {path}")
    return decode_text(path.read_bytes(), path)


def check_text_file(path: str | Path, chunk_bytes: int = 1 << 23) -> None:
    """Raise the `decode_text` error if a file of any size (read in chunks of whole lines) is not
    UTF-8 text; for files handed to the Rust readers, whose errors name no file or line."""
    with open(path, "rb") as f:
        line = 1
        while chunk := f.read(chunk_bytes) + f.readline():  # whole lines: no character is cut
            decode_text(chunk, path, line)
            line += chunk.count(b"\n")


def split_lines(text: str) -> list[str]:
    """Lines of a text split at LF only (CR of CRLF removed): line i is line i + 1 of the file.

    str.splitlines would also split at form feeds, U+2028 and other separators that occur inside
    sentences, and shift every later line number."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def parse_jsonl(lines: Iterable[str], path: str | Path) -> Iterator[tuple[int, Any]]:
    """(line number, decoded value) for each non-blank line of a JSON Lines file (an open file or
    a list of lines); bad JSON raises ValueError naming `path` and the line."""
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None
        yield lineno, value


def read_lines(path: str | Path) -> list[str]:
    """One text per line; line i of the file is row i of the output (blank lines included)."""
    lines = split_lines(read_text(path, "input file"))
    if not lines:
        raise ValueError(f"{path}: no lines to read (the file is empty)")
    return lines
