"""Rerankers (task: reranker): a cross-encoder that scores how relevant a passage is to a query.

    bert-kit finetune --task reranker model=sentence-transformers/all-MiniLM-L6-v2 \\
        train_file=hard_negatives.jsonl validation_file=dev_negatives.jsonl reranker.loss=listnet

The model reads "[CLS] query [SEP] passage [SEP]" and gives one logit (the family's
...ForSequenceClassification with one output, the layout of sentence-transformers' `CrossEncoder`,
which loads best/; its score is the sigmoid of the logit). Data (`retrieval.tuples.read_groups`):
(query, passage, label) rows, a tuple file such as `bert-kit mine-negatives` writes (the positive
relevant, the negatives not), or a BEIR folder's judged documents with random negatives. The loss
(`training/ranking.py`) is BCE on each pair, or ListNet / LambdaLoss over each query's candidates,
which a batch then holds together (`batch_size` counts queries). Validation ranks each query's
candidates by score: nDCG@10 (which picks best/), MRR@10, MAP@100 and Recall@k with MTEB's
definitions (`retrieval.metrics`).

A trained reranker rescores a first stage's top-k in `bert-kit evaluate --task retrieval --rerank`,
the candidates of `bert-kit mine-negatives --rescore`, and serves `/rerank` (`retrieval/rerank.py`).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn as nn

from bert_kit.data.classification import ClassificationDataset, pad_collate
from bert_kit.retrieval.metrics import DEFAULT_CUTOFFS, mean_metrics, query_metrics, ranked
from bert_kit.tasks.base import Task, build_model, drop_empty_texts, encode
from bert_kit.training.ranking import binary_cross_entropy, lambda_loss, listnet_loss


def grade(label: float) -> int:
    """A label as the integer grade a ranking metric takes: a grade as it is, a probability >= 0.5 as 1."""
    return int(label) if float(label).is_integer() else int(label >= 0.5)


class RerankerTask(Task):
    """A cross-encoder trained on (query, candidates, labels) groups (see the module docstring)."""

    name, default_metric, role = "reranker", "ndcg@10", "ForSequenceClassification"
    read_settings = ("encoding", "header", "delimiter")

    @property
    def r(self) -> Any:
        return self.s.reranker

    # ---- data -----------------------------------------------------------------------------------

    def _groups(self, path: str | Path, split: str, where: Any, train: bool, limit: int | None = None) -> list[dict]:
        """Tokenized groups {"pairs": [pair items], "labels": [floats]} of a data file or BEIR folder
        (its first `limit` queries)."""
        from bert_kit.retrieval.tuples import read_groups

        s = self.s
        groups = read_groups(path, self.r.columns, s.header, s.delimiter, where, s.encoding, split, self.r.negatives,
                             s.seed, per_positive=train)
        queries, passages, labels, lines, group = [], [], [], [], []
        keep = self.r.max_candidates if train and self.r.listwise else None
        for g, (q, ps, ls, at) in enumerate(list(zip(groups.queries, groups.passages, groups.labels, groups.lines))
                                            [:limit]):
            for p, lab in list(zip(ps, ls))[:keep]:
                queries.append(q)
                passages.append(p)
                labels.append(lab)
                lines.append(at)
                group.append(g)
        if train:  # a pair without text teaches nothing
            drop_empty_texts(path, self.tokenizer, lines, [queries, passages], [labels, lines, group])
        if train and self.r.listwise and group and max(Counter(group).values()) < 2:
            # a list of one candidate: its softmax is 1 whatever the score, so the loss is 0 and nothing trains
            raise ValueError(f"{path}: every training list holds one candidate, from which reranker.loss="
                             f"{self.r.loss} learns nothing (a loss of 0): give each query negatives (a BEIR "
                             f"folder: reranker.negatives >= 1; reranker.max_candidates >= 2), or use "
                             f"reranker.loss=bce")
        print(groups.source, flush=True)
        data = ClassificationDataset(queries, labels, self.tokenizer, s.max_length, passages)
        self.report_truncated(path, data.truncated)
        items: list[dict] = []
        together = not train or self.r.listwise  # the candidates of a query in one item (else: one pair each)
        for i in range(len(data)):
            pair = {k: v for k, v in data[i].items() if k != "labels"}
            if together and items and items[-1]["group"] == group[i]:
                items[-1]["pairs"].append(pair)
                items[-1]["labels"].append(labels[i])
            else:
                items.append({"group": group[i], "pairs": [pair], "labels": [labels[i]]})
        return items

    def read_train(self, path: str | Path, limit: int | None = None) -> list[dict]:
        return self._groups(path, self.r.split, self.s.where, train=True, limit=limit)

    def read_eval(self, path: str | Path, limit: int | None = None) -> list[dict]:
        return self._groups(path, self.r.validation_split, self.s.validation_where, train=False, limit=limit)

    def collate(self, items: list[dict]) -> dict:
        """The pairs of every group, (P, T), and where each sits in the (Q, n) matrix of the loss
        (pair items alone, as the evaluation scores them: just the pairs)."""
        if "pairs" not in items[0]:
            return pad_collate(items, self.pad_token_id, self.pad_multiple)
        pairs = [pair for item in items for pair in item["pairs"]]
        out = pad_collate(pairs, self.pad_token_id, self.pad_multiple)
        n = max(len(item["pairs"]) for item in items)
        labels = torch.zeros(len(items), n)
        mask = torch.zeros(len(items), n, dtype=torch.bool)
        for q, item in enumerate(items):
            labels[q, : len(item["labels"])] = torch.tensor(item["labels"], dtype=torch.float32)
            mask[q, : len(item["labels"])] = True
        out.update(group_labels=labels, group_mask=mask, slots=mask.flatten().nonzero().squeeze(1))
        return out

    def count(self, batch: dict) -> int:
        return len(batch["group_labels"])  # queries (a pointwise batch: pairs)

    # ---- model and loss -------------------------------------------------------------------------

    def build(self, source: str | Path) -> nn.Module:
        return build_model(self.role, source, self.tokenizer, num_labels=1,
                           classifier_dropout=self.s.classifier_dropout)

    def loss(self, model: nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
        logits = encode(model, batch, self.unpadded)[:, 0].float()  # (P,)
        labels, mask = batch["group_labels"], batch["group_mask"]
        scores = logits.new_zeros(mask.numel()).index_copy(0, batch["slots"], logits).view(mask.shape)  # (Q, n)
        if self.r.loss == "listnet":
            return listnet_loss(scores, labels, mask), {}
        if self.r.loss == "lambdaloss":
            return lambda_loss(scores, labels, mask), {}
        return binary_cross_entropy(scores, labels, mask), {}

    def metadata(self) -> dict[str, Any]:
        return {**super().metadata(), "reranker_loss": self.r.loss}

    # ---- evaluation -----------------------------------------------------------------------------

    def logits(self, model: nn.Module, items: Sequence[dict], precision: Any) -> torch.Tensor:
        """One logit per pair of `items` (pair items), in their order (under torchrun, shared out)."""
        return torch.stack(self.outputs(model, items, precision, lambda m, b: encode(m, b, self.unpadded)))[:, 0]

    def scored_items(self, items: Sequence[dict]) -> list:
        """The pairs of every group, in order: one logit each."""
        return [pair for item in items for pair in item["pairs"]]

    def evaluate(self, model: nn.Module, items: Sequence[dict], precision: Any) -> dict[str, Any]:
        return self.score(list(self.logits(model, self.scored_items(items), precision)), items)

    def score(self, outputs: Sequence[torch.Tensor], items: Sequence[dict]) -> dict[str, Any]:
        """Each query's candidates ranked by their logits (`outputs`, one per pair in order, a scalar
        or (1,) each), scored against their labels: MTEB's ranking metrics, averaged over the queries."""
        per_query, at = {}, 0
        for q, item in enumerate(items):
            n = len(item["pairs"])
            scores = [float(x) for x in outputs[at: at + n]]
            at += n
            ids = [str(j) for j in range(n)]
            per_query[str(q)] = query_metrics({d: grade(lab) for d, lab in zip(ids, item["labels"])},
                                              ranked(ids, scores), DEFAULT_CUTOFFS)
        return {**mean_metrics(per_query), "num_queries": len(items)}
