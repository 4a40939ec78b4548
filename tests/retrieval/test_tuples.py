"""Reading retrieval training data (retrieval/tuples.py): tuples for an embedding model from tables (columns
by name or index), mined negatives, NLI files and BEIR qrels; a reranker's candidate groups; errors
that name the file and line.

Run: .venv/bin/python -m pytest tests/data/test_tuples.py -q
"""

from __future__ import annotations

import json

import pytest

from bert_kit.retrieval.tuples import read_groups, read_tuples
from tests.retrieval.beir_files import write_beir


def test_a_table_by_column_names_indices_or_all_of_its_header(tmp_path):
    tsv = tmp_path / "t.tsv"
    tsv.write_text("q\tpos\tneg\nwhat\tthat\tother\nwho\tyou\tme\n")
    everything = read_tuples(tsv)
    assert everything.columns == [["what", "who"], ["that", "you"], ["other", "me"]]
    assert everything.names == ["q", "pos", "neg"] and everything.lines == [f"{tsv}:2", f"{tsv}:3"]
    assert read_tuples(tsv, ["neg", "q"]).columns == [["other", "me"], ["what", "who"]]
    headless = tmp_path / "h.tsv"
    headless.write_text("what\tthat\nwho\tyou\n")
    assert read_tuples(headless, [1, 0], header=False).columns == [["that", "you"], ["what", "who"]]
    with pytest.raises(ValueError, match=r"h.tsv: name the text columns .* embedding.columns"):
        read_tuples(headless, header=False)


def test_mined_negatives_read_as_written(tmp_path):
    """`bert-kit mine-negatives` output, n-tuples with scores: the texts in order, the scores left out."""
    mined = tmp_path / "hard.jsonl"
    rows = [{"anchor": "q1", "positive": "p1", "negative_1": "n1", "negative_2": "n2", "scores": [0.9, 0.5, 0.4]},
            {"anchor": "q2", "positive": "p2", "negative_1": "n3", "negative_2": "n1", "scores": [0.8, 0.7, 0.1]}]
    mined.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tuples = read_tuples(mined)
    assert tuples.names == ["anchor", "positive", "negative_1", "negative_2"]
    assert tuples.columns == [["q1", "q2"], ["p1", "p2"], ["n1", "n3"], ["n2", "n1"]]


def test_nli_files_give_allnli_triplets(tmp_path):
    jsonl = tmp_path / "nli.jsonl"
    pairs = [("A man eats.", "A person eats.", "entailment"), ("A man eats.", "Nobody eats.", "contradiction"),
             ("A man eats.", "He is hungry.", "neutral"), ("A man eats.", "Someone eats food.", "entailment"),
             ("Kids play.", "Children play.", "entailment")]  # no contradiction: no triplet
    jsonl.write_text("".join(json.dumps({"premise": p, "hypothesis": h, "label": lab}) + "\n" for p, h, lab in pairs))
    tuples = read_tuples(jsonl)
    assert tuples.columns == [["A man eats."] * 2, ["A person eats.", "Someone eats food."], ["Nobody eats."] * 2]
    csv = tmp_path / "nli.csv"  # HF's ids: 0 entailment, 1 neutral, 2 contradiction
    csv.write_text('index,premise,hypothesis,label\n0,"A dog, wet.",A dog.,0\n1,"A dog, wet.",A cat.,2\n')
    assert read_tuples(csv).columns == [["A dog, wet."], ["A dog."], ["A cat."]]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"premise": "a", "hypothesis": "b", "label": "maybe"}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: label 'maybe' is not entailment"):
        read_tuples(bad)


def test_a_beir_folder_gives_its_query_document_pairs(tmp_path):
    folder = write_beir(tmp_path / "beir", split="train")
    tuples = read_tuples(folder, split="train")
    pairs = set(zip(*tuples.columns))
    assert ("Does salt raise blood pressure?", "Salt Cutting dietary salt reduced blood pressure in hypertensive "
            "patients.") in pairs
    assert len(pairs) == 8  # the judgments of grade > 0
    with pytest.raises(FileNotFoundError, match="split 'dev' is not in"):
        read_tuples(folder, split="dev")


def test_columns_or_where_given_for_a_beir_folder_are_refused(tmp_path):
    """They were ignored: the run trained on the qrels' pairs as if they had not been set."""
    folder = write_beir(tmp_path / "med", split="train")
    with pytest.raises(ValueError, match=r"med is a BEIR folder, read by its qrels/train.tsv: the setting columns "
                                         r"\['q', 'p'\] is for a table file"):
        read_tuples(folder, ["q", "p"])
    with pytest.raises(ValueError, match=r"the setting where \{'split': 'a'\} is for a table file"):
        read_tuples(folder, where={"split": "a"})
    with pytest.raises(ValueError, match=r"the setting columns \['q', 'p', 'l'\] is for a table file"):
        read_groups(folder, ["q", "p", "l"])  # a reranker's


def test_values_that_are_no_text_name_their_line(tmp_path):
    f = tmp_path / "t.jsonl"
    rows = [{"anchor": "a", "positive": "b"}, {"anchor": "c", "positive": 3}]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=r"t.jsonl:2: column 'positive' holds int, expected a text"):
        read_tuples(f)
    with pytest.raises(ValueError, match="needs two text columns or more"):
        read_tuples(f, ["anchor"])


@pytest.mark.parametrize("name", ["t.jsonl", "t.tsv", "t.csv"])
def test_an_empty_file_is_called_empty(tmp_path, name):
    """Not a file without a header to name its columns."""
    f = tmp_path / name
    f.write_text("\n")
    with pytest.raises(ValueError, match=rf"{name}: no rows \(the file is empty\)"):
        read_tuples(f)
    with pytest.raises(ValueError, match=rf"{name}: no rows \(the file is empty\)"):
        read_groups(f)


def test_reranker_groups_from_labelled_rows_tuples_and_qrels(tmp_path):
    rows = tmp_path / "r.tsv"
    rows.write_text("query\tpassage\tlabel\nq1\tp1\t1\nq2\tp2\t0\nq1\tp3\t0\n")
    groups = read_groups(rows)
    assert groups.queries == ["q1", "q2"] and groups.passages == [["p1", "p3"], ["p2"]]
    assert groups.labels == [[1.0, 0.0], [0.0]] and groups.lines == [f"{rows}:2", f"{rows}:3"]
    triplets = tmp_path / "t.jsonl"
    triplets.write_text("".join(json.dumps({"anchor": "q", "positive": "p", "negative": n}) + "\n" for n in "abc"))
    groups = read_groups(triplets)
    assert groups.passages == [["p", "a", "b", "c"]] and groups.labels == [[1.0, 0.0, 0.0, 0.0]]
    folder = write_beir(tmp_path / "beir")
    groups = read_groups(folder, split="test", negatives=2, seed=1)
    q2 = groups.queries.index("Can diet treat asthma and eczema?")
    assert groups.labels[q2] == [2.0, 1.0, 0.0, 0.0, 0.0]  # judged d4, d6, d2 (grade 0), then 2 drawn
    assert len(set(groups.passages[q2])) == 5
    assert read_groups(folder, split="test", negatives=2, seed=1).passages == groups.passages  # seeded
    lists = read_groups(folder, split="test", negatives=2, seed=1, per_positive=True)  # to train: one a positive
    assert len(lists.queries) == 8 and lists.queries.count("Can diet treat asthma and eczema?") == 2
    assert [labels for q, labels in zip(lists.queries, lists.labels) if q.startswith("Can diet")] == [
        [2.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]  # the positive, d2 (judged 0), then 2 drawn
    bad = tmp_path / "bad.tsv"
    bad.write_text("query\tpassage\tlabel\nq\tp\tyes\n")
    with pytest.raises(ValueError, match=r"bad.tsv:2: label 'yes' is not a number"):
        read_groups(bad)
