"""NER data: the CoNLL reader on real CoNLL-2003 and malformed files, IOB conversion, label
alignment with the real MiniLM tokenizer and its inverse, the dataset and collate.

Run: .venv/bin/python -m pytest tests/data/test_ner.py -q
"""

import pytest
import torch

from bert_kit.data.ner import (
    IGNORE_INDEX,
    NERDataset,
    align_labels,
    best_windows,
    get_label_list,
    iob1_to_iob2,
    predictions_to_words,
    read_conll,
    window_spans,
)
from bert_kit.metrics import entity_f1

LABELS = ["O", "B-LOC", "B-MISC", "B-ORG", "B-PER", "I-LOC", "I-MISC", "I-ORG", "I-PER"]


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
    from bert_kit.tokenizer import get_tokenizer

    return get_tokenizer(minilm_path)


@pytest.fixture(scope="module")
def valid(data_dir):
    return read_conll(data_dir / "conll2003" / "valid.txt")


# ------------------------------------------------------------------------------ reader


def test_read_conll_valid_matches_published_counts(valid):
    assert len(valid) == 3250
    assert sum(len(words) for words, _ in valid) == 51362
    words, tags = valid[0]
    assert words == ["CRICKET", "-", "LEICESTERSHIRE", "TAKE", "OVER", "AT", "TOP", "AFTER",
                     "INNINGS", "VICTORY", "."]
    assert tags == ["O", "O", "B-ORG"] + ["O"] * 8
    assert all(len(w) == len(t) for w, t in valid)
    assert not any("-DOCSTART-" in w for w, _ in valid)
    counts = {k: v["support"] for k, v in entity_f1([t for _, t in valid],
                                                   [t for _, t in valid])["per_type"].items()}
    assert counts == {"PER": 1842, "LOC": 1837, "ORG": 1341, "MISC": 922}
    assert get_label_list(valid) == LABELS


def test_read_conll_train_and_tag_column(data_dir):
    train = read_conll(data_dir / "conll2003" / "train.txt")
    assert len(train) == 14041 and sum(len(w) for w, _ in train) == 203621
    pos = read_conll(data_dir / "conll2003" / "test.txt", tag_column=1)
    assert len(pos) == 3453 and pos[0][1][:4] == ["NN", ":", "NNP", "VB"]  # SOCCER - JAPAN GET


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_docstart_separates_sentences(tmp_path):
    path = write(tmp_path, "doc.txt", "a NN O\nb NN B-PER\n-DOCSTART- -X- -X- O\nc NN O\n\n\n\nd NN O")
    assert read_conll(path) == [(["a", "b"], ["O", "B-PER"]), (["c"], ["O"]), (["d"], ["O"])]


@pytest.mark.parametrize("text,kwargs,match", [
    ("EU NNP B-ORG\nrejects\n", {}, r"bad\.txt:2: expected a word and a tag"),
    ("EU B-ORG\n\nx B-PER\n", {"tag_column": 2}, r"bad\.txt:1: no tag_column 2"),
    ("EU NNP B-ORG\n\nx B-PER\n", {}, r"bad\.txt:3: 2 columns but line 1 has 3"),
    ("EU NNP B-ORG\n", {"tag_column": 0}, r"bad\.txt:1: tag column 0 is the word"),
])
def test_malformed_conll_names_file_and_line(tmp_path, text, kwargs, match):
    with pytest.raises(ValueError, match=match):
        read_conll(write(tmp_path, "bad.txt", text), **kwargs)


# ------------------------------------------------------------------------------ IOB1 / IOB2


def iob2_to_iob1(tags):
    """Reference inverse: B-X stays B-X only right after an entity of the same type X."""
    out, prev = [], "O"
    for tag in tags:
        if tag.startswith("B-") and (prev == "O" or prev[2:] != tag[2:]):
            out.append("I-" + tag[2:])
        else:
            out.append(tag)
        prev = tag
    return out


def test_iob1_to_iob2_hand_cases():
    assert iob1_to_iob2(["I-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-ORG"]) == \
        ["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "B-ORG"]
    assert iob1_to_iob2(["B-PER", "I-PER"]) == ["B-PER", "I-PER"]


def test_iob_round_trip_on_real_tags(valid):
    tags = [t for _, t in valid]
    iob1 = [iob2_to_iob1(t) for t in tags]
    assert sum(t != i for t, i in zip(tags, iob1)) > 2000  # the conversion does change tags
    assert [iob1_to_iob2(t) for t in iob1] == tags
    assert [iob1_to_iob2(t) for t in tags] == tags  # already IOB2: unchanged
    # conlleval reads both schemes alike
    assert entity_f1(tags, iob1, scheme="IOB1")["f1"] == 1.0


# ------------------------------------------------------------------------------ alignment


def test_align_labels_hand_case():
    assert align_labels([None, 0, 0, 1, 2, 2, None], [3, 5, 1]) == [-100, 3, -100, 5, 1, -100, -100]
    with pytest.raises(IndexError, match="word id 2"):
        align_labels([None, 0, 2, None], [1, 2])


def test_alignment_on_real_sentences(valid, tokenizer):
    sents = valid[:300]
    ds = NERDataset(sents, tokenizer, LABELS, max_length=512)
    label_id = {t: i for i, t in enumerate(LABELS)}
    n_split = 0
    for i, (words, tags) in enumerate(sents):
        item, wids = ds[i], ds.word_ids[i]
        assert len(item["labels"]) == len(item["input_ids"]) == len(wids)
        kept = [(t, lab) for t, lab in enumerate(item["labels"]) if lab != IGNORE_INDEX]
        assert [lab for _, lab in kept] == [label_id[t] for t in tags]  # one label per word
        for w, (t, _) in enumerate(kept):
            pieces = tokenizer.tokenize(words[w])
            # the labelled token is the word's first WordPiece; the others are ignored
            assert item["input_ids"][t] == tokenizer.convert_tokens_to_ids(pieces[0])
            assert item["labels"][t + 1: t + len(pieces)] == [IGNORE_INDEX] * (len(pieces) - 1)
            n_split += len(pieces) > 1
        assert item["labels"][0] == item["labels"][-1] == IGNORE_INDEX  # [CLS], [SEP]
    assert n_split > 100  # multi-piece words really occur (e.g. upper-case names)


@pytest.mark.parametrize("max_length", [512, 12])
def test_windows_give_every_word_its_tag(valid, tokenizer, max_length):
    """A sentence longer than max_length is cut into windows; each word is labelled in exactly one
    window, and read back from it, so every word gets its tag (before windows, the words past
    max_length were all "O")."""
    sents = valid[:300]
    ds = NERDataset(sents, tokenizer, LABELS, max_length=max_length)
    gen = torch.Generator().manual_seed(0)
    predictions = []
    for k in range(len(ds)):
        labels = torch.tensor(ds[k]["labels"])
        assert len(labels) <= max_length
        # random ids where the label is ignored: they must not leak into word predictions
        noise = torch.randint(0, len(LABELS), labels.shape, generator=gen)
        predictions.append(torch.cat([torch.where(labels == IGNORE_INDEX, noise, labels),
                                      torch.full((5,), 4)]))  # batch padding past the window
    assert ds.sentence_tags(predictions) == [tags for _, tags in sents]
    for s, (words, tags) in enumerate(sents):  # one label per word over all windows of its sentence
        labelled = sum(lab != IGNORE_INDEX for k in ds.windows_of[s] for lab in ds[k]["labels"])
        assert labelled == len(words)
    assert (len(ds) > len(sents)) == (max_length == 12)
    if max_length == 512:  # one window per sentence: the first sub-token's prediction, as always
        for i, (words, tags) in enumerate(sents):
            words_pred = predictions_to_words(predictions[i], ds.word_ids[i], num_words=len(words), label_list=LABELS)
            assert words_pred == tags == ds.predictions_to_tags(i, predictions[i])


def test_windows_overlap_and_pick_the_most_context():
    word_ids = [w for w in range(10) for _ in range(2)]  # 10 words of 2 pieces: 20 tokens
    spans = window_spans(word_ids, 8)
    assert spans == [(0, 8), (4, 12), (8, 16), (12, 20)]  # half of each window shared, starts at word starts
    assert window_spans(word_ids, 20) == [(0, 20)]
    best = best_windows(word_ids, spans, 10)
    # the window where min(tokens before, tokens after) is largest: word 2 (token 4) has 3 on either
    # side in (0, 8) and none before it in (4, 12); word 4 (token 8) is central in (4, 12), word 5
    # (token 10) in (8, 16); the last word has most context in the last window
    assert best == [0, 0, 0, 1, 1, 2, 2, 3, 3, 3]
    assert best_windows([0, 2], [(0, 2)], 3) == [0, None, 0]  # word 1 has no token


def test_predictions_to_words_raw_ids():
    assert predictions_to_words([0, 5, 6, 7, 0], [None, 0, 0, 1, None]) == [5, 7]
    assert predictions_to_words([0, 5, 0], [None, 0, None], num_words=3, fill=-1) == [5, -1, -1]


# ------------------------------------------------------------------------------ dataset / collate


def test_collate_pads_labels_with_ignore_index(valid, tokenizer):
    ds = NERDataset(valid[:4], tokenizer, LABELS, max_length=64)
    batch = ds.collate([ds[i] for i in range(4)])
    lengths = [len(ds[i]["input_ids"]) for i in range(4)]
    assert batch["input_ids"].shape == batch["labels"].shape == (4, max(lengths))
    for i, n in enumerate(lengths):
        assert torch.all(batch["labels"][i, n:] == IGNORE_INDEX)
        assert torch.all(batch["input_ids"][i, n:] == tokenizer.pad_token_id)
        assert batch["attention_mask"][i].sum() == n
        torch.testing.assert_close(batch["labels"][i, :n], torch.tensor(ds[i]["labels"]))


def test_dataset_errors_and_unlabelled_text(tokenizer):
    with pytest.raises(ValueError, match="sentence 1: tag 'B-FOO'"):
        NERDataset([(["a"], ["O"]), (["b"], ["B-FOO"])], tokenizer, LABELS)
    with pytest.raises(ValueError, match="sentence 0: 2 words but 1 tags"):
        NERDataset([(["a", "b"], ["O"])], tokenizer, LABELS)
    ds = NERDataset([(["Hello", "Berlin"], None)], tokenizer, LABELS)
    assert set(ds[0]["labels"]) == {IGNORE_INDEX} and ds.word_ids[0] == [None, 0, 1, None]


# ------------------------------------------------------------------------------ layouts


@pytest.mark.parametrize("text", [
    "EU NNP B-ORG\nrejects VBZ O\n\nPeter NNP B-PER\n",  # CoNLL-2003: single spaces
    "EU\tNNP\tB-ORG\nrejects\tVBZ\tO\n\nPeter\tNNP\tB-PER\n",  # tabs
    "EU    NNP  B-ORG\n rejects VBZ\t O \n  \nPeter NNP B-PER",  # runs of spaces, blank line of spaces, no final LF
    "\ufeffEU NNP B-ORG\r\nrejects VBZ O\r\n\r\nPeter NNP B-PER\r\n",  # byte-order mark and CRLF
    "\ufeff-DOCSTART- -X- -X- O\n\nEU NNP B-ORG\nrejects VBZ O\n\nPeter NNP B-PER\n",  # BOM before -DOCSTART-
])
def test_conll_any_whitespace_bom_and_crlf(tmp_path, text):
    assert read_conll(write(tmp_path, "x.conll", text)) == [(["EU", "rejects"], ["B-ORG", "O"]), (["Peter"], ["B-PER"])]


def test_conll_word_and_tag_columns(tmp_path):
    path = write(tmp_path, "cols.tsv", "1\tEU\tB-ORG\tNNP\n2\trejects\tO\tVBZ\n")
    assert read_conll(path, tag_column=2, word_column=1) == [(["EU", "rejects"], ["B-ORG", "O"])]
    assert read_conll(path, tag_column=-2, word_column=-3) == [(["EU", "rejects"], ["B-ORG", "O"])]
    with pytest.raises(ValueError, match=r"cols\.tsv:1: no word_column 4"):
        read_conll(path, word_column=4)


def test_conll_tags_checked_against_label_names(tmp_path):
    path = write(tmp_path, "tags.txt", "EU B-ORG\nrejects O\n\nPeter B-PERSON\n")
    assert len(read_conll(path, label_names=["O", "B-ORG", "B-PERSON"])) == 2
    with pytest.raises(ValueError, match=r"tags\.txt:4: tag 'B-PERSON' is not one of label_names \['O', 'B-ORG'\]"):
        read_conll(path, label_names=["O", "B-ORG"])


@pytest.mark.parametrize("data,match", [
    (b"", r"empty\.txt: no sentences"),
    (b"-DOCSTART- -X- O\n\n", r"empty\.txt: no sentences"),
    (b"EU NNP B-ORG\nna\xefve JJ O\n", r"empty\.txt:2: not UTF-8 text \(byte 0xef at column 3\)"),
])
def test_conll_empty_and_non_utf8(tmp_path, data, match):
    path = tmp_path / "empty.txt"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=match):
        read_conll(path)
