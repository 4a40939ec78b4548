"""Sequence classification (and regression with one output): text and label columns of a TSV/CSV/JSONL/TXT
file in any layout of `bert_kit.data.tables`, or labels written into the text (`label_pattern`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from bert_kit.data.classification import ClassificationDataset, read_classification_file
from bert_kit.metrics import classification_report_from_predictions, pearson, spearman
from bert_kit.tasks import CLASS_METRICS, SCORE_METRICS
from bert_kit.tasks.base import (Task, _label_names, build_model, drop_empty_texts, encode, flag_empty_texts,
                                 line_numbers)
from bert_kit.training.losses import compute_classification_loss


class ClassificationTask(Task):
    name, default_metric, role = "classification", "accuracy", "ForSequenceClassification"
    read_settings = ("text_column", "text_pair_column", "label_column", "header", "delimiter", "label_pattern",
                     "encoding")

    @property
    def regression(self) -> bool:
        return self.num_labels == 1

    @property
    def metric(self) -> str:
        return getattr(self.s, "metric", None) or ("pearson" if self.regression else "accuracy")

    @property
    def metric_names(self) -> tuple[str, ...]:
        return SCORE_METRICS if self.regression else CLASS_METRICS

    def _read(self, path: str | Path, labelled: bool = True, where: dict | None = None, names: list[str] | None = None,
              num_labels: int | None = None, text: str | None = None):
        s = self.s
        return read_classification_file(
            path, s.text_column, s.label_column if labelled else None, s.text_pair_column, s.delimiter, names,
            num_labels=num_labels, header=s.header, where=where, label_pattern=s.label_pattern,
            encoding=getattr(s, "encoding", None), text=text, what=self.what(path, "classification file"))

    def read_train(self, path: str | Path) -> list[dict]:
        # given label_names / num_labels win over what the labels look like (convert_labels)
        names = list(self.s.label_names) if self.s.label_names else None
        data = self._read(path, where=self.s.where, names=names, num_labels=self.s.num_labels)
        # classes come from every row (the ids stay those of the whole file); rows without text are left out
        drop_empty_texts(path, self.tokenizer, data.lines, [data.texts, data.text_pairs], [data.labels, data.lines])
        if self.s.num_labels == 1 or any(isinstance(y, float) for y in data.labels):  # scores: one output, MSE
            self.num_labels, self.label_names = 1, ["score"]
        else:  # a classifier has two outputs or more, even if the training slice shows one class
            self.num_labels = self.s.num_labels or len(data.label_names or []) or max(2, max(data.labels) + 1)
            self.label_names = _label_names(data.label_names, self.num_labels)
        return self._dataset(data, source=path)

    def read_eval(self, path: str | Path, limit: int | None = None) -> list[dict]:
        # the training classes: the same names and ids, and no label the head has no output for
        names = None if self.regression else self.label_names
        data = self._read(path, where=self.s.validation_where, names=names, num_labels=self.num_labels)
        n = len(data.texts) if limit is None else min(limit, len(data.texts))
        numbers = line_numbers(data.lines[:n])
        flag_empty_texts(path, self.tokenizer, data.texts[:n], data.text_pairs and data.text_pairs[:n],
                         "line" if numbers else "row", numbers)
        return self._dataset(data, limit, path)

    def _dataset(self, data, limit: int | None = None, source: str | Path | None = None) -> list[dict]:
        """The examples, tokenized; texts of `source` cut to max_length are counted on one line."""
        n = len(data.texts) if limit is None else min(limit, len(data.texts))
        labels = [float(y) for y in data.labels[:n]] if self.regression else list(data.labels[:n])
        pairs = None if data.text_pairs is None else data.text_pairs[:n]
        ds = ClassificationDataset(data.texts[:n], labels, self.tokenizer, self.s.max_length, pairs)
        if source is not None:
            self.report_truncated(source, ds.truncated)
        return [ds[i] for i in range(len(ds))]

    def build(self, source: str | Path) -> nn.Module:
        model = build_model(self.role, source, self.tokenizer,
                            num_labels=self.num_labels, classifier_dropout=self.s.classifier_dropout)
        model.id2label = {str(i): n for i, n in enumerate(self.label_names)}
        return model

    def load_metadata(self, meta: dict[str, Any]) -> None:
        super().load_metadata(meta)
        self.num_labels = len(self.label_names or []) or 2

    def loss(self, model: nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
        return compute_classification_loss(encode(model, batch, self.unpadded), batch["labels"]), {}

    def logits(self, model: nn.Module, items: Sequence[dict], precision: Any) -> torch.Tensor:
        return torch.stack(self.outputs(model, items, precision, lambda m, b: encode(m, b, self.unpadded)))

    def evaluate(self, model: nn.Module, items: Sequence[dict], precision: Any) -> dict[str, Any]:
        return self.score(self.logits(model, items, precision), items)

    def score(self, outputs: Sequence[torch.Tensor], items: Sequence[dict]) -> dict[str, Any]:
        logits = torch.stack(list(outputs))  # (N, C)
        if self.regression:
            scores, gold = logits[:, 0].numpy(), np.array([it["labels"] for it in items], dtype=np.float64)
            return {"mse": float(np.mean((scores - gold) ** 2)), "pearson": pearson(scores, gold),
                    "spearman": spearman(scores, gold), "num_examples": len(items)}
        gold = torch.tensor([it["labels"] for it in items])
        report = classification_report_from_predictions(gold.numpy(), logits.argmax(-1).numpy(), self.num_labels,
                                                         self.label_names)
        report["loss"] = float(F.cross_entropy(logits, gold))
        return report

