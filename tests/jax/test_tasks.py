"""The fine-tuning tasks on the JAX engine (`bert_kit/jax/tasks.py`): one batch's loss and
gradients equal the torch task's (QA, a bi-encoder with each loss, a cross-encoder), however far
the JAX batch is padded; the pair losses leave out the rows that pad a batch; and the engine's
batches pad a bi-encoder's two sentences side by side. Whole runs: test_engine_tasks.py.

Run: .venv/bin/python -m pytest tests/jax/test_tasks.py -q -n 0
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")
nnx = pytest.importorskip("flax.nnx")

from bert_kit import heads as torch_heads  # noqa: E402
from bert_kit.jax.tasks import (RANKING_LOSSES, LabelsHead, PooledHead, RerankHead, SpanHead, TaskHead,  # noqa: E402
                                by_side, cosent_loss, cosine_mse_loss, multi_label_loss, task_head,
                                weighted_cross_entropy)
from bert_kit.model import BERTModel  # noqa: E402
from bert_kit.tasks import make_task  # noqa: E402
from bert_kit.tasks.finetuning_config import FinetuneConfig  # noqa: E402
from bert_kit.training import ranking  # noqa: E402
from bert_kit.training.losses import (compute_classification_loss, compute_cosent_loss,  # noqa: E402
                                     compute_cosine_similarity_loss, compute_multi_label_loss)
from tests.jax.common import jax_twin, max_abs, padded_batch, tiny  # noqa: E402


def torch_grads(model, loss) -> dict[str, np.ndarray]:
    loss.backward()
    return {name: p.grad.numpy() for name, p in model.named_parameters() if p.grad is not None}


def jax_loss_and_grads(model, head, batch) -> tuple[float, dict[str, np.ndarray]]:
    from bert_kit.jax.weights import torch_state_dict

    loss, grads = nnx.value_and_grad(lambda m: head.loss(m, batch, None)[0])(model)
    return float(loss), torch_state_dict(model, grads)


def assert_same(torch_loss, torch_g, jax_loss, jax_g, tolerance=2e-5):
    assert abs(float(torch_loss.detach()) - jax_loss) <= 1e-5, (float(torch_loss.detach()), jax_loss)
    assert set(jax_g) >= set(torch_g)
    for name, g in torch_g.items():
        assert max_abs(jax_g[name], g) <= tolerance * max(1.0, float(np.abs(g).max())), name


def wider(batch: dict, T: int, pad_id: int = 0) -> dict:
    """The batch padded on to T tokens, as the JAX engine pads to a length bucket."""
    out = {}
    for k, v in batch.items():
        fill = pad_id if k == "input_ids" else 0
        out[k] = np.pad(v, ((0, 0), (0, T - v.shape[1])), constant_values=fill) if v.ndim == 2 else v
    return out


def test_qa_loss_and_gradients_equal_torchs_however_far_padded():
    config = tiny(num_hidden_layers=1)
    batch = padded_batch(config, [9, 6, 4], 9)
    batch["start_positions"], batch["end_positions"] = np.array([2, 0, 3]), np.array([5, 0, 3])
    torch.manual_seed(0)
    model = torch_heads.BERTForQuestionAnswering(config)
    task = make_task("qa", FinetuneConfig(task="qa", model="x"))
    loss = task.loss(model, {k: torch.as_tensor(v) for k, v in batch.items()})[0]
    expected = torch_grads(model, loss)
    jax_model = jax_twin(model)
    head = task_head(task)
    assert isinstance(head, SpanHead)
    for T in (9, 16):  # the torch batch's length, and a bucket's
        got_loss, got = jax_loss_and_grads(jax_model, head, {k: np.asarray(v) for k, v in wider(batch, T).items()})
        assert_same(loss, expected, got_loss, got)
    # padding is never an answer: the outputs put it below every real token
    out = np.asarray(head.outputs(jax_model, wider(batch, 16)))  # (B, 2, T)
    assert out.shape == (3, 2, 16) and (out[2, :, 4:] < out[2, :, :4].min()).all()


@pytest.mark.parametrize("loss_name", ["cosine", "cosent"])
def test_bi_encoder_loss_and_gradients_equal_torchs(loss_name):
    config = tiny(num_hidden_layers=1)
    sides = padded_batch(config, [7, 5, 3, 6, 2, 7], 7)  # three pairs: a-sides, then b-sides
    sides["token_type_ids"] = np.zeros_like(sides["input_ids"])
    labels = np.array([0.9, 0.1, 0.5], np.float32)
    torch.manual_seed(0)
    model = BERTModel(config)
    settings = FinetuneConfig(task="similarity", model="x", similarity={"mode": "bi-encoder", "loss": loss_name})
    task = make_task("similarity", settings)
    loss = task.loss(model, {**{k: torch.as_tensor(v) for k, v in sides.items()}, "labels": torch.as_tensor(labels)})[0]
    expected = torch_grads(model, loss)
    head = task_head(task)
    assert head == PooledHead("similarity", sides=2, pooling="mean", loss_name=loss_name)
    got_loss, got = jax_loss_and_grads(jax_twin(model), head, {**wider(sides, 16), "labels": labels})
    assert_same(loss, expected, got_loss, got)


def test_cross_encoder_is_the_regression_head():
    task = make_task("similarity", FinetuneConfig(task="similarity", model="x"))
    assert task_head(task) == TaskHead("similarity")  # MSE on one output (`train.classification_loss`)
    assert task_head(make_task("qa", FinetuneConfig(task="qa", model="x"))).sides == 1


def test_pair_losses_equal_torchs_and_leave_out_padding_rows():
    rng = np.random.default_rng(0)
    u, v = rng.normal(size=(2, 5, 8)).astype(np.float32)
    scores = np.array([0.2, 0.9, 0.5, 0.7, 0.1], np.float32)
    tu, tv, ts = (torch.as_tensor(x) for x in (u, v, scores))
    assert abs(float(cosine_mse_loss(u, v, scores)) - float(compute_cosine_similarity_loss(tu, tv, ts))) <= 1e-6
    assert abs(float(cosent_loss(u, v, scores)) - float(compute_cosent_loss(tu, tv, ts))) <= 1e-5
    # two rows padding the batch (copies of row 0, NaN scores) change neither loss
    pu, pv = np.concatenate([u, u[:2]]), np.concatenate([v, v[:2]])
    padded = np.concatenate([scores, [np.nan, np.nan]]).astype(np.float32)
    for loss in (cosine_mse_loss, cosent_loss):
        assert abs(float(loss(pu, pv, padded)) - float(loss(u, v, scores))) <= 1e-6
        assert np.isfinite(np.asarray(jax.grad(lambda x: loss(x, pv, padded))(pu))).all()



def test_label_set_and_class_weighted_losses_equal_torchs_and_leave_out_padding_rows():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, 4)).astype(np.float32)
    sets = (rng.random((6, 4)) < 0.3).astype(np.float32)
    sets[2] = 0.0  # a text with none of the labels
    weights = np.array([0.5, 2.0, 1.0, 3.0], np.float32)
    classes = np.array([0, 3, 1, 1, 2, -100])  # the last row carries no label
    t = torch.as_tensor
    for pos_weight in (None, weights):
        want = compute_multi_label_loss(t(logits), t(sets), None if pos_weight is None else t(pos_weight))
        assert abs(float(multi_label_loss(logits, sets, pos_weight)) - float(want)) <= 1e-6
    want = compute_classification_loss(t(logits), t(classes), weight=t(weights))
    assert abs(float(weighted_cross_entropy(logits, classes, weights)) - float(want)) <= 1e-6
    # rows padding a batch: NaN label sets, -100 classes; neither loss moves, gradients stay finite
    pad_logits = np.concatenate([logits, logits[:2]])
    pad_sets = np.concatenate([sets, np.full((2, 4), np.nan, np.float32)])
    unpadded = float(multi_label_loss(logits, sets, weights))
    assert abs(float(multi_label_loss(pad_logits, pad_sets, weights)) - unpadded) <= 1e-6
    assert np.isfinite(np.asarray(jax.grad(lambda x: multi_label_loss(x, pad_sets, weights))(pad_logits))).all()
    pad_classes = np.concatenate([classes, [-100, -100]])
    assert abs(float(weighted_cross_entropy(pad_logits, pad_classes, weights)) - float(want)) <= 1e-6


def test_label_sets_and_class_weights_take_the_labels_head():
    task = make_task("classification", FinetuneConfig(model="x"))
    assert task_head(task) == TaskHead("classification")
    task.multi_label, task.class_weights = True, [1.0, 4.0]
    assert task_head(task) == LabelsHead("classification", multi_label=True, weights=(1.0, 4.0))


def test_the_engine_pads_label_sets_by_rows_with_nan_targets():
    from types import SimpleNamespace

    from bert_kit.jax.batches import HostBatches

    head = LabelsHead("classification", multi_label=True)
    host_batches = HostBatches(SimpleNamespace(max_length=64, batch_size=3), head, 0, 1)
    ids = torch.tensor([[2, 5, 3], [2, 6, 3]])
    sets = torch.tensor([[1.0, 0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]])  # 5 labels; a row with none
    batch = host_batches([{"input_ids": ids, "attention_mask": (ids > 0).long(),
                           "token_type_ids": torch.zeros_like(ids), "labels": sets}], "train")
    assert batch["input_ids"].shape == (1, 3, 32) and batch["labels"].shape == (1, 3, 5)  # labels not padded to T
    assert batch["labels"][0, :2].tolist() == sets.tolist() and np.isnan(batch["labels"][0, 2]).all()



@pytest.mark.parametrize("name", ["bce", "listnet", "lambdaloss"])
def test_ranking_losses_equal_torchs_and_leave_out_padding(name):
    """(Q, n) scores of queries with 2 to 5 candidates (graded labels, a tie among them), then with
    two queries padding the batch (no candidate, NaN labels): the same loss, finite gradients."""
    rng = np.random.default_rng(1)
    scores = rng.normal(size=(4, 5)).astype(np.float32)
    labels = rng.integers(0, 3, size=(4, 5)).astype(np.float32)
    mask = np.arange(5)[None] < np.array([5, 3, 2, 4])[:, None]
    labels[~mask] = 0.0
    torch_loss = {"bce": ranking.binary_cross_entropy, "listnet": ranking.listnet_loss,
                  "lambdaloss": ranking.lambda_loss}[name]
    want = float(torch_loss(torch.as_tensor(scores), torch.as_tensor(labels), torch.as_tensor(mask)))
    loss = RANKING_LOSSES[name]
    assert abs(float(loss(scores, labels, mask)) - want) <= 1e-5 * max(1.0, abs(want))
    padded = (np.concatenate([scores, scores[:2]]), np.concatenate([labels, np.full((2, 5), np.nan, np.float32)]),
              np.concatenate([mask, np.zeros((2, 5), bool)]))
    labels_in = np.where(padded[2], padded[1], 0.0)  # as RerankHead.loss hands them on
    assert abs(float(loss(padded[0], labels_in, padded[2])) - want) <= 1e-5 * max(1.0, abs(want))
    grads = jax.grad(lambda x: loss(x, labels_in, padded[2]))(padded[0])
    assert np.isfinite(np.asarray(grads)).all() and float(np.abs(grads).sum()) > 0


def test_a_reranker_batch_is_laid_out_candidate_after_candidate():
    """Queries of 3, 1 and 2 candidates (`RerankerTask.collate`'s pairs and slots) in a grid of 3:
    row j Q + q is candidate j of query q; a missing candidate repeats the query's first, masked."""
    ids = np.arange(6)[:, None] * np.ones((1, 4), np.int64)  # pair p's tokens are all p
    mask = np.array([[1, 1, 1], [1, 0, 0], [1, 1, 0]], bool)
    batch = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids),
             "group_labels": np.where(mask, [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 2.0, 0.0]], 0.0),
             "group_mask": mask, "slots": np.flatnonzero(mask)}
    out = RerankHead("reranker", candidates=4).layout(batch)
    assert out["input_ids"][:, 0].tolist() == [0, 3, 4, 1, 3, 5, 2, 3, 4, 0, 3, 4]
    assert out["group_mask"].tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0]]
    assert out["group_labels"][2, :2].tolist() == [0.0, 2.0] and "slots" not in out
    with pytest.raises(ValueError, match="holds 3 candidates for a query; the engine laid out 2"):
        RerankHead("reranker", candidates=2).layout(batch)



def test_the_sides_of_a_batch_are_each_hosts_in_turn(monkeypatch):
    """One host: its rows side after side. Two: each host's rows side after side, the hosts in turn
    (as a batch's global rows hold them), so side 0 gathers both hosts' first sentences."""
    rows = np.arange(8)  # (sides 2 x 4 examples)
    assert by_side(rows, 2).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    # host A: a0 a1 (side 0) a0' a1' (side 1) = 0 1 2 3; host B: 4 5 6 7
    assert by_side(rows, 2).tolist() == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert by_side(np.arange(16).reshape(8, 2), 2)[1, 2].tolist() == [12, 13]  # trailing axes kept


def test_the_engine_pads_a_bi_encoders_sides_apart():
    """Two pairs of a batch of three: each side gets a third row (a copy of its first), the score NaN."""
    from types import SimpleNamespace

    from bert_kit.jax.batches import HostBatches

    host_batches = HostBatches(SimpleNamespace(max_length=64, batch_size=3), PooledHead("similarity", sides=2), 0, 1)
    ids = torch.tensor([[2, 5, 3], [2, 6, 3], [2, 7, 8], [2, 9, 0]])  # a1, a2, b1, b2
    batch = host_batches([{"input_ids": ids, "attention_mask": (ids > 0).long(),
                           "token_type_ids": torch.zeros_like(ids), "labels": torch.tensor([0.5, 0.25])}], "train")
    got = batch["input_ids"][0]
    assert got.shape == (6, 32)  # 3 pairs, both sides; 32 tokens: the shortest length bucket
    assert got[:, :3].tolist() == [[2, 5, 3], [2, 6, 3], [2, 5, 3], [2, 7, 8], [2, 9, 0], [2, 7, 8]]
    assert batch["labels"][0, :2].tolist() == [0.5, 0.25] and np.isnan(batch["labels"][0, 2])
