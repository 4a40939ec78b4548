"""Search: the top-k documents of every query, exact on the device or through a FAISS index.

Both take the corpus chunk by chunk (`add`), so no more than one chunk of document vectors is
ever held: a corpus of any size is searched exactly in the memory of its top-k lists.

    search = ExactSearch(query_vectors, k=100, score_function="cos")   # (Q, H) on the device
    for vectors in corpus_chunks:                                     # (n, H) each, in corpus order
        search.add(vectors)
    scores, indices = search.result()                                  # (Q, k) each, best first

`ExactSearch` scores a block of queries against the chunk with one matrix product (float32)
and keeps a running top-k; `FaissSearch` adds the chunks to a FAISS index built from a factory
string ("Flat" exact; "HNSW32", "IVF4096,PQ64" approximate, for corpora whose float32 vectors
would not fit in memory), from the optional extra `pip install bert-kit[retrieval]`.
Score functions: "cos" (cosine: both sides L2-normalised) or "dot".
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

SCORE_FUNCTIONS = ("cos", "dot")
SCORE_BLOCK = 1 << 25  # query x document scores computed at once (128 MB of float32)


def check_score_function(name: str) -> str:
    if name not in SCORE_FUNCTIONS:
        raise ValueError(f"score function must be one of {SCORE_FUNCTIONS}, got {name!r}")
    return name


class ExactSearch:
    """The exact top-k documents of each query, the corpus added in chunks.

    queries: (Q, H) float tensor, on the device the search runs on; k: documents kept per query.
    Among documents of equal score at the k-th place, which ones are kept is arbitrary (the
    metrics then rank ties by document id, as trec_eval)."""

    def __init__(self, queries: torch.Tensor, k: int, score_function: str = "cos"):
        if queries.dim() != 2:
            raise ValueError(f"queries must be (Q, H) vectors, got shape {tuple(queries.shape)}")
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.score_function = check_score_function(score_function)
        queries = queries.float()
        self.queries = F.normalize(queries, dim=-1) if score_function == "cos" else queries
        self.k, self.seen = k, 0
        Q = len(queries)
        self.scores = torch.full((Q, k), -torch.inf, device=queries.device)  # (Q, k) best first
        self.indices = torch.full((Q, k), -1, dtype=torch.long, device=queries.device)

    def add(self, docs: torch.Tensor) -> None:
        """Score the next chunk of the corpus, docs (n, H), whose first row is document `self.seen`."""
        if docs.dim() != 2 or docs.shape[1] != self.queries.shape[1]:
            raise ValueError(f"documents must be (n, {self.queries.shape[1]}) vectors, got shape {tuple(docs.shape)}")
        docs = docs.to(self.queries.device, torch.float32)
        if self.score_function == "cos":
            docs = F.normalize(docs, dim=-1)
        n = len(docs)
        block = max(1, SCORE_BLOCK // max(n, 1))  # queries a block
        top = min(self.k, n)
        for start in range(0, len(self.queries), block):
            rows = slice(start, start + block)
            scores = self.queries[rows] @ docs.T  # (b, n)
            values, where = scores.topk(top, dim=1)  # (b, top)
            merged = torch.cat((self.scores[rows], values), dim=1)  # (b, k + top)
            merged_ids = torch.cat((self.indices[rows], where + self.seen), dim=1)
            best = merged.topk(self.k, dim=1)
            self.scores[rows] = best.values
            self.indices[rows] = merged_ids.gather(1, best.indices)
        self.seen += n

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(scores, document indices), each (Q, min(k, documents added)), best first."""
        k = min(self.k, self.seen)
        return self.scores[:, :k].cpu().numpy(), self.indices[:, :k].cpu().numpy()


def require_faiss():
    try:
        import faiss
    except ImportError:
        raise ImportError("a FAISS index needs the faiss package: pip install bert-kit[retrieval] "
                          "(or faiss-cpu / faiss-gpu)") from None
    return faiss


class FaissSearch:
    """The top-k documents of each query from a FAISS index (`faiss.index_factory` string), built
    as the corpus is added: an index that needs training (IVF, PQ) trains on the first chunk."""

    def __init__(self, queries: torch.Tensor | np.ndarray, k: int, score_function: str = "cos",
                 factory: str = "Flat"):
        self.faiss = require_faiss()
        self.score_function = check_score_function(score_function)
        self.queries = self._prepared(queries)
        self.k, self.seen = k, 0
        try:
            self.index = self.faiss.index_factory(self.queries.shape[1], factory, self.faiss.METRIC_INNER_PRODUCT)
        except RuntimeError as e:
            raise ValueError(f"FAISS cannot build the index {factory!r}: {str(e).strip().splitlines()[-1]}") from None

    def _prepared(self, vectors: torch.Tensor | np.ndarray) -> np.ndarray:
        x = vectors.detach().float().cpu().numpy() if torch.is_tensor(vectors) else np.asarray(vectors, np.float32)
        x = np.ascontiguousarray(x, dtype=np.float32)
        if self.score_function == "cos":
            x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        return x

    def add(self, docs: torch.Tensor | np.ndarray) -> None:
        x = self._prepared(docs)
        if not self.index.is_trained:
            self.index.train(x)
        self.index.add(x)
        self.seen += len(x)

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        k = min(self.k, self.seen)
        scores, indices = self.index.search(self.queries, k)
        return scores.astype(np.float32), indices.astype(np.int64)  # index -1: fewer than k found
