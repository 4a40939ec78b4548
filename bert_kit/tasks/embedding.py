"""Embedding models for search (task: embedding): in-batch negatives on text tuples, scored by retrieval.

    bert-kit finetune --task embedding model=sentence-transformers/all-MiniLM-L6-v2 \\
        train_file=nfcorpus validation_file=nfcorpus batch_size=64 lr=2e-5 epochs=1

Each training example is a tuple of texts (`retrieval.tuples`): an anchor (a query), its positive and
any hard negatives, from a table, an NLI file, a BEIR folder's qrels, or `bert-kit mine-negatives`.
A batch of B tuples with k texts each is embedded as (k, B, H) and trained with MNRL, or its
symmetric form (`training/contrastive.py`): every other row's positive and negatives are an
anchor's negatives, and under torchrun every rank's (`embedding.gather_across_ranks`).
`embedding.no_duplicates` deals the batches so that no text comes twice in one
(`data/no_duplicates.py`). With `embedding.cached: true`, GradCache (`training/grad_cache.py`)
embeds the batch `mini_batch_size` texts at a time, with the gradients of the whole batch: the
contrastive batch (`batch_size`) is no longer bound by the device's memory. `matryoshka_dims`
adds the loss of the vectors' first d components for each d, and scores each width.

The validation data is a BEIR folder, scored as `bert-kit evaluate --task retrieval` scores it
(`RetrievalEvaluator`: nDCG@10 picks best/; `max_eval_examples` queries and `embedding.eval_docs`
documents for a quick subsample), or an STS file (Spearman of the cosines). Under torchrun each
rank embeds its share of the texts. best/ holds the encoder as a sentence-transformers folder
(modules.json, pooling, normalisation): `SentenceTransformer("run/best")` loads it, and so does
every bert-kit command (`embed`, `evaluate --task retrieval`, `serve`).

With engine=jax the loss is `bert_kit/jax/tasks.py`'s `ContrastiveHead` and the evaluation scores
the JAX model's vectors by this task's code (`score_outputs`).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from bert_kit.data.classification import pad_collate
from bert_kit.data.no_duplicates import NoDuplicatesSampler, text_keys
from bert_kit.data.truncation import Truncated, find_truncated
from bert_kit.embeddings import SentenceEncoder, pool
from bert_kit.kernels.packing import Packed
from bert_kit.metrics import pearson, spearman
from bert_kit.model_folder import write_sentence_transformers_files
from bert_kit.tasks import RANK_METRICS, SCORE_METRICS
from bert_kit.tasks.base import Task, build_model, drop_empty_texts, encode, freeze_pooler, shard_and_gather
from bert_kit.training.contrastive import (MAX_LEARNED_SCALE, known_positives, matryoshka_loss,
                                           multiple_negatives_ranking_loss, pair_codes)
from bert_kit.training.distributed import unwrap_model, world_size
from bert_kit.training.grad_cache import cached_loss

STS_METRICS = SCORE_METRICS[:2]


class EmbeddingModel(nn.Module):
    """An encoder of any family (`BERTModel`, `ModernBertModel`, ...) and its pooling: a sentence
    vector (B, H) per text; with a learned contrastive scale, that scale's log (`logit_scale`,
    CLIP's). Checkpoints hold both under the family's HF names (`bert_kit.hf`: the encoder's with
    the family's prefix, `bert.`, `roberta.`, `model.`, and `logit_scale`); the kept folder holds
    the encoder alone."""

    def __init__(self, encoder: nn.Module, pooling: str = "mean", learned_scale: bool = False, scale: float = 20.0):
        super().__init__()
        self.bert, self.config, self.pooling = encoder, encoder.config, pooling
        self.hf_architecture = encoder.hf_architecture  # the checkpoint's config.json names the encoder
        self.logit_scale = nn.Parameter(torch.tensor(math.log(scale))) if learned_scale else None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                unpadded: bool | Packed = False) -> torch.Tensor:
        """(B, T) ids and mask -> pooled vectors (B, H) (float32 for mean pooling)."""
        return pool(self.bert(input_ids, attention_mask, token_type_ids, unpadded=unpadded), attention_mask,
                    self.pooling)


class Vectors:
    """The vectors of lists of texts as the evaluation asks for them (`RetrievalEvaluator` calls
    `encode`): each list embedded once (under torchrun each rank embeds its share), then served at
    any width (`at(d)`: the first d components, renormalised) without embedding again."""

    def __init__(self, encoder: SentenceEncoder, batch_size: int | None, dim: int | None = None,
                 memo: dict | None = None):
        self.encoder, self.batch_size, self.dim = encoder, batch_size, dim
        self.memo: dict[tuple[str, ...], torch.Tensor] = {} if memo is None else memo

    def at(self, dim: int | None) -> "Vectors":
        return Vectors(self.encoder, self.batch_size, dim, self.memo)

    def encode(self, texts: Sequence[str], batch_size: int | None = None, convert_to_tensor: bool = False,
               progress: Any = None, **_: Any) -> torch.Tensor | np.ndarray:
        key = tuple(texts)
        if key not in self.memo:
            if world_size() > 1:
                rows = shard_and_gather(list(texts), lambda share: list(self.encoder.encode(share, self.batch_size)))
                self.memo[key] = torch.from_numpy(np.stack(rows)).to(self.encoder.device)
            else:
                self.memo[key] = self.encoder.encode(list(texts), self.batch_size, convert_to_tensor=True)
        vectors = self.memo[key]
        if self.dim is not None:
            vectors = F.normalize(vectors[:, :self.dim].float(), dim=-1)
        if progress is not None:
            progress(len(texts))
        return vectors if convert_to_tensor else vectors.cpu().numpy()


class OutputsEncoder:
    """`SentenceEncoder.encode` over another engine's forward: texts tokenized as it tokenizes them,
    as one-text examples for `outputs_of` (examples -> a pooled vector (H,) each), normalised."""

    device = torch.device("cpu")

    def __init__(self, task: "EmbeddingTask", outputs_of: Callable[[list], list]):
        self.task, self.outputs_of = task, outputs_of

    def encode(self, texts: Sequence[str], batch_size: int | None = None, convert_to_tensor: bool = False,
               **_: Any) -> torch.Tensor | np.ndarray:
        """(N, H) float32 unit vectors of the texts."""
        ids = self.task.tokenizer(list(texts), max_length=self.task.s.max_length, padding=False, truncation=True,
                                  return_tensors=None)["input_ids"] if texts else []
        rows = self.outputs_of([{"texts": [row], "keys": (i,)} for i, row in enumerate(ids)])
        vectors = torch.stack(rows).float() if rows else torch.zeros(0, 0)
        if not torch.isfinite(vectors).all():
            raise ValueError("the model's vectors of the validation texts are not finite (NaN or inf): the "
                             "weights diverged; lower lr")
        vectors = F.normalize(vectors, dim=-1)
        return vectors if convert_to_tensor else vectors.numpy()


class EmbeddingTask(Task):
    """Contrastive training of a bi-encoder (see the module docstring)."""

    name, role = "embedding", "Model"  # the encoder, in an `EmbeddingModel`
    read_settings = ("encoding", "header", "delimiter")
    ungraphable = "with embedding.cached: true (GradCache replays mini-batches from the backward)"

    def __init__(self, settings: Any):
        super().__init__(settings)
        self.eval_data: Any = None  # a BEIR split, or an STS file's (sentences1, sentences2, scores)

    @property
    def e(self) -> Any:
        return self.s.embedding

    @property
    def graphable(self) -> bool:
        return not self.e.cached

    @property
    def on_beir(self) -> bool:
        return self.eval_data is None or not isinstance(self.eval_data, tuple)

    @property
    def default_metric(self) -> str:
        return "ndcg@10" if self.on_beir else "spearman"

    @property
    def metric_names(self) -> tuple[str, ...]:
        names = RANK_METRICS if self.on_beir else STS_METRICS
        return names + tuple(f"{n}_dim{d}" for d in self.other_dims() for n in names)

    def other_dims(self, width: int | None = None) -> list[int]:
        """The Matryoshka widths scored besides the full one (`width`: the model's, when known)."""
        return [d for d in self.e.matryoshka_dims or () if d != width]

    # ---- data -----------------------------------------------------------------------------------

    def read_train(self, path: str | Path, limit: int | None = None) -> list[dict]:
        from bert_kit.retrieval.tuples import read_tuples

        s = self.s
        tuples = read_tuples(path, self.e.columns, s.header, s.delimiter, s.where, s.encoding, self.e.split)
        columns, lines = tuples.columns, tuples.lines
        drop_empty_texts(path, self.tokenizer, lines, columns, [lines])  # a text without tokens teaches nothing
        print(tuples.source, flush=True)
        every = text_keys(columns)  # equal texts, equal ids: for the no-duplicates batches, and the known pairs
        if self.e.exclude_known_positives and every:  # the pairs of every row, those past the limit too
            self.known_pairs, self.num_texts = pair_codes(every)
        columns = [column[:limit] for column in columns]  # tokenize (and count cut) only what trains
        keys = every[:len(columns[0])]
        prefixes = [self.e.query_prefix] + [self.e.passage_prefix] * (len(columns) - 1)
        ids, found = [], Truncated(len(keys), s.max_length)
        for prefix, texts in zip(prefixes, columns):
            texts = [prefix + t for t in texts] if prefix else texts
            tokens = self.tokenizer(texts, max_length=s.max_length, padding=False, return_tensors=None)["input_ids"]
            cut = find_truncated(self.tokenizer, texts, None, s.max_length, [len(t) for t in tokens])
            found = found.merge(cut, unit="tuples")
            ids.append(tokens)
        self.report_truncated(path, found)
        return [{"texts": [column[i] for column in ids], "keys": keys[i]} for i in range(len(keys))]

    def read_eval(self, path: str | Path, limit: int | None = None) -> list[str]:
        """A BEIR folder's `embedding.validation_split` (its first `limit` queries drawn at random,
        with `embedding.eval_docs`), or an STS file's pairs; returns the texts to embed."""
        path = Path(path)
        if path.is_dir():
            from bert_kit.retrieval.beir import read_beir, subsample

            data = read_beir(path, self.e.validation_split)
            if limit or self.e.eval_docs:
                data = subsample(data, limit, self.e.eval_docs, seed=self.s.seed)
            self.eval_data = data
            return list(data.queries.values()) + data.corpus_texts
        from bert_kit.data.sts import read_pair_file, read_sts

        s = self.s
        if s.text_pair_column is None:
            pairs = read_sts(path, encoding=s.encoding, what=self.what(path, "STS file"))
        else:
            pairs = read_pair_file(path, s.text_column, s.text_pair_column, s.label_column, (-math.inf, math.inf),
                                   s.header, s.delimiter, s.validation_where, s.encoding,
                                   what=self.what(path, "sentence-pair file"))
        self.eval_data = tuple(column[:limit] for column in pairs)
        return self.eval_data[0] + self.eval_data[1]

    def sampler(self, items: Sequence[dict], batch_size: int, seed: int) -> Any:
        if not self.e.no_duplicates:
            return super().sampler(items, batch_size, seed)
        from bert_kit.training.distributed import rank

        return NoDuplicatesSampler([item["keys"] for item in items], batch_size, seed, rank(), world_size())

    def collate(self, items: list[dict]) -> dict:
        """Column after column, (k B, T): anchors, positives, negatives. With embedding.cached, each
        mini-batch's padded length (and packing layout) is laid out here, on the host."""
        k = len(items[0]["texts"])
        rows = [item["texts"][c] for c in range(k) for item in items]
        out = pad_collate([{"input_ids": ids} for ids in rows], self.pad_token_id, self.pad_multiple)
        lengths = torch.tensor([len(ids) for ids in rows])
        T = out["input_ids"].shape[1]
        out["attention_mask"] = (torch.arange(T)[None, :] < lengths[:, None]).long()
        out["token_type_ids"] = torch.zeros_like(out["input_ids"])
        out["columns"] = k
        out["keys"] = torch.tensor([item["keys"] for item in items], dtype=torch.int64).T  # (k, B) text ids
        if self.e.cached:
            size, multiple = self.e.mini_batch_size, self.pad_multiple
            spans = [(start, min(start + size, len(rows))) for start in range(0, len(rows), size)]
            out["chunk_lengths"] = [-(-int(lengths[a:b].max()) // multiple) * multiple for a, b in spans]
            if self.unpadded is True:
                for i, ((a, b), length) in enumerate(zip(spans, out["chunk_lengths"])):
                    out[f"packed_{i}"] = Packed.from_mask(out["attention_mask"][a:b, :length])
        return out

    def count(self, batch: dict) -> int:
        return len(batch["input_ids"]) // batch["columns"]

    # ---- model and loss -------------------------------------------------------------------------

    def build(self, source: str | Path) -> nn.Module:
        encoder = build_model(self.role, source, self.tokenizer)
        dims = self.e.matryoshka_dims or ()
        if dims and max(dims) > encoder.config.hidden_size:
            raise ValueError(f"embedding.matryoshka_dims {list(dims)} exceeds the model's width "
                             f"{encoder.config.hidden_size} (hidden_size)")
        # a sentence vector is pooled from the states, never by the [CLS] pooler: frozen (DDP would wait for it)
        return freeze_pooler(EmbeddingModel(encoder, self.e.pooling, learned_scale=self.e.scale == "learned"))

    def load(self, folder: str | Path) -> nn.Module:
        return EmbeddingModel(super().load(folder), self.e.pooling)

    def loss_of_vectors(self, columns: int, vectors: torch.Tensor, log_scale: torch.Tensor | None,
                        keys: torch.Tensor | None = None) -> torch.Tensor:
        """The contrastive loss of a batch's vectors (k B, H), column after column; keys (k, B):
        the texts' ids, for embedding.exclude_known_positives."""
        cols = vectors.view(columns, -1, vectors.shape[-1])  # (k, B, H)
        scale = self.e.scale if log_scale is None else log_scale.exp().clamp(max=MAX_LEARNED_SCALE)
        gather = self.e.gather_across_ranks and world_size() > 1
        exclude = None
        if self.e.exclude_known_positives and keys is not None and hasattr(self, "known_pairs"):
            pairs = self.known_pairs = self.known_pairs.to(vectors.device)
            exclude = functools.partial(known_positives, pairs=pairs, texts=self.num_texts)
            keys = keys.to(vectors.device)

        def mnrl(c: torch.Tensor) -> torch.Tensor:
            return multiple_negatives_ranking_loss(c, scale, self.e.loss == "symmetric", gather, exclude, keys)

        dims = self.e.matryoshka_dims
        return matryoshka_loss(mnrl, cols, dims, self.e.matryoshka_weights) if dims else mnrl(cols)

    def loss(self, model: nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
        core = unwrap_model(model)
        log_scale, k = core.logit_scale, batch["columns"]
        keys = batch.get("keys")
        if not self.e.cached:  # one forward pass over every text of the batch
            return self.loss_of_vectors(k, encode(model, batch, self.unpadded), log_scale, keys), {}
        size = self.e.mini_batch_size

        def embed(i: int) -> torch.Tensor:  # mini-batch i, cut to its own padded length
            rows, length = slice(i * size, (i + 1) * size), batch["chunk_lengths"][i]
            mask = batch["attention_mask"][rows, :length]
            layout: Any = False
            if self.unpadded is True:
                layout = batch[f"packed_{i}"]
            elif self.unpadded == "rows":
                layout = Packed.of_rows(mask)
            return model(batch["input_ids"][rows, :length], mask, batch["token_type_ids"][rows, :length],
                         unpadded=layout)

        loss = cached_loss(embed, len(batch["chunk_lengths"]), lambda v, s: self.loss_of_vectors(k, v, s, keys),
                           batch["input_ids"].device, log_scale, model)
        return loss, {}

    # ---- the kept folder ------------------------------------------------------------------------

    def save_model(self, model: nn.Module, folder: Path, state: dict[str, torch.Tensor] | None = None) -> None:
        """The encoder alone (a BertModel folder) and sentence-transformers' files (pooling, normalisation)."""
        from bert_kit.training.checkpoint import save_model

        core = unwrap_model(model)
        encoder = None if state is None else {k[len("bert."):]: v for k, v in state.items() if k.startswith("bert.")}
        save_model(core.bert, folder, encoder)
        write_sentence_transformers_files(folder, self.e.pooling, self.s.max_length)

    def metadata(self) -> dict[str, Any]:
        e = self.e
        return {**super().metadata(), "pooling": e.pooling, "loss": e.loss, "matryoshka_dims": e.matryoshka_dims,
                "query_prefix": e.query_prefix, "passage_prefix": e.passage_prefix}

    # ---- evaluation -----------------------------------------------------------------------------

    def evaluate(self, model: nn.Module, items: Sequence[Any], precision: Any) -> dict[str, Any]:
        """Retrieval metrics on the BEIR split (or Spearman and Pearson on the STS pairs), at the full
        width and at each other Matryoshka width (`ndcg@10_dim128`)."""
        core = unwrap_model(model)
        encoder_model = core.bert if isinstance(core, EmbeddingModel) else core
        was_training = encoder_model.training
        try:
            encoder = SentenceEncoder(encoder_model, self.tokenizer, self.e.pooling, True, self.s.max_length,
                                      precision.device, unpadded=True, precision=precision.name)
            return self.metrics_of(Vectors(encoder, None))
        finally:
            encoder_model.train(was_training)

    def score_outputs(self, items: Sequence[Any], outputs_of: Callable[[list], list]) -> dict[str, Any]:
        """The metrics of another engine's vectors (the JAX engine's): `outputs_of(examples)` gives
        the pooled vector (H,) of each example of one text (`collate`'s), scored as `evaluate` scores."""
        return self.metrics_of(Vectors(OutputsEncoder(self, outputs_of), None))

    def metrics_of(self, vectors: Vectors) -> dict[str, Any]:
        """The metrics at the full width, then at each other Matryoshka width."""
        metrics = self.score(vectors)
        width = next((v.shape[-1] for v in vectors.memo.values()), None)  # the model's, as embedded
        names = RANK_METRICS if self.on_beir else STS_METRICS
        for d in self.other_dims(width):
            metrics.update({f"{n}_dim{d}": v for n, v in self.score(vectors.at(d)).items() if n in names})
        return metrics

    def score(self, vectors: Vectors) -> dict[str, Any]:
        if self.on_beir:
            from bert_kit.retrieval.evaluator import RetrievalEvaluator

            return RetrievalEvaluator(self.eval_data, query_prefix=self.e.query_prefix,
                                      passage_prefix=self.e.passage_prefix)(vectors)
        s1, s2, gold = self.eval_data
        a, b = (F.normalize(vectors.encode(texts, convert_to_tensor=True).float(), dim=-1) for texts in (s1, s2))
        cosine = (a * b).sum(-1).double().cpu().numpy()
        return {"pearson": pearson(cosine, gold), "spearman": spearman(cosine, gold), "num_examples": len(gold)}
