"""Evaluation metrics for the fine-tuning tasks, in plain NumPy and Python.

- classification: accuracy, precision / recall / F1 (macro, micro, weighted, per class),
  confusion matrix, Matthews correlation, a full report, a model-over-loader evaluator and a
  confusion-matrix plot; for several labels per text, the same over labels and per text
  (samples), subset accuracy and Hamming loss (`multi_label_report`), and per-label thresholds
  tuned for F1 (`tune_thresholds`). Conventions follow scikit-learn with ``zero_division=0``: a class that
  is never predicted has precision 0 (never NaN), and macro averages run over all
  ``num_classes`` classes.
- regression / STS: Pearson and Spearman (ties get their average rank) correlation.
- NER: entity-level precision / recall / F1 with conlleval chunking, identical to seqeval's
  default mode.
- SQuAD v1.1: exact match and token F1 with the official answer normalisation, max over the
  gold answers, reported on a 0-100 scale as the official script does.
- Which way is better: `higher_is_better` (losses and errors are best at their lowest).

torch is imported only inside :func:`evaluate_classification_metrics` and matplotlib only
inside :func:`plot_confusion_matrix`, so the metrics themselves need neither.
"""

from __future__ import annotations

import re
import string
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from bert_kit.outputs import write_file

# ----------------------------------------------------------------------------------------------
# classification


# metrics whose lowest value is the best: a run that chooses best/ by one of them keeps its lowest
LOWER_IS_BETTER = frozenset({"loss", "mse", "mlm_loss", "nsp_loss", "perplexity"})


def higher_is_better(metric: str) -> bool:
    """Whether a higher value of `metric` is better (accuracy, f1, ...) or a lower one (a loss, mse)."""
    return metric not in LOWER_IS_BETTER and not metric.endswith("_loss")


def _as_labels(y: Iterable[int], name: str) -> np.ndarray:
    """Convert a label sequence (list, array or tensor) to a 1-D int64 array."""
    if hasattr(y, "detach"):  # torch tensor without importing torch
        y = y.detach().cpu().numpy()
    arr = np.asarray(y)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size and not np.all(np.equal(np.mod(arr, 1), 0)):
        raise ValueError(f"{name} must hold integer class ids")
    return arr.astype(np.int64)


def _check_pair(y_true, y_pred, num_classes: int | None) -> tuple[np.ndarray, np.ndarray, int]:
    t, p = _as_labels(y_true, "y_true"), _as_labels(y_pred, "y_pred")
    if t.shape != p.shape:
        raise ValueError(f"y_true has {t.shape[0]} labels but y_pred has {p.shape[0]}")
    if num_classes is None:
        num_classes = int(max(t.max(initial=-1), p.max(initial=-1))) + 1
    for name, arr in (("y_true", t), ("y_pred", p)):
        if arr.size and (arr.min() < 0 or arr.max() >= num_classes):
            raise ValueError(f"{name} has labels outside [0, {num_classes}): "
                             f"min {arr.min()}, max {arr.max()}")
    return t, p, num_classes


def _safe_div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den with 0 where den == 0 (sklearn's zero_division=0)."""
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    return np.divide(num, den, out=np.zeros_like(num), where=den != 0)


def accuracy(y_true: Sequence[int], y_pred: Sequence[int]) -> float:
    """Fraction of positions where y_pred == y_true; 0.0 for empty input."""
    t, p = _as_labels(y_true, "y_true"), _as_labels(y_pred, "y_pred")
    if t.shape != p.shape:
        raise ValueError(f"y_true has {t.shape[0]} labels but y_pred has {p.shape[0]}")
    return float((t == p).mean()) if t.size else 0.0


def compute_confusion_matrix(y_true: Sequence[int], y_pred: Sequence[int],
                             num_classes: int | None = None) -> np.ndarray:
    """Confusion matrix (C, C) int64: rows are true classes, columns predicted classes."""
    t, p, c = _check_pair(y_true, y_pred, num_classes)
    # bincount over the flat index true * C + pred fills the matrix in one pass
    return np.bincount(t * c + p, minlength=c * c).reshape(c, c).astype(np.int64)


def compute_precision_recall_f1(y_true: Sequence[int], y_pred: Sequence[int],
                                num_classes: int | None = None, average: str | None = "macro"):
    """Precision, recall and F1 of single-label multi-class predictions.

    average: "macro" (unweighted mean over all ``num_classes`` classes), "micro" (global counts),
    "weighted" (mean weighted by true support) or None (per-class arrays of shape (C,)).
    Returns a tuple (precision, recall, f1) of floats, or of arrays when average is None.
    """
    if average not in ("macro", "micro", "weighted", None):
        raise ValueError(f"average must be 'macro', 'micro', 'weighted' or None, got {average!r}")
    cm = compute_confusion_matrix(y_true, y_pred, num_classes)
    tp = np.diag(cm).astype(np.float64)
    pred_sum, true_sum = cm.sum(axis=0), cm.sum(axis=1)
    if average == "micro":
        p = float(_safe_div(tp.sum(), pred_sum.sum()))
        r = float(_safe_div(tp.sum(), true_sum.sum()))
        return p, r, float(_safe_div(2 * p * r, p + r))
    precision, recall = _safe_div(tp, pred_sum), _safe_div(tp, true_sum)
    f1 = _safe_div(2 * precision * recall, precision + recall)
    if average is None:
        return precision, recall, f1
    if average == "macro":
        weights = np.ones_like(precision)
    else:
        weights = true_sum.astype(np.float64)
    if weights.sum() == 0:
        return 0.0, 0.0, 0.0
    return tuple(float(np.average(m, weights=weights)) for m in (precision, recall, f1))


def matthews_corrcoef(y_true: Sequence[int], y_pred: Sequence[int],
                      num_classes: int | None = None) -> float:
    """Multi-class Matthews correlation (Gorodkin's R_K, as sklearn); 0.0 when undefined."""
    cm = compute_confusion_matrix(y_true, y_pred, num_classes).astype(np.float64)
    t_sum, p_sum = cm.sum(axis=1), cm.sum(axis=0)
    n, correct = cm.sum(), np.trace(cm)
    cov_tp = correct * n - t_sum @ p_sum
    cov_pp = n * n - p_sum @ p_sum
    cov_tt = n * n - t_sum @ t_sum
    if cov_pp * cov_tt == 0:
        return 0.0
    return float(cov_tp / np.sqrt(cov_tt * cov_pp))


def classification_report_from_predictions(y_true: Sequence[int], y_pred: Sequence[int],
                                           num_classes: int | None = None,
                                           label_names: Sequence[str] | None = None
                                           ) -> dict[str, Any]:
    """All classification metrics of predictions in one JSON-friendly dict.

    Keys: accuracy, precision, recall, f1 (macro), {precision,recall,f1}_{micro,weighted},
    mcc, per_class (list of {label, precision, recall, f1, support}), confusion_matrix
    (list of lists, rows = true class), num_examples.
    """
    t, p, c = _check_pair(y_true, y_pred, num_classes)
    if label_names is not None and len(label_names) != c:
        raise ValueError(f"label_names has {len(label_names)} names for {c} classes")
    report: dict[str, Any] = {"accuracy": accuracy(t, p), "num_examples": int(t.size)}
    for avg in ("macro", "micro", "weighted"):
        prec, rec, f1 = compute_precision_recall_f1(t, p, c, average=avg)
        suffix = "" if avg == "macro" else f"_{avg}"
        report.update({f"precision{suffix}": prec, f"recall{suffix}": rec, f"f1{suffix}": f1})
    prec, rec, f1 = compute_precision_recall_f1(t, p, c, average=None)
    cm = compute_confusion_matrix(t, p, c)
    support = cm.sum(axis=1)
    report["per_class"] = [
        {"label": label_names[i] if label_names is not None else i, "precision": float(prec[i]),
         "recall": float(rec[i]), "f1": float(f1[i]), "support": int(support[i])}
        for i in range(c)
    ]
    report["confusion_matrix"] = cm.tolist()
    report["mcc"] = matthews_corrcoef(t, p, c)
    return report


# ----------------------------------------------------------------------------------------------
# multi-label classification (several labels per text): (N, C) 0/1 indicator matrices


def _indicators(y: Any, name: str) -> np.ndarray:
    """A (N, C) 0/1 array (list, array or tensor) as bool."""
    if hasattr(y, "detach"):
        y = y.detach().cpu().numpy()
    arr = np.asarray(y)
    if arr.ndim != 2 or (arr.size and not np.isin(arr, (0, 1)).all()):
        raise ValueError(f"{name} must be a (N, C) matrix of 0 and 1, got shape {arr.shape}")
    return arr.astype(bool)


def multi_label_report(y_true: Any, y_pred: Any, label_names: Sequence[str] | None = None) -> dict[str, Any]:
    """All multi-label metrics of (N, C) 0/1 gold labels and predictions, as scikit-learn computes
    them with zero_division=0 (a label never predicted has precision 0; a text with no gold and no
    predicted label scores 0 in the per-text averages).

    Keys: precision, recall, f1 (macro: the mean over labels), their _micro (counts of all labels),
    _weighted (by each label's gold count) and _samples (the mean over texts) forms;
    subset_accuracy (texts whose label set is exactly right), hamming_loss (the share of wrong
    label decisions), per_class (list of {label, precision, recall, f1, support}), num_examples.
    """
    t, p = _indicators(y_true, "y_true"), _indicators(y_pred, "y_pred")
    if t.shape != p.shape:
        raise ValueError(f"y_true has shape {t.shape} but y_pred {p.shape}")
    n, c = t.shape
    if label_names is not None and len(label_names) != c:
        raise ValueError(f"label_names has {len(label_names)} names for {c} labels")
    tp, predicted, support = (t & p).sum(0), p.sum(0), t.sum(0)  # (C,) each
    precision, recall = _safe_div(tp, predicted), _safe_div(tp, support)
    f1 = _safe_div(2 * tp, predicted + support)
    report: dict[str, Any] = {"precision": float(precision.mean()) if c else 0.0,
                              "recall": float(recall.mean()) if c else 0.0, "f1": float(f1.mean()) if c else 0.0}
    micro_p, micro_r = float(_safe_div(tp.sum(), predicted.sum())), float(_safe_div(tp.sum(), support.sum()))
    report.update(precision_micro=micro_p, recall_micro=micro_r,
                  f1_micro=float(_safe_div(2 * tp.sum(), predicted.sum() + support.sum())))
    weights = support / support.sum() if support.sum() else np.zeros(c)
    report.update(precision_weighted=float(precision @ weights), recall_weighted=float(recall @ weights),
                  f1_weighted=float(f1 @ weights))
    row_tp, row_pred, row_true = (t & p).sum(1), p.sum(1), t.sum(1)  # (N,) each
    report.update(precision_samples=float(_safe_div(row_tp, row_pred).mean()) if n else 0.0,
                  recall_samples=float(_safe_div(row_tp, row_true).mean()) if n else 0.0,
                  f1_samples=float(_safe_div(2 * row_tp, row_pred + row_true).mean()) if n else 0.0)
    report["subset_accuracy"] = float((t == p).all(1).mean()) if n else 0.0
    report["hamming_loss"] = float((t != p).mean()) if t.size else 0.0
    report["per_class"] = [
        {"label": label_names[j] if label_names is not None else j, "precision": float(precision[j]),
         "recall": float(recall[j]), "f1": float(f1[j]), "support": int(support[j])} for j in range(c)]
    report["num_examples"] = n
    return report


def tune_thresholds(probabilities: Any, y_true: Any, grid: Sequence[float] | None = None) -> list[float]:
    """Per label, the threshold of `grid` (default 0.05, 0.10, ..., 0.95) whose predictions
    (probability >= threshold) have the best F1 on (N, C) `probabilities` and 0/1 `y_true`; of
    equally good ones the nearest to 0.5. A label with no gold example keeps 0.5: nothing to tune on."""
    probs, t = np.asarray(probabilities, dtype=np.float64), _indicators(y_true, "y_true")
    grid = np.round(np.arange(0.05, 0.951, 0.05), 2) if grid is None else np.asarray(grid, dtype=np.float64)
    f1 = np.zeros((len(grid), t.shape[1]))  # (G, C): each threshold's F1 of each label
    for g, threshold in enumerate(grid):  # one (N, C) matrix at a time
        predicted = probs >= threshold
        f1[g] = _safe_div(2 * (predicted & t).sum(0), predicted.sum(0) + t.sum(0))
    # the best F1, then the threshold nearest to 0.5: order the grid by distance to 0.5 first
    order = np.argsort(np.abs(grid - 0.5), kind="stable")
    best = order[np.argmax(f1[order], axis=0)]  # (C,)
    return [float(grid[g]) if t[:, j].any() else 0.5 for j, g in enumerate(best)]


def evaluate_classification_metrics(model, loader, device: str = "cpu",
                                    num_classes: int = 2) -> dict[str, Any]:
    """Run a sequence-classification model over a loader and report its metrics.

    The model is called as ``model(input_ids, attention_mask=..., token_type_ids=...)`` and
    returns logits (B, C); each batch is a dict with input_ids (B, T), attention_mask (B, T),
    optional token_type_ids (B, T) and labels (B,). With C == 1 (regression, e.g. STS-B) the
    report holds mse, pearson and spearman; otherwise the keys of
    :func:`classification_report_from_predictions` plus the mean cross-entropy ``loss``.
    Batches are moved to ``device`` (the model must already be there); the model's
    train/eval mode is restored afterwards.
    """
    import torch
    import torch.nn.functional as F

    was_training = model.training
    model.eval()
    preds, labels, scores, loss_sum = [], [], [], 0.0
    try:
        with torch.no_grad():
            for i, batch in enumerate(loader):
                if "labels" not in batch:
                    raise KeyError(f"batch {i} has no 'labels' key (keys: {sorted(batch)})")
                input_ids = batch["input_ids"].to(device)
                mask = batch.get("attention_mask")
                types = batch.get("token_type_ids")
                logits = model(input_ids, attention_mask=None if mask is None else mask.to(device),
                               token_type_ids=None if types is None else types.to(device))
                logits = logits.float().cpu()
                y = batch["labels"].cpu()
                if logits.ndim != 2 or logits.shape[0] != y.shape[0]:
                    raise ValueError(f"batch {i}: expected logits (B={y.shape[0]}, C), "
                                     f"got {tuple(logits.shape)}")
                if logits.shape[1] == 1:
                    scores.append(logits[:, 0].numpy())
                    labels.append(y.float().numpy())
                else:
                    loss_sum += float(F.cross_entropy(logits, y.long(), reduction="sum"))
                    preds.append(logits.argmax(dim=-1).numpy())
                    labels.append(y.long().numpy())
    finally:
        model.train(was_training)
    y_true = np.concatenate(labels) if labels else np.zeros(0)
    if scores:
        y_score = np.concatenate(scores)
        return {"mse": float(np.mean((y_score - y_true) ** 2)), "pearson": pearson(y_score, y_true),
                "spearman": spearman(y_score, y_true), "num_examples": int(y_true.size)}
    report = classification_report_from_predictions(y_true, np.concatenate(preds) if preds else
                                                     np.zeros(0, np.int64), num_classes)
    report["loss"] = loss_sum / max(int(y_true.size), 1)
    return report


def plot_confusion_matrix(cm, labels: Sequence[str], path: str | Path,
                          title: str = "Confusion matrix") -> Path:
    """Write a confusion matrix (C, C) as an annotated PNG heat map; returns the path.

    Uses matplotlib's object-oriented Agg canvas, so no global backend is switched.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cm = np.asarray(cm)
    if cm.ndim != 2 or cm.shape[0] != cm.shape[1] or cm.shape[0] != len(labels):
        raise ValueError(f"cm must be ({len(labels)}, {len(labels)}) for {len(labels)} labels, "
                         f"got {cm.shape}")
    size = 2.0 + 0.6 * len(labels)
    fig = Figure(figsize=(size, size))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(cm, cmap="Blues")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    ax.set(xticks=range(len(labels)), yticks=range(len(labels)), xticklabels=labels,
           yticklabels=labels, xlabel="predicted", ylabel="true", title=title)
    # white text on dark cells keeps the counts readable
    threshold = cm.max() / 2.0 if cm.size else 0
    for i in range(cm.shape[0]):
        for j in range(cm.shape[1]):
            ax.text(j, i, f"{cm[i, j]:g}", ha="center", va="center",
                    color="white" if cm[i, j] > threshold else "black")
    fig.tight_layout()
    write_file(path, lambda f: fig.savefig(f, format="png", dpi=100), binary=True)  # whole, through a link
    return Path(path)


# ----------------------------------------------------------------------------------------------
# regression / STS


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson correlation in float64; 0.0 when either input is constant (undefined)."""
    a = np.asarray(x, dtype=np.float64).ravel()
    b = np.asarray(y, dtype=np.float64).ravel()
    if a.shape != b.shape or a.size < 2:
        raise ValueError(f"pearson needs two equal-length inputs of >= 2 values, "
                         f"got {a.size} and {b.size}")
    a, b = a - a.mean(), b - b.mean()
    den = np.sqrt((a @ a) * (b @ b))
    return float(np.clip(a @ b / den, -1.0, 1.0)) if den > 0 else 0.0


def _rank_average(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n with tied values sharing their average rank (scipy's rankdata 'average')."""
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    # boundaries of runs of equal values in sorted order
    new_run = np.concatenate([[True], sorted_x[1:] != sorted_x[:-1], [True]])
    starts = np.flatnonzero(new_run)
    run_id = np.cumsum(new_run[:-1]) - 1
    avg_rank = (starts[:-1] + starts[1:] + 1) / 2.0  # mean of ranks start+1 .. end
    ranks = np.empty(x.size, dtype=np.float64)
    ranks[order] = avg_rank[run_id]
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation: Pearson of average ranks (ties handled as scipy)."""
    a = np.asarray(x, dtype=np.float64).ravel()
    b = np.asarray(y, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"spearman needs equal-length inputs, got {a.size} and {b.size}")
    return pearson(_rank_average(a), _rank_average(b))


# ----------------------------------------------------------------------------------------------
# NER (entity level)


def _split_tag(tag: str) -> tuple[str, str]:
    """'B-PER' -> ('B', 'PER'); 'O' -> ('O', '_'), as seqeval parses prefixes."""
    return tag[0], (tag[1:].split("-", maxsplit=1)[-1] or "_")


def _end_of_chunk(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    # conlleval's endOfChunk, extended to E/S tags like seqeval
    if prev_tag in ("E", "S"):
        return True
    if prev_tag in ("B", "I") and tag in ("B", "S", "O"):
        return True
    return prev_tag not in ("O", ".") and prev_type != type_


def _start_of_chunk(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    # an I- (or E-) after O or after an ended chunk opens a new entity: this is what makes
    # IOB1 input and ill-formed IOB2 predictions score like conlleval
    if tag in ("B", "S"):
        return True
    if prev_tag in ("E", "S", "O") and tag in ("E", "I"):
        return True
    return tag not in ("O", ".") and prev_type != type_


def get_entities(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """Entity chunks (type, first, last) of one tag sequence, last index inclusive."""
    chunks, prev_tag, prev_type, begin = [], "O", "_", 0
    for i, chunk in enumerate(list(tags) + ["O"]):  # sentinel O closes a trailing entity
        tag, type_ = _split_tag(chunk)
        if _end_of_chunk(prev_tag, tag, prev_type, type_):
            chunks.append((prev_type, begin, i - 1))
        if _start_of_chunk(prev_tag, tag, prev_type, type_):
            begin = i
        prev_tag, prev_type = tag, type_
    return chunks


def entity_f1(true_tag_seqs: Sequence[Sequence[str]], pred_tag_seqs: Sequence[Sequence[str]],
              scheme: str = "IOB2") -> dict[str, Any]:
    """Entity-level precision / recall / F1 (CoNLL semantics, = seqeval default mode).

    An entity counts as correct only if its type and exact span match. ``scheme`` may be
    "IOB1", "IOB2" or "IOBES": conlleval chunking reads all of them, so it only documents the
    input. Returns {precision, recall, f1 (micro over entities), support (true entities),
    num_predicted, num_correct, per_type: {type: {precision, recall, f1, support}}}.
    """
    if scheme not in ("IOB1", "IOB2", "IOBES"):
        raise ValueError(f"scheme must be 'IOB1', 'IOB2' or 'IOBES', got {scheme!r}")
    if len(true_tag_seqs) != len(pred_tag_seqs):
        raise ValueError(f"{len(true_tag_seqs)} true sequences but {len(pred_tag_seqs)} predicted")
    true_ents: set[tuple] = set()
    pred_ents: set[tuple] = set()
    for i, (t, p) in enumerate(zip(true_tag_seqs, pred_tag_seqs)):
        if len(t) != len(p):
            raise ValueError(f"sequence {i}: {len(t)} true tags but {len(p)} predicted tags")
        true_ents.update((i, *e) for e in get_entities(t))
        pred_ents.update((i, *e) for e in get_entities(p))
    correct = true_ents & pred_ents

    def prf(n_correct: int, n_pred: int, n_true: int) -> dict[str, float]:
        prec, rec = float(_safe_div(n_correct, n_pred)), float(_safe_div(n_correct, n_true))
        return {"precision": prec, "recall": rec, "f1": float(_safe_div(2 * prec * rec, prec + rec))}

    per_type = {}
    for type_ in sorted({e[1] for e in true_ents | pred_ents}):
        n_true = sum(e[1] == type_ for e in true_ents)
        scores = prf(sum(e[1] == type_ for e in correct), sum(e[1] == type_ for e in pred_ents),
                     n_true)
        per_type[type_] = {**scores, "support": n_true}
    return {**prf(len(correct), len(pred_ents), len(true_ents)), "support": len(true_ents),
            "num_predicted": len(pred_ents), "num_correct": len(correct), "per_type": per_type}


# ----------------------------------------------------------------------------------------------
# SQuAD v1.1 (the official evaluate-v1.1.py logic)


_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(s: str) -> str:
    """Lower case, drop punctuation, drop articles (a/an/the), collapse whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCTUATION)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def squad_exact_match(prediction: str, ground_truth: str) -> float:
    """1.0 if the normalised strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def squad_f1(prediction: str, ground_truth: str) -> float:
    """Token-overlap F1 between normalised prediction and ground truth (bag of words)."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(ground_truth).split()
    num_same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if num_same == 0:
        return 0.0
    precision, recall = num_same / len(pred_tokens), num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _iter_questions(dataset_or_examples) -> Iterable[tuple[str, list[str]]]:
    """Yield (id, gold answer texts) from a SQuAD JSON dict, its "data" list or examples."""
    data = dataset_or_examples
    if isinstance(data, dict):
        if "data" not in data:
            raise KeyError("SQuAD dataset dict has no 'data' key")
        data = data["data"]
    for item in data:
        if "paragraphs" in item:  # an article of the official JSON
            for paragraph in item["paragraphs"]:
                for qa in paragraph["qas"]:
                    yield qa["id"], [a["text"] for a in qa["answers"]]
        else:  # a flat example as returned by bert_kit.data.squad.read_squad
            yield item["id"], [a["text"] for a in item["answers"]]


def squad_evaluate(predictions: dict[str, str], dataset_or_examples) -> dict[str, float]:
    """Official SQuAD v1.1 scores, 0-100: {"exact_match", "f1"}.

    dataset_or_examples: the parsed JSON ({"data": [...]}), its "data" list, or flat examples
    with "id" and "answers". Unanswered questions score 0 (with a warning), as officially.
    """
    em = f1 = 0.0
    total = missing = 0
    for qid, golds in _iter_questions(dataset_or_examples):
        total += 1
        if qid not in predictions:
            missing += 1
            continue
        if not golds:
            raise ValueError(f"question {qid!r} has no gold answers (SQuAD v1.1 needs one)")
        pred = predictions[qid]
        em += max(squad_exact_match(pred, g) for g in golds)
        f1 += max(squad_f1(pred, g) for g in golds)
    if missing:
        warnings.warn(f"{missing} of {total} questions have no prediction and score 0")
    total = max(total, 1)
    return {"exact_match": 100.0 * em / total, "f1": 100.0 * f1 / total}
