"""Scoring an embedding model on a BEIR split, as MTEB does: embed, search, rank, average.

    data = read_beir("nfcorpus", split="test")
    evaluator = RetrievalEvaluator(data)                          # nDCG@10, MRR@10, Recall@1/10/100, MAP@100
    metrics = evaluator(SentenceEncoder.from_pretrained("sentence-transformers/all-MiniLM-L6-v2"))
    metrics["ndcg@10"]                                            # 0.3162 (MTEB publishes 31.59)

The queries are embedded first (with `query_prefix`, e.g. "query: " for E5 models), then the
corpus in chunks of `corpus_chunk_size` documents (with `passage_prefix`), each chunk searched
as soon as it is embedded (`search.ExactSearch`, or a FAISS index with `index`), so only one
chunk of document vectors is held at a time. The top `top_k` documents of each query (default:
the largest cutoff) are ranked and scored with `metrics.query_metrics`.

During training, `evaluate_model(model, tokenizer)` scores a model being trained and puts it
back in training mode; `beir.subsample` makes a split small enough to score often.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from bert_kit.embeddings import SentenceEncoder
from bert_kit.outputs import write_text
from bert_kit.retrieval.beir import BeirData
from bert_kit.retrieval.metrics import (DEFAULT_CUTOFFS, check_cutoffs, max_cutoff, mean_metrics, query_metrics,
                                        ranked)
from bert_kit.retrieval.search import ExactSearch, FaissSearch, check_score_function

CORPUS_CHUNK = 50_000  # documents embedded, then searched, at a time


@dataclass
class Ranking:
    """The top documents of each query: query_ids (Q,), doc_ids[q] and scores[q] best first
    (equal scores by document id, highest first, as trec_eval ranks them)."""

    query_ids: list[str]
    doc_ids: list[list[str]]
    scores: list[list[float]]

    def run(self) -> dict[str, dict[str, float]]:
        """As pytrec_eval takes it: {query id: {document id: score}}."""
        return {q: dict(zip(docs, scores)) for q, docs, scores in zip(self.query_ids, self.doc_ids, self.scores)}

    def write_trec(self, path: str | Path, tag: str = "bert-kit") -> Path:
        """A TREC run file: `query-id Q0 doc-id rank score tag` per line (trec_eval reads it)."""
        lines = [f"{q} Q0 {doc} {rank} {score!r} {tag}\n" for q, docs, scores in
                 zip(self.query_ids, self.doc_ids, self.scores)
                 for rank, (doc, score) in enumerate(zip(docs, scores), 1)]
        return write_text(path, "".join(lines))


class RetrievalEvaluator:
    """Retrieval metrics of an embedding model on one BEIR split.

    data: the split (`beir.read_beir`); cutoffs: {metric: ks} (`metrics.DEFAULT_CUTOFFS`);
    query_prefix / passage_prefix: put before each query / document; score_function: "cos" or
    "dot"; top_k: documents retrieved per query (default: the largest cutoff); corpus_chunk_size:
    documents embedded and searched at a time; index: a FAISS factory string ("Flat", "HNSW32",
    "IVF4096,PQ64") instead of the exact search; batch_size: at most this many texts a batch
    (the encoder's token budget decides otherwise); show_progress: a bar over the corpus.
    """

    def __init__(self, data: BeirData, cutoffs: Mapping[str, Sequence[int]] = DEFAULT_CUTOFFS,
                 query_prefix: str = "", passage_prefix: str = "", score_function: str = "cos",
                 top_k: int | None = None, corpus_chunk_size: int = CORPUS_CHUNK, index: str | None = None,
                 batch_size: int | None = None, show_progress: bool = False):
        self.data = data
        self.cutoffs = check_cutoffs(cutoffs)
        self.query_prefix, self.passage_prefix = query_prefix, passage_prefix
        self.score_function = check_score_function(score_function)
        self.top_k = top_k or max_cutoff(self.cutoffs)
        if self.top_k < 1 or corpus_chunk_size < 1:
            raise ValueError(f"top_k and corpus_chunk_size must be >= 1, got {self.top_k} and {corpus_chunk_size}")
        self.corpus_chunk_size, self.index = corpus_chunk_size, index
        self.batch_size, self.show_progress = batch_size, show_progress
        self.seconds: dict[str, float] = {}

    def search(self, encoder: SentenceEncoder) -> Ranking:
        """Embed the queries and the corpus and retrieve the top_k documents of each query."""
        data, t0 = self.data, time.perf_counter()
        query_ids = list(data.qrels)
        queries = encoder.encode([self.query_prefix + data.queries[q] for q in query_ids], self.batch_size,
                                 convert_to_tensor=True)
        t1 = time.perf_counter()
        if self.index is None:
            search = ExactSearch(queries, self.top_k, self.score_function)
        else:
            search = FaissSearch(queries, self.top_k, self.score_function, self.index)
        bar = None
        if self.show_progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(data.corpus_texts), desc="corpus", unit="doc", dynamic_ncols=True)
        try:
            for start in range(0, len(data.corpus_texts), self.corpus_chunk_size):
                chunk = data.corpus_texts[start: start + self.corpus_chunk_size]
                vectors = encoder.encode([self.passage_prefix + text for text in chunk], self.batch_size,
                                         convert_to_tensor=True, progress=bar.update if bar else None)
                search.add(vectors)
        finally:
            if bar is not None:
                bar.close()
        t2 = time.perf_counter()
        scores, indices = search.result()  # (Q, k) each
        ids, doc_ids, kept = data.corpus_ids, [], []
        for srow, irow in zip(scores.tolist(), indices.tolist()):
            found = {ids[j]: s for s, j in zip(srow, irow) if j >= 0}
            order = ranked(list(found), list(found.values()))  # ties by document id, as trec_eval
            doc_ids.append(order)
            kept.append([found[d] for d in order])
        self.seconds = {"queries": round(t1 - t0, 3), "corpus": round(t2 - t1, 3),
                        "search": round(time.perf_counter() - t2, 3)}
        return Ranking(query_ids, doc_ids, kept)

    def score(self, ranking: Ranking, per_query: bool = False) -> dict[str, Any]:
        """The metrics of a ranking, averaged over the judged queries (or each query's, per_query)."""
        scores = {q: query_metrics(self.data.qrels[q], docs, self.cutoffs)
                  for q, docs in zip(ranking.query_ids, ranking.doc_ids)}
        return scores if per_query else mean_metrics(scores)

    def __call__(self, encoder: SentenceEncoder) -> dict[str, Any]:
        """The averaged metrics ("ndcg@10", ...), with the counts of queries and documents."""
        metrics = self.score(self.search(encoder))
        return {**metrics, "num_queries": len(self.data.qrels), "num_docs": len(self.data.corpus_ids),
                "queries_without_relevant": self.data.unanswerable}

    def evaluate_model(self, model: torch.nn.Module, tokenizer: Any, pooling: str = "mean", max_length: int = 256,
                       precision: str = "auto", normalize: bool = True) -> dict[str, Any]:
        """The metrics of a model being trained (a `BERTModel` on its device); it runs in eval mode
        and returns to the mode it was in."""
        was_training = model.training
        device = next(model.parameters()).device
        try:
            encoder = SentenceEncoder(model, tokenizer, pooling, normalize, max_length, device, precision=precision)
            return self(encoder)
        finally:
            model.train(was_training)


def format_table(metrics: Mapping[str, Any], names: Sequence[str], **more: Mapping[str, Any]) -> str:
    """Metric names and values, one a line, aligned; `more`: further columns of values, each under
    its name (`first_stage=..., reranked=...`), the first column then under "metric"."""
    width = max(len(n) for n in names)
    if not more:
        return "\n".join(f"  {name:<{width}}  {metrics[name]:.4f}" for name in names)
    heads = [k.replace("_", " ") for k in more]
    lines = ["  " + "metric".ljust(width) + "".join(f"  {h:>12}" for h in heads)]
    lines += ["  " + name.ljust(width) + "".join(f"  {m[name]:>12.4f}" for m in more.values()) for name in names]
    return "\n".join(lines)

