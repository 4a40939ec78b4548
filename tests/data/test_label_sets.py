"""Label sets (multi-label classification) as files hold them: JSON lists, delimited texts, id lists
as GoEmotions distributes them, one 0/1 column per label; rows without a label; detection; the
errors, each naming the file and line; and the (B, C) targets the collate makes of them.

Run: .venv/bin/python -m pytest tests/data/test_label_sets.py -q -n 0
"""

import pytest
import torch

from bert_kit.data.classification import ClassificationDataset, pad_collate, read_classification_file
from bert_kit.data.label_sets import convert_sets, detect, split_sets
from bert_kit.tasks.classification_config import read_label_names_file


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_json_lists_of_names_and_rows_without_a_label(tmp_path):
    path = write(tmp_path, "f.jsonl", '{"text": "so happy", "labels": ["joy"]}\n'
                                      '{"text": "grr", "labels": ["anger", "joy", "anger"]}\n'
                                      '{"text": "the bus is late", "labels": []}\n')
    data = read_classification_file(path, "text", "labels")
    assert data.multi_label and data.detected == "the labels are JSON lists"
    assert data.label_names == ["anger", "joy"] and data.labels == [[1], [0, 1], []]  # duplicates count once


def test_delimited_texts_with_a_delimiter_setting(tmp_path):
    path = write(tmp_path, "f.tsv", "sentence\tlabel\na\tjoy|anger\nb\tjoy\nc\t\nd\tfear|joy\ne\tanger|fear\n")
    data = read_classification_file(path)  # lists in most rows: sets; a blank field: none of the labels
    assert data.labels == [[0, 2], [2], [], [1, 2], [0, 1]] and data.label_names == ["anger", "fear", "joy"]
    # rows with no label are no evidence of single labels: lists in most of the labelled rows
    path = write(tmp_path, "h.csv", 'text,labels\na,"joy;love"\nb,anger\nc,""\nd,"joy;thanks"\n')
    data = read_classification_file(path, "text", "labels")
    assert data.multi_label and data.labels == [[1, 2], [0], [], [1, 3]]
    assert data.detected == "2 of 4 rows hold lists separated by ';'"
    path = write(tmp_path, "i.csv", 'text,labels\na,"joy;love"\nb,anger\nc,""\nd,fear\n')
    with pytest.raises(ValueError, match=r"i\.csv:4: empty label, and other rows hold lists of labels \('joy;love', "
                                         r"in 1 of 4 rows\): .*set classification\.multi_label=true"):
        read_classification_file(path, "text", "labels")
    path = write(tmp_path, "g.tsv", "sentence\tlabel\na\tjoy / anger\nb\tjoy\n")
    data = read_classification_file(path, label_delimiter=" / ", multi_label=True)
    assert data.labels == [[0, 1], [1]] and data.detected == ""  # asked for: nothing to say


def test_goemotions_id_lists_with_the_names_of_emotions_txt(data_dir):
    """GoEmotions' TSVs as distributed (no header; `text \\t 8,20 \\t id`): lists are in 16% of the
    rows only, but every id in them is also some row's only label, so they are label sets."""
    folder = data_dir / "goemotions"
    names = read_label_names_file(folder / "emotions.txt")
    assert len(names) == 28 and names[0] == "admiration" and names[27] == "neutral"
    data = read_classification_file(folder / "test.tsv", 0, 1, header=False)
    assert data.multi_label and "of labels that other rows hold alone" in data.detected
    assert len(data.texts) == 5427 and data.label_names is None
    counts = torch.zeros(28, dtype=torch.long)
    for ids in data.labels:
        counts[ids] += 1
    # the README's test label counts in id order
    assert counts.tolist() == [504, 264, 198, 320, 351, 135, 153, 284, 83, 151, 267, 123, 37, 103, 78, 352, 6, 161,
                               238, 23, 186, 16, 145, 11, 56, 156, 141, 1787]
    named = read_classification_file(folder / "test.tsv", 0, 1, header=False, label_names=names, multi_label=True)
    assert named.labels == data.labels and named.label_names == names
    sizes = [len(ids) for ids in named.labels]
    assert [sizes.count(k) for k in (1, 2, 3, 4)] == [4590, 774, 61, 2]  # the README's rows with 1-4 labels


def test_one_column_per_label(tmp_path):
    path = write(tmp_path, "f.csv", "id,text,anger,joy,fear\n1,grr,1,0,0\n2,yay,0,1,0\n3,meh,0,0,0\n4,eek,1,0,1\n")
    data = read_classification_file(path, "text", "label", label_columns=["anger", "joy", "fear"])
    assert data.label_names == ["anger", "joy", "fear"] and data.labels == [[0], [1], [], [0, 2]]
    jsonl = write(tmp_path, "f.jsonl", '{"t": "a", "x": true, "y": false}\n{"t": "b", "x": 0, "y": 1.0}\n')
    assert read_classification_file(jsonl, "t", "label", label_columns=["x", "y"]).labels == [[0], [1]]
    with pytest.raises(ValueError, match=r"f\.csv:3: label column 'joy' holds 2: each label column holds 1"):
        read_classification_file(write(tmp_path, "f.csv", "text,anger,joy\na,0,1\nb,0,2\n"), "text", "label",
                                 label_columns=["anger", "joy"])


def test_detection_reads_single_labels_as_before(tmp_path):
    """A comma inside a few class names (no part of them a label alone), decimal commas and single
    labels are single-label files; a label that is one of label_names is a class."""
    raw = ["Sci,Tech", "Sports", "World", "Sports"]
    assert detect(raw) == (None, "")
    assert detect(["0,5", "1,5", "2,25"]) == (None, "")
    assert detect(["pos", "neg"]) == (None, "")
    assert detect(["a,b", "a", "b"], label_names=["a", "b", "a,b"]) == (None, "")
    assert detect(["a;b", "a", "c"]) == (None, "")  # 1 row of 3, and b is no label alone: a class "a;b"
    assert detect(["a;b", "a", "b"])[0] == ";"  # a and b are labels alone: a set


@pytest.mark.parametrize("raw,kwargs,match", [
    (["0,2", "joy"], {}, r"f:2: label 'joy' is a name but other labels are ids"),
    (["0,5"], {"num_labels": 3}, r"f:1: label id 5 is outside the label ids 0\.\.2"),
    (["joy,Joy"], {}, r"f:1: label 'joy' differs from label 'Joy' only in case"),
    (["joy,fear"], {"label_names": ["joy", "anger"]}, r"f:1: label 'fear' is not one of label_names"),
    (["1,2.5"], {}, r"f:1: label id|fractional|name"),
])
def test_label_set_errors_name_the_line(raw, kwargs, match):
    where = [f"f:{i + 1}" for i in range(len(raw))]
    with pytest.raises(ValueError, match=match):
        convert_sets(split_sets(raw, where, ","), where, **kwargs)


def test_null_labels_are_missing_not_empty():
    with pytest.raises(ValueError, match=r"f:2: labels are null \(missing\); write \[\]"):
        split_sets([["a"], None], ["f:1", "f:2"], ",")


def test_label_names_file_errors(tmp_path):
    assert read_label_names_file(write(tmp_path, "n.txt", "a\nb\n\n")) == ["a", "b"]
    with pytest.raises(ValueError, match=r"n\.txt:3: label name 'a' is already on line 1"):
        read_label_names_file(write(tmp_path, "n.txt", "a\nb\na"))
    with pytest.raises(ValueError, match=r"n\.txt:2: a blank line among the label names"):
        read_label_names_file(write(tmp_path, "n.txt", "a\n\nb"))


def test_label_sets_collate_to_float_targets(minilm_path):
    from bert_kit.tokenizer import get_tokenizer

    ds = ClassificationDataset(["a", "b c d"], [[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]], get_tokenizer(minilm_path))
    batch = pad_collate([ds[0], ds[1]])
    assert batch["labels"].dtype == torch.float32
    torch.testing.assert_close(batch["labels"], torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]), rtol=0, atol=0)
    assert batch["input_ids"].shape == (2, 5)


def test_windows_of_long_texts_carry_their_text_and_label(minilm_path):
    """long_text chunks: every window of a text is an item with the text's label and index; windows
    share `stride` tokens; the collate leaves the index out of the model's inputs."""
    from bert_kit.tokenizer import get_tokenizer

    tokenizer = get_tokenizer(minilm_path)
    long = " ".join(f"w{i}" for i in range(40))  # 'w', '##0' ...: more than one 16-token window
    ds = ClassificationDataset(["short", long], [0, 1], tokenizer, max_length=16, stride=4)
    n = ds.windows[1]
    assert ds.windows[0] == 1 and n > 3 and len(ds) == 1 + n
    assert [ds[i]["document"] for i in range(len(ds))] == [0] + [1] * n
    assert [ds[i]["labels"] for i in range(len(ds))] == [0] + [1] * n
    whole = tokenizer([long], max_length=10_000, return_tensors=None)["input_ids"][0][1:-1]
    first, second = ds[1]["input_ids"][1:-1], ds[2]["input_ids"][1:-1]
    assert first == whole[:14] and second[:4] == first[-4:]  # 14 text tokens a window, 4 shared
    assert not ds.truncated  # nothing was cut
    assert "document" not in pad_collate([ds[0], ds[1]])
