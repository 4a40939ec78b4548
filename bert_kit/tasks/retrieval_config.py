"""The settings groups of the retrieval tasks: `embedding:` (task: embedding) and `reranker:` (task: reranker).

Plain Python (no torch), as `FinetuneConfig`, which holds them:

    task: embedding
    embedding: {loss: mnrl, cached: true, mini_batch_size: 64, matryoshka_dims: [384, 256, 128, 64]}
    batch_size: 4096                                   # the contrastive batch: 4,095 negatives a query

docs/retrieval.md describes what each does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from bert_kit.checks import ConfigError, Range, check_settings, positive
from bert_kit.data.tables import column_ref


def _columns(value: Any, key: str, at_least: int) -> list | None:
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or len(value) < at_least:
        raise ConfigError(f"{key} must list {at_least} or more columns (names or 0-based indices), got {value!r}")
    columns = [column_ref(c, key) for c in value]
    if len(set(columns)) != len(columns):
        raise ConfigError(f"{key} names a column twice: {columns}")
    return columns


@dataclass
class EmbeddingSettings:
    """Embedding models for search (task: embedding): in-batch negatives on text tuples."""

    columns: list[int | str] | None = None
    """a table's text columns: anchor, positive, then negatives (names or 0-based indices); default:
    every column of its header or JSON keys (an NLI file: its (premise, entailment, contradiction) triplets)"""
    split: str = "train"  # a BEIR folder as train_file: the qrels split whose (query, document) pairs train
    validation_split: str = "dev"  # a BEIR folder as validation_file: the split scored during training
    eval_docs: int | None = None
    """a BEIR validation_file: search the judged documents of the scored queries and others drawn at
    random up to this many in all (a quick score; max_eval_examples draws the queries)"""
    pooling: Literal["mean", "cls"] = "mean"  # sentence vector: the mean of the token states, or [CLS]'s
    loss: Literal["mnrl", "symmetric"] = "mnrl"  # MNRL, or also each positive against the anchors
    scale: float | Literal["learned"] = 20.0  # 1 / temperature of the cosine scores; learned: from 20, up to 100
    cached: bool = False  # GradCache: the contrastive batch (batch_size) embedded mini_batch_size rows at a time
    mini_batch_size: int = 32  # rows (texts) a forward pass with cached: true
    gather_across_ranks: bool = True  # under torchrun, every rank's texts are every anchor's candidates
    no_duplicates: bool = True  # no text twice in a batch (an in-batch negative that is a copy of a positive)
    exclude_known_positives: bool = False
    """leave out of an anchor's negatives every candidate the training data pairs with it (another
    row's positive, or a "negative", that a row of the same anchor holds as its positive)"""
    matryoshka_dims: list[int] | None = None  # also train (and score) the first d components, e.g. [384, 256, 128, 64]
    matryoshka_weights: list[float] | None = None  # the loss of each of matryoshka_dims (default 1 each)
    query_prefix: str = ""  # before every anchor (query), e.g. "query: " (E5)
    passage_prefix: str = ""  # before every positive and negative, e.g. "passage: "

    def __post_init__(self) -> None:
        check_settings(self, {"eval_docs": positive(integer=True, optional=True),
                              "mini_batch_size": positive(integer=True)}, prefix="embedding.")
        self.columns = _columns(self.columns, "embedding.columns", 2)
        if self.scale != "learned":
            Range(0, low_open=True).check("embedding.scale", self.scale)
        dims = self.matryoshka_dims
        if dims is not None:
            if not dims or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims) \
                    or len(set(dims)) != len(dims):
                raise ConfigError(f"embedding.matryoshka_dims must be distinct positive integers, e.g. [384, 256, 128, "
                                  f"64], got {dims!r}")
            self.matryoshka_dims = sorted(dims, reverse=True)
        weights = self.matryoshka_weights
        if weights is not None:
            if dims is None or len(weights) != len(dims):
                raise ConfigError(f"embedding.matryoshka_weights needs one weight per matryoshka_dims entry, got "
                                  f"{weights!r} for {dims!r}")
            if not all(isinstance(w, (int, float)) and math.isfinite(w) and w >= 0 for w in weights):
                raise ConfigError(f"embedding.matryoshka_weights must be finite numbers >= 0, got {weights!r}")
            order = sorted(range(len(dims)), key=lambda i: -dims[i])  # as the dims were sorted
            self.matryoshka_weights = [float(weights[i]) for i in order]


@dataclass
class RerankerSettings:
    """Rerankers (task: reranker): a cross-encoder scoring (query, passage) pairs."""

    columns: list[int | str] | None = None
    """a table's query, passage and label columns; default: query, passage, label, or a tuple file's
    anchor, positive and negatives (the positive relevant, the negatives not)"""
    split: str = "train"  # a BEIR folder as train_file: the qrels split to train on
    validation_split: str = "dev"  # a BEIR folder as validation_file: the split scored during training
    loss: Literal["bce", "listnet", "lambdaloss"] = "bce"
    """bce: each pair on its own (binary cross-entropy, labels clamped to [0, 1]); listnet / lambdaloss:
    a query's candidates together (batch_size counts queries)"""
    negatives: int = 7
    """a BEIR folder: unjudged documents drawn as negatives for each relevant document (training) or
    each query (validation)"""
    max_candidates: int | None = None  # listwise training: at most this many candidates a group (its first ones)

    def __post_init__(self) -> None:
        check_settings(self, {"negatives": Range(0, integer=True),
                              "max_candidates": positive(integer=True, optional=True)}, prefix="reranker.")
        self.columns = _columns(self.columns, "reranker.columns", 2)

    @property
    def listwise(self) -> bool:
        return self.loss != "bce"
