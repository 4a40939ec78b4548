"""Metrics against their references: scikit-learn, scipy, seqeval and hand-computed SQuAD cases.

Run: .venv/bin/python -m pytest tests/test_metrics.py -q
"""

import warnings

import numpy as np
import pytest
import scipy.stats
import sklearn.metrics as skm
import torch
from seqeval.metrics import classification_report as seqeval_report
from seqeval.metrics import f1_score as seqeval_f1
from seqeval.metrics import precision_score as seqeval_precision
from seqeval.metrics import recall_score as seqeval_recall
from torch import nn
from torch.utils.data import DataLoader

from bert_kit.metrics import (
    accuracy,
    classification_report_from_predictions,
    compute_confusion_matrix,
    compute_precision_recall_f1,
    entity_f1,
    evaluate_classification_metrics,
    get_entities,
    matthews_corrcoef,
    multi_label_report,
    normalize_answer,
    pearson,
    plot_confusion_matrix,
    spearman,
    squad_evaluate,
    squad_exact_match,
    squad_f1,
    tune_thresholds,
)

TOL = dict(rtol=1e-12, atol=1e-12)


def random_labels(seed: int):
    rng = np.random.default_rng(seed)
    c = int(rng.integers(2, 7))
    n = int(rng.integers(1, 200))
    y_true = rng.integers(0, c, n)
    # predictions biased towards the truth so the scores are not all near chance
    y_pred = np.where(rng.random(n) < 0.6, y_true, rng.integers(0, c, n))
    if seed % 3 == 0:
        y_pred[y_pred == c - 1] = 0  # class c-1 never predicted
    return y_true, y_pred, c


# ------------------------------------------------------------------------------ classification


@pytest.mark.filterwarnings("ignore:A single label")  # sklearn, on a 1-sample draw
@pytest.mark.parametrize("seed", range(40))
def test_classification_metrics_match_sklearn(seed):
    y_true, y_pred, c = random_labels(seed)
    labels = list(range(c))
    assert accuracy(y_true, y_pred) == pytest.approx(skm.accuracy_score(y_true, y_pred), abs=1e-12)
    np.testing.assert_array_equal(compute_confusion_matrix(y_true, y_pred, c),
                                  skm.confusion_matrix(y_true, y_pred, labels=labels))
    for average in ("macro", "micro", "weighted", None):
        ours = compute_precision_recall_f1(y_true, y_pred, c, average=average)
        ref = skm.precision_recall_fscore_support(y_true, y_pred, labels=labels, average=average,
                                                  zero_division=0)[:3]
        for a, b in zip(ours, ref):
            np.testing.assert_allclose(a, b, **TOL)
            assert not np.any(np.isnan(a))
    assert matthews_corrcoef(y_true, y_pred, c) == pytest.approx(
        skm.matthews_corrcoef(y_true, y_pred), abs=1e-12)


def random_label_sets(seed: int):
    """(N, C) 0/1 gold and predictions with rows of no label, labels never predicted or never gold."""
    rng = np.random.default_rng(seed)
    n, c = int(rng.integers(1, 120)), int(rng.integers(2, 9))
    y_true = (rng.random((n, c)) < rng.uniform(0.05, 0.5)).astype(int)
    y_pred = np.where(rng.random((n, c)) < 0.7, y_true, rng.random((n, c)) < 0.3).astype(int)
    if seed % 3 == 0:
        y_pred[:, -1] = 0  # a label never predicted
    if seed % 4 == 0:
        y_true[:, 0] = 0  # a label never gold
    return y_true, y_pred


@pytest.mark.parametrize("seed", range(30))
def test_multi_label_metrics_match_sklearn(seed):
    y_true, y_pred = random_label_sets(seed)
    ours = multi_label_report(y_true, y_pred)
    for average in ("macro", "micro", "weighted", "samples"):
        ref = skm.precision_recall_fscore_support(y_true, y_pred, average=average, zero_division=0)[:3]
        suffix = "" if average == "macro" else f"_{average}"
        got = [ours[f"precision{suffix}"], ours[f"recall{suffix}"], ours[f"f1{suffix}"]]
        np.testing.assert_allclose(got, ref, **TOL)
    p, r, f, support = skm.precision_recall_fscore_support(y_true, y_pred, average=None, zero_division=0)
    np.testing.assert_allclose([[e["precision"], e["recall"], e["f1"]] for e in ours["per_class"]],
                               np.stack([p, r, f], 1), **TOL)
    assert [e["support"] for e in ours["per_class"]] == support.tolist()
    assert ours["subset_accuracy"] == pytest.approx(skm.accuracy_score(y_true, y_pred), abs=1e-12)
    assert ours["hamming_loss"] == pytest.approx(skm.hamming_loss(y_true, y_pred), abs=1e-12)
    assert ours["num_examples"] == len(y_true)


def test_multi_label_rows_without_labels_score_as_sklearn():
    """A text with no gold and no predicted label: 0 in the per-text averages (zero_division=0), right
    in subset accuracy."""
    y_true, y_pred = np.array([[0, 0], [1, 0], [0, 1]]), np.array([[0, 0], [1, 1], [0, 0]])
    report = multi_label_report(y_true, y_pred, ["joy", "anger"])
    assert report["f1_samples"] == pytest.approx(2 / 9, abs=1e-12)  # (0 + 2/3 + 0) / 3
    assert report["subset_accuracy"] == pytest.approx(1 / 3, abs=1e-12)
    assert [e["label"] for e in report["per_class"]] == ["joy", "anger"]
    with pytest.raises(ValueError, match=r"y_pred must be a \(N, C\) matrix of 0 and 1"):
        multi_label_report(y_true, np.array([[0, 2], [1, 0], [0, 0]]))


def test_tuned_thresholds_are_the_best_f1_of_the_grid():
    """Against a brute-force search: per label, the grid threshold with the highest F1 (sklearn's),
    the nearest to 0.5 among ties; a label without gold examples keeps 0.5."""
    rng = np.random.default_rng(0)
    n, c = 300, 5
    y_true = (rng.random((n, c)) < 0.2).astype(int)
    y_true[:, 4] = 0
    probs = np.clip(y_true * rng.uniform(0.1, 0.9, (n, c)) + rng.uniform(0, 0.5, (n, c)), 0, 1)
    grid = np.round(np.arange(0.05, 0.951, 0.05), 2)
    tuned = tune_thresholds(probs, y_true)
    for j in range(4):
        scores = [skm.f1_score(y_true[:, j], probs[:, j] >= t, zero_division=0) for t in grid]
        best = max(scores)
        ties = [t for t, f in zip(grid, scores) if f == pytest.approx(best, abs=1e-12)]
        assert tuned[j] == min(ties, key=lambda t: abs(t - 0.5))
    assert tuned[4] == 0.5
    assert tune_thresholds(np.full((4, 1), 0.7), np.ones((4, 1), int)) == [0.5]  # every threshold ties: 0.5


def test_class_never_predicted_has_zero_precision_not_nan():
    y_true = [0, 1, 2, 2, 1, 0]
    y_pred = [0, 1, 1, 1, 1, 0]  # class 2 is never predicted
    p, r, f = compute_precision_recall_f1(y_true, y_pred, 3, average=None)
    np.testing.assert_allclose(p, [1.0, 0.5, 0.0])
    np.testing.assert_allclose(r, [1.0, 1.0, 0.0])
    np.testing.assert_allclose(f, [1.0, 2 / 3, 0.0])
    # class 3 is neither true nor predicted: all zero, and it counts in the macro mean
    p, r, f = compute_precision_recall_f1(y_true, y_pred, 4, average="macro")
    assert (p, r, f) == pytest.approx((1.5 / 4, 2.0 / 4, (1 + 2 / 3) / 4))
    # constant predictions: MCC undefined -> 0, as sklearn
    assert matthews_corrcoef([0, 1, 1], [1, 1, 1]) == 0.0
    assert skm.matthews_corrcoef([0, 1, 1], [1, 1, 1]) == 0.0


def test_bad_labels_are_rejected():
    with pytest.raises(ValueError, match="outside"):
        compute_confusion_matrix([0, 3], [0, 1], num_classes=2)
    with pytest.raises(ValueError, match="3 labels"):
        accuracy([0, 1, 1], [0, 1])
    with pytest.raises(ValueError, match="average"):
        compute_precision_recall_f1([0], [0], average="samples")


def test_report_holds_every_metric():
    y_true, y_pred, c = random_labels(7)
    rep = classification_report_from_predictions(y_true, y_pred, c,
                                                 label_names=[f"c{i}" for i in range(c)])
    assert rep["f1"] == pytest.approx(skm.f1_score(y_true, y_pred, labels=range(c),
                                                   average="macro", zero_division=0))
    assert rep["f1_micro"] == pytest.approx(rep["accuracy"])
    assert rep["recall_weighted"] == pytest.approx(rep["accuracy"])  # identity for single-label
    assert rep["confusion_matrix"] == skm.confusion_matrix(y_true, y_pred, labels=range(c)).tolist()
    assert [d["label"] for d in rep["per_class"]] == [f"c{i}" for i in range(c)]
    assert [d["support"] for d in rep["per_class"]] == np.bincount(y_true, minlength=c).tolist()
    assert rep["mcc"] == pytest.approx(skm.matthews_corrcoef(y_true, y_pred), abs=1e-12)


class FixedLogits(nn.Module):
    """Returns a stored logits row per example; the example index travels in input_ids[:, 0]."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.register_buffer("table", logits)
        self.calls = []

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        self.calls.append((attention_mask is not None, token_type_ids is not None, self.training))
        return self.table[input_ids[:, 0]]


def make_loader(labels: torch.Tensor, batch_size: int = 8):
    n = labels.shape[0]
    items = [{"input_ids": torch.tensor([i, 5, 6]), "attention_mask": torch.ones(3, dtype=torch.long),
              "token_type_ids": torch.zeros(3, dtype=torch.long), "labels": labels[i]} for i in range(n)]
    return DataLoader(items, batch_size=batch_size, shuffle=False)


def test_evaluate_classification_metrics_with_fixed_model():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(37, 3, generator=g)
    labels = torch.randint(0, 3, (37,), generator=g)
    model = FixedLogits(logits)
    model.train()
    out = evaluate_classification_metrics(model, make_loader(labels), device="cpu", num_classes=3)
    preds = logits.argmax(-1).numpy()
    ref = classification_report_from_predictions(labels.numpy(), preds, 3)
    for key in ("accuracy", "precision", "recall", "f1", "f1_micro", "f1_weighted", "mcc"):
        assert out[key] == pytest.approx(ref[key], abs=1e-12), key
    assert out["accuracy"] == pytest.approx(skm.accuracy_score(labels.numpy(), preds))
    assert out["confusion_matrix"] == ref["confusion_matrix"]
    assert len(out["per_class"]) == 3 and out["num_examples"] == 37
    torch.testing.assert_close(torch.tensor(out["loss"]),
                               nn.functional.cross_entropy(logits, labels), rtol=1e-5, atol=1e-6)
    assert all(c == (True, True, False) for c in model.calls)  # masks passed, eval mode
    assert model.training  # mode restored


def test_evaluate_regression_model_reports_correlations():
    g = torch.Generator().manual_seed(1)
    scores = torch.rand(20, generator=g) * 5
    preds = scores + 0.3 * torch.randn(20, generator=g)
    out = evaluate_classification_metrics(FixedLogits(preds[:, None]), make_loader(scores, 6),
                                          num_classes=1)
    assert out["pearson"] == pytest.approx(scipy.stats.pearsonr(preds, scores)[0], abs=1e-6)
    assert out["spearman"] == pytest.approx(scipy.stats.spearmanr(preds, scores)[0], abs=1e-6)
    assert out["mse"] == pytest.approx(float(((preds - scores) ** 2).mean()), rel=1e-5)


def test_plot_confusion_matrix_writes_png(tmp_path):
    path = plot_confusion_matrix(np.array([[5, 1], [2, 7]]), ["neg", "pos"], tmp_path / "cm.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    with pytest.raises(ValueError, match="3 labels"):
        plot_confusion_matrix(np.eye(2), ["a", "b", "c"], tmp_path / "bad.png")


# ------------------------------------------------------------------------------ correlations


@pytest.mark.parametrize("seed", range(10))
def test_pearson_spearman_match_scipy_with_ties(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 300))
    x = rng.integers(0, 6, n).astype(float)  # many ties
    y = x + rng.normal(0, 2, n)
    y[: n // 3] = np.round(y[: n // 3])
    assert pearson(x, y) == pytest.approx(scipy.stats.pearsonr(x, y)[0], abs=1e-12)
    assert spearman(x, y) == pytest.approx(scipy.stats.spearmanr(x, y)[0], abs=1e-12)


def test_correlation_edge_cases():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 1000]) == pytest.approx(1.0)
    assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert pearson([1, 1, 1], [1, 2, 3]) == 0.0  # constant input: undefined, reported as 0
    with pytest.raises(ValueError, match="equal-length"):
        pearson([1, 2, 3], [1, 2])


# ------------------------------------------------------------------------------ NER


def test_entity_f1_hand_computed():
    true = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "I-ORG", "I-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "I-ORG", "O", "O"]]
    # true: PER(0-1), LOC(3), ORG(0-2); pred: PER(0-1), ORG(3), ORG(0-1): one correct
    out = entity_f1(true, pred)
    assert (out["precision"], out["recall"], out["f1"]) == pytest.approx((1 / 3, 1 / 3, 1 / 3))
    assert out["per_type"]["PER"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 1}
    assert out["per_type"]["LOC"]["support"] == 1 and out["per_type"]["LOC"]["precision"] == 0.0
    assert out["per_type"]["ORG"]["precision"] == 0.0 and out["per_type"]["ORG"]["support"] == 1


def test_conlleval_chunking_rules():
    assert get_entities(["O", "I-PER", "I-PER", "O"]) == [("PER", 1, 2)]  # I- after O starts
    assert get_entities(["B-PER", "I-LOC"]) == [("PER", 0, 0), ("LOC", 1, 1)]  # type change
    assert get_entities(["I-PER", "B-PER", "I-PER"]) == [("PER", 0, 0), ("PER", 1, 2)]  # IOB1
    assert get_entities(["B-PER", "I-PER"]) == [("PER", 0, 1)]  # entity at the end
    # a sentence boundary ends an entity: same positions in two sentences are different entities
    out = entity_f1([["B-PER"], ["I-PER"]], [["B-PER"], ["I-PER"]], scheme="IOB1")
    assert out["support"] == 2 and out["f1"] == 1.0


def random_tag_seqs(rng, n_seqs, tags):
    return [list(rng.choice(tags, int(rng.integers(1, 15)))) for _ in range(n_seqs)]


@pytest.mark.parametrize("scheme,tags", [
    ("IOB2", ["O", "O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]),
    ("IOB1", ["O", "O", "O", "I-PER", "I-PER", "B-PER", "I-LOC", "B-LOC", "I-MISC"]),
    ("IOBES", ["O", "O", "B-PER", "I-PER", "E-PER", "S-PER", "B-LOC", "E-LOC", "S-LOC"]),
])
@pytest.mark.parametrize("seed", range(8))
def test_entity_f1_matches_seqeval_default_mode(scheme, tags, seed):
    rng = np.random.default_rng(seed)
    true = random_tag_seqs(rng, 30, tags)
    pred = [[t if rng.random() < 0.7 else str(rng.choice(tags)) for t in seq] for seq in true]
    out = entity_f1(true, pred, scheme=scheme)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # seqeval warns on zero division
        assert out["precision"] == pytest.approx(seqeval_precision(true, pred), abs=1e-12)
        assert out["recall"] == pytest.approx(seqeval_recall(true, pred), abs=1e-12)
        assert out["f1"] == pytest.approx(seqeval_f1(true, pred), abs=1e-12)
        ref = seqeval_report(true, pred, output_dict=True)
    types = {k for k in ref if not k.endswith(" avg")}
    assert set(out["per_type"]) == types
    for t in types:
        for key, ref_key in (("precision", "precision"), ("recall", "recall"), ("f1", "f1-score"),
                             ("support", "support")):
            assert out["per_type"][t][key] == pytest.approx(ref[t][ref_key], abs=1e-12), (t, key)


def test_entity_f1_input_errors():
    with pytest.raises(ValueError, match="sequence 1"):
        entity_f1([["O"], ["O", "O"]], [["O"], ["O"]])
    with pytest.raises(ValueError, match="scheme"):
        entity_f1([["O"]], [["O"]], scheme="BILOU")


# ------------------------------------------------------------------------------ SQuAD


def test_normalize_answer():
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert normalize_answer("U.S. (1,000)") == "us 1000"
    assert normalize_answer("an apple and a theory") == "apple and theory"  # whole words only


@pytest.mark.parametrize("pred,gold,em,f1", [
    ("the Eiffel Tower!", "Eiffel tower", 1.0, 1.0),                   # articles, case, punctuation
    ("in the Eiffel Tower in Paris", "Eiffel Tower", 0.0, 2 * 0.4 / 1.4),  # P 2/5, R 1
    ("Denver Broncos", "Broncos", 0.0, 2 / 3),                          # P 1/2, R 1
    ("Broncos Denver", "Denver Broncos", 0.0, 1.0),                     # bag of words
    ("well-known", "well known", 0.0, 0.0),                             # hyphen removed, not split
    ("a", "the", 1.0, 0.0),                                             # both empty: EM 1, F1 0
    ("the the cat", "cat cat", 0.0, 2 / 3),  # ["cat"] vs ["cat", "cat"]: common 1, P 1, R 1/2
])
def test_squad_em_f1_hand_computed(pred, gold, em, f1):
    assert squad_exact_match(pred, gold) == em
    assert squad_f1(pred, gold) == pytest.approx(f1, abs=1e-12)


def test_squad_evaluate_max_over_golds_and_missing_answers():
    dataset = {"data": [{"title": "t", "paragraphs": [{"context": "c", "qas": [
        {"id": "q1", "question": "?", "answers": [{"text": "Denver Broncos", "answer_start": 0},
                                                   {"text": "Broncos", "answer_start": 7}]},
        {"id": "q2", "question": "?", "answers": [{"text": "Paris", "answer_start": 0}]},
    ]}]}]}
    preds = {"q1": "Broncos", "q2": "in Paris France"}  # q1: EM 1 via 2nd gold; q2: F1 1/2
    assert squad_evaluate(preds, dataset) == pytest.approx({"exact_match": 50.0, "f1": 75.0})
    flat = [{"id": "q1", "answers": [{"text": "Broncos"}]}, {"id": "q2", "answers": [{"text": "Paris"}]},
            {"id": "q3", "answers": [{"text": "x"}]}]
    with pytest.warns(UserWarning, match="1 of 3"):
        out = squad_evaluate(preds, flat)
    assert out == pytest.approx({"exact_match": 100 / 3, "f1": 150 / 3})
