"""Texts longer than max_length are counted (bert_kit.data.truncation): the rows cut and their whole
lengths must be those of tokenizing without a limit, for single texts, pairs (longest first) and
the two sentences of bi-encoder pairs; the message says how many and by how much.

Run: .venv/bin/python -m pytest tests/data/test_truncation.py -q
"""

from __future__ import annotations

import pytest

from bert_kit.data import truncation
from bert_kit.data.classification import ClassificationDataset
from bert_kit.data.truncation import Truncated, find_truncated


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
    from bert_kit.tokenizer import get_tokenizer

    return get_tokenizer(minilm_path)


def whole_lengths(tokenizer, texts, pairs=None):
    encoded = tokenizer(texts, pairs, truncation=False, padding=False, return_tensors=None)
    return [len(ids) for ids in encoded["input_ids"]]


TEXTS = ["a short one", "word " * 40, "", "the cat sat on the mat " * 3, "x " * 14, "x " * 13]


def test_the_rows_cut_and_their_whole_lengths(tokenizer):
    whole = whole_lengths(tokenizer, TEXTS)  # [5, 42, 2, 20, 16, 15]
    found = find_truncated(tokenizer, TEXTS, None, 16)
    assert found.rows == [i for i, n in enumerate(whole) if n > 16] == [1, 3]
    assert found.lengths == [whole[1], whole[3]] and found.total == len(TEXTS)
    # exactly max_length tokens is not cut; the lengths kept by an earlier tokenization give the same answer
    kept = [min(n, 16) for n in whole]
    assert find_truncated(tokenizer, TEXTS, None, 16, kept).rows == [1, 3]
    assert not find_truncated(tokenizer, TEXTS, None, 64)


def test_pairs_are_cut_by_their_total_length(tokenizer):
    a, b = ["one two three", "word " * 10, "hi"], ["four", "word " * 10, "there"]
    whole = whole_lengths(tokenizer, a, b)
    found = find_truncated(tokenizer, a, b, 12, unit="pairs")
    assert found.rows == [1] and found.lengths == [whole[1]] == [23]
    ds = ClassificationDataset(a, [0, 1, 0], tokenizer, 12, b)
    assert ds.truncated.rows == [1] and ds.truncated.unit == "pairs"


def test_a_very_long_text_is_counted_up_to_a_limit(tokenizer, monkeypatch):
    monkeypatch.setattr(truncation, "COUNT_LIMIT", 50)
    found = find_truncated(tokenizer, ["word " * 1000, "word " * 30], None, 16)
    assert found.lengths == [50, 32]
    assert "(median 32 tokens, longest at least 50)" in found.message()


def test_the_message_says_how_many_and_by_how_much():
    found = Truncated(2000, 128, list(range(142)), [150] * 70 + [212] * 2 + [300] * 69 + [830])
    assert found.message("train.csv", positions=512) == (
        "train.csv: 142 of 2,000 texts were longer than max_length 128 and were cut (median 212 tokens, longest 830); "
        "set max_length higher (up to the model's 512 positions) to keep more of each")
    assert "the model has 512 positions, so the rest of each is never read" in \
        Truncated(10, 512, [3], [700]).message(positions=512)


def test_either_sentence_of_a_bi_encoder_pair():
    a = Truncated(5, 8, [1, 3], [10, 20])
    b = Truncated(5, 8, [3, 4], [30, 9])
    both = a.merge(b)
    assert (both.rows, both.lengths, both.unit, both.total) == ([1, 3, 4], [10, 30, 9], "pairs", 5)


def test_questions_past_max_query_length_are_counted(tokenizer):
    """QA reads a long context in windows, but cuts a question to max_query_length tokens."""
    from bert_kit.data.truncation import find_long_questions

    questions = ["who?", "what " * 20 + "is it?", "when " * 8]
    found = find_long_questions(tokenizer, questions, 8)
    assert found.rows == [1] and found.lengths == [23] and found.unit == "questions"
    assert found.message("dev.json") == ("dev.json: 1 of 3 questions were longer than max_query_length 8 and were "
                                         "cut (median 23 tokens, longest 23); set max_query_length higher to keep "
                                         "more of each")
