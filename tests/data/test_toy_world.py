"""The demo's generated corpus: held-out people are really held out, every fill-mask probe is
answerable from its own text, and the topic task is balanced enough to have a meaningful
majority baseline.

Run: .venv/bin/python -m pytest tests/data/test_toy_world.py -q
"""

import random
import re

from bert_kit.data.corpus import read_documents
from bert_kit.data.toy_world import (ANIMALS, COUNTRIES, HELD_OUT_NAMES, JOBS, NAMES, TOPICS, biography,
                                     city_country, fill_mask_probes, write_corpus, write_topic_task)


def test_corpus_layout_and_held_out_names(tmp_path):
    train, test = write_corpus(tmp_path, n_train=300, n_test=50)
    docs = read_documents(train, "blank_line")
    assert len(docs) == 300 and len(read_documents(test, "blank_line")) == 50
    assert all(len(d.splitlines()) == 10 for d in docs)  # home (3), work (3), pet (3), free time (1)
    held_out = {n for names in HELD_OUT_NAMES.values() for n in names}
    train_words = set(re.findall(r"[a-z]+", train.read_text()))
    assert not held_out & train_words and held_out & set(re.findall(r"[a-z]+", test.read_text()))
    assert not held_out & {n for names in NAMES.values() for n in names}
    # the same seed writes the same corpus
    again, _ = write_corpus(tmp_path / "again", n_train=300, n_test=50)
    assert again.read_text() == train.read_text()


def test_every_biography_is_consistent_with_the_world():
    rng = random.Random(3)
    where = city_country()
    for _ in range(200):
        topics, sentences = zip(*biography(rng, NAMES))
        assert topics[:3] == ("home",) * 3 and sorted(topics[3:]) == sorted(["work"] * 3 + ["pet"] * 3 + ["free time"])
        text = " ".join(sentences)
        city = next(c for c in where if f" {c}." in f" {text}")
        country = where[city]
        assert COUNTRIES[country][0] in sentences[2]  # its language
        job = next(j for j in JOBS if f" {j}" in text)
        assert JOBS[job][0] in text  # the workplace that goes with the job
        pet = next(a for a in ANIMALS if f" {a}" in text)
        assert ANIMALS[pet][0] in text


def test_fill_mask_probes_are_answerable_from_their_text(tmp_path):
    _, test = write_corpus(tmp_path, n_train=10, n_test=60)
    probes = fill_mask_probes(test, limit=200)
    assert len(probes) == 200 and {k for *_, k in probes} == {"country", "language", "workplace", "food"}
    where = city_country()
    for text, answer, kind in probes:
        assert text.count("[MASK]") == 1 and answer not in text.split("[MASK]")[1]
        last = text.split(". ")[-1]
        if kind == "country":  # "lyon is a city in [MASK]."
            assert where[last.split()[0]] == answer
        elif kind == "workplace":  # the job is named in the sentence before
            job = next(j for j in JOBS if j in text.split("[MASK]")[0])
            assert JOBS[job][0] == answer
        elif kind == "food":
            pet = next(a for a in ANIMALS if a in last)
            assert ANIMALS[pet][0] == answer
        else:  # the country is named before the language
            country = next(c for c in COUNTRIES if c in text)
            assert COUNTRIES[country][0] == answer


def test_topic_task(tmp_path):
    train, dev, majority = write_topic_task(tmp_path, n_train=200, n_dev=200)
    rows = [line.split("\t") for line in dev.read_text().splitlines()]
    assert rows[0] == ["sentence", "label"] and len(rows) == 201
    labels = [label for _, label in rows[1:]]
    assert set(labels) == set(TOPICS) and majority == max(labels.count(t) for t in TOPICS) / 200
    assert majority < 0.4  # home, work and pet have three sentences each, free time one
    held_out = {n for names in HELD_OUT_NAMES.values() for n in names}
    assert not held_out & set(re.findall(r"[a-z]+", train.read_text()))
