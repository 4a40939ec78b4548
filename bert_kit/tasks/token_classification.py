"""Token classification (NER): CoNLL files (any whitespace, any word and tag column), one tag per word,
entity-level F1. A sentence longer than max_length is tagged in overlapping windows (`data/ner.py`), so
every word gets the model's tag; `tag_words` is what `predict` and the server's /tag call."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn as nn

from bert_kit.tasks.base import Task, build_model, encode, freeze_pooler
from bert_kit.training.losses import compute_classification_loss


class TokenClassificationTask(Task):
    name, default_metric, role = "token-classification", "f1", "ForTokenClassification"
    read_settings = ("ner.word_column", "ner.tag_column", "encoding")

    def _dataset(self, sentences, limit: int | None = None):
        from bert_kit.data.ner import NERDataset

        return NERDataset(sentences[:limit] if limit else sentences, self.tokenizer, self.label_names,
                          self.s.max_length)

    fixed_labels = False  # True once the labels are those of a saved head

    def load_metadata(self, meta: dict[str, Any]) -> None:
        super().load_metadata(meta)
        self.fixed_labels = True

    def _read(self, path: str | Path, names: list[str] | None = None, names_from: str | None = None) -> list:
        from bert_kit.data.ner import read_conll

        return read_conll(path, self.s.ner.tag_column, self.s.ner.word_column, names,
                          getattr(self.s, "encoding", None), names_from=names_from, what=self.what(path, "CoNLL file"))

    def read_train(self, path: str | Path) -> list[dict]:
        from bert_kit.data.ner import get_label_list

        names = list(self.s.label_names) if self.s.label_names else None
        sentences = self._read(path, names)  # given label_names: every tag must be one of them (file:line)
        self.label_names = names or get_label_list(sentences)
        ds = self._dataset(sentences)
        return [ds[i] for i in range(len(ds))]

    def read_eval(self, path: str | Path, limit: int | None = None) -> Any:
        # the tags are those of a saved head, of given label_names or of the training file: the head has
        # no output for any other, so an unknown tag is an error naming its line (as an unseen class is)
        names_from = ("the model's tags" if self.fixed_labels else None if self.s.label_names
                      else "the training file's tags")
        sentences = self._read(path, self.label_names, names_from)[:limit]
        self.eval_dataset = self._dataset(sentences)
        return [self.eval_dataset[i] for i in range(len(self.eval_dataset))]

    def build(self, source: str | Path) -> nn.Module:
        model = build_model(self.role, source, self.tokenizer,
                            num_labels=len(self.label_names), classifier_dropout=self.s.classifier_dropout)
        model.id2label = {str(i): n for i, n in enumerate(self.label_names)}
        return freeze_pooler(model)

    def loss(self, model: nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
        # (B, T, C) logits against (B, T) labels; -100 (later sub-tokens, specials, padding) ignored
        return compute_classification_loss(encode(model, batch, self.unpadded), batch["labels"]), {}

    def tag(self, model: nn.Module, dataset: Any, precision: Any) -> list[list[str]]:
        """Predicted tags, one per word, for every sentence of an NERDataset: each word's from the
        window where it has the most context (a sentence that fits is one window)."""
        items = [dataset[i] for i in range(len(dataset))]
        logits = self.outputs(model, items, precision, lambda m, b: encode(m, b, self.unpadded))
        return dataset.sentence_tags([row.argmax(-1) for row in logits])

    def tag_words(self, model: nn.Module, sentences: Sequence[Sequence[str]], precision: Any) -> list[list[str]]:
        """Tags of every word of each word list, whatever its length (predict, the server's /tag)."""
        return self.tag(model, self._dataset([(list(words), None) for words in sentences]), precision)

    def evaluate(self, model: nn.Module, items: Sequence[dict], precision: Any) -> dict[str, Any]:
        return self.score(self.outputs(model, items, precision, lambda m, b: encode(m, b, self.unpadded)), items)

    def score(self, outputs: Sequence[torch.Tensor], items: Sequence[dict]) -> dict[str, Any]:
        """Entity scores of the (T, C) logits of every window of the validation set (`read_eval`)."""
        from bert_kit.metrics import entity_f1

        predicted = self.eval_dataset.sentence_tags([row.argmax(-1) for row in outputs])
        gold = [tags for _, tags in self.eval_dataset.sentences]
        scores = entity_f1(gold, predicted)
        words = sum(len(t) for t in gold)
        # word-level accuracy (every word, "O" included) beside the entity scores
        scores["accuracy"] = sum(p == g for ps, gs in zip(predicted, gold) for p, g in zip(ps, gs)) / max(words, 1)
        scores["num_sentences"] = len(gold)
        return scores
