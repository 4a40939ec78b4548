"""Sequence classification (and regression with one output): text and label columns of a TSV/CSV/JSONL/TXT
file in any layout of `bert_kit.data.tables`, or labels written into the text (`label_pattern`).

What the `classification:` settings add (`ClassificationSettings`, docs/finetuning.md):
* several labels per text (multi-label): label sets (`bert_kit.data.label_sets`) become (B, C)
  0/1 targets, the head's C outputs are independent sigmoids trained with binary cross-entropy
  (HF's `problem_type: multi_label_classification`, written to config.json), and a label is
  predicted where its probability reaches its threshold (0.5, or tuned per label for F1 on the
  validation set at every evaluation: the model folder keeps those of its evaluation);
* class weights: cross-entropy weighted per class, or BCE's pos_weight per label; classes under
  1% of the training rows are named at the start;
* long texts in windows (`long_text: chunks`): each window of a text is a training example with
  the text's label (as BERT's SQuAD windows, and Pappagari et al. 2019 fine-tune on segments);
  evaluation and prediction pool the logits of a text's windows (mean or max, as the sliding-window
  baseline of CogLTX, Ding et al. 2020) into one prediction per text.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from bert_kit.data.classification import ClassificationDataset, FirstTextTooLongError, read_classification_file
from bert_kit.metrics import classification_report_from_predictions, multi_label_report, pearson, spearman, \
    tune_thresholds
from bert_kit.tasks import CLASS_METRICS, MULTI_LABEL_METRICS, SCORE_METRICS
from bert_kit.tasks.base import (Task, _label_names, build_model, drop_empty_texts, encode, flag_empty_texts,
                                 line_numbers)
from bert_kit.tasks.classification_config import ClassificationSettings
from bert_kit.training.losses import compute_classification_loss, compute_multi_label_loss

MULTI_LABEL = "multi_label_classification"  # HF's config.json problem_type of a multi-label head
RARE = 0.01  # a class on fewer training rows than this share is named at the start


class ClassificationTask(Task):
    name, default_metric, role = "classification", "accuracy", "ForSequenceClassification"
    read_settings = ("text_column", "text_pair_column", "label_column", "header", "delimiter", "label_pattern",
                     "encoding", "classification.label_delimiter", "classification.label_columns")

    def __init__(self, settings: Any):
        super().__init__(settings)
        self.c: ClassificationSettings = getattr(settings, "classification", None) or ClassificationSettings()
        self.multi_label = False
        self.thresholds: list[float] | None = None  # multi-label: each label's decision threshold
        self.tune = False  # thresholds tuned at every evaluation (a fine-tuning run with threshold: tune)
        self.class_weights: list[float] | None = None  # single-label: per class; multi-label: pos_weight per label
        self._weights: dict[torch.device, torch.Tensor] = {}  # class_weights on each device the loss ran on

    @property
    def regression(self) -> bool:
        return self.num_labels == 1

    @property
    def chunks(self) -> bool:
        return self.c.long_text == "chunks"

    @property
    def stride(self) -> int:
        """Tokens shared by consecutive windows of a long text (default a quarter of a window's text)."""
        return (self.s.max_length - 3) // 4 if self.c.chunk_stride is None else self.c.chunk_stride

    @property
    def metric(self) -> str:
        default = "pearson" if self.regression else "f1" if self.multi_label else "accuracy"
        return getattr(self.s, "metric", None) or default

    @property
    def metric_names(self) -> tuple[str, ...]:
        if self.regression:
            return SCORE_METRICS
        names = MULTI_LABEL_METRICS if self.multi_label else CLASS_METRICS
        return names + tuple(k for k in self.label_metrics() if k not in names)

    def label_metrics(self) -> list[str]:
        """The per-label metric names of the report (`f1_joy`; for a label named as an average,
        micro, samples or weighted, that name is the average's)."""
        return [f"f1_{name}" for name in self.label_names or []]

    # ---- data ----------------------------------------------------------------------------------

    def _read(self, path: str | Path, labelled: bool = True, where: dict | None = None, names: list[str] | None = None,
              num_labels: int | None = None, text: str | None = None, multi_label: bool | None = None):
        s, c = self.s, self.c
        return read_classification_file(
            path, s.text_column, s.label_column if labelled else None, s.text_pair_column, s.delimiter, names,
            num_labels=num_labels, header=s.header, where=where, label_pattern=s.label_pattern,
            encoding=getattr(s, "encoding", None), text=text, what=self.what(path, "classification file"),
            multi_label=multi_label, label_delimiter=c.label_delimiter, label_columns=c.label_columns)

    def read_train(self, path: str | Path, limit: int | None = None) -> list[dict]:
        # given label_names / num_labels win over what the labels look like (convert_labels)
        names = list(self.s.label_names) if self.s.label_names else None
        data = self._read(path, where=self.s.where, names=names, num_labels=self.s.num_labels,
                          multi_label=self.c.multi_label)
        if data.detected:
            print(f"{path}: multi-label classification ({data.detected}): sigmoid outputs, one per label "
                  "(classification.multi_label=false reads one label per row)", file=sys.stderr, flush=True)
        # classes come from every row (the ids stay those of the whole file); rows without text are left out
        drop_empty_texts(path, self.tokenizer, data.lines, [data.texts, data.text_pairs], [data.labels, data.lines])
        self.multi_label = data.multi_label
        if not data.multi_label and (self.c.tuned or self.c.threshold != 0.5):  # else silently unused
            raise ValueError(f"classification.threshold={self.c.threshold} applies to several labels per text "
                             f"(a sigmoid each), but {path} holds one label per row, whose most probable class "
                             "is predicted: leave threshold out, or set classification.multi_label=true")
        if data.multi_label:  # one output per label, even for labels the training slice never shows
            top = max((max(ids) for ids in data.labels if ids), default=1)
            self.num_labels = self.s.num_labels or len(data.label_names or []) or max(2, top + 1)
            self.label_names = _label_names(data.label_names, self.num_labels)
            self.thresholds = [0.5 if self.c.tuned else float(self.c.threshold)] * self.num_labels
            self.tune = self.c.tuned
        elif self.s.num_labels == 1 or any(isinstance(y, float) for y in data.labels):  # scores: one output, MSE
            self.num_labels, self.label_names = 1, ["score"]
        else:  # a classifier has two outputs or more, even if the training slice shows one class
            self.num_labels = self.s.num_labels or len(data.label_names or []) or max(2, max(data.labels) + 1)
            self.label_names = _label_names(data.label_names, self.num_labels)
        if not self.regression:
            counts = self.class_counts(data.labels[:limit])
            warn_rare_classes(path, self.label_names, counts, len(data.labels[:limit]), self.multi_label,
                              weighted=self.c.class_weights is not None, metric=self.metric)
            self.class_weights = self.weights_of(counts, len(data.labels[:limit]))
        elif self.c.class_weights is not None:
            raise ValueError(f"classification.class_weights weighs classes, but {path} holds scores (regression)")
        return self._dataset(data, limit, source=path)

    def read_eval(self, path: str | Path, limit: int | None = None) -> list[dict]:
        # the training classes: the same names and ids, and no label the head has no output for
        names = None if self.regression else self.label_names
        data = self._read(path, where=self.s.validation_where, names=names, num_labels=self.num_labels,
                          multi_label=True if self.multi_label else None)
        if data.multi_label and not self.multi_label:
            raise ValueError(f"{path} holds several labels per row ({data.detected}) but the model predicts one "
                             "label per text")
        n = len(data.texts) if limit is None else min(limit, len(data.texts))
        numbers = line_numbers(data.lines[:n])
        flag_empty_texts(path, self.tokenizer, data.texts[:n], data.text_pairs and data.text_pairs[:n],
                         "line" if numbers else "row", numbers)
        return self._dataset(data, limit, path)

    def _dataset(self, data, limit: int | None = None, source: str | Path | None = None) -> list[dict]:
        """The examples (or windows), tokenized; texts of `source` cut to max_length, or split into
        windows, are counted on one line."""
        n = len(data.texts) if limit is None else min(limit, len(data.texts))
        if self.multi_label:  # each text's label set as C floats, 1.0 for each of its labels
            labels = [[float(j in ids) for j in range(self.num_labels)] for ids in map(set, data.labels[:n])]
        else:
            labels = [float(y) for y in data.labels[:n]] if self.regression else list(data.labels[:n])
        pairs = None if data.text_pairs is None else data.text_pairs[:n]
        try:
            ds = ClassificationDataset(data.texts[:n], labels, self.tokenizer, self.s.max_length, pairs,
                                       stride=self.stride if self.chunks else None)
        except FirstTextTooLongError as e:  # name the row's line rather than its index
            at = data.lines[e.index] if data.lines else f"{source}: row {e.index + 1}"
            raise ValueError(f"{at}: {str(e).partition(': ')[2]}") from None
        if source is not None:
            self.report_truncated(source, ds.truncated)
            if self.chunks:
                report_windows(source, ds.windows, self.s.max_length, self.stride)
        return [ds[i] for i in range(len(ds))]

    def class_counts(self, labels: Sequence) -> np.ndarray:
        """Training rows of each class (multi-label: rows holding each label), (C,)."""
        if self.multi_label:
            counts = np.zeros(self.num_labels, dtype=np.int64)
            for ids in labels:
                counts[list(ids)] += 1
            return counts
        return np.bincount(np.asarray(labels, dtype=np.int64), minlength=self.num_labels)

    def weights_of(self, counts: np.ndarray, rows: int) -> list[float] | None:
        """The loss's class weights (`classification.class_weights`): balanced as scikit-learn's
        n_rows / (n_classes * count); multi-label: each label's negatives / positives, BCE's
        pos_weight. A class without rows gets 1 (it is never a target)."""
        asked = self.c.class_weights
        if asked is None:
            return None
        if isinstance(asked, list):
            if len(asked) != self.num_labels:
                raise ValueError(f"classification.class_weights holds {len(asked)} weights for the {self.num_labels} "
                                 f"{'labels' if self.multi_label else 'classes'} {self.label_names[:8]}")
            weights = np.asarray(asked, dtype=float)
        elif self.multi_label:
            weights = np.where(counts > 0, (rows - counts) / np.maximum(counts, 1), 1.0)
        else:
            weights = np.where(counts > 0, rows / (self.num_labels * np.maximum(counts, 1)), 1.0)
        shown = ", ".join(f"{n} {w:.3g}" for n, w in list(zip(self.label_names, weights))[:10])
        what = "pos_weight" if self.multi_label else "class weights"
        print(f"class_weights{' balanced' if asked == 'balanced' else ''}: {what} {shown}"
              f"{', ...' if len(weights) > 10 else ''}", file=sys.stderr, flush=True)
        return weights.tolist()

    def build(self, source: str | Path) -> nn.Module:
        model = build_model(self.role, source, self.tokenizer,
                            num_labels=self.num_labels, classifier_dropout=self.s.classifier_dropout)
        model.id2label = {str(i): n for i, n in enumerate(self.label_names)}
        return model

    def metadata(self) -> dict[str, Any]:
        meta = super().metadata()
        if self.multi_label:  # problem_type goes to config.json's top level, where transformers reads it
            meta.update(problem_type=MULTI_LABEL, thresholds=list(self.thresholds))
        if self.chunks:
            meta["long_text"] = {"mode": "chunks", "stride": self.stride, "pooling": self.c.chunk_pooling}
        return meta

    def load_metadata(self, meta: dict[str, Any]) -> None:
        super().load_metadata(meta)
        self.num_labels = len(self.label_names or []) or 2
        self.multi_label = meta.get("problem_type") == MULTI_LABEL
        if self.multi_label:
            thresholds = meta.get("thresholds") or [0.5] * self.num_labels
            if len(thresholds) != self.num_labels:
                raise ValueError(f"config.json holds {len(thresholds)} thresholds for {self.num_labels} labels")
            self.thresholds = [float(t) for t in thresholds]

    def weights_on(self, device: torch.device) -> torch.Tensor | None:
        """class_weights as a float32 tensor on `device`, made once (a CUDA graph replays the loss)."""
        if self.class_weights is None:
            return None
        if device not in self._weights:
            self._weights[device] = torch.tensor(self.class_weights, dtype=torch.float32, device=device)
        return self._weights[device]

    def loss(self, model: nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
        return self.labels_loss(encode(model, batch, self.unpadded), batch["labels"]), {}

    def labels_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The loss of logits (B, C) on the labels (B,) or label sets (B, C), class_weights applied."""
        weights = self.weights_on(logits.device)
        if self.multi_label:
            return compute_multi_label_loss(logits, labels, pos_weight=weights)
        return compute_classification_loss(logits, labels, weight=weights)

    def logits(self, model: nn.Module, items: Sequence[dict], precision: Any) -> torch.Tensor:
        """(N, C) logits of the items: one row per item (per window, with long_text chunks)."""
        return torch.stack(self.outputs(model, items, precision, lambda m, b: encode(m, b, self.unpadded)))

    def evaluate(self, model: nn.Module, items: Sequence[dict], precision: Any) -> dict[str, Any]:
        return self.score(self.logits(model, items, precision), items)

    # ---- scores ------------------------------------------------------------------------------------

    def pool(self, logits: torch.Tensor, items: Sequence[dict]) -> tuple[torch.Tensor, list[dict]]:
        """(the logits of each text (D, C), the first item of each text): the windows' (N, C)
        logits pooled by their `document` (long_text: chunks); one item per text: unchanged."""
        if not items or "document" not in items[0]:
            return logits, list(items)
        documents = [it["document"] for it in items]
        firsts = {d: i for i, d in reversed(list(enumerate(documents)))}
        texts = sorted(firsts)
        return pool_windows(logits, documents, self.c.chunk_pooling), [items[firsts[d]] for d in texts]

    def score(self, outputs: Sequence[torch.Tensor], items: Sequence[dict]) -> dict[str, Any]:
        logits, items = self.pool(torch.stack(list(outputs)), items)  # (N, C)
        if self.regression:
            scores, gold = logits[:, 0].numpy(), np.array([it["labels"] for it in items], dtype=np.float64)
            return {"mse": float(np.mean((scores - gold) ** 2)), "pearson": pearson(scores, gold),
                    "spearman": spearman(scores, gold), "num_examples": len(items)}
        if self.multi_label:
            return self.score_sets(logits, torch.tensor([it["labels"] for it in items]))
        gold = torch.tensor([it["labels"] for it in items])
        report = classification_report_from_predictions(gold.numpy(), logits.argmax(-1).numpy(), self.num_labels,
                                                         self.label_names)
        report["loss"] = float(F.cross_entropy(logits, gold))
        return self.with_label_metrics(report)

    def score_sets(self, logits: torch.Tensor, gold: torch.Tensor) -> dict[str, Any]:
        """Multi-label metrics of (N, C) logits against (N, C) 0/1 label sets, at the thresholds
        (tuned on these first, where the run tunes them)."""
        probabilities = torch.sigmoid(logits).numpy()
        if self.tune:
            self.thresholds = tune_thresholds(probabilities, gold.numpy())
        predicted = probabilities >= np.asarray(self.thresholds)[None, :]
        report = multi_label_report(gold.numpy(), predicted, self.label_names)
        report["loss"] = float(F.binary_cross_entropy_with_logits(logits, gold.float()))
        report["thresholds"] = dict(zip(self.label_names, self.thresholds))
        return self.with_label_metrics(report)

    def with_label_metrics(self, report: dict[str, Any]) -> dict[str, Any]:
        """The report with each label's F1 as a number of its own (`f1_joy`), which `metric` may name."""
        for entry in report["per_class"]:
            key = f"f1_{entry['label']}"
            if key not in report:  # a label named micro, weighted or samples: its F1 stays in per_class
                report[key] = entry["f1"]
        return report

    def predicted_labels(self, row: torch.Tensor) -> list[int]:
        """Multi-label: the ids of the labels whose probability reaches their threshold, of one (C,) row."""
        probabilities = torch.sigmoid(row.float())
        return [j for j, (p, t) in enumerate(zip(probabilities.tolist(), self.thresholds)) if p >= t]


def pool_windows(logits: torch.Tensor, documents: Sequence[int], how: str = "mean") -> torch.Tensor:
    """(D, C) logits of D texts from the (N, C) logits of their windows; documents[i] (0..D-1) is
    the text of row i. mean: the average of a text's windows; max: each output's largest."""
    index = torch.as_tensor(documents, dtype=torch.long, device=logits.device)
    n = int(index.max()) + 1 if len(documents) else 0
    if how == "max":
        pooled = logits.new_full((n, logits.shape[1]), float("-inf"))
        return pooled.scatter_reduce_(0, index[:, None].expand_as(logits), logits, "amax", include_self=False)
    sums = logits.new_zeros((n, logits.shape[1])).index_add_(0, index, logits)
    return sums / torch.bincount(index, minlength=n).clamp(min=1)[:, None].to(logits.dtype)


def warn_rare_classes(path: str | Path, names: Sequence[str], counts: np.ndarray, rows: int, multi_label: bool,
                      weighted: bool = False, metric: str = "accuracy") -> None:
    """One warning naming the classes (labels) on fewer than 1% of the training rows, with their counts,
    and what to set about them, of what is not set yet: class weights (`weighted`: some are), and a
    `metric` for best/ that sees every class (a macro average, or one label's F1)."""
    rare = [(name, int(n)) for name, n in zip(names, counts) if n < RARE * rows]
    if not rare or not rows:
        return
    shown = ", ".join(f"{name} {n:,} ({100 * n / rows:.2g}%)" for name, n in sorted(rare, key=lambda r: r[1])[:10])
    what = "labels are" if multi_label else "classes are"
    advice = [] if weighted else ["classification.class_weights=balanced"]
    sees_them = metric in ("f1", "precision", "recall", "mcc") or metric in {f"f1_{name}" for name in names}
    if not sees_them:
        advice.append(f"choose best/ by a metric that sees them (metric=f1 for the macro F1, or f1_{rare[0][0]})")
    print(f"warning: {path}: {len(rare)} of {len(names)} {what} on fewer than 1% of the {rows:,} training rows: "
          f"{shown}{', ...' if len(rare) > 10 else ''}" + (f"; to weigh them in: {', and '.join(advice)}" if advice
                                                           else ""), file=sys.stderr, flush=True)


def report_windows(path: str | Path, windows: Sequence[int], max_length: int, stride: int) -> None:
    """One line: how many windows the texts of `path` became (long_text: chunks)."""
    long = [n for n in windows if n > 1]
    if long:
        print(f"{path}: {len(long):,} of {len(windows):,} texts were longer than max_length {max_length}: "
              f"{sum(windows):,} windows in all (up to {max(long)} a text, {stride} tokens shared by neighbours), "
              "each scored; a text's windows pool into its prediction", file=sys.stderr, flush=True)
