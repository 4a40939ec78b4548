"""Exact search in corpus chunks against the full score matrix; FAISS's flat index against it.

    .venv/bin/python -m pytest tests/retrieval/test_search.py -q
"""

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from bert_kit.retrieval import search as search_module
from bert_kit.retrieval.search import ExactSearch, FaissSearch


def vectors(n: int, dim: int = 16, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, dim, generator=torch.Generator().manual_seed(seed))


def full_topk(queries, docs, k, score):
    if score == "cos":
        queries, docs = (torch.nn.functional.normalize(x, dim=-1) for x in (queries, docs))
    return (queries @ docs.T).topk(k, dim=1)


@pytest.mark.parametrize("score", ["cos", "dot"])
@pytest.mark.parametrize("chunks", [[100], [1, 99], [7, 30, 63], [50, 50]])
def test_chunked_search_equals_the_full_score_matrix(score, chunks, monkeypatch):
    monkeypatch.setattr(search_module, "SCORE_BLOCK", 64)  # several query blocks a chunk
    queries, docs = vectors(9, seed=1), vectors(100, seed=2)
    search, start = ExactSearch(queries, 12, score), 0
    for size in chunks:
        search.add(docs[start: start + size])
        start += size
    scores, indices = search.result()
    expect = full_topk(queries, docs, 12, score)
    assert scores.shape == indices.shape == (9, 12)
    assert_close(torch.from_numpy(scores), expect.values, rtol=1e-6, atol=1e-6)  # float32 sums, other blocking
    assert (indices == expect.indices.numpy()).all()  # random vectors: no ties


def test_fewer_documents_than_k_and_shape_errors():
    search = ExactSearch(vectors(3), k=10)
    search.add(vectors(4, seed=5))
    scores, indices = search.result()
    assert scores.shape == (3, 4) and sorted(indices[0].tolist()) == [0, 1, 2, 3]
    assert (np.diff(scores, axis=1) <= 0).all()  # best first
    with pytest.raises(ValueError, match=r"documents must be \(n, 16\) vectors"):
        search.add(vectors(2, dim=8))
    with pytest.raises(ValueError, match="score function must be one of"):
        ExactSearch(vectors(3), 2, "l2")


def test_faiss_flat_index_equals_the_exact_search():
    pytest.importorskip("faiss")
    queries, docs = vectors(5, seed=3), vectors(60, seed=4)
    exact, flat = ExactSearch(queries, 7), FaissSearch(queries, 7, factory="Flat")
    for part in (docs[:25], docs[25:]):
        exact.add(part)
        flat.add(part)
    (s1, i1), (s2, i2) = exact.result(), flat.result()
    np.testing.assert_allclose(s2, s1, rtol=0, atol=1e-5)
    assert (i1 == i2).all()
    with pytest.raises(ValueError, match="FAISS cannot build the index 'Nonsense'"):
        FaissSearch(queries, 7, factory="Nonsense")
