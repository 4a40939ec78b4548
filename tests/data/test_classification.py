"""Classification data: the file reader on real SST-2 and on malformed files, the dataset, the
dynamically padded loader.

Run: .venv/bin/python -m pytest tests/data/test_classification.py -q
"""

import pytest
import torch

from bert_kit.data.classification import (
    ClassificationDataset,
    create_classification_dataloader,
    pad_collate,
    read_classification_file,
)


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
    from bert_kit.tokenizer import get_tokenizer

    return get_tokenizer(minilm_path)


# ------------------------------------------------------------------------------ reader


def test_read_sst2_dev_and_train(data_dir):
    dev = read_classification_file(data_dir / "sst2" / "dev.tsv")
    assert len(dev.texts) == len(dev.labels) == 872
    assert sum(dev.labels) == 444 and set(dev.labels) == {0, 1}  # published GLUE counts
    assert all(type(y) is int for y in dev.labels)
    assert dev.texts[0] == "it 's a charming and often affecting journey . "  # trailing space kept
    assert dev.labels[:2] == [1, 0] and dev.text_pairs is None and dev.label_names is None
    train = read_classification_file(data_dir / "sst2" / "train.tsv")
    assert len(train.texts) == 67349 and sum(train.labels) == 37569


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_tsv_keeps_quotes_and_reads_pairs(tmp_path):
    path = write(tmp_path, "pairs.tsv", 'q1\tq2\tlabel\n"a" b\tc "d\t1\ne\tf\t0\n')
    data = read_classification_file(path, text_column="q1", text_pair_column="q2")
    assert data.texts == ['"a" b', "e"] and data.text_pairs == ['c "d', "f"]
    assert data.labels == [1, 0]


def test_csv_quoting_and_float_labels(tmp_path):
    path = write(tmp_path, "scores.csv", 'sentence,label\n"hello, world",0.5\nbye,2.25\n')
    data = read_classification_file(path)
    assert data.texts == ["hello, world", "bye"]
    assert data.labels == [0.5, 2.25] and all(type(y) is float for y in data.labels)
    path = write(tmp_path, "ints.csv", "sentence,label\na,1.0\nb,0\n")
    assert read_classification_file(path).labels == [1, 0]  # integral floats become ints
    # a fraction among integer classes is a mistake, unless regression is asked for
    path = write(tmp_path, "mixed.csv", "sentence,label\na,0\nb,0.5\nc,2\n")
    with pytest.raises(ValueError, match=r"mixed\.csv:3: label '0\.5' is fractional but the other labels are integer"):
        read_classification_file(path)
    assert read_classification_file(path, num_labels=1).labels == [0.0, 0.5, 2.0]


def test_jsonl_with_string_labels(tmp_path):
    path = write(tmp_path, "d.jsonl",
                 '{"text": "good", "y": "pos"}\n\n{"text": "bad", "y": "neg"}\n{"text": "ok", "y": "pos"}\n')
    data = read_classification_file(path, text_column="text", label_column="y")
    assert data.label_names == ["neg", "pos"] and data.labels == [1, 0, 1]
    # another split read with the training names keeps the same ids
    data = read_classification_file(path, text_column="text", label_column="y",
                                    label_names=["pos", "neg"])
    assert data.labels == [0, 1, 0]
    with pytest.raises(ValueError, match=r"d\.jsonl:3.*'neg'"):
        read_classification_file(path, text_column="text", label_column="y", label_names=["pos"])
    texts_only = read_classification_file(path, text_column="text", label_column=None)
    assert texts_only.labels is None and texts_only.texts == ["good", "bad", "ok"]


@pytest.mark.parametrize("name,text,kwargs,match", [
    ("short_row.tsv", "sentence\tlabel\na\t1\nb\n", {}, r"short_row\.tsv:3: row has 1 fields"),
    ("no_col.tsv", "text\tlabel\na\t1\n", {}, r"no_col\.tsv:1: header has no column 'sentence'"),
    ("empty_label.tsv", "sentence\tlabel\na\t1\nb\t \n", {}, r"empty_label\.tsv:3: empty label"),
    ("bad.jsonl", '{"sentence": "a", "label": 1}\n{"sentence": "b", label: 0}\n', {},
     r"bad\.jsonl:2: invalid JSON"),
    ("missing.jsonl", '{"sentence": "a", "label": 1}\n{"sentence": "b"}\n', {},
     r"missing\.jsonl:2: missing key 'label'"),
    ("list.jsonl", '[1, 2]\n', {}, r"list\.jsonl:1: column 'sentence' is a name but the record is a JSON array"),
    ("scalar.jsonl", '"text"\n', {}, r"scalar\.jsonl:1: expected a JSON object"),
    ("multi.csv", 'sentence,label\n"two\nlines",1\nc,1,extra\n', {}, r"multi\.csv:4: row has 3"),
])
def test_malformed_files_name_file_and_line(tmp_path, name, text, kwargs, match):
    path = write(tmp_path, name, text)
    with pytest.raises((ValueError, KeyError), match=match):
        read_classification_file(path, **kwargs)


def test_missing_file():
    with pytest.raises(FileNotFoundError, match="nope.tsv"):
        read_classification_file("/nonexistent/nope.tsv")


# ------------------------------------------------------------------------------ dataset / loader


def test_dataset_items_match_tokenizer_encode(data_dir, tokenizer):
    dev = read_classification_file(data_dir / "sst2" / "dev.tsv")
    ds = ClassificationDataset(dev.texts[:50], dev.labels[:50], tokenizer, max_length=16)
    assert len(ds) == 50
    for i in (0, 7, 49):
        item = ds[i]
        assert item["input_ids"] == tokenizer.encode(dev.texts[i], max_length=16)
        assert len(item["input_ids"]) <= 16 and item["labels"] == dev.labels[i]
        assert item["attention_mask"] == [1] * len(item["input_ids"])
        assert item["token_type_ids"] == [0] * len(item["input_ids"])


def test_pairs_get_segment_ids(tokenizer):
    ds = ClassificationDataset(["a man is eating ."], [3.8], tokenizer,
                               text_pairs=["a person eats food ."])
    item = ds[0]
    assert item["input_ids"] == tokenizer.encode("a man is eating .", "a person eats food .")
    sep = item["input_ids"].index(tokenizer.sep_token_id)
    assert item["token_type_ids"] == [0] * (sep + 1) + [1] * (len(item["input_ids"]) - sep - 1)
    assert ds.collate([item])["labels"].dtype == torch.float32


def test_pad_collate_pads_to_longest():
    batch = [{"input_ids": [101, 7, 102], "token_type_ids": [0, 0, 0], "attention_mask": [1, 1, 1],
              "labels": 1},
             {"input_ids": [101, 102], "token_type_ids": [0, 0], "attention_mask": [1, 1], "labels": 0}]
    out = pad_collate(batch, pad_token_id=9)
    torch.testing.assert_close(out["input_ids"], torch.tensor([[101, 7, 102], [101, 102, 9]]))
    torch.testing.assert_close(out["attention_mask"], torch.tensor([[1, 1, 1], [1, 1, 0]]))
    torch.testing.assert_close(out["labels"], torch.tensor([1, 0]))
    batch[1]["labels"] = 0.25  # one float label makes the batch a regression batch
    torch.testing.assert_close(pad_collate(batch)["labels"], torch.tensor([1.0, 0.25]))


def test_dataloader_pads_dynamically_and_sees_every_example(data_dir, tokenizer):
    dev = read_classification_file(data_dir / "sst2" / "dev.tsv")
    texts, labels = dev.texts[:70], dev.labels[:70]
    loader = create_classification_dataloader(texts, labels, tokenizer, batch_size=16,
                                              max_length=64, shuffle=True, seed=0)
    lengths = [len(tokenizer.encode(t, max_length=64)) for t in texts]
    seen = []
    for batch in loader:
        ids = batch["input_ids"]
        assert ids.dtype == torch.long and batch["labels"].dtype == torch.long
        assert batch["attention_mask"].shape == ids.shape == batch["token_type_ids"].shape
        real = batch["attention_mask"].sum(1)
        assert ids.shape[1] == int(real.max())  # padded only to the batch's longest
        assert torch.all(ids[batch["attention_mask"] == 0] == tokenizer.pad_token_id)
        seen += list(zip(real.tolist(), batch["labels"].tolist()))
    assert sorted(seen) == sorted(zip(lengths, labels))
    # the same seed gives the same order (fresh loaders: iterating advances the generator)
    first = [next(iter(create_classification_dataloader(texts, labels, tokenizer, batch_size=16,
                                                        seed=s)))["input_ids"] for s in (0, 0, 1)]
    torch.testing.assert_close(first[0], first[1])
    assert first[0].shape != first[2].shape or not torch.equal(first[0], first[2])


def test_dataset_input_errors(tokenizer):
    with pytest.raises(ValueError, match="2 texts but 1 labels"):
        ClassificationDataset(["a", "b"], [1], tokenizer)
    with pytest.raises(ValueError, match="1 text_pairs"):
        ClassificationDataset(["a", "b"], [1, 0], tokenizer, text_pairs=["c"])


def test_pad_collate_rounds_length_up_to_a_multiple():
    from bert_kit.data.classification import pad_collate

    items = [{"input_ids": [2, 5, 6, 3], "attention_mask": [1] * 4, "labels": 1},
             {"input_ids": [2, 7, 3], "attention_mask": [1] * 3, "labels": 0}]
    batch = pad_collate(items, pad_token_id=0, pad_to_multiple_of=16)
    assert batch["input_ids"].shape == (2, 16)
    assert batch["attention_mask"].sum().item() == 7
    assert pad_collate(items, pad_token_id=0)["input_ids"].shape == (2, 4)



def test_pad_collate_reads_lists_tuples_arrays_and_tensors_alike():
    """Rows as the tokenizer gives them (lists), tuples, NumPy arrays or tensors: the same batch;
    per-token labels pad with -100."""
    import numpy as np

    rows = [[101, 7, 8, 102], [101, 102], [101, 5, 102]]
    tags = [[-100, 1, 2, -100], [-100, -100], [-100, 0, -100]]
    expected = torch.tensor([[101, 7, 8, 102], [101, 102, 0, 0], [101, 5, 102, 0]])
    for as_row in (list, tuple, np.array, torch.tensor):
        out = pad_collate([{"input_ids": as_row(r), "attention_mask": as_row([1] * len(r)), "labels": as_row(t)}
                           for r, t in zip(rows, tags)])
        torch.testing.assert_close(out["input_ids"], expected, msg=str(as_row))
        assert out["input_ids"].dtype == torch.long and out["attention_mask"].sum().item() == 9
        torch.testing.assert_close(out["labels"][1], torch.tensor([-100, -100, -100, -100]))

# ------------------------------------------------------------------------------ layouts and labels


def test_headerless_bom_crlf_tsv_by_index(tmp_path):
    path = tmp_path / "plain.tsv"
    path.write_bytes(b"\xef\xbb\xbf1\tgreat fun\r\n0\tdull\r\n")
    data = read_classification_file(path, text_column=1, label_column=0)
    assert data.texts == ["great fun", "dull"] and data.labels == [1, 0]


def test_label_pattern_reads_labels_written_into_the_text(tmp_path):
    path = write(tmp_path, "fasttext.txt", "__label__pos a fine film\n\n__label__neg so dull\n")
    data = read_classification_file(path, label_pattern=r"__label__(?P<label>\S+) (?P<text>.*)")
    assert data.texts == ["a fine film", "so dull"] and data.labels == [1, 0] and data.label_names == ["neg", "pos"]
    tsv = write(tmp_path, "prefixed.tsv", "id\ttext\n1\tLABEL:fine rest of the line\n2\tLABEL:bad other\n")
    data = read_classification_file(tsv, text_column="text", label_pattern=r"LABEL:(?P<label>\w+) (?P<text>.*)")
    assert data.texts == ["rest of the line", "other"] and data.label_names == ["bad", "fine"]
    # unlabelled reading (predict) keeps a text that does not match whole, and strips one that does
    unlabelled = read_classification_file(path, label_column=None, label_pattern=r"__label__(?P<label>\S+) (?P<text>.*)")
    assert unlabelled.texts == ["a fine film", "so dull"]
    bad = write(tmp_path, "bad.txt", "__label__pos ok\nno label here\n")
    with pytest.raises(ValueError, match=r"bad\.txt:2: text 'no label here' does not match label_pattern"):
        read_classification_file(bad, label_pattern=r"__label__(?P<label>\S+) (?P<text>.*)")
    with pytest.raises(ValueError, match=r"a \.txt file holds one text per line and no label column"):
        read_classification_file(bad)


def test_where_splits_one_file(tmp_path):
    path = write(tmp_path, "all.csv", "sentence,label,split\na,1,train\nb,0,dev\nc,0,train\n")
    train = read_classification_file(path, where={"split": "train"})
    dev = read_classification_file(path, where={"split": "dev"})
    assert (train.texts, train.labels, dev.texts, dev.labels) == (["a", "c"], [1, 0], ["b"], [0])


LOC = [f"f.tsv:{i}" for i in range(2, 8)]


@pytest.mark.parametrize("raw,kwargs,expected", [
    (["0", "1", "1"], {}, ([0, 1, 1], None)),
    ([0, 1, 2], {}, ([0, 1, 2], None)),  # JSON ints
    (["1.0", "0"], {}, ([1, 0], None)),  # integral decimals are classes
    (["3.800", "5.000", "0.5"], {}, ([3.8, 5.0, 0.5], None)),  # decimals with fractions: regression
    (["1", "0"], {"num_labels": 1}, ([1.0, 0.0], None)),  # explicit regression
    (["pos", "neg", "pos"], {}, ([1, 0, 1], ["neg", "pos"])),  # names, sorted
    (["pos", "neg"], {"label_names": ["pos", "neg"]}, ([0, 1], ["pos", "neg"])),  # given order wins
    (["1", "0"], {"label_names": ["negative", "positive"]}, ([1, 0], ["negative", "positive"])),  # ids
    (["1", "0"], {"label_names": ["1", "0"]}, ([0, 1], ["1", "0"])),  # names win over ids
    (["0", "0"], {"num_labels": 3}, ([0, 0], None)),
    (["nan"], {"label_names": ["nan", "ok"]}, ([0], ["nan", "ok"])),  # a given name is a name
])
def test_convert_labels_rules(raw, kwargs, expected):
    from bert_kit.data.classification import convert_labels

    labels, names = convert_labels(raw, LOC[: len(raw)], **kwargs)
    assert (labels, names) == expected
    assert [type(y) for y in labels] == [type(y) for y in expected[0]]


@pytest.mark.parametrize("raw,kwargs,match", [
    (["0", "1", "0.5"], {}, r"f\.tsv:4: label '0\.5' is fractional but the other labels are integer classes"),
    (["0", "0.5"], {"num_labels": 2}, r"f\.tsv:3: label '0\.5' is fractional but num_labels=2 asks for class ids"),
    (["0", "0.5"], {"label_names": ["a", "b"]}, r"f\.tsv:3: label '0\.5' is not one of label_names"),
    (["0", "1", "2"], {"label_names": ["a", "b"]}, r"f\.tsv:4: label '2' is not one of label_names \['a', 'b'\] nor a class id 0\.\.1"),
    (["0", "nan"], {}, r"f\.tsv:3: label 'nan' is not a finite number"),
    (["1", "inf"], {"num_labels": 1}, r"f\.tsv:3: label 'inf' is not a finite number"),
    ([0, None], {}, r"f\.tsv:3: label is null"),
    ([True, 0], {}, r"f\.tsv:2: label true is a boolean"),
    ([[1], 0], {}, r"f\.tsv:2: label \[1\] is a JSON list"),
    (["0", " "], {}, r"f\.tsv:3: empty label"),
    (["0", "-1"], {}, r"f\.tsv:3: label -1 is negative"),
    (["0", "3"], {"num_labels": 3}, r"f\.tsv:3: label 3 is outside the num_labels=3 classes 0\.\.2"),
    (["label", "0", "1"], {}, r"f\.tsv:2: label 'label' is not a number but the other labels are numbers \(a header line"),
    (["pos", "neg", "1"], {}, r"f\.tsv:4: label '1' is a number but the other labels are class names"),
    (["pos", "x"], {"num_labels": 1}, r"f\.tsv:2: label 'pos' is not a number; num_labels=1 means regression"),
    (["pos", "pos"], {}, r"f\.tsv: every label is 'pos': a classifier needs two or more classes"),
    (["a", "b", "c"], {"num_labels": 2}, r"f\.tsv: 3 class names \['a', 'b', 'c'\] but num_labels=2"),
])
def test_convert_labels_errors_name_the_line(raw, kwargs, match):
    from bert_kit.data.classification import convert_labels

    with pytest.raises(ValueError, match=match):
        convert_labels(raw, LOC[: len(raw)], **kwargs)


def test_labels_that_differ_only_in_case_are_refused(tmp_path):
    """`Positive` and `positive` would silently become two classes; given label_names listing both,
    they are two classes on purpose."""
    from bert_kit.data.classification import convert_labels

    with pytest.raises(ValueError, match=r"^f\.tsv:4: label 'Positive' differs from label 'positive' \(f\.tsv:2\) "
                                         r"only in case, so they would be two classes; write one spelling, or list "
                                         "both in label_names"):
        convert_labels(["positive", "negative", "Positive", "negative"], LOC[:4])
    both = ["Positive", "negative", "positive"]
    assert convert_labels(["positive", "Positive"], LOC[:2], label_names=both) == ([2, 0], both)
    with pytest.raises(ValueError, match="label 'Positive' is not one of label_names"):
        convert_labels(["positive", "Positive"], LOC[:2], label_names=["negative", "positive"])
    path = tmp_path / "t.tsv"
    path.write_text("sentence\tlabel\ngood\tPOS\nbad\tneg\nfine\tpos\n")
    with pytest.raises(ValueError, match=r"t\.tsv:4: label 'pos' differs from label 'POS' \(.*t\.tsv:2\)"):
        read_classification_file(path)


def test_tokenless_finds_texts_that_give_no_token(tokenizer):
    from bert_kit.data.classification import tokenless

    texts = ["a film", "", "   ", "\x01\x02\x7f", "\u200b\u00ad", "\ufffd", "!!", "_", "\x01 ok", "\u0301"]
    assert tokenless(texts, tokenizer) == [1, 2, 3, 4, 5, 9]  # the accent alone is dropped by lowercasing too
    assert tokenless(texts) == [1, 2, 3, 4, 5]  # without a tokenizer: whitespace and control characters
    ids = tokenizer([texts[i] for i in (3, 4, 5, 9)], padding=False, return_tensors=None)["input_ids"]
    assert all(row == [tokenizer.cls_token_id, tokenizer.sep_token_id] for row in ids)


def test_a_column_of_label_lists_is_read_as_label_sets_not_as_combined_classes(tmp_path):
    """"price,quality" in most rows is a label set (multi-label), never a class of its own; asked for
    one label per row (multi_label=False) it is an error naming the file, line and column; a few
    labels that hold a comma, label_names that do, decimal commas and scores are read as before."""
    path = tmp_path / "f.csv"
    path.write_text("text,labels\na,\"price,quality\"\nb,price\nc,\"quality,service\"\n")
    data = read_classification_file(path, "text", "labels")
    assert data.multi_label and data.label_names == ["price", "quality", "service"]
    assert data.labels == [[0, 1], [0], [1, 2]] and "2 of 3 rows hold lists separated by ','" in data.detected
    with pytest.raises(ValueError, match=r"f\.csv:2: column 'labels' holds lists of labels \('price,quality', "
                                         r"separated by ',', in 2 of 3 rows\): several labels per row, but "
                                         r"classification.multi_label=false reads one label per row"):
        read_classification_file(path, "text", "labels", multi_label=False)
    # named as classes: kept
    data = read_classification_file(path, "text", "labels", label_names=["price", "price,quality", "quality,service"])
    assert data.labels == [1, 0, 2]
    # one combined label among single ones: a class (Sci,Tech), as before
    path.write_text("text,labels\na,\"Sci,Tech\"\nb,Sports\nc,World\n")
    assert read_classification_file(path, "text", "labels").label_names == ["Sci,Tech", "Sports", "World"]
    # decimal commas are numbers as some locales write them, not lists; scores are never lists
    path.write_text("text,labels\na,\"0,5\"\nb,\"1,5\"\n")
    assert read_classification_file(path, "text", "labels").label_names == ["0,5", "1,5"]
    jsonl = tmp_path / "f.jsonl"
    jsonl.write_text('{"t": "a", "y": "pos"}\n{"t": "b", "y": ["pos", "neg"]}\n')
    assert read_classification_file(jsonl, "t", "y").labels == [[1], [0, 1]]  # JSON lists: sets
    with pytest.raises(ValueError, match=r"f\.jsonl:2: column 'y' holds a JSON list of labels \(\["):
        read_classification_file(jsonl, "t", "y", multi_label=False)
