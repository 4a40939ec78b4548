"""Hard negatives: for each (query, positive) pair, passages the model ranks high that are not positives.

The rules are sentence-transformers' `util.mine_hard_negatives`, so a recipe carries over:

1. Queries and passages are deduplicated by text; the corpus is the passages given (a BEIR
   corpus, a file of passages) plus every positive. A query's positives are all the passages
   paired with it (or judged relevant to it, for a BEIR split).
2. Queries and passages are embedded (`query_prefix` / `passage_prefix` before them) and each
   query's `range_max + most positives of a query` best passages retrieved exactly (cosine).
3. `rescore`, when given, rescores those candidates and the positives (a cross-encoder's seam:
   `rescore(query, passages) -> scores`).
4. Candidates are dropped when they are a positive of the query, when they score within
   `margin` of the query's weakest positive (absolute: score > positive - margin; relative:
   score > positive - |positive| * relative_margin), above `max_score` or below `min_score`.
5. The kept candidates, best first, from place `range_min` to `range_max` (counted among the
   kept ones, as sentence-transformers counts), give `num_negatives` negatives: the best ones
   ("top") or drawn at random ("random", seeded).

Output: one row per (pair, negative) as (anchor, positive, negative) triplets, or one row per
pair as (anchor, positive, negative_1..negative_n) when n negatives were found ("n-tuple"),
written as JSON Lines, TSV or CSV (`write_rows`), the files the embedding training task reads.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from bert_kit.embeddings import SentenceEncoder
from bert_kit.outputs import write_text
from bert_kit.retrieval.beir import BeirData
from bert_kit.retrieval.search import ExactSearch

Rescore = Callable[[str, list[str]], Sequence[float]]  # (query, passages) -> a score for each passage
FORMATS = ("triplet", "n-tuple")


@dataclass
class MiningSettings:
    """Which candidates become negatives (see the module docstring; sentence-transformers' names)."""

    num_negatives: int = 3
    range_min: int = 0
    range_max: int | None = None  # default: range_min + num_negatives (x10 with a margin or score limit) + positives
    margin: float | None = None  # absolute_margin
    relative_margin: float | None = None
    max_score: float | None = None
    min_score: float | None = None
    sampling: str = "top"  # or "random"
    seed: int = 0
    format: str = "triplet"  # or "n-tuple"

    def __post_init__(self) -> None:
        if self.num_negatives < 1:
            raise ValueError(f"num_negatives must be >= 1, got {self.num_negatives}")
        if self.range_min < 0:
            raise ValueError(f"range_min must be >= 0, got {self.range_min}")
        if self.sampling not in ("top", "random"):
            raise ValueError(f"sampling must be 'top' or 'random', got {self.sampling!r}")
        if self.format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, got {self.format!r}")
        for name in ("margin", "relative_margin"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.min_score is not None and self.max_score is not None and self.min_score > self.max_score:
            raise ValueError(f"min_score {self.min_score} is above max_score {self.max_score}: no candidate "
                             "scores between them")

    def window(self, most_positives: int) -> int:
        """range_max, checked: at least num_negatives places after range_min."""
        filtered = any(v is not None for v in (self.margin, self.relative_margin, self.max_score, self.min_score))
        range_max = self.range_max
        if range_max is None:
            range_max = self.range_min + self.num_negatives * (10 if filtered else 1) + most_positives
        if range_max - self.range_min < self.num_negatives:
            raise ValueError(f"range_min {self.range_min} to range_max {range_max} leaves fewer than num_negatives "
                             f"{self.num_negatives} places: raise range_max or lower range_min")
        return range_max


@dataclass
class Mined:
    """Mined negatives: anchors, the deduplicated corpus, and per input pair its query, positive
    and negatives (corpus indices, best first) with scores."""

    anchors: list[str]  # unique queries
    corpus: list[str]  # unique passages
    pairs: list[tuple[int, int]]  # (anchor index, positive corpus index) of each input pair
    negatives: list[list[int]]  # per unique query
    negative_scores: list[list[float]]
    positive_scores: list[float]  # per pair
    num_negatives: int = 3  # asked for: an n-tuple needs that many
    skipped: dict[str, int] = field(default_factory=dict)  # candidates dropped by each rule

    def rows(self, format: str = "triplet", scores: bool = False) -> list[dict[str, Any]]:
        """Triplets {anchor, positive, negative} (one per negative) or n-tuples {anchor, positive,
        negative_1..n} (pairs with fewer negatives left out); scores: [positive, negative...] too."""
        out, n = [], self.num_negatives
        for (q, p), pos_score in zip(self.pairs, self.positive_scores):
            base = {"anchor": self.anchors[q], "positive": self.corpus[p]}
            found = list(zip(self.negatives[q], self.negative_scores[q]))
            if format == "triplet":
                for neg, neg_score in found:
                    out.append({**base, "negative": self.corpus[neg], **({"scores": [pos_score, neg_score]}
                                                                          if scores else {})})
            elif len(found) == n:
                row = {**base, **{f"negative_{i}": self.corpus[neg] for i, (neg, _) in enumerate(found, 1)}}
                if scores:
                    row["scores"] = [pos_score] + [s for _, s in found]
                out.append(row)
        return out

    def summary(self) -> str:
        """Counts, and positive / negative score statistics, as sentence-transformers prints them."""
        negs = np.array([s for row in self.negative_scores for s in row], dtype=np.float64)
        pos = np.array(self.positive_scores, dtype=np.float64)
        short = sum(1 for q, _ in self.pairs if len(self.negatives[q]) < self.num_negatives)
        lines = [f"{len(self.pairs)} pairs ({len(self.anchors)} queries), {len(negs)} negatives from "
                 f"{len(self.corpus)} passages"]
        if len(negs):
            lines.append("score     positive  negative")
            for name, fn in (("mean", np.mean), ("median", np.median), ("min", np.min), ("max", np.max)):
                lines.append(f"{name:<8}  {fn(pos):8.4f}  {fn(negs):8.4f}")
        lines += [f"skipped {count} candidate(s) by {rule}" for rule, count in self.skipped.items() if count]
        if short:
            lines.append(f"{short} pair(s) got fewer than {self.num_negatives} negatives (left out of n-tuples): "
                         "raise range_max, or lower the margin")
        return "\n".join(lines)


def mine_hard_negatives(encoder: SentenceEncoder, anchors: Sequence[str], positives: Sequence[str],
                        corpus: Sequence[str] = (), settings: MiningSettings | None = None,
                        query_prefix: str = "", passage_prefix: str = "", rescore: Rescore | None = None,
                        batch_size: int | None = None, show_progress: bool = False) -> Mined:
    """Hard negatives for the pairs (anchors[i], positives[i]) from `corpus` and the positives. The
    passages' vectors are held on the encoder's device while the queries search them."""
    s = settings or MiningSettings()
    if len(anchors) != len(positives):
        raise ValueError(f"{len(anchors)} anchors but {len(positives)} positives")
    if not anchors:
        raise ValueError("no (anchor, positive) pair to mine negatives for")
    queries = list(dict.fromkeys(anchors))
    passages = list(dict.fromkeys([*corpus, *positives]))
    query_at = {q: i for i, q in enumerate(queries)}
    passage_at = {p: i for i, p in enumerate(passages)}
    pairs = [(query_at[a], passage_at[p]) for a, p in zip(anchors, positives)]
    own: list[list[int]] = [[] for _ in queries]  # each query's positives
    for q, p in pairs:
        if p not in own[q]:
            own[q].append(p)
    range_max = s.window(max(map(len, own)))

    # embed and retrieve: the range_max best candidates besides the positives
    q_vectors = encoder.encode([query_prefix + q for q in queries], batch_size, convert_to_tensor=True)
    p_vectors = encoder.encode([passage_prefix + p for p in passages], batch_size, show_progress=show_progress,
                               convert_to_tensor=True)
    search = ExactSearch(q_vectors, range_max + max(map(len, own)), "cos")
    search.add(p_vectors)
    scores_np, indices_np = search.result()
    scores, indices = torch.from_numpy(scores_np.copy()), torch.from_numpy(indices_np.copy())  # (Q, K)
    q_unit = torch.nn.functional.normalize(q_vectors.float(), dim=-1)
    p_unit = torch.nn.functional.normalize(p_vectors.float(), dim=-1)
    pair_q = torch.tensor([q for q, _ in pairs], device=q_unit.device)
    pair_p = torch.tensor([p for _, p in pairs], device=q_unit.device)
    positive_scores = (q_unit[pair_q] * p_unit[pair_p]).sum(-1).cpu()  # (pairs,)

    if rescore is not None:  # e.g. a cross-encoder: its scores replace the embedding model's
        rescored: dict[tuple[int, int], float] = {}  # (query, its positive) -> score
        for q, row in enumerate(indices.tolist()):  # one call a query: its candidates and its positives
            found = [float(x) for x in rescore(queries[q], [passages[j] for j in row + own[q]])]
            scores[q] = torch.tensor(found[:len(row)], dtype=torch.float32)
            rescored.update({(q, p): x for p, x in zip(own[q], found[len(row):])})
        positive_scores = torch.tensor([rescored[pair] for pair in pairs])

    dropped = torch.zeros_like(scores, dtype=torch.bool)
    skipped: dict[str, int] = {}

    def drop(rule: str, mask: torch.Tensor) -> None:
        new = mask & ~dropped
        skipped[rule] = int(new.sum())
        dropped.logical_or_(new)

    positive_mask = torch.stack([torch.isin(indices[q], torch.tensor(own[q])) for q in range(len(queries))])
    dropped |= positive_mask
    weakest_np = np.full(len(queries), np.inf, dtype=np.float32)  # each query's weakest positive: the margin's base
    np.minimum.at(weakest_np, pair_q.cpu().numpy(), positive_scores.numpy().astype(np.float32))
    weakest = torch.from_numpy(weakest_np)
    if s.margin is not None:
        drop("margin", scores + s.margin > weakest[:, None])
    if s.relative_margin is not None:
        drop("relative_margin", scores > (weakest - weakest.abs() * s.relative_margin)[:, None])
    if s.max_score is not None:
        drop("max_score", scores > s.max_score)
    if s.min_score is not None:
        drop("min_score", scores < s.min_score)

    # the kept candidates best first, places range_min..range_max, then n of them
    kept, gone = scores.masked_fill(dropped, -torch.inf).numpy(), dropped.numpy()
    candidates, values = indices.numpy(), scores.numpy()
    order = np.argsort(-kept, axis=1, kind="stable")[:, s.range_min:range_max]  # dropped ones sort last
    generator = np.random.default_rng(s.seed)
    negatives, negative_scores = [], []
    for q in range(len(queries)):
        places = order[q][~gone[q, order[q]]]
        if s.sampling == "random" and len(places) > s.num_negatives:
            places = generator.choice(places, s.num_negatives, replace=False)
            places = places[np.argsort(-kept[q, places], kind="stable")]
        places = places[:s.num_negatives]
        negatives.append(candidates[q, places].tolist())
        negative_scores.append(values[q, places].tolist())
    return Mined(queries, passages, pairs, negatives, negative_scores, positive_scores.tolist(), s.num_negatives,
                 skipped)


def pairs_from_beir(data: BeirData) -> tuple[list[str], list[str]]:
    """(anchors, positives) of a BEIR split: each query with each document it judges relevant (> 0)."""
    text = dict(zip(data.corpus_ids, data.corpus_texts))
    anchors, positives = [], []
    for q, judged in data.qrels.items():
        for doc, grade in judged.items():
            if grade > 0 and doc in text:
                anchors.append(data.queries[q])
                positives.append(text[doc])
    if not anchors:
        raise ValueError(f"{data.name} {data.split}: no query has a relevant document in the corpus")
    return anchors, positives


def write_rows(path: str | Path, rows: list[dict[str, Any]]) -> Path:
    """Rows as JSON Lines (.jsonl), CSV (.csv) or TSV (anything else), with a header line naming
    the columns. A TSV cannot hold a text with a tab or a line break: that is an error naming the row."""
    path = Path(path)
    if path.suffix.lower() in (".jsonl", ".json"):
        return write_text(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    columns = list(rows[0]) if rows else ["anchor", "positive", "negative"]
    flat = [[json.dumps(v) if isinstance(v, list) else v for v in (row[c] for c in columns)] for row in rows]
    if path.suffix.lower() == ".csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerows([columns, *flat])
        return write_text(path, buffer.getvalue())
    for i, row in enumerate(flat):
        bad = next((c for c, v in zip(columns, row) if isinstance(v, str) and any(ch in v for ch in "\t\r\n")), None)
        if bad is not None:
            raise ValueError(f"row {i + 1}: the {bad} text holds a tab or a line break, which a TSV cannot hold: "
                             f"write {path.with_suffix('.jsonl').name} or {path.with_suffix('.csv').name} instead")
    return write_text(path, "".join("\t".join(map(str, row)) + "\n" for row in [columns, *flat]))

