"""Rows of a TSV, CSV, JSON Lines or plain text file, in the layouts users have them.

    rows = read_table("pairs.csv", ["s1", "s2", "score"], where={"split": "train"})
    for at, (a, b, score) in rows:   # at = "pairs.csv:17", for error messages
        ...

The layout follows the file's extension unless `delimiter` names one:

| extension      | layout                                                                   |
| -------------- | ------------------------------------------------------------------------ |
| .jsonl, .json  | JSON Lines: one object (columns by key) or array (by index) per line; a   |
|                | .json file may instead hold one JSON array of such records                |
| .csv           | comma separated, quoted fields as in RFC 4180 (a field may span lines)     |
| .txt           | one value per line: the whole line is column 0; tab separated instead     |
|                | when the first line holds tabs and names a column asked for by name (or    |
|                | header=true): MRPC's msr_paraphrase_train.txt                              |
| anything else  | tab separated, split on tabs only: GLUE's TSVs hold literal `"` characters |

Columns are names (of the header line, or JSON keys) or 0-based indices. `header=True`: the
first line names the columns; `False`: every line is data, columns are indices; `None` (the
default): a header line exactly when some column is given by name. Blank lines are skipped;
every row must have as many fields as the header (or, without one, as the first row).

`where` keeps the rows whose columns hold given values, compared as text: {"split": "train"},
{"split": ["train", "extra"]} or {3: "en"}; one file can then hold several splits. Errors name
the file and line: a missing column, a short row, bad JSON, or a filter that keeps no row.
Files are UTF-8 unless `encoding` names another codec (see `bert_kit.data`).
"""

from __future__ import annotations

import csv
import gc
import io
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence, Union

from bert_kit.data import parse_jsonl, read_lines, read_text, setting, split_lines

Column = Union[str, int]  # a header name / JSON key, or a 0-based index
Row = tuple[str, list[Any]]  # ("file:line", values of the asked columns)
DELIMITER_NAMES = {"\\t": "\t", "tab": "\t", "comma": ",", "semicolon": ";", "pipe": "|"}


def column_ref(value: Any, setting: str = "column") -> Column:
    """A column given by a user: an int index >= 0, or a name; a whole number written as text
    ("2") is an index, as it is on the command line."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"{setting} must be a column name or a 0-based index, got {value!r}")
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, int) and value < 0:
        raise ValueError(f"{setting} must be a 0-based column index (>= 0) or a name, got {value}")
    if isinstance(value, str) and not value.strip():
        raise ValueError(f"{setting} is empty: name a column or give its 0-based index")
    return value


def layout_of(path: str | Path, delimiter: str | None = None) -> str:
    """"jsonl", "lines", or the field delimiter of a delimited file, by the file's extension (see
    the module table) unless `delimiter` (one character, or tab, comma, semicolon, pipe) is given."""
    if delimiter is not None:
        delimiter = DELIMITER_NAMES.get(delimiter, delimiter)
        if len(delimiter) != 1 or delimiter in "\r\n\"":
            raise ValueError(f"{setting('delimiter', repr(delimiter))}: a delimiter is one character "
                             "(or tab, comma, semicolon, pipe)")
        return delimiter
    suffix = Path(path).suffix.lower()
    return {".jsonl": "jsonl", ".json": "jsonl", ".csv": ",", ".txt": "lines"}.get(suffix, "\t")


def first_line(text: str) -> str:
    """The first non-blank line of a text ("" if none), without reading past it."""
    start = 0
    while start < len(text):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        if text[start:end].strip():
            return text[start:end].rstrip("\r")
        start = end + 1
    return ""


def table_layout(path: str | Path, text: str, delimiter: str | None = None, header: bool | None = None,
                 columns: Sequence[Column] = ()) -> str:
    """`layout_of`, where a .txt file whose first line holds tabs is tab separated when that line
    names one of the `columns` given by name, or with header=true (MRPC's release is such a file)."""
    layout = layout_of(path, delimiter)
    if layout != "lines":
        return layout
    head = first_line(text)
    names = {field.strip() for field in head.split("\t")}
    if "\t" in head and (header is True or any(isinstance(c, str) and c in names for c in columns)):
        return "\t"
    return layout


def separator_hint(head: str) -> str:
    """How to read a one-text-per-line file as columns: the delimiter its first line seems to use."""
    found = next((name for name, char in (("tab", "\t"), ("comma", ","), ("semicolon", ";"), ("pipe", "|"))
                  if char in head), "tab")
    return f"set {setting('delimiter', found)} to read it as columns"


def _json_records(text: str, path: Path) -> list[tuple[str, Any]]:
    if Path(path).suffix.lower() == ".json" and text.lstrip().startswith("["):
        try:  # one JSON array of records (pandas' to_json(orient="records"))
            records = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
        return [(f"{path}: record {i}", r) for i, r in enumerate(records)]
    return [(f"{path}:{i}", r) for i, r in parse_jsonl(split_lines(text), path)]


def _delimited(text: str, path: Path, delimiter: str) -> list[tuple[int, list[str]]]:
    """(line number, fields) of each non-blank line."""
    if delimiter == "lines":
        return [(i, [line]) for i, line in enumerate(split_lines(text), start=1) if line.strip()]
    if delimiter == "\t":  # quotes are literal characters in TSV (GLUE): split on tabs only
        return [(i, line.split("\t")) for i, line in enumerate(split_lines(text), start=1) if line.strip()]
    # strict: an unclosed quote is an error, not a field that swallows the rest of the file
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    rows = []
    try:
        for fields in reader:
            rows.append((reader.line_num, fields))
    except csv.Error as e:  # name the line where the bad record starts, not where the reader gave up
        start = rows[-1][0] + 1 if rows else 1
        raise ValueError(f"{path}:{start}: bad quoting ({e}); a field with the delimiter, a quote or a "
                         "line break must be quoted whole, with quotes inside doubled") from None
    return [(i, fields) for i, fields in rows if any(f.strip() for f in fields)]


def _keep(rows: list[Row], where: Mapping[Column, Any], n: int, path: Path) -> list[Row]:
    """Rows whose filter columns (values n, n+1, ... of each row) match `where` (as stripped text)."""
    wanted = [{str(o).strip() for o in (w if isinstance(w, (list, tuple, set)) else [w])} for w in where.values()]
    kept = [(at, values[:n]) for at, values in rows
            if all(str(v).strip() in options for v, options in zip(values[n:], wanted))]
    if rows and not kept:
        column, want = next(iter(where.items()))
        seen = sorted({str(values[n]).strip() for _, values in rows})
        shown = ", ".join(repr(s) for s in seen[:10]) + (", ..." if len(seen) > 10 else "")
        raise ValueError(f"{path}: no row has {column!r} = {want!r} (where={dict(where)}); "
                         f"that column holds {shown}")
    return kept


@contextmanager
def no_garbage_collection() -> Iterator[None]:
    """Pause the cyclic garbage collector while parsing: a file of many rows allocates many small
    lists and tuples (no cycles), and each collection also walks every object of the process
    (all of torch), which made reading SST-2's 67k rows 3x slower."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def read_table(path: str | Path, columns: Sequence[Column], header: bool | None = None,
               delimiter: str | None = None, where: Mapping[Any, Any] | None = None,
               what: str = "data file", encoding: str | None = None, text: str | None = None) -> list[Row]:
    """The rows of a data file kept by `where`: ("file:line", [value of each of `columns`]).

    Values are strings for TSV/CSV/text files and JSON values for JSON Lines. A file without
    data rows (empty, only a header, or nothing kept by `where`) raises ValueError. `encoding`:
    the file's codec (default UTF-8); `text`: the file's text when it was read already.
    """
    with no_garbage_collection():
        if text is None:
            text = read_text(path, what, encoding)
        return _read_table(path, columns, header, delimiter, where, text)


def _read_table(path: str | Path, columns: Sequence[Column], header: bool | None, delimiter: str | None,
                where: Mapping[Any, Any] | None, text: str) -> list[Row]:
    path = Path(path)
    columns = [column_ref(c) for c in columns]
    where = {column_ref(k, "where key"): v for k, v in (where or {}).items()}
    wanted = columns + list(where)
    layout = table_layout(path, text, delimiter, header, wanted)
    if layout == "jsonl":
        rows = [(at, _json_values(record, wanted, at)) for at, record in _json_records(text, path)]
        if not rows:
            raise ValueError(f"{path}: no records (the file is empty)")
        return _keep(rows, where, len(columns), path) if where else rows

    lines = _delimited(text, path, layout)
    if not lines:
        raise ValueError(f"{path}: the file is empty")
    named = [c for c in wanted if isinstance(c, str)]
    if header is None:
        header = bool(named)
    if not header and named:
        raise ValueError(f"{path}: column {named[0]!r} is a name but the file is read without a header "
                         f"line ({setting('header', False)}): give its 0-based index")
    if header:
        head_line, names = lines[0]
        names = [n.strip() for n in names]
        lines = lines[1:]
        index = []
        for c in wanted:
            if isinstance(c, int):
                index.append(c)
            elif names.count(c) == 1:
                index.append(names.index(c))
            elif c in names:
                raise ValueError(f"{path}:{head_line}: the header names column {c!r} twice")
            elif layout == "lines":  # a .txt file whose first line names none of the columns
                raise ValueError(f"{path}:{head_line}: no column {c!r}: a .txt file is one text per line unless "
                                 f"its first line names the columns, tab separated (it reads {names[0][:60]!r}); "
                                 + separator_hint(names[0]))
            else:
                raise ValueError(f"{path}:{head_line}: header has no column {c!r} (columns: {names}); "
                                 f"for a file without a header line set {setting('header', False)} and give "
                                 "columns by 0-based index")
        width, width_of = len(names), "the header has"
        if not lines:  # after the column check: a header-less one-line file gets the header hint
            raise ValueError(f"{path}: only a header line, no data rows")
    else:
        index = list(wanted)
        width, width_of = len(lines[0][1]), f"line {lines[0][0]} has"
    if layout == "lines":
        width = 1
    for c in index:
        if c >= width:
            hint = f" (a .txt file is one text per line: {separator_hint(first_line(text))})" if layout == "lines" else ""
            raise ValueError(f"{path}: column index {c} is out of range: rows have {width} field(s) "
                             f"(0..{width - 1}){hint}")
    rows, prefix = [], f"{path}:"
    for i, fields in lines:
        if len(fields) != width and layout != "lines":
            raise ValueError(f"{path}:{i}: row has {len(fields)} fields but {width_of} {width}"
                             + (f" ({names})" if header else ""))
        rows.append((prefix + str(i), [fields[c] for c in index]))
    return _keep(rows, where, len(columns), path) if where else rows


def _json_values(record: Any, wanted: list[Column], at: str) -> list[Any]:
    """Values of `wanted` columns of one JSON record (an object by key, or an array by index)."""
    if isinstance(record, dict):
        values = []
        for c in wanted:
            if isinstance(c, int):
                raise ValueError(f"{at}: column {c} is an index but the record is a JSON object: name its key")
            if c not in record:
                raise ValueError(f"{at}: missing key {c!r} (keys: {sorted(record)})")
            values.append(record[c])
        return values
    if isinstance(record, list):
        for c in wanted:
            if isinstance(c, str):
                raise ValueError(f"{at}: column {c!r} is a name but the record is a JSON array: give its index")
            if c >= len(record):
                raise ValueError(f"{at}: no column {c} in a record of {len(record)} values")
        return [record[c] for c in wanted]
    raise ValueError(f"{at}: expected a JSON object, got {type(record).__name__}")


def read_texts(path: str | Path, column: Column | None = None, header: bool | None = None,
               delimiter: str | None = None, where: Mapping[Any, Any] | None = None,
               encoding: str | None = None) -> list[str]:
    """Texts to embed or score: every line of the file (blank ones included, so row i is line i),
    or, with `column` (or `where`), that column of the rows of any layout of `read_table`."""
    if column is None and where is None:
        return read_lines(path, encoding)
    texts = []
    for at, (value,) in read_table(path, [0 if column is None else column], header, delimiter, where, "input file",
                                   encoding):
        if not isinstance(value, str):
            raise ValueError(f"{at}: column {column!r} holds {type(value).__name__}, expected a text")
        texts.append(value)
    return texts


def parse_where(items: Sequence[str] | None) -> dict[str, Any] | None:
    """Command-line filters, `--where COLUMN=VALUE` (repeatable) -> the `where` of `read_table`;
    a column given twice keeps the rows holding either value."""
    if not items:
        return None
    where: dict[str, list[str]] = {}
    for item in items:
        column, sep, value = item.partition("=")
        if not sep or not column.strip():
            raise ValueError(f"--where {item!r} is not COLUMN=VALUE (e.g. --where split=test)")
        where.setdefault(column.strip(), []).append(value)
    return {column: values[0] if len(values) == 1 else values for column, values in where.items()}
