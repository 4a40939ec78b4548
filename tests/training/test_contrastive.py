"""Contrastive losses (training/contrastive.py) and GradCache (training/grad_cache.py) on the CPU.

* MNRL and its symmetric form equal sentence-transformers' losses on the same vectors, and the
  formula written out in float64; Matryoshka sums the loss of truncated, renormalised vectors.
* GradCache gives the gradients of the uncached loss (weights and a learned scale, 1e-5, dropout
  off), scaled by what the backward brings (a loss scale, 1/grad_accum); with dropout on, the
  replayed mini-batches draw the masks of the first pass.

Run: .venv/bin/python -m pytest tests/training/test_contrastive.py -q
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close
from torch.utils._python_dispatch import TorchDispatchMode

from bert_kit.config import BertConfig
from bert_kit.embeddings import mean_pool
from bert_kit.model import BERTModel
from bert_kit.training.contrastive import matryoshka_loss, multiple_negatives_ranking_loss, truncated
from bert_kit.training.grad_cache import cached_loss

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def columns(k: int = 3, B: int = 5, H: int = 8, seed: int = 0) -> torch.Tensor:
    return torch.randn(k, B, H, generator=torch.Generator().manual_seed(seed))


def by_hand(cols: torch.Tensor, scale: float, symmetric: bool = False) -> torch.Tensor:
    """-log softmax of each anchor's own positive among all candidates, in float64, loop by loop."""
    u = F.normalize(cols.double(), dim=-1)
    k, B, _ = u.shape
    candidates = u[1:].reshape(-1, u.shape[-1])
    forward = [-(scale * u[0, i] @ u[1, i]) + torch.logsumexp(scale * candidates @ u[0, i], 0) for i in range(B)]
    loss = torch.stack(forward).mean()
    if symmetric:
        back = [-(scale * u[0, i] @ u[1, i]) + torch.logsumexp(scale * u[0] @ u[1, i], 0) for i in range(B)]
        loss = (loss + torch.stack(back).mean()) / 2
    return loss


@pytest.mark.parametrize("k", [2, 3, 5])
@pytest.mark.parametrize("symmetric", [False, True])
def test_mnrl_is_the_formula(k, symmetric):
    cols = columns(k)
    got = multiple_negatives_ranking_loss(cols, 20.0, symmetric)
    assert_close(got.double(), by_hand(cols, 20.0, symmetric), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("symmetric", [False, True])
def test_mnrl_equals_sentence_transformers(k, symmetric):
    losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")
    directions = ("query_to_doc", "doc_to_query") if symmetric else ("query_to_doc",)
    reference = losses.MultipleNegativesRankingLoss(None, scale=13.0, directions=directions,
                                                       partition_mode="per_direction" if symmetric else "joint")
    cols = columns(k, B=7, H=16, seed=k)
    want = reference.compute_loss_from_embeddings(list(cols), None)
    assert_close(multiple_negatives_ranking_loss(cols, 13.0, symmetric), want, rtol=1e-6, atol=1e-6)


def by_hand_excluding(cols: torch.Tensor, scale: float, out: set, symmetric: bool) -> torch.Tensor:
    """by_hand with the candidates (i, j) in `out` (anchor row, flat candidate index) left out of the
    softmax; symmetric: positive i against anchor l left out where (l, i) is."""
    u = F.normalize(cols.double(), dim=-1)
    k, B, _ = u.shape
    candidates = u[1:].reshape(-1, u.shape[-1])
    forward = []
    for i in range(B):
        kept = [j for j in range(len(candidates)) if (i, j) not in out or j == i]
        forward.append(-(scale * u[0, i] @ u[1, i]) + torch.logsumexp(scale * candidates[kept] @ u[0, i], 0))
    loss = torch.stack(forward).mean()
    if symmetric:
        back = []
        for i in range(B):
            kept = [l for l in range(B) if (l, i) not in out or l == i]
            back.append(-(scale * u[0, i] @ u[1, i]) + torch.logsumexp(scale * u[0, kept] @ u[1, i], 0))
        loss = (loss + torch.stack(back).mean()) / 2
    return loss


@pytest.mark.parametrize("symmetric", [False, True])
def test_known_positives_are_left_out_of_the_negatives(symmetric):
    """A document relevant to two queries of a batch was a negative of each for the other
    (NFCorpus: a document is relevant to 30 queries on average); the pairs of the training data
    leave it out of both softmaxes, never an anchor's own positive."""
    from bert_kit.training.contrastive import known_positives, pair_codes

    k, B = 3, 5
    cols = columns(k, B)
    keys = torch.tensor([[0, 1, 2, 3, 4], [10, 11, 12, 13, 14], [20, 21, 22, 23, 24]])  # anchors, positives, negatives
    training = [(a, 10 + a) for a in range(B)] + [(0, 12), (3, 11), (1, 24), (4, 10)]  # (anchor id, its positive id)
    codes, texts = pair_codes(training)
    exclude = functools.partial(known_positives, pairs=codes, texts=texts)
    flat = {int(t): j for j, t in enumerate(keys[1:].reshape(-1))}  # text id -> candidate index
    out = {(a, flat[p]) for a, p in training}
    got = multiple_negatives_ranking_loss(cols, 2.0, symmetric, exclude=exclude, keys=keys)
    assert_close(got.double(), by_hand_excluding(cols, 2.0, out, symmetric), rtol=1e-5, atol=1e-6)
    assert abs(got - multiple_negatives_ranking_loss(cols, 2.0, symmetric)) > 0.02  # it left some out
    only_own = pair_codes([(a, 10 + a) for a in range(B)])
    same = multiple_negatives_ranking_loss(cols, 2.0, symmetric, exclude=functools.partial(
        known_positives, pairs=only_own[0], texts=only_own[1]), keys=keys)
    assert_close(same, multiple_negatives_ranking_loss(cols, 2.0, symmetric))  # no pair beyond its own: MNRL
    with pytest.raises(ValueError, match="exclude needs the texts' ids"):
        multiple_negatives_ranking_loss(cols, 2.0, symmetric, exclude=exclude)


class Assignments(TorchDispatchMode):
    """Records the in-place index assignments (`x[i] = value`) that reach the dispatcher."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "index_put" in str(func):
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("symmetric", [False, True])
def test_known_positives_assign_nothing_from_the_host(symmetric):
    """`mask[rows, cols] = False` on a CUDA tensor copies the scalar from the host, which a CUDA
    graph's capture refuses (a `cuda_graphs` run with `embedding.exclude_known_positives` stopped at
    its first captured step): the loss's masks are comparisons, nothing is assigned."""
    from bert_kit.training.contrastive import known_positives, pair_codes

    codes, texts = pair_codes([(0, 10), (0, 11), (1, 11), (2, 12)])
    keys = torch.tensor([[0, 1, 2], [10, 11, 12]])
    exclude = functools.partial(known_positives, pairs=codes, texts=texts)
    cols = columns(2, 3).requires_grad_()
    with Assignments() as seen:
        multiple_negatives_ranking_loss(cols, 2.0, symmetric, exclude=exclude, keys=keys).backward()
    assert seen.seen == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_known_positives_loss_is_captured_in_a_cuda_graph():
    from bert_kit.training.contrastive import known_positives, pair_codes

    codes, texts = pair_codes([(0, 10), (0, 11), (1, 11), (2, 12)])
    keys = torch.tensor([[0, 1, 2], [10, 11, 12]], device="cuda")
    exclude = functools.partial(known_positives, pairs=codes.cuda(), texts=texts)
    cols = columns(2, 3).cuda()
    want = multiple_negatives_ranking_loss(cols, 2.0, True, exclude=exclude, keys=keys)  # eager, warms up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = multiple_negatives_ranking_loss(cols, 2.0, True, exclude=exclude, keys=keys)
    graph.replay()
    assert_close(got, want)


def test_a_learned_scale_gets_its_gradient():
    cols = columns()
    log_scale = torch.tensor(math.log(20.0), requires_grad=True)
    loss = multiple_negatives_ranking_loss(cols, log_scale.exp())
    loss.backward()
    # d/d log s of L(s) = s * dL/ds, by a central difference
    eps, s = 1e-3, 20.0
    numeric = (by_hand(cols, s * math.exp(eps)) - by_hand(cols, s * math.exp(-eps))) / (2 * eps)
    assert_close(log_scale.grad.double(), numeric, rtol=1e-3, atol=1e-5)


def test_bad_columns_are_refused():
    with pytest.raises(ValueError, match=r"\(k >= 2, B, H\)"):
        multiple_negatives_ranking_loss(torch.randn(1, 4, 8))
    with pytest.raises(ValueError, match="exceeds the embedding size 8"):
        matryoshka_loss(multiple_negatives_ranking_loss, columns(), [16, 4])
    with pytest.raises(ValueError, match="2 matryoshka dims but 1 weights"):
        matryoshka_loss(multiple_negatives_ranking_loss, columns(), [8, 4], [1.0])


def test_matryoshka_sums_the_loss_of_truncated_renormalised_vectors():
    cols = columns(H=16)
    got = matryoshka_loss(multiple_negatives_ranking_loss, cols, [16, 8, 4], [1.0, 0.5, 0.25])
    want = by_hand(cols, 20.0) + 0.5 * by_hand(cols[..., :8], 20.0) + 0.25 * by_hand(cols[..., :4], 20.0)
    assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    unit = truncated(cols, 4)
    assert unit.shape == (3, 5, 4)
    assert_close(unit.norm(dim=-1), torch.ones(3, 5))


# ---- GradCache ---------------------------------------------------------------------------------

def tiny_encoder(dropout: float = 0.0) -> BERTModel:
    torch.manual_seed(0)
    return BERTModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=32, max_position_embeddings=16, hidden_dropout_prob=dropout,
                                attention_probs_dropout_prob=dropout)).train()


def text_batch(rows: int = 12, length: int = 9) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 50, (rows, length), generator=g)
    lengths = torch.randint(3, length + 1, (rows,), generator=g)
    mask = (torch.arange(length)[None] < lengths[:, None]).long()
    return ids * mask, mask


def embedder(model, ids, mask, size):
    def embed(i: int) -> torch.Tensor:
        rows = slice(i * size, (i + 1) * size)
        return mean_pool(model(ids[rows], mask[rows]), mask[rows])
    return embed


def loss_of(k: int, symmetric: bool = False, dims=None):
    def loss(vectors: torch.Tensor, log_scale: torch.Tensor | None) -> torch.Tensor:
        cols = vectors.view(k, -1, vectors.shape[-1])  # (k, B, H): the rows are the columns one after another
        scale = 20.0 if log_scale is None else log_scale.exp()
        fn = lambda c: multiple_negatives_ranking_loss(c, scale, symmetric)  # noqa: E731
        return fn(cols) if dims is None else matryoshka_loss(fn, cols, dims)
    return loss


def gradients(model, scale=None) -> dict[str, torch.Tensor]:
    out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    if scale is not None:
        out["scale"] = scale.grad.clone()
    return out


@pytest.mark.parametrize("symmetric, dims, learned", [(False, None, False), (True, None, True), (False, [16, 8], True)])
def test_grad_cache_gives_the_gradients_of_the_uncached_loss(symmetric, dims, learned):
    k, ids, mask = 3, *text_batch(12)
    fn = loss_of(k, symmetric, dims)

    def run(chunk: int | None) -> tuple[torch.Tensor, dict]:
        model = tiny_encoder()
        scale = torch.nn.Parameter(torch.tensor(math.log(20.0))) if learned else None
        if chunk is None:  # uncached: one forward over the whole batch
            loss = fn(embedder(model, ids, mask, 12)(0), scale)
        else:
            loss = cached_loss(embedder(model, ids, mask, chunk), -(-12 // chunk), fn, torch.device("cpu"), scale)
            assert loss.grad_fn is None and loss.requires_grad  # a leaf: the backward runs the hook
        (loss * 0.5).backward()  # as a trainer's 1/grad_accum: it reaches the replay as its incoming gradient
        return loss.detach(), gradients(model, scale)

    want_loss, want = run(None)
    for chunk in (1, 4, 5):  # 5: the last mini-batch holds 2 rows
        got_loss, got = run(chunk)
        assert_close(got_loss, want_loss, rtol=1e-6, atol=1e-6)
        assert got.keys() == want.keys()
        for name in want:
            assert_close(got[name], want[name], rtol=1e-5, atol=1e-5, msg=name)


def test_grad_cache_replays_the_dropout_masks_of_its_first_pass():
    """With dropout on, the cached gradient is that of the same mini-batches embedded with autograd
    from the same random state: the replay draws the masks of the first pass."""
    k, ids, mask = 2, *text_batch(8)
    fn = loss_of(k)
    model = tiny_encoder(dropout=0.3)
    torch.manual_seed(5)
    embed = embedder(model, ids, mask, 3)
    loss = fn(torch.cat([embed(i) for i in range(3)]), None)  # autograd through all of them, in order
    loss.backward()
    want = gradients(model)
    model.zero_grad()
    torch.manual_seed(5)
    cached = cached_loss(embed, 3, fn, torch.device("cpu"))
    after = torch.rand(1)  # the generator moved on as after one pass, not two
    cached.backward()
    assert_close(cached.detach(), loss.detach(), rtol=1e-6, atol=1e-6)
    for name, grad in gradients(model).items():
        assert_close(grad, want[name], rtol=1e-5, atol=1e-5, msg=name)
    torch.manual_seed(5)
    for i in range(3):
        embed(i)
    assert_close(torch.rand(1), after)


def test_grad_cache_without_autograd_is_the_plain_loss():
    k, ids, mask = 2, *text_batch(8)
    model = tiny_encoder()
    with torch.no_grad():
        got = cached_loss(embedder(model, ids, mask, 3), 3, loss_of(k), torch.device("cpu"))
        want = loss_of(k)(embedder(model, ids, mask, 8)(0), None)
    assert not got.requires_grad
    assert_close(got, want, rtol=1e-6, atol=1e-6)
