"""The readers on the public files as they are distributed (skipped without the data root), and
the one-text-per-line .txt files whose first line names tab-separated columns (MRPC's release,
msr_paraphrase_train.txt, has the layout of GLUE's MRPC/train.tsv).

Run: .venv/bin/python -m pytest tests/data/test_real_files.py -q
"""

from __future__ import annotations

from collections import Counter

import pytest

from bert_kit.data.classification import read_classification_file
from bert_kit.data.ner import read_conll
from bert_kit.data.sts import read_sts
from bert_kit.data.tables import read_table

MRPC_COLUMNS = {"text_column": "#1 String", "text_pair_column": "#2 String", "label_column": "Quality"}


@pytest.fixture(scope="module")
def glue(data_dir):
    if not (data_dir / "glue" / "MRPC" / "train.tsv").is_file():
        pytest.skip("no GLUE files under the data root")
    return data_dir / "glue"


def test_mrpc_with_a_byte_order_mark_and_named_columns(glue):
    head = (glue / "MRPC" / "train.tsv").read_bytes()[:40]
    assert head.startswith(b"\xef\xbb\xbfQuality\t#1 ID\t#2 ID\t#1 String")  # as distributed
    train = read_classification_file(glue / "MRPC" / "train.tsv", **MRPC_COLUMNS)
    assert len(train.texts) == 3668 and Counter(train.labels) == {1: 2474, 0: 1194}  # the official counts
    assert train.texts[0].startswith('Amrozi accused his brother, whom he called "the witness"')  # quotes kept
    dev = read_classification_file(glue / "MRPC" / "dev.tsv", **MRPC_COLUMNS)
    assert len(dev.texts) == 408 and Counter(dev.labels) == {1: 279, 0: 129}


def test_mrpc_release_txt_is_read_by_its_named_columns(glue, tmp_path):
    """msr_paraphrase_train.txt: tab-separated columns with a header, in a .txt file. Naming a
    column reads it as columns (before, as one text per line: "a .txt file holds one text per line")."""
    txt = tmp_path / "msr_paraphrase_train.txt"
    txt.write_bytes((glue / "MRPC" / "train.tsv").read_bytes())
    as_txt = read_classification_file(txt, **MRPC_COLUMNS)
    as_tsv = read_classification_file(glue / "MRPC" / "train.tsv", **MRPC_COLUMNS)
    assert as_txt.texts == as_tsv.texts and as_txt.text_pairs == as_tsv.text_pairs and as_txt.labels == as_tsv.labels
    assert [v for _, v in read_table(txt, ["#1 ID"])][:2] == [["702876"], ["2108705"]]
    # a typo in one name: the header's columns are listed
    with pytest.raises(ValueError, match=r"msr_paraphrase_train.txt:1: header has no column 'Qualty' \(columns: "
                                         r"\['Quality', '#1 ID'"):
        read_classification_file(txt, **{**MRPC_COLUMNS, "label_column": "Qualty"})
    # no name of the header at all (the defaults sentence / label): what to do is said
    with pytest.raises(ValueError, match="a .txt file holds one text per line and no label column.*its first line "
                                         "holds tabs but names no column asked for"):
        read_classification_file(txt)


def test_a_one_column_txt_names_the_delimiter_to_set(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text("text,label\ngood film,1\n")
    with pytest.raises(ValueError, match=r"data.txt:1: no column 'text': a .txt file is one text per line unless its "
                                         r"first line names the columns, tab separated \(it reads 'text,label'\); "
                                         "set delimiter=comma to read it as columns"):
        read_table(path, ["text", "label"])
    assert [v for _, v in read_table(path, ["text", "label"], delimiter="comma")] == [["good film", "1"]]
    with pytest.raises(ValueError, match=r"column index 1 is out of range: rows have 1 field\(s\) \(0..0\) \(a .txt "
                                         "file is one text per line: set delimiter=comma"):
        read_table(path, [0, 1], header=False)
    # a .txt file whose first line has tabs but no column is asked for by name: one text per line, as before
    plain = tmp_path / "plain.txt"
    plain.write_text("a\tb\nc\td\n")
    assert [v for _, v in read_table(plain, [0], header=False)] == [["a\tb"], ["c\td"]]
    assert [v for _, v in read_table(plain, [1], header=True)] == [["d"]]  # header=true: its tab columns


def test_cola_without_a_header(glue):
    train = read_classification_file(glue / "CoLA" / "train.tsv", text_column=3, label_column=1, header=False)
    assert len(train.texts) == 8551 and Counter(train.labels) == {1: 6023, 0: 2528}
    dev = read_classification_file(glue / "CoLA" / "dev.tsv", text_column=3, label_column=1, header=False)
    assert len(dev.texts) == 1043  # no final newline in the official file


def test_stsb_glue_copy_and_release(glue, data_dir):
    assert [len(read_sts(glue / "STS-B" / f"{s}.tsv")[2]) for s in ("train", "dev")] == [5749, 1500]
    release = data_dir / "stsb" / "sts-dev.csv"
    if release.is_file():
        assert len(read_sts(release)[2]) == 1500


def test_sst2_and_conll2003(data_dir):
    if not (data_dir / "conll2003" / "train.txt").is_file():
        pytest.skip("no CoNLL-2003 under the data root")
    assert [len(read_conll(data_dir / "conll2003" / f"{s}.txt")) for s in ("train", "valid", "test")] == [14041, 3250, 3453]
    dev = read_classification_file(data_dir / "sst2" / "dev.tsv")
    assert len(dev.texts) == 872 and Counter(dev.labels) == {1: 444, 0: 428}
