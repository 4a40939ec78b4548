"""The table reader behind every task's TSV/CSV/JSONL/TXT files: each layout option reads a small
file written in that layout, and each malformed file gives an error naming the file and line.

Run: .venv/bin/python -m pytest tests/data/test_tables.py -q
"""

import pytest

from bert_kit.data import read_lines, read_text, split_lines
from bert_kit.data.tables import column_ref, layout_of, read_table

ROWS = [("the film is great", "pos", "train"), ("dull and long", "neg", "dev"), ("a delight", "pos", "train")]


def write(tmp_path, name, text, encoding="utf-8", bom=False, crlf=False):
    if crlf:
        text = text.replace("\n", "\r\n")
    data = text.encode(encoding)
    path = tmp_path / name
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + data)
    return path


def values(rows):
    return [v for _, v in rows]


def tsv(header=True):
    lines = ["text\tlabel\tsplit"] if header else []
    return "\n".join(lines + ["\t".join(r) for r in ROWS]) + "\n"


# ------------------------------------------------------------------------------ layouts


def test_tsv_with_header_columns_by_name_and_index(tmp_path):
    path = write(tmp_path, "d.tsv", tsv())
    rows = read_table(path, ["text", "label"])
    assert values(rows) == [[t, y] for t, y, _ in ROWS]
    assert [at for at, _ in rows] == [f"{path}:2", f"{path}:3", f"{path}:4"]
    assert values(read_table(path, [0, "label"])) == values(rows)  # an index works with a header too


def test_tsv_without_header_columns_by_index(tmp_path):
    path = write(tmp_path, "d.tsv", tsv(header=False))
    rows = read_table(path, [0, 1])  # no name given: every line is data
    assert values(rows) == [[t, y] for t, y, _ in ROWS] and rows[0][0] == f"{path}:1"
    assert values(read_table(path, ["1", "0"])) == [[y, t] for t, y, _ in ROWS]  # "1" from a command line
    with pytest.raises(ValueError, match=r"d\.tsv: column 'text' is a name but the file is read without a header"):
        read_table(path, ["text"], header=False)


def test_header_true_with_indices_skips_the_header_line(tmp_path):
    path = write(tmp_path, "d.tsv", tsv())
    assert values(read_table(path, [0], header=True)) == [[t] for t, _, _ in ROWS]
    assert values(read_table(path, [0], header=False))[0] == ["text"]  # asked for: the header is data


@pytest.mark.parametrize("bom,crlf", [(True, False), (False, True), (True, True)])
def test_byte_order_mark_and_crlf(tmp_path, bom, crlf):
    path = write(tmp_path, "d.tsv", tsv(), bom=bom, crlf=crlf)
    assert values(read_table(path, ["text", "label", "split"])) == [list(r) for r in ROWS]
    csv_path = write(tmp_path, "d.csv", tsv().replace("\t", ","), bom=bom, crlf=crlf)
    assert values(read_table(csv_path, ["text", "split"])) == [[t, s] for t, _, s in ROWS]


def test_csv_quotes_and_other_delimiters(tmp_path):
    path = write(tmp_path, "d.csv", 'text,label\n"a, b ""c""",1\n"two\nlines",0\n')
    rows = read_table(path, ["text", "label"])
    assert values(rows) == [['a, b "c"', "1"], ["two\nlines", "0"]]
    assert rows[1][0] == f"{path}:4"  # the line where the record ends
    semi = write(tmp_path, "d.txt", "text;label\nx;1\n")
    assert values(read_table(semi, ["text", "label"], delimiter=";")) == [["x", "1"]]
    tabbed_csv = write(tmp_path, "tabs.csv", tsv())
    assert values(read_table(tabbed_csv, ["label"], delimiter="\t")) == [["pos"], ["neg"], ["pos"]]


def test_tsv_keeps_quote_characters(tmp_path):
    path = write(tmp_path, "d.tsv", 'text\tlabel\n"quoted" start\t1\nend "\t0\n')
    assert values(read_table(path, ["text"])) == [['"quoted" start'], ['end "']]


def test_jsonl_objects_arrays_and_json_array_file(tmp_path):
    path = write(tmp_path, "d.jsonl", '{"t": "a", "y": 1}\n\n{"t": "b", "y": null}\n')
    assert values(read_table(path, ["t", "y"])) == [["a", 1], ["b", None]]  # JSON values kept
    arrays = write(tmp_path, "a.jsonl", '["a", 1]\n["b", 0]\n')
    assert values(read_table(arrays, [1, 0])) == [[1, "a"], [0, "b"]]
    records = write(tmp_path, "r.json", '[{"t": "a", "y": 1},\n {"t": "b", "y": 0}]')
    rows = read_table(records, ["y"])
    assert values(rows) == [[1], [0]] and rows[1][0] == f"{records}: record 1"
    bom = write(tmp_path, "b.jsonl", '{"t": "a"}\n', bom=True, crlf=True)
    assert values(read_table(bom, ["t"])) == [["a"]]


def test_txt_is_one_value_per_line(tmp_path):
    path = write(tmp_path, "d.txt", "first\tline, with tab\n\nsecond\n")
    assert layout_of(path) == "lines" and layout_of(path, ",") == ","
    assert values(read_table(path, [0])) == [["first\tline, with tab"], ["second"]]


@pytest.mark.parametrize("where,kept", [
    ({"split": "train"}, [0, 2]),
    ({"split": ["dev", "train"]}, [0, 1, 2]),
    ({"split": "train", "label": "pos"}, [0, 2]),
    ({2: "dev"}, [1]),
    ({"label": " neg "}, [1]),  # compared as stripped text
])
def test_where_keeps_matching_rows(tmp_path, where, kept):
    path = write(tmp_path, "d.tsv", tsv())
    assert values(read_table(path, ["text"], where=where)) == [[ROWS[i][0]] for i in kept]


def test_where_on_json_values(tmp_path):
    path = write(tmp_path, "d.jsonl", '{"t": "a", "year": 2017, "ok": true}\n{"t": "b", "year": 2018, "ok": false}\n')
    assert values(read_table(path, ["t"], where={"year": 2018})) == [["b"]]
    assert values(read_table(path, ["t"], where={"ok": True})) == [["a"]]


def test_helpers_split_lines_and_column_ref(tmp_path):
    assert split_lines("a\r\nb\u2028c\n\nd") == ["a", "b\u2028c", "", "d"]  # LF only: U+2028 stays inside
    assert column_ref("3") == 3 and column_ref(" text ") == " text " and column_ref(0) == 0
    path = write(tmp_path, "lines.txt", "x\r\n\r\ny\n", bom=True)
    assert read_lines(path) == ["x", "", "y"] and read_text(path) == "x\r\n\r\ny\n"


# ------------------------------------------------------------------------------ errors


@pytest.mark.parametrize("name,text,columns,kwargs,match", [
    ("empty.tsv", "", ["text"], {}, r"empty\.tsv: the file is empty"),
    ("blank.tsv", "\n \n", ["text"], {}, r"blank\.tsv: the file is empty"),
    ("head.tsv", "text\tlabel\n", ["text"], {}, r"head\.tsv: only a header line, no data rows"),
    ("nocol.tsv", "text\tlabel\na\t1\n", ["sentence"], {},
     r"nocol\.tsv:1: header has no column 'sentence' \(columns: \['text', 'label'\]\); .*set header=false"),
    ("twice.tsv", "text\ttext\na\tb\n", ["text"], {}, r"twice\.tsv:1: the header names column 'text' twice"),
    ("short.tsv", "text\tlabel\na\t1\nb\n", ["text"], {}, r"short\.tsv:3: row has 1 fields but the header has 2"),
    ("ragged.tsv", "a\t1\nb\t2\t3\n", [0], {}, r"ragged\.tsv:2: row has 3 fields but line 1 has 2"),
    ("range.tsv", "a\t1\n", [2], {}, r"range\.tsv: column index 2 is out of range: rows have 2 field\(s\)"),
    ("range.txt", "a\n", [1], {}, r"range\.txt: column index 1 is out of range.*one text per line"),
    ("where.tsv", "text\tsplit\na\tTRAIN\nb\tDEV\n", ["text"], {"where": {"split": "train"}},
     r"where\.tsv: no row has 'split' = 'train'.*that column holds 'DEV', 'TRAIN'"),
    ("where_col.tsv", "text\tsplit\na\tx\n", ["text"], {"where": {"fold": "1"}}, r"header has no column 'fold'"),
    ("bad.jsonl", '{"t": "a"}\n{"t": }\n', ["t"], {}, r"bad\.jsonl:2: invalid JSON"),
    ("key.jsonl", '{"t": "a"}\n{"x": "b"}\n', ["t"], {}, r"key\.jsonl:2: missing key 't' \(keys: \['x'\]\)"),
    ("index.jsonl", '{"t": "a"}\n', [0], {}, r"index\.jsonl:1: column 0 is an index but the record is a JSON object"),
    ("short.jsonl", '["a"]\n', [0, 1], {}, r"short\.jsonl:1: no column 1 in a record of 1 values"),
    ("empty.jsonl", "\n\n", ["t"], {}, r"empty\.jsonl: no records"),
    ("broken.json", '[{"t": "a"},\n {"t": }]', ["t"], {}, r"broken\.json:2: invalid JSON"),
    ("quote.csv", 'a,b\nx,1\n"open,1\ny,2\n', ["a"], {}, r"quote\.csv:3: bad quoting \(unexpected end of data\)"),
    ("stray.csv", 'a,b\n"x"y,1\n', ["a"], {}, r"stray\.csv:2: bad quoting"),
])
def test_malformed_tables_name_file_and_line(tmp_path, name, text, columns, kwargs, match):
    path = write(tmp_path, name, text)
    with pytest.raises((ValueError, KeyError), match=match):
        read_table(path, columns, **kwargs)


@pytest.mark.parametrize("data,match", [
    (b"text\tlabel\ngood\t1\nbad \xe9t\xe9\t0\n", r"latin1\.tsv:3: not UTF-8 text \(byte 0xe9 at column 5\)"),
    (b"\xff\xfet\x00e\x00x\x00t\x00", r"latin1\.tsv:1: not UTF-8 text \(byte 0xff at column 1\)"),  # UTF-16
    (b"text\tlabel\na\x00b\t1\n", r"latin1\.tsv:2: NUL byte: this is a binary file"),
])
def test_non_utf8_names_the_line(tmp_path, data, match):
    path = tmp_path / "latin1.tsv"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=match):
        read_table(path, ["text"])


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"data file not found: .*nope\.tsv"):
        read_table(tmp_path / "nope.tsv", ["text"])
    with pytest.raises(FileNotFoundError, match=r"data file is a folder, not a file"):
        read_table(tmp_path, ["text"])
    with pytest.raises(ValueError, match="column must be a column name or a 0-based index"):
        column_ref(1.5)
    with pytest.raises(ValueError, match="must be a 0-based column index"):
        column_ref(-1)


def test_read_texts_lines_or_a_column(tmp_path):
    from bert_kit.data.tables import parse_where, read_texts

    lines = write(tmp_path, "t.txt", "a\n\nb\n")
    assert read_texts(lines) == ["a", "", "b"]  # row i is line i, blank lines included
    table = write(tmp_path, "t.tsv", tsv())
    assert read_texts(table, "text", where=parse_where(["split=train"])) == ["the film is great", "a delight"]
    assert read_texts(table, "2", header=True) == ["train", "dev", "train"]
    assert parse_where(["split=a", "split=b", "lang= en"]) == {"split": ["a", "b"], "lang": " en"}
    with pytest.raises(ValueError, match="--where 'split' is not COLUMN=VALUE"):
        parse_where(["split"])
    jsonl = write(tmp_path, "t.jsonl", '{"text": 3}\n')
    with pytest.raises(ValueError, match=r"t\.jsonl:1: column 'text' holds int, expected a text"):
        read_texts(jsonl, "text")
