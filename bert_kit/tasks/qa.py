"""Extractive question answering: SQuAD v1.1 JSON (every answer checked against its context), windows
over long contexts, EM/F1."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from bert_kit.tasks.base import Task, build_model, encode, freeze_pooler


class QATask(Task):
    name, default_metric, role = "qa", "f1", "ForQuestionAnswering"

    def _examples(self, path: str | Path, part: str) -> list[dict]:
        """SQuAD examples; with `qa.train_articles` N, train on the first N articles, evaluate on the rest."""
        from bert_kit.data.squad import read_squad, split_by_article

        examples = read_squad(path, self.s.qa.skip_bad_answers, getattr(self.s, "encoding", None),
                              self.what(path, "SQuAD file"))
        n = self.s.qa.train_articles
        if n:
            train, held_out = split_by_article(examples, n)
            examples = train if part == "train" else held_out
        return examples

    def read_train(self, path: str | Path, limit: int | None = None) -> list[dict]:
        """The training features (windows) of `path`, the first `limit` of them."""
        from bert_kit.data.squad import prepare_train_features

        self.label_names = None
        examples = self._examples(path, "train")
        self.report_long_questions(path, examples)
        return prepare_train_features(examples, self.tokenizer, self.s.max_length, self.s.qa.doc_stride,
                                      self.s.qa.max_query_length)[:limit]

    def read_eval(self, path: str | Path, limit: int | None = None) -> list[dict]:
        from bert_kit.data.squad import prepare_eval_features

        self.eval_examples = self._examples(path, "eval")[:limit]
        self.report_long_questions(path, self.eval_examples)
        return prepare_eval_features(self.eval_examples, self.tokenizer, self.s.max_length, self.s.qa.doc_stride,
                                     self.s.qa.max_query_length)

    def report_long_questions(self, path: str | Path, examples: list[dict]) -> None:
        """Contexts are read whole, in windows; questions are cut to max_query_length: say how many."""
        from bert_kit.data.truncation import find_long_questions, report_truncated

        questions = [ex["question"].lstrip() for ex in examples]
        report_truncated(find_long_questions(self.tokenizer, questions, self.s.qa.max_query_length), path)

    def metadata(self) -> dict[str, Any]:
        qa = self.s.qa
        return {**super().metadata(), "doc_stride": qa.doc_stride, "max_query_length": qa.max_query_length}

    def build(self, source: str | Path) -> nn.Module:
        return freeze_pooler(build_model(self.role, source, self.tokenizer))

    def loss(self, model: nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
        start, end = encode(model, batch, self.unpadded)  # (B, T) each
        # mean of the start and end cross-entropies, as BERT; targets are 0 ([CLS]) when the
        # window does not hold the answer; padding is never an answer (nor its share of the softmax,
        # so the loss is the same however far a batch is padded)
        padding = batch["attention_mask"] == 0
        start, end = (x.float().masked_fill(padding, torch.finfo(torch.float32).min) for x in (start, end))
        loss = (F.cross_entropy(start, batch["start_positions"]) + F.cross_entropy(end, batch["end_positions"])) / 2
        return loss, {}

    def answers(self, model: nn.Module, examples: list[dict], features: list[dict], precision: Any) -> dict[str, str]:
        rows = self.outputs(model, features, precision, lambda m, b: torch.stack(encode(m, b, self.unpadded), 1))
        return self.answers_of(rows, examples, features)

    def answers_of(self, rows: list[torch.Tensor], examples: list[dict], features: list[dict]) -> dict[str, str]:
        """The answer text of each example from its windows' (2, T) start and end logit rows."""
        from bert_kit.data.squad import postprocess_predictions

        return postprocess_predictions(examples, features, [r[0].numpy() for r in rows], [r[1].numpy() for r in rows],
                                       self.s.qa.n_best, self.s.qa.max_answer_length)

    def evaluate(self, model: nn.Module, features: list[dict], precision: Any) -> dict[str, Any]:
        return self.score(self.outputs(model, features, precision,
                                       lambda m, b: torch.stack(encode(m, b, self.unpadded), 1)), features)

    def score(self, outputs: list[torch.Tensor], features: list[dict]) -> dict[str, Any]:
        """EM and F1 of the answers read from each window's (2, T) start and end logits."""
        from bert_kit.metrics import squad_evaluate

        scores = squad_evaluate(self.answers_of(outputs, self.eval_examples, features), self.eval_examples)
        return {**scores, "num_examples": len(self.eval_examples), "num_features": len(features)}
