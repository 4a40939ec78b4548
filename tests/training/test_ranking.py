"""Reranker losses (training/ranking.py) against sentence-transformers' cross-encoder losses on the
same scores (a stand-in model hands them out), with queries of different numbers of candidates.

Run: .venv/bin/python -m pytest tests/training/test_ranking.py -q
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from bert_kit.training.ranking import binary_cross_entropy, lambda_loss, listnet_loss

LABELS = [[1.0, 0.0, 0.0, 2.0], [0.0, 1.0], [1.0, 0.0, 0.0]]  # graded, and three list lengths


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(scores, labels, mask), each (3, 4): the candidates of three queries, padded."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(3, 4, generator=g) * 3
    labels, mask = torch.zeros(3, 4), torch.zeros(3, 4, dtype=torch.bool)
    for q, row in enumerate(LABELS):
        labels[q, : len(row)] = torch.tensor(row)
        mask[q, : len(row)] = True
    return scores, labels, mask


class Scores:
    """What sentence-transformers' cross-encoder losses call: preprocess(pairs) and the model's
    forward, here handing out given scores for (query, document) pairs."""

    num_labels, device = 1, torch.device("cpu")

    def __init__(self, scores: torch.Tensor, mask: torch.Tensor):
        self.index = {(f"q{q}", f"d{j}"): q * scores.shape[1] + j for q in range(len(mask)) for j in range(len(mask[q]))
                      if mask[q, j]}
        self.flat = scores.flatten()

    def preprocess(self, pairs, prompt=None, task=None):
        return {"rows": torch.tensor([self.index[p] for p in pairs])}

    def __call__(self, tokens):
        return {"scores": self.flat[tokens["rows"]][:, None]}


def st_inputs(mask: torch.Tensor):
    docs = [[f"d{j}" for j in range(int(row.sum()))] for row in mask]
    return [[f"q{q}" for q in range(len(mask))], docs], [torch.tensor(row) for row in LABELS]


@pytest.mark.parametrize("name", ["ListNetLoss", "LambdaLoss"])
def test_listwise_losses_equal_sentence_transformers(name):
    losses = pytest.importorskip("sentence_transformers.cross_encoder.losses")
    scores, labels, mask = batch()
    reference = getattr(losses, name)(Scores(scores, mask))
    want = reference(*st_inputs(mask))
    got = (listnet_loss if name == "ListNetLoss" else lambda_loss)(scores, labels, mask)
    assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_lambda_loss_with_a_cutoff_equals_sentence_transformers():
    losses = pytest.importorskip("sentence_transformers.cross_encoder.losses")
    scores, labels, mask = batch(3)
    want = losses.LambdaLoss(Scores(scores, mask), k=2)(*st_inputs(mask))
    assert_close(lambda_loss(scores, labels, mask, k=2), want, rtol=1e-5, atol=1e-6)


def test_listnet_is_the_cross_entropy_of_the_top_one_distributions():
    scores, labels, mask = batch(1)
    terms = []
    for q, row in enumerate(LABELS):
        n = len(row)
        target = torch.tensor(row).softmax(0)
        terms.append(-(target * scores[q, :n].log_softmax(0)).sum())
    assert_close(listnet_loss(scores, labels, mask), torch.stack(terms).mean())


def test_padding_changes_nothing():
    scores, labels, mask = batch(2)
    noisy = scores.masked_fill(~mask, 1e3)  # whatever sits in the padded slots
    for fn in (listnet_loss, lambda_loss, binary_cross_entropy):
        assert_close(fn(noisy, labels, mask), fn(scores, labels, mask))


def test_bce_clamps_grades_and_averages_the_real_candidates():
    scores, labels, mask = batch(4)
    real = mask.flatten()
    want = F.binary_cross_entropy_with_logits(scores.flatten()[real], labels.flatten()[real].clamp(max=1))
    assert_close(binary_cross_entropy(scores, labels, mask), want)
    assert_close(binary_cross_entropy(scores[0], labels[0].clamp(max=1)),
                 F.binary_cross_entropy_with_logits(scores[0], labels[0].clamp(max=1)))


def test_the_losses_prefer_the_right_order():
    _, labels, mask = batch()
    right, wrong = labels * 3, -labels * 3  # scores that agree / disagree with the labels
    for fn in (listnet_loss, lambda_loss, binary_cross_entropy):
        assert fn(right, labels, mask) < fn(wrong, labels, mask)
