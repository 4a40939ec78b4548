"""Fine-tuning a reranker (task: reranker) on the CPU: each loss trains, best/ is a sentence-transformers
`CrossEncoder` folder that scores as bert-kit does, and the validation ranks each query's candidates
with MTEB's metrics.

Run: .venv/bin/python -m pytest tests/tasks/test_reranker.py -q
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from bert_kit.heads import BERTForSequenceClassification
from bert_kit.model_folder import read_model_metadata
from bert_kit.retrieval.metrics import DEFAULT_CUTOFFS, query_metrics
from bert_kit.retrieval.rerank import Reranker
from bert_kit.tasks.finetuning import FinetuneConfig, finetune
from bert_kit.tasks.reranker import RerankerTask, grade
from bert_kit.tokenizer import get_tokenizer
from tests.retrieval.beir_files import write_beir

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOPICS = ["cancer", "coffee", "sleep", "salt", "asthma", "diabetes", "fiber", "nuts"]


def write_groups(path, n: int = 8):
    """n queries, each with a relevant passage and three others (n-tuples, as mine-negatives writes)."""
    rows = []
    for i in range(n):
        topic, others = TOPICS[i % len(TOPICS)], [TOPICS[(i + j) % len(TOPICS)] for j in (1, 2, 3)]
        rows.append({"anchor": f"what does {topic} do to health {i}", "positive": f"{topic} changes health {i}",
                     **{f"negative_{j}": f"{o} is unrelated {i}" for j, o in enumerate(others, 1)}})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def config(model, out, **kw) -> FinetuneConfig:
    settings = dict(task="reranker", model=str(model), output_dir=str(out), batch_size=4, lr=1e-3, log_every=1,
                    precision="fp32", device="cpu", seed=3, max_length=32)
    return FinetuneConfig(**{**settings, **kw})


@pytest.mark.parametrize("loss", ["bce", "listnet", "lambdaloss"])
def test_each_loss_trains_and_best_is_a_cross_encoder(tiny_encoder, tmp_path, loss):
    train, dev = write_groups(tmp_path / "train.jsonl", 8), write_groups(tmp_path / "dev.jsonl", 4)
    results = finetune(config(tiny_encoder, tmp_path / "run", train_file=str(train), validation_file=str(dev),
                              max_steps=4, eval_every=2, reranker={"loss": loss}))
    assert results["metric"] == "ndcg@10" and [h["step"] for h in results["history"]] == [2, 4]
    assert results["history"][-1]["num_queries"] == 4
    # bce: one pair an example (8 x 4 = 32); listwise: one query an example
    assert results["num_train_examples"] == (32 if loss == "bce" else 8)
    best = tmp_path / "run" / "best"
    assert read_model_metadata(best)["task"] == "reranker"
    model = BERTForSequenceClassification.from_pretrained(best)
    assert model.num_labels == 1
    pairs = [("what does salt do to health", "salt raises blood pressure"), ("a query", "an unrelated text")]
    ours = Reranker.from_pretrained(best, device="cpu").score_pairs(*zip(*pairs))
    st = pytest.importorskip("sentence_transformers")
    theirs = st.CrossEncoder(str(best), device="cpu").predict(pairs)
    assert_close(torch.tensor(ours), torch.tensor(theirs, dtype=torch.float32), rtol=1e-5, atol=1e-5)


def test_a_beir_folder_trains_with_random_negatives(tiny_encoder, tmp_path):
    folder = write_beir(tmp_path / "beir", split="train")
    write_beir(folder, split="dev")
    results = finetune(config(tiny_encoder, tmp_path / "run", train_file=str(folder), validation_file=str(folder),
                              max_steps=2, reranker={"loss": "listnet", "negatives": 3}))
    # a list for each of the 8 relevant documents; the 5 dev queries each rank all of their candidates
    assert results["num_train_examples"] == 8 and results["history"][-1]["num_queries"] == 5


@pytest.mark.parametrize("pairs", [True, False])
def test_listwise_lists_of_one_candidate_are_refused(tiny_encoder, tmp_path, pairs):
    """A list of one candidate gives ListNet a loss of 0 whatever the scores: a run that trains nothing
    (a file of (query, positive) pairs, or max_candidates 1)."""
    train = write_groups(tmp_path / "train.jsonl", 8)
    if pairs:
        rows = [json.loads(line) for line in train.read_text().splitlines()]
        train.write_text("".join(json.dumps({"anchor": r["anchor"], "positive": r["positive"]}) + "\n" for r in rows))
    with pytest.raises(ValueError, match=r"train.jsonl: every training list holds one candidate, from which "
                                         r"reranker.loss=listnet learns nothing"):
        finetune(config(tiny_encoder, tmp_path / "run", train_file=str(train), validation_file=str(train),
                        max_steps=2, reranker={"loss": "listnet", **({} if pairs else {"max_candidates": 1})}))


def test_the_validation_ranks_each_querys_candidates(tiny_encoder, tmp_path):
    cfg = config(tiny_encoder, tmp_path / "run")
    task = RerankerTask(cfg)
    task.bind(get_tokenizer(tiny_encoder))
    items = [{"pairs": [None] * 3, "labels": [0.0, 2.0, 1.0]}, {"pairs": [None] * 2, "labels": [0.0, 0.7]}]
    outputs = [torch.tensor(x) for x in (0.5, 0.1, 0.9, 0.3, 0.2)]
    metrics = task.score(outputs, items)
    want = [query_metrics({"0": 0, "1": 2, "2": 1}, ["2", "0", "1"], DEFAULT_CUTOFFS),
            query_metrics({"0": 0, "1": 1}, ["0", "1"], DEFAULT_CUTOFFS)]
    assert metrics["num_queries"] == 2
    for name in ("ndcg@10", "mrr@10", "map@100"):
        assert metrics[name] == pytest.approx(np.mean([w[name] for w in want]))
    assert [grade(x) for x in (0.0, 2.0, 0.7, 0.2)] == [0, 2, 1, 0]


def test_the_collated_batch_places_each_pair_in_its_querys_row(tiny_encoder, tmp_path):
    train = write_groups(tmp_path / "train.jsonl", 3)
    task = RerankerTask(config(tiny_encoder, tmp_path / "run", reranker={"loss": "listnet", "max_candidates": 3}))
    task.bind(get_tokenizer(tiny_encoder))
    items = task.read_train(train)
    assert [len(it["pairs"]) for it in items] == [3, 3, 3]  # cut to max_candidates, the positive first
    batch = task.collate(items[:2])
    assert batch["input_ids"].shape[0] == 6 and batch["group_mask"].all()
    assert batch["group_labels"].tolist() == [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]
    assert batch["slots"].tolist() == list(range(6))
