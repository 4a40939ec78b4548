"""Reading BEIR folders: the layout as distributed (gzipped or not), MTEB's document texts, and
errors that name the file and line.

    .venv/bin/python -m pytest tests/retrieval/test_beir.py -q
"""

import gzip
import json

import pytest

from bert_kit.retrieval.beir import document_text, read_beir, read_qrels, subsample
from tests.retrieval.beir_files import DOCS, QRELS, QUERIES, write_beir


@pytest.mark.parametrize("gz", [False, True])
def test_reads_a_split_as_beir_and_mteb_do(tmp_path, gz):
    data = read_beir(write_beir(tmp_path / "set", gz=gz), "test")
    assert data.corpus_ids == list(DOCS) and data.name == "set" and data.split == "test"
    # title + " " + text, stripped; the text alone without a title
    assert data.corpus_texts[0] == "Statins and breast cancer Statin use was linked to lower breast cancer mortality " \
                                   "in Finland."
    assert data.corpus_texts[2] == DOCS["d3"][1]
    assert data.qrels == QRELS and list(data.queries) == list(QRELS)  # q9 is judged in no test row
    assert data.queries["q2"] == QUERIES["q2"]
    assert data.unanswerable == 0 and data.missing_docs == 0


def test_document_text_and_the_nfcorpus_files(data_dir):
    assert document_text("  Title", "text  ") == "Title text"
    assert document_text("", "  only text ") == "only text"
    data = read_beir(data_dir / "nfcorpus", "test")
    # BEIR's published figures for the test split
    assert (len(data.corpus_ids), len(data.qrels)) == (3633, 323)
    assert sum(len(j) for j in data.qrels.values()) == 12334
    assert {s for j in data.qrels.values() for s in j.values()} == {1, 2}


def test_trec_qrels_no_header_and_zero_grades(tmp_path):
    path = tmp_path / "qrels.txt"
    path.write_text("q1 0 d1 1\nq1 0 d2 0\nq2 0 d3 2\n")
    qrels, first = read_qrels(path)
    assert qrels == {"q1": {"d1": 1, "d2": 0}, "q2": {"d3": 2}} and first["q2"].endswith(":3")
    folder = write_beir(tmp_path / "zero", qrels={"q1": {"d1": 0}, "q2": {"d4": 1}})
    assert read_beir(folder).unanswerable == 1  # judged, but nothing relevant: scored 0 (as MTEB)


def test_judged_documents_missing_from_the_corpus_are_counted(tmp_path, capsys):
    folder = write_beir(tmp_path / "set", qrels={"q1": {"d1": 1, "gone": 2}})
    assert read_beir(folder).missing_docs == 1
    assert "1 judged document(s) are not in the corpus" in capsys.readouterr().err


def test_subsample_keeps_judged_documents(tmp_path):
    data = read_beir(write_beir(tmp_path / "set"))
    small = subsample(data, max_queries=2, max_docs=6, seed=1)
    assert len(small.qrels) == 2 and set(small.queries) == set(small.qrels)
    judged = {d for j in small.qrels.values() for d in j}
    assert judged <= set(small.corpus_ids) and len(small.corpus_ids) == max(6, len(judged))
    assert small.corpus_ids == [d for d in data.corpus_ids if d in small.corpus_ids]  # corpus order kept


@pytest.mark.parametrize("file, content, message", [
    ("corpus.jsonl", '{"_id": "d1", "text": "a"}\n{"_id": "d2", "text": \n', r"corpus.jsonl:2: invalid JSON"),
    ("corpus.jsonl", '{"_id": "d1", "text": "a"}\n\n{"text": "b"}\n', r"corpus.jsonl:3: needs an \"_id\""),
    ("corpus.jsonl", '{"_id": "d1", "text": "a"}\n{"_id": "d1", "text": "b"}\n',
     r"corpus.jsonl:2: \"_id\" 'd1' is already used on line 1"),
    ("corpus.jsonl", '{"_id": "d1", "title": "t"}\n', r"corpus.jsonl:1: \"text\" must be a text, got no such key"),
    ("corpus.jsonl", '["d1", "text"]\n', r"corpus.jsonl:1: expected a JSON object"),
    ("queries.jsonl", '{"_id": "q1", "text": 3}\n', r"queries.jsonl:1: \"text\" must be a text, got int"),
    ("qrels/test.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\thigh\n",
     r"test.tsv:3: score 'high' is not an integer grade"),
    ("qrels/test.tsv", "query-id\tcorpus-id\tscore\nq1\td1\n", r"test.tsv:2: expected query-id, corpus-id and score"),
    ("qrels/test.tsv", "q1\td1\t1\nq1\td1\t2\n", r"test.tsv:2: q1 d1 is judged 2 here but 1 before"),
    ("qrels/test.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t1\nnope\td1\t1\n",
     r"test.tsv:3: query 'nope' is not in .*queries.jsonl"),
])
def test_malformed_files_name_file_and_line(tmp_path, file, content, message):
    folder = write_beir(tmp_path / "set")
    (folder / file).write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        read_beir(folder)


def test_missing_files_and_splits(tmp_path):
    folder = write_beir(tmp_path / "set")
    with pytest.raises(FileNotFoundError, match=r"split 'dev' is not in .* \(it has test\)"):
        read_beir(folder, "dev")
    with pytest.raises(FileNotFoundError, match="BEIR folder not found"):
        read_beir(tmp_path / "nope")
    (folder / "queries.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match=r"queries.jsonl not found \(nor queries.jsonl.gz\)"):
        read_beir(folder)


def test_bad_bytes_and_broken_gzip(tmp_path):
    folder = write_beir(tmp_path / "set")
    (folder / "corpus.jsonl").write_bytes(b'{"_id": "d1", "text": "a"}\n{"_id": "d2", "text": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=r"corpus.jsonl:2: not UTF-8 text"):
        read_beir(folder)
    (folder / "corpus.jsonl").unlink()
    data = gzip.compress(json.dumps({"_id": "d1", "text": "a"}).encode() + b"\n")
    (folder / "corpus.jsonl.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"corpus.jsonl.gz: not a readable gzip file"):
        read_beir(folder)
