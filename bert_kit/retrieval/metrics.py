"""Retrieval metrics with the definitions of trec_eval (`pytrec_eval`) and MTEB.

For one query, the retrieved documents are ranked by score, highest first, and documents of
equal score by document id, highest first (trec_eval sorts so; MTEB sorts its MRR the same way).
With rel(d) the query's judgment of document d (0 when unjudged), R the number of documents
judged relevant (rel > 0), and rel_i the judgment of the document at rank i = 1, 2, ...:

    nDCG@k      DCG@k / ideal DCG@k, DCG@k = sum_{i<=k} max(rel_i, 0) / log2(i + 1); the ideal
                ranks every judged relevant document first, highest grade first (0 if none)
    MRR@k       1 / the rank of the first relevant document within the top k (0 if none)
    Recall@k    relevant documents in the top k / R (0 if R = 0)
    MAP@k       sum over the relevant documents in the top k of precision at their rank, / R
    P@k         relevant documents in the top k / k

nDCG uses the grades as gains (linear, as trec_eval's ndcg_cut); the other metrics count a
document relevant when its grade is > 0. A query's metrics are averaged over the queries the
judgments name (MTEB drops queries without any judgment; a query whose judgments are all <= 0 is
kept and scores 0, as pytrec_eval and MTEB count it). Values are fractions (MTEB's 31.59 is 0.3159).
`tests/retrieval/test_metrics.py` holds these to pytrec_eval on random runs with ties.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

METRICS = ("ndcg", "mrr", "recall", "map", "precision")
# what MTEB's and BEIR's tables lead with: nDCG@10, MRR@10, Recall@1/10/100, MAP@100
DEFAULT_CUTOFFS: dict[str, tuple[int, ...]] = {"ndcg": (10,), "mrr": (10,), "recall": (1, 10, 100), "map": (100,)}


def check_cutoffs(cutoffs: Mapping[str, Iterable[int]]) -> dict[str, tuple[int, ...]]:
    """{metric: sorted unique cutoffs}; unknown metrics or cutoffs < 1 are a ValueError."""
    out = {}
    for name, ks in cutoffs.items():
        if name not in METRICS:
            raise ValueError(f"unknown retrieval metric {name!r}: expected one of {METRICS}")
        ks = tuple(sorted({int(k) for k in ks}))
        if any(k < 1 for k in ks):
            raise ValueError(f"{name} cutoffs must be >= 1, got {list(ks)}")
        if ks:
            out[name] = ks
    if not out:
        raise ValueError("no retrieval metric asked for")
    return out


def metric_names(cutoffs: Mapping[str, Sequence[int]]) -> list[str]:
    """"ndcg@10", "recall@1", ... in the order of METRICS."""
    return [f"{name}@{k}" for name in METRICS for k in cutoffs.get(name, ())]


def max_cutoff(cutoffs: Mapping[str, Sequence[int]]) -> int:
    """The depth a ranking needs for these metrics."""
    return max(k for ks in cutoffs.values() for k in ks)


def ranked(doc_ids: Sequence[str], scores: Sequence[float]) -> list[str]:
    """Document ids by score, highest first; ties by document id, highest first (as trec_eval)."""
    if len(doc_ids) != len(scores):
        raise ValueError(f"{len(doc_ids)} document ids but {len(scores)} scores")
    order = sorted(range(len(doc_ids)), key=lambda i: (scores[i], doc_ids[i]), reverse=True)
    return [doc_ids[i] for i in order]


def query_metrics(judged: Mapping[str, int], ranking: Sequence[str],
                  cutoffs: Mapping[str, Sequence[int]] = DEFAULT_CUTOFFS) -> dict[str, float]:
    """The metrics of one query: `judged` its judgments {document id: grade}, `ranking` the
    retrieved document ids best first (see `ranked`)."""
    grades = [judged.get(doc, 0) for doc in ranking]
    relevant = [g > 0 for g in grades]
    num_relevant = sum(1 for g in judged.values() if g > 0)
    out = {}
    for k in cutoffs.get("ndcg", ()):
        ideal = sorted((g for g in judged.values() if g > 0), reverse=True)[:k]
        idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
        dcg = sum(g / math.log2(i + 2) for i, g in enumerate(grades[:k]) if g > 0)
        out[f"ndcg@{k}"] = dcg / idcg if idcg > 0 else 0.0
    for k in cutoffs.get("mrr", ()):
        first = next((i for i, rel in enumerate(relevant[:k]) if rel), None)
        out[f"mrr@{k}"] = 0.0 if first is None else 1.0 / (first + 1)
    for k in cutoffs.get("recall", ()):
        out[f"recall@{k}"] = sum(relevant[:k]) / num_relevant if num_relevant else 0.0
    for k in cutoffs.get("map", ()):
        hits, total = 0, 0.0
        for i, rel in enumerate(relevant[:k]):
            if rel:
                hits += 1
                total += hits / (i + 1)
        out[f"map@{k}"] = total / num_relevant if num_relevant else 0.0
    for k in cutoffs.get("precision", ()):
        out[f"precision@{k}"] = sum(relevant[:k]) / k
    return {name: out[name] for name in metric_names(cutoffs)}


def mean_metrics(per_query: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """The average of each metric over the queries."""
    if not per_query:
        raise ValueError("no query to average over")
    names = next(iter(per_query.values())).keys()
    return {name: sum(m[name] for m in per_query.values()) / len(per_query) for name in names}


def evaluate_run(qrels: Mapping[str, Mapping[str, int]], run: Mapping[str, Mapping[str, float]],
                 cutoffs: Mapping[str, Sequence[int]] = DEFAULT_CUTOFFS, per_query: bool = False
                 ) -> dict[str, float] | dict[str, dict[str, float]]:
    """Metrics of a run {query id: {document id: score}} against judgments {query id: {document
    id: grade}}, averaged over the judged queries that the run answers (pytrec_eval's set, which
    is every judged query for a search over them all); per_query: each query's metrics instead."""
    cutoffs = check_cutoffs(cutoffs)
    scores = {q: query_metrics(qrels[q], ranked(list(docs), list(docs.values())), cutoffs)
              for q, docs in run.items() if q in qrels}
    return scores if per_query else mean_metrics(scores)
