"""Sentence similarity (STS): a cross-encoder on the pair or a bi-encoder of pooled vectors."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn as nn

from bert_kit.data.classification import ClassificationDataset, pad_collate
from bert_kit.data.truncation import Truncated, find_truncated
from bert_kit.embeddings import SentenceEncoder, pool
from bert_kit.metrics import pearson, spearman
from bert_kit.tasks.base import (Task, build_model, drop_empty_texts, encode, flag_empty_texts, freeze_pooler,
                                 line_numbers, shard_and_gather)
from bert_kit.training.losses import compute_classification_loss, compute_cosent_loss, compute_cosine_similarity_loss


class SimilarityTask(Task):
    """STS: a cross-encoder (regression head on "[CLS] a [SEP] b [SEP]", MSE on the gold score) or
    a bi-encoder (one encoder, pooled vectors u and v, CosineSimilarityLoss: MSE(cos(u, v), the score
    mapped from score_range to [0, 1]), or with similarity.loss=cosent the CoSENT ranking loss on cos(u, v)).

    Files: the STS-B release layout (a preset), or, with text_pair_column set, any pair file with
    the sentences in text_column / text_pair_column and the score in label_column (names or 0-based
    indices), rows filtered by where / validation_where; scores must lie in similarity.score_range."""

    name, default_metric = "similarity", "spearman"
    read_settings = ("text_column", "text_pair_column", "label_column", "header", "delimiter", "encoding")

    @property
    def bi_encoder(self) -> bool:
        return self.s.similarity.mode == "bi-encoder"

    @property
    def score_range(self) -> tuple[float, float]:
        from bert_kit.data.sts import STS_RANGE

        return tuple(self.s.similarity.score_range or STS_RANGE)

    def _read(self, path: str | Path, limit: int | None = None, where: dict | None = None, scored: bool = True,
              text: str | None = None, lines: list[str] | None = None
              ) -> tuple[list[str], list[str], list[float] | None]:
        """(sentences1, sentences2, scores) of the first `limit` pairs; `lines` receives their "file:line"."""
        from bert_kit.data.sts import read_pair_file, read_sts

        s, encoding, found = self.s, getattr(self.s, "encoding", None), []
        if s.text_pair_column is None:  # the STS-B release (or GLUE) layout
            s1, s2, scores = read_sts(path, self.score_range, encoding, text, found, self.what(path, "STS file"))
        else:
            s1, s2, scores = read_pair_file(path, s.text_column, s.text_pair_column, s.label_column if scored else None,
                                            self.score_range, s.header, s.delimiter, where, encoding, text, found,
                                            self.what(path, "sentence-pair file"))
        if lines is not None:
            lines.extend(found[:limit])
        return s1[:limit], s2[:limit], None if scores is None else scores[:limit]

    def _items(self, s1: list[str], s2: list[str], scores: list[float] | None,
               source: str | Path | None = None) -> list[dict]:
        """The tokenized pairs; pairs of `source` cut to max_length are counted on one line."""
        if not self.bi_encoder:  # one "[CLS] s1 [SEP] s2 [SEP]" sequence per pair, the score as label
            ds = ClassificationDataset(s1, scores, self.tokenizer, self.s.max_length, s2)
            found, items = ds.truncated, [ds[i] for i in range(len(ds))]
        else:
            enc = {key: self.tokenizer(texts, max_length=self.s.max_length, padding=False, return_tensors=None)
                   for key, texts in (("a", s1), ("b", s2))}
            found = self.truncation(s1, s2, [list(map(len, enc[side]["input_ids"])) for side in "ab"])
            items, (low, high) = [], self.score_range
            for i in range(len(s1)):
                item = {f"{k}_{side}": enc[side][k][i] for side in "ab" for k in ("input_ids", "attention_mask")}
                if scores is not None:  # cosine targets in [0, 1]
                    item["labels"] = (float(scores[i]) - low) / (high - low)
                items.append(item)
        if source is not None:
            self.report_truncated(source, found)
        return items

    def truncation(self, s1: list[str], s2: list[str], kept: Sequence[Any] = (None, None)) -> Truncated:
        """The pairs cut to max_length: the pair as one sequence (a cross-encoder), or either
        sentence on its own (a bi-encoder). kept: the token counts as truncated, if known."""
        if not self.bi_encoder:
            return find_truncated(self.tokenizer, s1, s2, self.s.max_length, kept[0], "pairs")
        a, b = (find_truncated(self.tokenizer, texts, None, self.s.max_length, k) for texts, k in zip((s1, s2), kept))
        return a.merge(b)

    def read_train(self, path: str | Path, limit: int | None = None) -> list[dict]:
        self.label_names, lines = ["score"], []
        s1, s2, scores = self._read(path, where=self.s.where, lines=lines)
        drop_empty_texts(path, self.tokenizer, lines, [s1, s2], [scores, lines])  # pairs without text teach nothing
        # tokenize (and count cut) only the pairs that train
        return self._items(s1[:limit], s2[:limit], None if scores is None else scores[:limit], path)

    def read_eval(self, path: str | Path, limit: int | None = None) -> list[dict]:
        lines = []
        self.eval_pairs = self._read(path, limit, self.s.validation_where, lines=lines)
        numbers = line_numbers(lines)
        flag_empty_texts(path, self.tokenizer, self.eval_pairs[0], self.eval_pairs[1], "line" if numbers else "row",
                         numbers)
        return self._items(*self.eval_pairs, source=path)

    def collate(self, items: list[dict]) -> dict:
        if not self.bi_encoder:
            return pad_collate(items, self.pad_token_id, self.pad_multiple)
        # all first sentences, then all second ones: (2B, T), one forward pass for both sides
        # (one pass per step also keeps DDP's one-forward-one-backward rule)
        sides = [{"input_ids": it[f"input_ids_{side}"], "attention_mask": it[f"attention_mask_{side}"]}
                 for side in "ab" for it in items]
        out = pad_collate(sides, self.pad_token_id, self.pad_multiple)
        out["token_type_ids"] = torch.zeros_like(out["input_ids"])
        if "labels" in items[0]:
            out["labels"] = torch.tensor([it["labels"] for it in items], dtype=torch.float32)  # (B,)
        return out

    def metadata(self) -> dict[str, Any]:
        return {**super().metadata(), "similarity_mode": self.s.similarity.mode, "pooling": self.s.similarity.pooling,
                "score_range": list(self.score_range)}

    @property
    def role(self) -> str:
        return "Model" if self.bi_encoder else "ForSequenceClassification"

    def build(self, source: str | Path) -> nn.Module:
        if self.bi_encoder:
            return freeze_pooler(build_model(self.role, source, self.tokenizer))
        model = build_model(self.role, source, self.tokenizer, num_labels=1,
                            classifier_dropout=self.s.classifier_dropout)
        model.id2label = {"0": "score"}
        return model

    def embed_pair(self, model: nn.Module, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Pooled vectors u, v (B, H) of both sides of a bi-encoder batch of 2B sentences."""
        hidden = encode(model, batch, self.unpadded)
        vectors = pool(hidden, batch["attention_mask"], self.s.similarity.pooling)  # (2B, H)
        return vectors.chunk(2)

    def loss(self, model: nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
        if not self.bi_encoder:
            return compute_classification_loss(encode(model, batch, self.unpadded), batch["labels"]), {}
        u, v = self.embed_pair(model, batch)
        if self.s.similarity.loss == "cosent":
            return compute_cosent_loss(u, v, batch["labels"]), {}
        return compute_cosine_similarity_loss(u, v, batch["labels"]), {}

    def scores(self, model: nn.Module, s1: list[str], s2: list[str], precision: Any) -> np.ndarray:
        """Predicted similarity of each pair: cosine of pooled vectors, or the regression output."""
        if self.bi_encoder:
            # the SentenceEncoder that embeds after training, so the score is what users get
            encoder = SentenceEncoder(model, self.tokenizer, self.s.similarity.pooling, True, self.s.max_length,
                                      precision.device, unpadded=True, precision=precision.name)
            was_training = model.training
            try:  # under torchrun each rank scores its share of the pairs
                scores = shard_and_gather(list(zip(s1, s2)), lambda pairs: encoder.similarity(
                    [a for a, _ in pairs], [b for _, b in pairs], self.s.eval_batch_size).tolist())
                return np.asarray(scores, dtype=np.float64)
            finally:
                model.train(was_training)
        items = self._items(s1, s2, None)
        rows = self.outputs(model, items, precision, lambda m, b: encode(m, b, self.unpadded))
        return torch.stack(rows)[:, 0].double().numpy()

    def evaluate(self, model: nn.Module, items: Sequence[dict], precision: Any) -> dict[str, Any]:
        return self.metrics(self.scores(model, *self.eval_pairs[:2], precision))

    def metrics(self, predicted: np.ndarray) -> dict[str, Any]:
        """Pearson and Spearman of the predicted similarities with the gold scores (and the MSE of a cross-encoder)."""
        gold = self.eval_pairs[2]
        result = {"pearson": pearson(predicted, gold), "spearman": spearman(predicted, gold), "num_examples": len(gold)}
        if not self.bi_encoder:
            result["mse"] = float(np.mean((predicted - np.asarray(gold)) ** 2))
        return result

    def score(self, outputs: Sequence[torch.Tensor], items: Sequence[dict]) -> dict[str, Any]:
        """The metrics of another engine's outputs for the evaluation pairs: a cross-encoder's (1,)
        score, or a bi-encoder's (2, H) pooled vectors u, v of each pair (scored by their cosine)."""
        rows = torch.stack(list(outputs)).double()
        if self.bi_encoder:
            predicted = torch.nn.functional.cosine_similarity(rows[:, 0], rows[:, 1], dim=-1)
        else:
            predicted = rows[:, 0]
        return self.metrics(predicted.numpy())
