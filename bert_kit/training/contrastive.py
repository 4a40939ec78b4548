"""Contrastive losses of embedding models: in-batch negatives, across ranks, at several widths.

Plain functions of the embeddings (sentence-transformers' `MultipleNegativesRankingLoss`,
`MultipleNegativesSymmetricRankingLoss` and `MatryoshkaLoss`, with their definitions), so any
engine computes them from the vectors it made; `grad_cache.py` runs them over batches far
larger than the device could embed at once.

A batch is k columns of B texts each, embedded as `columns` (k, B, H): the anchors (queries)
a_1..a_B, their positives p_1..p_B, and k - 2 columns of hard negatives n^j_1..n^j_B. The
candidates of every anchor are all the positives and negatives of the batch (C = (k - 1) B):

    s_ij = scale * cos(a_i, c_j)                          (B, C)
    MNRL      = mean_i [ -s_ii + logsumexp_j s_ij ]       cross-entropy: a_i's answer is p_i
    symmetric = (MNRL + mean_i [ -s_ii + logsumexp_l scale * cos(p_i, a_l) ]) / 2

The other rows' positives are the anchor's in-batch negatives, so a batch of B pairs gives
B - 1 negatives each for free; a text repeated in a batch would be a false negative
(`data.no_duplicates` keeps them out), and so is another row's positive that the training data
also pairs with the anchor (on NFCorpus 11% of the in-batch negatives at batch 64): with
`exclude`, such candidates are left out of the anchor's softmax (`known_positives`). `scale` is
1 / temperature: 20 (sentence-transformers' default), or exp of a learned parameter (CLIP's logit_scale).

Under torchrun (`gather=True`) each rank's candidates are all ranks' ((k - 1) B W): the rows are
gathered with `gather_with_grad`, whose backward sums every rank's gradient of this rank's rows,
so after DDP averages the weight gradients over the W ranks, loss and gradients are those of one
process on the concatenated batch (tests/training/test_contrastive_ranks.py).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from bert_kit.training.distributed import rank, world_size

DEFAULT_SCALE = 20.0  # sentence-transformers' MNRL scale: temperature 0.05
MAX_LEARNED_SCALE = 100.0  # a learned scale is clamped here, as CLIP clamps its logit scale


class _GatherWithGrad(torch.autograd.Function):
    """all_gather whose backward hands each rank the sum over ranks of the gradients of its rows
    (an all-reduce, then this rank's slice: gloo has no reduce-scatter)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(x) for _ in range(world_size())]
        dist.all_gather(parts, x.contiguous())
        ctx.rows = x.shape[0]
        return torch.cat(parts)  # (W * n, ...)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)  # every rank's loss reaches every rank's rows
        start = rank() * ctx.rows
        return grad[start: start + ctx.rows]


def gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """x (n, ...) of every rank, concatenated in rank order: (W * n, ...); x itself in one process."""
    if world_size() <= 1:
        return x
    return _GatherWithGrad.apply(x)


def gather_keys(x: torch.Tensor) -> torch.Tensor:
    """x (n, ...) of every rank, concatenated in rank order, without gradients (text ids)."""
    if world_size() <= 1:
        return x
    parts = [torch.empty_like(x) for _ in range(world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts)


def known_positives(anchor_keys: torch.Tensor, candidate_keys: torch.Tensor, pairs: torch.Tensor,
                    texts: int) -> torch.Tensor:
    """(B, C) bool: True where candidate j is a known positive of anchor i, by the text ids of
    anchors (B,) and candidates (C,) and `pairs`, the sorted (anchor id * texts + positive id) of
    every training pair (`pair_codes`)."""
    codes = anchor_keys[:, None] * texts + candidate_keys[None, :]
    at = torch.searchsorted(pairs, codes).clamp(max=len(pairs) - 1)  # a lookup with no host sync
    return pairs[at] == codes


def pair_codes(keys: list[tuple[int, ...]]) -> tuple[torch.Tensor, int]:
    """The sorted codes (anchor id * texts + positive id) of the examples' (anchor, positive) text
    ids, and `texts` (one more than the largest id)."""
    texts = 1 + max(max(k) for k in keys)
    return torch.tensor(sorted({k[0] * texts + k[1] for k in keys}), dtype=torch.int64), texts


def own(labels: torch.Tensor, columns: int) -> torch.Tensor:
    """(B, columns) bool: True at each row's own positive, column labels[i]. A comparison, not an
    assignment of False into a mask: a scalar assigned is copied from the host, which a CUDA graph's
    capture refuses."""
    return torch.arange(columns, device=labels.device)[None, :] == labels[:, None]


def multiple_negatives_ranking_loss(columns: torch.Tensor, scale: float | torch.Tensor = DEFAULT_SCALE,
                                    symmetric: bool = False, gather: bool = False,
                                    exclude: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                                    keys: torch.Tensor | None = None) -> torch.Tensor:
    """MNRL (InfoNCE with in-batch negatives) of `columns` (k >= 2, B, H): anchors, positives, then
    hard negatives (see the module docstring). scale: a number or a 0-d tensor (a learned one's
    exp). symmetric: also each positive against all anchors, averaged with the forward term.
    gather: the candidates (and, symmetric, the anchors) of every rank. exclude(anchor ids (B,),
    candidate ids (C,)) -> (B, C) bool: candidates left out of an anchor's negatives (never its own
    positive), given the texts' ids `keys` (k, B). Returns the mean loss over this rank's anchors
    (float32)."""
    if columns.dim() != 3 or columns.shape[0] < 2:
        raise ValueError(f"columns must be (k >= 2, B, H): anchors, positives, negatives; got {tuple(columns.shape)}")
    k, B, _ = columns.shape
    unit = F.normalize(columns.float(), dim=-1)  # cosine similarity
    anchors, candidates = unit[0], unit[1:]  # (B, H), (k - 1, B, H)
    offset = 0
    if gather and world_size() > 1:
        candidates = torch.stack([gather_with_grad(column) for column in candidates])  # (k - 1, W B, H)
        offset = rank() * B
    labels = torch.arange(offset, offset + B, device=columns.device)  # p_i is candidate offset + i
    scores = anchors @ candidates.reshape(-1, candidates.shape[-1]).T * scale  # (B, (k - 1) W B)
    left_out = None
    if exclude is not None:
        if keys is None:
            raise ValueError("exclude needs the texts' ids (keys)")
        candidate_keys = keys[1:] if not (gather and world_size() > 1) else \
            torch.stack([gather_keys(column) for column in keys[1:]])  # (k - 1, W B)
        left_out = exclude(keys[0], candidate_keys.reshape(-1)) & ~own(labels, scores.shape[1])  # (B, (k - 1) W B)
        scores = scores.masked_fill(left_out, float("-inf"))
    loss = F.cross_entropy(scores, labels)
    if not symmetric:
        return loss
    all_anchors = gather_with_grad(anchors) if gather else anchors  # (W B, H)
    backward = unit[1] @ all_anchors.T * scale  # (B, W B): p_i against every anchor
    if left_out is not None:  # p_i against anchor l: left out where p_i is one of l's known positives
        all_anchor_keys = gather_keys(keys[0]) if gather else keys[0]
        back_out = exclude(all_anchor_keys, keys[1]).T & ~own(labels, backward.shape[1])  # (B, W B)
        backward = backward.masked_fill(back_out, float("-inf"))
    return (loss + F.cross_entropy(backward, labels)) / 2


def truncated(columns: torch.Tensor, dim: int) -> torch.Tensor:
    """The first `dim` components of every vector, renormalised: a Matryoshka embedding (..., dim)."""
    return F.normalize(columns[..., :dim].float(), dim=-1)


def matryoshka_loss(loss: Callable[[torch.Tensor], torch.Tensor], columns: torch.Tensor, dims: Sequence[int],
                    weights: Sequence[float] | None = None) -> torch.Tensor:
    """sentence-transformers' MatryoshkaLoss: sum_d w_d loss(columns truncated to d and renormalised),
    so the first d components of a vector are an embedding of their own for every d in `dims`.
    loss: columns (k, B, d) -> a 0-d loss; weights: one per dim (default 1 each)."""
    weights = [1.0] * len(dims) if weights is None else list(weights)
    if len(weights) != len(dims):
        raise ValueError(f"{len(dims)} matryoshka dims but {len(weights)} weights")
    if max(dims) > columns.shape[-1]:
        raise ValueError(f"matryoshka dim {max(dims)} exceeds the embedding size {columns.shape[-1]}")
    return sum(w * loss(truncated(columns, d)) for d, w in zip(dims, weights))
