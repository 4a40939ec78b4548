"""The metrics table the settings are checked against (bert_kit.tasks.METRICS, torch-free) names
what each task's evaluation reports, so a metric accepted at the start is there at every evaluation.

Run: .venv/bin/python -m pytest tests/tasks/test_task_metrics.py -q
"""

import torch

from bert_kit.metrics import entity_f1, higher_is_better, squad_evaluate
from bert_kit.tasks import CLASS_METRICS, METRICS, MULTI_LABEL_METRICS, SCORE_METRICS, metric_names
from bert_kit.tasks.classification import ClassificationTask
from bert_kit.tasks.finetuning_config import FinetuneConfig


def numbers(report: dict) -> set[str]:
    return {k for k, v in report.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def test_classification_reports_the_metrics_the_settings_accept():
    torch.manual_seed(0)
    task = ClassificationTask(FinetuneConfig(task="classification"))
    task.num_labels, task.label_names = 3, ["a", "b", "c"]
    items = [{"labels": i % 3} for i in range(9)]
    classes = task.score([torch.randn(3) for _ in items], items)
    per_label = ("f1_a", "f1_b", "f1_c")  # each label's F1, which `metric` may name too
    assert numbers(classes) - {"num_examples"} == set(CLASS_METRICS + per_label)
    assert task.metric_names == CLASS_METRICS + per_label
    task.multi_label, task.thresholds = True, [0.5, 0.5, 0.5]  # several labels per text
    items = [{"labels": [float(i % 2), float(i % 3 == 0), 0.0]} for i in range(9)]
    sets = task.score([torch.randn(3) for _ in items], items)
    assert numbers(sets) - {"num_examples"} == set(MULTI_LABEL_METRICS + per_label)
    assert task.metric_names == MULTI_LABEL_METRICS + per_label and task.metric == "f1"
    task.multi_label = False
    task.num_labels = 1  # scores: regression
    items = [{"labels": float(i)} for i in range(9)]
    scores = task.score([torch.randn(1) for _ in items], items)
    assert numbers(scores) - {"num_examples"} == set(SCORE_METRICS) and task.metric_names == SCORE_METRICS
    assert set(METRICS["classification"]) == set(CLASS_METRICS) | set(MULTI_LABEL_METRICS) | set(SCORE_METRICS)


def test_token_classification_qa_and_similarity_report_theirs():
    ner = entity_f1([["B-PER", "O"], ["B-LOC"]], [["B-PER", "O"], ["O"]])
    assert set(metric_names("token-classification")) - {"accuracy"} <= numbers(ner)  # accuracy: per word, beside
    qa = squad_evaluate({"1": "Paris"}, [{"id": "1", "answers": [{"text": "Paris"}]}])
    assert set(metric_names("qa")) == numbers(qa)
    assert metric_names("similarity") == ("pearson", "spearman", "mse")  # a cross-encoder's mse
    assert metric_names("similarity", bi_encoder=True) == ("pearson", "spearman")


def test_a_loss_or_an_error_is_best_at_its_lowest():
    assert [higher_is_better(m) for m in ("accuracy", "f1", "spearman", "exact_match", "mcc")] == [True] * 5
    assert [higher_is_better(m) for m in ("loss", "mse", "mlm_loss", "perplexity", "nsp_loss")] == [False] * 5


def test_embedding_and_reranker_report_the_ranking_metrics():
    from bert_kit.retrieval.metrics import DEFAULT_CUTOFFS
    from bert_kit.retrieval.metrics import metric_names as ranking_names
    from bert_kit.tasks import RANK_METRICS
    from bert_kit.tasks.reranker import RerankerTask

    assert tuple(ranking_names(DEFAULT_CUTOFFS)) == RANK_METRICS  # what RetrievalEvaluator reports by default
    items = [{"pairs": [None] * 3, "labels": [1.0, 0.0, 0.0]}, {"pairs": [None] * 2, "labels": [0.0, 1.0]}]
    report = RerankerTask(FinetuneConfig(task="reranker")).score([torch.randn(()) for _ in range(5)], items)
    assert numbers(report) - {"num_queries"} == set(RANK_METRICS) == set(metric_names("reranker"))
    assert set(metric_names("embedding")) == set(RANK_METRICS) | {"pearson", "spearman"}
    assert "ndcg@10_dim128" in metric_names("embedding", dims=[256, 128])
    assert higher_is_better("ndcg@10_dim128") and higher_is_better("recall@100")
