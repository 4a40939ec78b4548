"""Losses of a reranker (a cross-encoder with one output): pointwise, or over each query's candidates.

Plain functions of the scores, as sentence-transformers' cross-encoder losses define them. A
batch of Q queries with up to n candidates each holds its scores as a (Q, n) matrix, `mask`
(Q, n) marking the real candidates (a query with fewer than n is padded), and `labels` (Q, n)
their relevance (0 / 1, a grade, or a probability):

    BCE        mean over candidates of  -y log sigmoid(s) - (1 - y) log(1 - sigmoid(s)),
               y = the label clamped to [0, 1] (a grade 2 counts as relevant)
    ListNet    mean over queries of  -sum_j softmax(labels)_j log softmax(scores)_j
               (Cao et al., 2007: the cross-entropy of the two top-one distributions)
    LambdaLoss mean over the query's document pairs (i, j) ranked by score, with label_i > label_j,
               of  -w_ij log2 sigmoid(sigma (s_i - s_j)),  w_ij the NDCG-Loss2++ weight
               (Wang et al., 2018: mu NDCG-Loss2 + LambdaRank), gains 2^label - 1

Padded candidates take no part in any of them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

PADDED = -1e16  # a padded candidate's score: softmax weight 0, sorted last


def binary_cross_entropy(scores: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Pointwise BCE of logits `scores` and `labels` (same shape), over the real candidates."""
    terms = F.binary_cross_entropy_with_logits(scores.float(), labels.float().clamp(0, 1), reduction="none")
    if mask is None:
        return terms.mean()
    return (terms * mask).sum() / mask.sum().clamp(min=1)


def listnet_loss(scores: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """ListNet of scores, labels and mask (Q, n): each query's cross-entropy between
    softmax(labels) and softmax(scores) over its candidates, averaged over the queries."""
    scores = scores.float().masked_fill(~mask, PADDED)
    target = labels.float().masked_fill(~mask, -torch.inf).softmax(dim=1)  # (Q, n), 0 on padding
    return -(target * scores.log_softmax(dim=1)).sum(dim=1).mean()


def lambda_loss(scores: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, k: int | None = None,
                sigma: float = 1.0, mu: float = 10.0, eps: float = 1e-10) -> torch.Tensor:
    """LambdaLoss with NDCG-Loss2++ weights of scores, labels and mask (Q, n) (sentence-transformers'
    `LambdaLoss` defaults); k: only pairs with a document in the top k by score (default all)."""
    n = scores.shape[1]
    scores = scores.float().masked_fill(~mask, PADDED)
    labels = labels.float().masked_fill(~mask, -torch.inf)
    by_score, order = scores.sort(descending=True, dim=1)  # (Q, n)
    ideal = labels.sort(descending=True, dim=1).values.clamp(min=0)
    true = labels.gather(1, order)  # labels in the order of the scores, -inf on padding
    diffs = true[:, :, None] - true[:, None, :]  # (Q, n, n)
    pairs = torch.isfinite(diffs) & (diffs > 0)
    top = torch.zeros(n, n, dtype=torch.bool, device=scores.device)
    top[: k or n, :] = True
    top[:, : k or n] = True
    pairs = pairs & top
    true = true.clamp(min=0)
    discount = torch.log2(torch.arange(2, n + 2, device=scores.device, dtype=torch.float32))[None, :]  # (1, n)
    max_dcg = ((2 ** ideal - 1) / discount)[:, : k or n].sum(dim=1).clamp(min=eps)  # (Q,)
    gain = (2 ** true - 1) / max_dcg[:, None]  # (Q, n)
    # NDCG-Loss2: |1/D(|i-j|) - 1/D(|i-j|+1)| |G_i - G_j|; LambdaRank: |1/D_i - 1/D_j| |G_i - G_j|
    place = torch.arange(1, n + 1, device=scores.device)
    gap = (place[:, None] - place[None, :]).abs()  # (n, n)
    delta = (1 / discount[0, gap - 1] - 1 / discount[0, gap]).abs()
    delta.fill_diagonal_(0)
    gain_gap = (gain[:, :, None] - gain[:, None, :]).abs()  # (Q, n, n)
    lambda_rank = (1 / discount[:, :, None] - 1 / discount[:, None, :]).abs() * gain_gap
    weights = mu * delta[None] * gain_gap + lambda_rank
    score_gap = (by_score[:, :, None] - by_score[:, None, :]).clamp(-1e8, 1e8)
    terms = weights * F.logsigmoid(sigma * score_gap) / math.log(2)  # log2
    return -(terms * pairs).sum() / pairs.sum().clamp(min=1)
