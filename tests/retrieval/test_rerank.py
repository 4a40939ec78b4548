"""A reranker at inference (retrieval/rerank.py) and where it plugs in: sentence-transformers'
`CrossEncoder` scores as `Reranker` does; `rerank` reorders a first stage; `evaluate --task
retrieval --rerank` reports both stages; `mine-negatives --rescore` takes its scores; `/rerank` in
`bert-kit serve` answers as TEI and infinity-emb do, through the batcher.

Run: .venv/bin/python -m pytest tests/retrieval/test_rerank.py -q
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from bert_kit.cli import main
from bert_kit.heads import BERTForSequenceClassification
from bert_kit.hf import NewWeightsWarning
from bert_kit.model_folder import write_model_metadata
from bert_kit.retrieval.beir import read_beir
from bert_kit.retrieval.evaluator import Ranking
from bert_kit.retrieval.rerank import Reranker, rerank
from bert_kit.tokenizer import get_tokenizer
from tests.retrieval.beir_files import write_beir

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PAIRS = [("Does salt raise blood pressure?", "Cutting dietary salt reduced blood pressure."),
         ("Does salt raise blood pressure?", "Green tea catechins lowered blood pressure slightly."),
         ("Is coffee good for the liver?", "Drinking coffee was associated with a lower risk of liver disease. " * 40)]


@pytest.fixture(scope="module")
def reranker_folder(minilm_path, tmp_path_factory):
    """all-MiniLM-L6-v2 with a new one-output head (seeded), as a reranker folder."""
    folder = tmp_path_factory.mktemp("reranker")
    torch.manual_seed(0)
    with pytest.warns(NewWeightsWarning):  # the new head
        model = BERTForSequenceClassification.from_pretrained(minilm_path, num_labels=1)
    with torch.no_grad():
        model.classifier.weight.normal_(0, 0.5)
    model.save_pretrained(folder)
    get_tokenizer(minilm_path).save(folder)
    write_model_metadata(folder, {"task": "reranker", "max_length": 128})
    return folder


def test_scores_equal_sentence_transformers_cross_encoder(reranker_folder):
    """Short pairs and one cut to max_length (longest-first, as the HF tokenizer cuts)."""
    st = pytest.importorskip("sentence_transformers")
    ours = Reranker.from_pretrained(reranker_folder, device="cpu")
    assert ours.max_length == 128  # the folder's fine-tuning length
    want = st.CrossEncoder(str(reranker_folder), device="cpu", max_length=128).predict(PAIRS)
    assert_close(torch.tensor(ours.score_pairs(*zip(*PAIRS))), torch.tensor(want, dtype=torch.float32),
                 rtol=1e-5, atol=1e-5)
    raw = ours.score_pairs(*zip(*PAIRS), raw=True)
    assert_close(torch.tensor(raw).sigmoid(), torch.tensor(want, dtype=torch.float32), rtol=1e-5, atol=1e-5)
    order = ours.rank(PAIRS[0][0], [p for _, p in PAIRS], top_n=2)
    assert [i for i, _ in order] == list(np.argsort(-ours.score(PAIRS[0][0], [p for _, p in PAIRS]))[:2])


def test_a_folder_with_several_outputs_is_no_reranker(minilm_path, tmp_path):
    with pytest.warns(NewWeightsWarning):
        model = BERTForSequenceClassification.from_pretrained(minilm_path, num_labels=3)
    with pytest.raises(ValueError, match="its head has 3 outputs"):
        Reranker(model, get_tokenizer(minilm_path))
    model.save_pretrained(tmp_path)
    get_tokenizer(minilm_path).save(tmp_path)
    with pytest.raises(ValueError, match="holds a classifier with 3 outputs, not a reranker"):
        Reranker.from_pretrained(tmp_path)


class ByLength:
    """A stand-in reranker: the longer the passage, the higher its score."""

    def score_pairs(self, queries, passages, raw=False):
        return np.array([float(len(p)) for p in passages], dtype=np.float32)


def test_rerank_reorders_the_top_k_and_keeps_the_rest_behind_them(tmp_path):
    data = read_beir(write_beir(tmp_path / "beir"))
    docs = data.corpus_ids
    first = Ranking(["q1", "q3"], [docs[:5], docs[5:9]], [[5.0, 4.0, 3.0, 2.0, 1.0], [4.0, 3.0, 2.0, 1.0]])
    done = []
    out = rerank(first, data, ByLength(), top_k=3, progress=done.append)
    text = dict(zip(data.corpus_ids, data.corpus_texts))
    for q, kept, rest in zip(out.doc_ids, [docs[:3], docs[5:8]], [docs[3:5], docs[8:9]]):
        assert sorted(q[:3]) == sorted(kept)  # the first three of each query, reordered by the reranker
        assert [len(text[d]) for d in q[:3]] == sorted((len(text[d]) for d in kept), reverse=True)
        assert q[3:] == rest  # then the first stage's others, in its order
    for scores, ids in zip(out.scores, out.doc_ids):
        assert scores == sorted(scores, reverse=True) and len(set(scores)) == len(scores) == len(ids)
    assert done == [1, 1]


def test_evaluate_reports_both_stages(minilm_path, reranker_folder, tmp_path, capsys):
    folder = write_beir(tmp_path / "beir")
    out = tmp_path / "eval.json"
    rc = main(["evaluate", "--task", "retrieval", "--model", str(minilm_path), "--data", str(folder), "--rerank",
               str(reranker_folder), "--top-k", "4", "--output", str(out), "--device", "cpu"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "reranked each query's first 4 documents" in printed and "first stage" in printed
    result = json.loads(out.read_text())
    assert result["rerank"]["top_k"] == 4 and result["rerank"]["max_length"] == 128
    assert set(result["first_stage"]) >= {"ndcg@10", "recall@100"} and "ndcg@10" in result
    # the reranked four are followed by the first stage's others: the same top 100, the same recall
    # (it was Recall@4 printed as Recall@100 beside the first stage's)
    assert result["recall@100"] == result["first_stage"]["recall@100"]


def test_a_folder_that_is_no_reranker_is_refused_before_the_first_stage(minilm_path, tmp_path, capsys,
                                                                        monkeypatch):
    """--rerank / --rescore given the embedding model: one line naming the folder, before the corpus
    is embedded (it failed on missing classifier weights after the whole first stage)."""
    from bert_kit.embeddings import SentenceEncoder

    def never(*args, **kwargs):
        raise AssertionError("the corpus was embedded before the reranker was checked")

    monkeypatch.setattr(SentenceEncoder, "encode", never)
    folder = write_beir(tmp_path / "beir", split="train")
    rc = main(["evaluate", "--task", "retrieval", "--model", str(minilm_path), "--data", str(folder), "--split",
               "train", "--rerank", str(minilm_path), "--output", str(tmp_path / "eval.json"), "--device", "cpu"])
    rc_mine = main(["mine-negatives", "--model", str(minilm_path), "--data", str(folder), "--device", "cpu",
                    "--rescore", str(minilm_path), "--output", str(tmp_path / "hard.jsonl")])
    err = capsys.readouterr().err.splitlines()
    assert (rc, rc_mine) == (2, 2) and not list(tmp_path.glob("*.json*"))
    for line in err:
        assert f"{minilm_path} holds a BertModel, not a reranker (a cross-encoder with one output)" in line


@pytest.mark.parametrize("task", [[], ["--task", "reranker"], ["--task", "retrieval"]])
def test_a_reranker_as_the_model_on_a_beir_folder_says_to_rerank(reranker_folder, tmp_path, capsys, task):
    """It failed with "input file is a folder" (no --task, --task reranker), or embedded the corpus
    with the cross-encoder's encoder and scored that as a first stage (--task retrieval)."""
    folder = write_beir(tmp_path / "beir")
    rc = main(["evaluate", *task, "--model", str(reranker_folder), "--data", str(folder),
               "--output", str(tmp_path / "eval.json"), "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2 and not (tmp_path / "eval.json").exists() and len(err.splitlines()) == 1
    assert "a reranker scores (query, document) pairs and embeds no corpus" in err
    assert f"--task retrieval --model EMBEDDING_MODEL --data {folder} --rerank {reranker_folder}" in err


def test_mine_negatives_takes_the_rerankers_scores(minilm_path, reranker_folder, tmp_path, capsys):
    folder = write_beir(tmp_path / "beir", split="train")
    out = tmp_path / "hard.jsonl"
    rc = main(["mine-negatives", "--model", str(minilm_path), "--data", str(folder), "--output", str(out),
               "--num-negatives", "2", "--rescore", str(reranker_folder), "--output-scores", "--device", "cpu"])
    assert rc == 0 and "rescored by" in capsys.readouterr().out
    reranker = Reranker.from_pretrained(reranker_folder, device="cpu")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    for row in rows[:3]:
        want = reranker.score(row["anchor"], [row["positive"], row["negative"]])
        assert row["scores"] == pytest.approx(want.tolist(), abs=1e-5)


def test_serve_rerank_answers_through_the_batcher(reranker_folder):
    pytest.importorskip("starlette")
    pytest.importorskip("httpx")
    from starlette.testclient import TestClient

    from bert_kit.serving.server import ServeConfig, build

    info, operations, app = build(ServeConfig(model=str(reranker_folder), device="cpu"))
    assert "/rerank" in [op.path for op in operations] and "/embed" in [op.path for op in operations]
    reranker = Reranker.from_pretrained(reranker_folder, device="cpu")
    query, docs = PAIRS[0][0], [p for _, p in PAIRS]
    want = reranker.score(query, docs)
    with TestClient(app) as client:
        answer = client.post("/rerank", json={"query": query, "documents": docs, "top_n": 2, "return_documents": True})
        assert answer.status_code == 200, answer.text
        results = answer.json()["results"]
        order = sorted(range(3), key=lambda i: -want[i])[:2]
        assert [r["index"] for r in results] == order
        assert [r["relevance_score"] for r in results] == pytest.approx([float(want[i]) for i in order], abs=1e-5)
        assert [r["document"] for r in results] == [docs[i] for i in order]
        raw = client.post("/rerank", json={"query": query, "documents": docs, "raw_scores": True}).json()["results"]
        assert len(raw) == 3 and "document" not in raw[0]
        assert sorted(r["relevance_score"] for r in raw) == pytest.approx(
            sorted(reranker.score(query, docs, raw=True).tolist()), abs=1e-4)
        missing = client.post("/rerank", json={"documents": docs})
        assert missing.status_code == 422 and missing.json()["field"] == "query"
        empty = client.post("/rerank", json={"query": query, "documents": []})
        assert empty.status_code == 422 and empty.json()["field"] == "documents"
        spec = client.get("/openapi.json").json()["paths"]["/rerank"]["post"]
        assert spec["requestBody"]["content"]["application/json"]["example"]["query"]


def test_serve_an_embedding_model_names_its_endpoints_to_a_rerank_request(minilm_path):
    """POST /rerank to a server of a model that is no reranker: the 404 says what it answers."""
    pytest.importorskip("starlette")
    pytest.importorskip("httpx")
    from starlette.testclient import TestClient

    from bert_kit.serving.server import ServeConfig, build

    _, _, app = build(ServeConfig(model=str(minilm_path), device="cpu"))
    with TestClient(app) as client:
        answer = client.post("/rerank", json={"query": "q", "documents": ["d"]})
    assert answer.status_code == 404
    assert answer.json()["error"] == "POST /rerank: Not Found (this server's model answers POST /embed)"


def test_predict_names_what_runs_a_reranker(reranker_folder, tmp_path, capsys):
    pairs = tmp_path / "in.txt"
    pairs.write_text("a\tb\n")
    args = ["--model", str(reranker_folder), "--input", str(pairs), "--output", str(tmp_path / "out.jsonl")]
    assert main(["predict", "--task", "reranker", *args]) == 2  # not among predict's tasks
    assert main(["predict", *args]) == 2  # the folder's own task
    assert "is a reranker model, which predict does not run: use bert-kit serve (POST /rerank)" in \
        capsys.readouterr().err
