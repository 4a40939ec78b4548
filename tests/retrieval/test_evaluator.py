"""RetrievalEvaluator and `bert-kit evaluate --task retrieval` on a small BEIR folder made here:
the real all-MiniLM-L6-v2 against sentence-transformers' encode with the same metric code, and a
stub encoder for prefixes, chunks, ties and the FAISS path.

    .venv/bin/python -m pytest tests/retrieval/test_evaluator.py -q
"""

import json

import pytest
import torch

from bert_kit.cli import main as cli_main
from bert_kit.config import BertConfig
from bert_kit.embeddings import SentenceEncoder
from bert_kit.model import BERTModel
from bert_kit.retrieval.beir import read_beir
from bert_kit.retrieval.evaluator import RetrievalEvaluator
from bert_kit.retrieval.metrics import evaluate_run
from bert_kit.tokenizer import get_tokenizer
from tests.retrieval.beir_files import write_beir

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CUTOFFS = {"ndcg": (3, 10), "mrr": (10,), "recall": (1, 10), "map": (10,)}


def code(text: str) -> int:
    return sum(map(ord, text.split()[0]))


class StubEncoder:
    """Vectors from a lookup of each text's first word: equal first words tie exactly. Records texts."""

    def __init__(self):
        self.seen, self.dim, self.device = [], 4, torch.device("cpu")

    def encode(self, texts, batch_size=None, convert_to_tensor=False, progress=None):
        self.seen.append(list(texts))
        if progress:
            progress(len(texts))
        rows = [[1.0, code(t) % 7 / 7, code(t) % 5 / 5, 0.5] if t.split() else [0, 0, 0, 1]
                for t in texts]
        return torch.tensor(rows)


@pytest.fixture()
def folder(tmp_path):
    return write_beir(tmp_path / "med")


def test_metrics_equal_sentence_transformers_encode_with_the_same_scoring(folder, minilm_path):
    st = pytest.importorskip("sentence_transformers")
    data = read_beir(folder)
    ours = RetrievalEvaluator(data, CUTOFFS)(SentenceEncoder.from_pretrained(minilm_path, device="cpu"))
    model = st.SentenceTransformer(str(minilm_path), device="cpu")
    q_ids = list(data.qrels)
    q = model.encode([data.queries[i] for i in q_ids], convert_to_tensor=True, normalize_embeddings=True)
    d = model.encode(data.corpus_texts, convert_to_tensor=True, normalize_embeddings=True)
    scores = (q @ d.T).tolist()
    run = {qid: dict(zip(data.corpus_ids, row)) for qid, row in zip(q_ids, scores)}
    expect = evaluate_run(data.qrels, run, CUTOFFS)
    assert {k: ours[k] for k in expect} == pytest.approx(expect, abs=1e-9)
    assert (ours["num_queries"], ours["num_docs"], ours["queries_without_relevant"]) == (5, 12, 0)
    assert ours["ndcg@10"] > 0.5  # MiniLM finds these easy pairs


def test_prefixes_chunks_ties_and_faiss_agree(folder):
    data = read_beir(folder)
    stub = StubEncoder()
    base = RetrievalEvaluator(data, CUTOFFS, query_prefix="query: ", passage_prefix="passage: ", top_k=12)
    ranking = base.search(stub)
    queries, *chunks = stub.seen
    assert queries == ["query: " + data.queries[q] for q in data.qrels]
    assert chunks == [["passage: " + t for t in data.corpus_texts]]
    # the stub ties every document of equal first word: the ranking breaks ties by id, highest first
    run = ranking.run()
    for q, docs in zip(ranking.query_ids, ranking.doc_ids):
        keys = [(run[q][d], d) for d in docs]
        assert keys == sorted(keys, reverse=True)
    expect = base.score(ranking)
    assert expect == evaluate_run(data.qrels, run, CUTOFFS)
    chunked = RetrievalEvaluator(data, CUTOFFS, "query: ", "passage: ", top_k=12, corpus_chunk_size=5)
    assert chunked(StubEncoder()) == pytest.approx({**expect, "num_queries": 5, "num_docs": 12,
                                                    "queries_without_relevant": 0})
    stub = StubEncoder()
    chunked.search(stub)
    assert [len(texts) for texts in stub.seen] == [5, 5, 5, 2]  # the queries, then the corpus by 5


def test_a_faiss_flat_index_scores_as_the_exact_search(folder):
    pytest.importorskip("faiss")
    data = read_beir(folder)
    exact = RetrievalEvaluator(data, CUTOFFS, top_k=12)
    flat = RetrievalEvaluator(data, CUTOFFS, top_k=12, index="Flat", corpus_chunk_size=5)
    assert flat.score(flat.search(StubEncoder())) == pytest.approx(exact.score(exact.search(StubEncoder())))


def test_evaluate_model_returns_the_model_to_training(folder, minilm_path):
    torch.manual_seed(0)
    model = BERTModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=64, max_position_embeddings=64)).train()
    metrics = RetrievalEvaluator(read_beir(folder)).evaluate_model(model, get_tokenizer(minilm_path), max_length=64)
    assert model.training and 0.0 <= metrics["ndcg@10"] <= 1.0


def test_evaluate_command_writes_json_and_a_trec_run(folder, tmp_path, minilm_path, capsys):
    out, run_file = tmp_path / "eval.json", tmp_path / "run.trec"
    rc = cli_main(["evaluate", "--task", "retrieval", "--model", str(minilm_path), "--data", str(folder),
                   "--output", str(out), "--save-run", str(run_file), "--recall-at", "1", "5", "--top-k", "6",
                   "--query-prefix", ""])
    printed, err = capsys.readouterr()
    assert rc == 0 and "retrieval: med test, 5 queries, 12 documents" in printed and "recall@5" in printed
    # scored silently as a run of 6 documents, below the cutoffs of 10 and 100
    assert "warning: --top-k 6 keeps fewer documents than ndcg@10, mrr@10, map@100 count" in err
    result = json.loads(out.read_text())
    assert result["task"] == "retrieval" and result["split"] == "test" and result["top_k"] == 6
    assert {"ndcg@10", "mrr@10", "recall@1", "recall@5", "map@100"} <= set(result)
    assert result["max_length"] == 256 and result["pooling"] == "mean" and result["precision"] == "fp32"
    lines = run_file.read_text().splitlines()
    assert len(lines) == 5 * 6 and lines[0].split()[1::2] == ["Q0", "1", "bert-kit"]
    # the run file scores as the JSON says
    run: dict = {}
    for line in lines:
        q, _, d, _, score, _ = line.split()
        run.setdefault(q, {})[d] = float(score)
    assert evaluate_run(read_beir(folder).qrels, run, {"recall": (5,)})["recall@5"] == pytest.approx(
        result["recall@5"], abs=1e-9)


@pytest.mark.parametrize("args, message", [
    (["--split", "dev"], "split 'dev' is not in"),
    (["--ndcg-at", "--mrr-at", "--recall-at", "--map-at"], "no metric to compute"),
    (["--faiss", "Flat", "--score-function", "l2"], "invalid choice: 'l2'"),
])
def test_evaluate_command_errors_are_one_line(folder, minilm_path, tmp_path, capsys, args, message):
    rc = cli_main(["evaluate", "--task", "retrieval", "--model", str(minilm_path), "--data", str(folder),
                   "--output", str(tmp_path / "e.json"), *args])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err



@pytest.mark.parametrize("flag, name", [("--output", "qrels/test.tsv"), ("--save-run", "corpus.jsonl"),
                                        ("--save-run", "queries.jsonl")])
def test_evaluate_never_writes_over_a_file_of_its_beir_folder(minilm_path, tmp_path, capsys, flag, name):
    """--data is the folder, so its files were not among the inputs an output may not replace: the
    JSON or the TREC run overwrote the qrels or the corpus."""
    data = write_beir(tmp_path / "med")
    before = (data / name).read_bytes()
    outputs = {"--output": str(tmp_path / "e.json"), flag: str(data / name)}
    rc = cli_main(["evaluate", "--task", "retrieval", "--model", str(minilm_path), "--data", str(data),
                   *[a for pair in outputs.items() for a in pair]])
    err = capsys.readouterr().err
    assert rc == 2 and f"{flag} {data / name} is the input file {data / name}" in err
    assert (data / name).read_bytes() == before
