"""Data: pretraining corpora and masking, and the fine-tuning task readers.

pretraining: corpus.py (readers, token cache, streaming), masking.py (MLM masking and collator),
pretraining.py (MLM / NSP datasets, resumable samplers, loaders).
tasks: tables.py (TSV/CSV/JSONL rows as users have them), classification.py, ner.py, squad.py,
sts.py.

Every reader takes files as editors and spreadsheets write them: UTF-8 with or without a
byte-order mark, LF or CRLF line ends, or any other text encoding named by `encoding` (a Python
codec name: latin-1, cp1252, utf-16, ...). A file that is not text in its encoding is an error
naming the file and the line of the first bad byte, never a decode traceback. Any readable path
that is not a folder is read once, whole: a regular file, a FIFO, /dev/stdin, `<(command)`; a
chunk at a time, so that a binary file fails at its first bytes and a line past `MAX_LINE`
characters is cut, with a warning, in bounded memory (`read_text`).

Messages that tell the user what to set name the setting as the command at hand spells it:
`header=false` in a run config, `--no-header` in `evaluate`, `predict` and `embed`, which run
their work inside `settings_named_as(flags)`; see `setting`.
"""

from __future__ import annotations

import codecs
import json
import re
import warnings
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

BOM = "\ufeff"
DEFAULT_ENCODING = "utf-8"
MAX_LINE = 1_000_000  # characters a line of an input file keeps (tokens past any model's max_length)
READ_BYTES = 1 << 23  # bytes read and decoded at a time

# setting -> the command-line flag that sets it, while a command of flags runs (None: key=value)
_FLAGS: ContextVar[Mapping[str, str] | None] = ContextVar("bert_kit_setting_flags", default=None)


@contextmanager
def settings_named_as(flags: Mapping[str, str]) -> Iterator[None]:
    """Inside, `setting` spells the settings in `flags` ({"header": "--header", ...}) as flags."""
    token = _FLAGS.set(dict(flags))
    try:
        yield
    finally:
        _FLAGS.reset(token)


def setting(key: str, value: Any = None) -> str:
    """How the user sets `key` (to `value`) in the command at hand, for messages: `header=false`,
    `score_range=[LOW, HIGH]` in a run config; `--no-header`, `--score-range LOW HIGH` in a command
    of flags. Booleans are on/off flags (`--header` / `--no-header`); a value given as text is
    written as it is."""
    flag = (_FLAGS.get() or {}).get(key)
    if flag is None:
        if value is None:
            return key
        shown = (str(value).lower() if isinstance(value, bool) else
                 "[" + ", ".join(map(str, value)) + "]" if isinstance(value, (list, tuple)) else value)
        return f"{key}={shown}"
    if value is None or value is True:
        return flag
    if value is False:
        return "--no-" + flag[2:]
    return f"{flag} " + (" ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value))


def check_encoding(encoding: str | None, key: str = "encoding") -> str:
    """The codec name a reader decodes with (None: UTF-8); an unknown codec, or one that is not a
    text encoding (base64, zlib), is a ValueError naming the setting."""
    if encoding is None:
        return DEFAULT_ENCODING
    from bert_kit.checks import ConfigError

    try:
        # bytes-to-bytes codecs (base64, zlib) are known to Python but are no text encodings
        known = isinstance(encoding, str) and encoding.strip() and getattr(codecs.lookup(encoding),
                                                                          "_is_text_encoding", True)
    except LookupError:
        known = False
    if not known:
        raise ConfigError(f"{setting(key, repr(encoding))} is not a known text encoding: name a Python codec, "
                          "such as utf-8, latin-1, cp1252 or utf-16")
    return encoding


def _is_utf8(encoding: str) -> bool:
    return codecs.lookup(encoding).name in ("utf-8", "utf-8-sig")


def splits_at_newline_bytes(encoding: str) -> bool:
    """Whether every b"\\n" of a file in `encoding` is a line end, so that lines decode one by one
    (UTF-8, latin-1, cp1252, Shift-JIS, ...; not UTF-16 or UTF-32)."""
    return _is_utf8(encoding) or ("\n".encode(encoding) == b"\n" and "a".encode(encoding) == b"a")


def decode_error(path: str | Path, data: bytes, err: UnicodeDecodeError, first_line: int = 1,
                 encoding: str = DEFAULT_ENCODING, first_column: int = 1) -> ValueError:
    """The one-line error for bytes that are not `encoding` text, naming the file, line and bad
    byte, and how to name the file's encoding.

    data: the bytes that failed to decode (err.start indexes into them); first_line, first_column:
    the line of the file that data starts on, and the byte of that line."""
    line = first_line + data.count(b"\n", 0, err.start)
    newline = data.rfind(b"\n", 0, err.start)
    column = err.start - newline if newline >= 0 else first_column + err.start
    name = "UTF-8" if _is_utf8(encoding) else encoding
    where = f"{path}:{line}: not {name} text (byte 0x{data[err.start]:02x} at column {column})"
    if not _is_utf8(encoding):
        return ValueError(f"{where}; name the file's encoding with {setting('encoding', 'NAME')}")
    # a UTF-16 byte-order mark gives it away; otherwise the likeliest one-byte encodings
    guess = "utf-16" if first_line == 1 and data[:2] in (b"\xff\xfe", b"\xfe\xff") else "latin-1"
    others = "" if guess == "utf-16" else " (or cp1252, ...)"
    return ValueError(f"{where}; save the file as UTF-8, or name its encoding with "
                      f"{setting('encoding', guess)}{others}")


def decode_text(data: bytes, path: str | Path, first_line: int = 1, encoding: str | None = None) -> str:
    """Bytes of a file (from line `first_line` on) in `encoding` (default UTF-8) -> str without a
    leading byte-order mark. Bytes that do not decode or a NUL byte (a binary file) raise
    ValueError naming file and line."""
    encoding = check_encoding(encoding)
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as e:
        raise decode_error(path, data, e, first_line, encoding) from None
    nul = text.find("\x00")
    if nul >= 0:
        raise ValueError(f"{path}:{first_line + text.count(chr(10), 0, nul)}: NUL byte: this is a binary file, "
                         "not text")
    return text.removeprefix(BOM)


def _open(path: str | Path, what: str) -> Any:
    """A readable path that is not a folder, open for reading bytes: a file, a FIFO, /dev/stdin or
    `<(command)`, read once (no existence check first, which a pipe could not pass twice). A
    missing path or a folder is a FileNotFoundError naming `what` and the path."""
    path = Path(path)
    if path.is_dir():
        raise FileNotFoundError(f"{what} is a folder, not a file: {path}")
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} not found: {path}") from None
    except IsADirectoryError:
        raise FileNotFoundError(f"{what} is a folder, not a file: {path}") from None


def read_text(path: str | Path, what: str = "data file", encoding: str | None = None,
              max_line: int | None = MAX_LINE) -> str:
    """The whole text of a file in `encoding` (default UTF-8; see `decode_text`); a missing path or
    a folder is a FileNotFoundError naming `what` and the path (see `_open`).

    Read and decoded a chunk at a time, so that a binary file (/dev/zero, /dev/urandom) fails at
    its first bytes, and a line longer than `max_line` characters (None: no limit, for a JSON
    document) keeps its first `max_line` in memory bounded by them; a warning says how many lines
    were cut, and which."""
    cut = _LineCutter(max_line)
    kept = [cut.feed(text, line) for text, line in _decoded(path, what, encoding)]
    if cut.lines:
        shown = ", ".join(map(str, cut.lines[:5])) + (", ..." if len(cut.lines) > 5 else "")
        warnings.warn(f"{path}: {len(cut.lines)} line(s) longer than {max_line:,} characters were cut to their "
                      f"first {max_line:,} (line {shown})", stacklevel=2)
    return "".join(kept).removeprefix(BOM)


def _decoded(path: str | Path, what: str, encoding: str | None) -> Iterator[tuple[str, int]]:
    """(text, the line it starts on) of a file, a chunk of READ_BYTES at a time: bytes that do not
    decode, or a NUL byte, are a ValueError naming the file and line (see `decode_text`)."""
    encoding = check_encoding(encoding)
    decoder = codecs.getincrementaldecoder(encoding)()
    line, column = 1, 1  # where the next byte to decode is: its line, and its byte in that line
    with _open(path, what) as f:
        while True:
            data = f.read(READ_BYTES)
            try:
                text = decoder.decode(data, final=not data)
            except UnicodeDecodeError as e:  # e.object: the bytes held back from the last chunk, then these
                raise decode_error(path, e.object, e, line, encoding, column - len(e.object) + len(data)) from None
            if (nul := text.find("\x00")) >= 0:
                raise ValueError(f"{path}:{line + text.count(chr(10), 0, nul)}: NUL byte: this is a binary file, "
                                 "not text")
            yield text, line
            newline = data.rfind(b"\n")
            line += text.count("\n")
            column = len(data) - newline if newline >= 0 else column + len(data)
            if not data:
                return


class _LineCutter:
    """Cuts the lines of a text read a chunk at a time to `max_line` characters (None: no cut);
    `lines`: the numbers of the lines cut."""

    def __init__(self, max_line: int | None):
        self.max_line, self.length, self.lines = max_line, 0, []  # length: characters of the open line so far
        self._long = None if max_line is None else re.compile(f"(?<![^\n])[^\n]{{{max_line + 1},}}")

    def feed(self, text: str, line: int) -> str:
        """The part of `text` (the next chunk, starting on `line`) that is kept."""
        if self.max_line is None:
            return text
        first = text.find("\n")
        open_end = len(text) if first < 0 else first  # the open line goes on to here
        keep = max(0, min(open_end, self.max_line - self.length))
        if keep < open_end and (not self.lines or self.lines[-1] != line):
            self.lines.append(line)
        if first < 0:
            self.length += len(text)
            return text[:keep]
        half = (self.max_line + 1) // 2  # a line past max_line holds a newline-free window of `half`
        windows = range(first + 1, len(text), half)
        found = list(self._long.finditer(text, first + 1)) if any(text.find("\n", k, k + half) < 0
                                                                  for k in windows) else []
        self.length = len(text) - text.rfind("\n") - 1
        if keep == open_end and not found:
            return text
        parts, at = [text[:keep]], first
        for long in found:  # whole lines, and the start of the next
            self.lines.append(line + text.count("\n", 0, long.start()))
            parts.append(text[at:long.start() + self.max_line])
            at = long.end()
        parts.append(text[at:])
        return "".join(parts)


def check_text_file(path: str | Path, encoding: str | None = None) -> None:
    """Raise the `decode_text` error if a file of any size (read a chunk at a time) is not
    `encoding` text; for files handed to the Rust readers, whose errors name no file or line."""
    for _ in _decoded(path, "data file", encoding):
        pass


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


def read_lines(path: str | Path, encoding: str | None = None, text: str | None = None) -> list[str]:
    """One text per line; line i of the file is row i of the output (blank lines included).
    text: the file's text when it was read already (a pipe can be read only once)."""
    lines = split_lines(read_text(path, "input file", encoding) if text is None else text)
    if not lines:
        raise ValueError(f"{path}: no lines to read (the file is empty)")
    return lines
