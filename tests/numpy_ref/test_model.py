"""Whole NumPy models: float64 finite-difference check of every parameter tensor of the
pretraining model (tied decoder, segments, padding mask), the losses, the SGD contract of
``backward(grad_mlm, grad_nsp, lr)``, the second API (``create_bert_model``) and bad input.

Run: .venv/bin/python -m pytest tests/numpy_ref/test_model.py -q
"""

import numpy as np
import pytest

from bert_kit.numpy_ref import (BertBaseModel, BertForPretraining, BertModel, create_bert_model,
                                create_mlm_batch)
from bert_kit.numpy_ref.gradcheck import check_layer, compare_gradients

F64 = np.float64
TOL = 1e-6
VOCAB, HIDDEN, HEADS, FF, LAYERS, MAX_LEN = 20, 8, 2, 16, 2, 10


def tiny_model(cls=BertModel, seed: int = 0, **kwargs):
    model = cls(VOCAB, HIDDEN, HEADS, FF, LAYERS, MAX_LEN, dtype=F64, seed=seed, initializer_range=0.3, **kwargs)
    rng = np.random.default_rng(seed + 100)
    for _, param in model.named_parameters():
        if param.ndim == 1:  # biases and LayerNorm away from 0 / 1
            param += rng.standard_normal(param.shape) * 0.2
    return model


def pair_inputs():
    """Two segments, a padded sequence and masked positions with padding slots."""
    batch = create_mlm_batch(3, 9, VOCAB, mask_prob=0.3, random_seed=0)
    segments = np.zeros_like(batch.input_ids)
    segments[:, 5:] = 1
    attention = np.ones_like(batch.input_ids)
    attention[0, 7:] = 0
    input_ids = batch.input_ids.copy()
    input_ids[0, 7:] = 0  # [PAD] tokens under the mask
    assert (batch.masked_positions == -1).any()
    return input_ids, segments, batch.masked_positions, batch.mlm_labels, attention


def test_pretraining_model_gradients_for_every_parameter():
    model = tiny_model()
    input_ids, segments, positions, labels, attention = pair_inputs()
    nsp_labels = np.array([0, 1, 1])

    def loss() -> float:
        mlm_logits, nsp_logits = model.forward(input_ids, segments, positions, attention)
        return model.mlm_loss_and_grad(mlm_logits, labels)[0] + model.nsp_loss_and_grad(nsp_logits, nsp_labels)[0]

    mlm_logits, nsp_logits = model.forward(input_ids, segments, positions, attention)
    _, grad_mlm = model.mlm_loss_and_grad(mlm_logits, labels)
    _, grad_nsp = model.nsp_loss_and_grad(nsp_logits, nsp_labels)
    model.backward(grad_mlm, grad_nsp, lr=0.0)
    analytic = {name: grad.copy() for name, grad in model.named_grads()}
    params = dict(model.named_parameters())
    assert len(params) == 5 + 16 * LAYERS + 2 + 5 + 2  # embeddings, layers, pooler, MLM, NSP
    errors = compare_gradients(loss, params, analytic, entries=6)
    bad = {name: err for name, err in errors.items() if not err < TOL}
    assert not bad, f"gradient check failed: {bad}"
    # Every table gets a gradient, positions and segments included.
    for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
        assert np.abs(analytic[f"bert.embeddings.{name}.weight"]).max() > 1e-4


@pytest.mark.parametrize("position_embedding", ["learned", "sinusoidal"])
def test_base_model_gradients(position_embedding):
    model = tiny_model(BertBaseModel, seed=5, position_embedding=position_embedding)
    model.embeddings.word_embeddings.padding_idx = None  # pure lookup gradient (ids include [PAD])
    ids = np.random.default_rng(6).integers(0, VOCAB, (2, 7))
    errors = check_layer(model, ids, np.zeros_like(ids), input_is_differentiable=False, entries=4)
    expected = {name for name, _ in model.named_parameters()}
    assert set(errors) == expected and ("embeddings.position_embeddings.weight" in expected) == (
        position_embedding == "learned")
    bad = {name: err for name, err in errors.items() if not err < TOL}
    assert not bad, f"gradient check failed: {bad}"
    np.testing.assert_array_equal(model.pooler.dense.grads["weight"], 0.0)  # pooler unused here


def test_tied_decoder_gradient_flows_into_word_embeddings():
    model = tiny_model()
    input_ids, segments, positions, labels, attention = pair_inputs()
    mlm_logits, _ = model.forward(input_ids, segments, positions, attention)
    _, grad_mlm = model.mlm_loss_and_grad(mlm_logits, labels)
    model.backward(grad_mlm, None, lr=0.0)
    word = model.bert.embeddings.word_embeddings
    decoder_part = model.mlm_head.grads["decoder_weight"]
    unused = np.setdiff1d(np.arange(VOCAB), input_ids)  # rows only the decoder touches
    assert unused.size > 0
    np.testing.assert_array_equal(word.grads["weight"][unused], decoder_part[unused])
    # [PAD] is looked up (under the mask) but, as in torch, only the decoder trains it.
    np.testing.assert_array_equal(word.grads["weight"][0], decoder_part[0])


def test_backward_lr_zero_keeps_weights_and_lr_is_one_sgd_step():
    model = tiny_model()
    input_ids, segments, positions, labels, attention = pair_inputs()
    before = {name: p.copy() for name, p in model.named_parameters()}

    def step(lr: float) -> None:
        mlm_logits, nsp_logits = model.forward(input_ids, segments, positions, attention)
        model.backward(model.mlm_loss_and_grad(mlm_logits, labels)[1],
                       model.nsp_loss_and_grad(nsp_logits, np.array([1, 0, 1]))[1], lr)

    step(0.0)
    for name, param in model.named_parameters():
        np.testing.assert_array_equal(param, before[name], err_msg=name)
    grads = {name: g.copy() for name, g in model.named_grads()}
    step(0.1)
    for name, param in model.named_parameters():
        np.testing.assert_allclose(param, before[name] - 0.1 * grads[name], rtol=0, atol=1e-15, err_msg=name)


def test_losses_match_direct_formulas_and_ignore_padding():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((2, 3, 5))
    labels = np.array([[4, -1, 0], [-100, 2, -1]])
    loss, grad = BertModel.mlm_loss_and_grad(logits, labels)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    expected = -(log_probs[0, 0, 4] + log_probs[0, 2, 0] + log_probs[1, 1, 2]) / 3
    np.testing.assert_allclose(loss, expected, rtol=1e-13)
    np.testing.assert_array_equal(grad[0, 1], 0.0)
    np.testing.assert_allclose(grad.sum(-1), 0.0, atol=1e-15)  # softmax - onehot sums to 0 per row
    # An explicit mask can drop a real label too.
    loss_masked, _ = BertModel.mlm_loss_and_grad(logits, labels, mask=np.array([[1, 0, 0], [0, 1, 0]]))
    np.testing.assert_allclose(loss_masked, -(log_probs[0, 0, 4] + log_probs[1, 1, 2]) / 2, rtol=1e-13)
    # No masked token at all: zero loss and gradient, not nan.
    empty_loss, empty_grad = BertModel.mlm_loss_and_grad(logits, np.full((2, 3), -1))
    assert empty_loss == 0.0 and not empty_grad.any()

    nsp_logits = rng.standard_normal((4, 2))
    nsp_loss, nsp_grad = BertModel.nsp_loss_and_grad(nsp_logits, np.array([0, 1, 1, 0]))
    nsp_log_probs = nsp_logits - np.log(np.exp(nsp_logits).sum(-1, keepdims=True))
    np.testing.assert_allclose(nsp_loss, -nsp_log_probs[[0, 1, 2, 3], [0, 1, 1, 0]].mean(), rtol=1e-13)
    assert nsp_grad.shape == (4, 2)


def test_loss_bad_input():
    with pytest.raises(ValueError, match=r"mlm labels\[\(0, 1\)\] = 5 is out of range"):
        BertModel.mlm_loss_and_grad(np.zeros((1, 2, 5)), np.array([[1, 5]]))
    with pytest.raises(ValueError, match="MLM logits .* disagree"):
        BertModel.mlm_loss_and_grad(np.zeros((1, 2, 5)), np.array([1, 2]))
    with pytest.raises(ValueError, match=r"nsp labels\[\(1,\)\] = 2"):
        BertModel.nsp_loss_and_grad(np.zeros((2, 2)), np.array([0, 2]))
    with pytest.raises(ValueError, match="NSP logits .* disagree"):
        BertModel.nsp_loss_and_grad(np.zeros((2, 3)), np.array([0, 1]))


def test_create_bert_model_second_api():
    model = create_bert_model(vocab_size=30, max_seq_length=12, d_model=16, num_heads=4, d_ff=32,
                              num_layers=2, for_pretraining=True)
    assert isinstance(model, BertForPretraining) and isinstance(model, BertModel)
    token_ids = np.random.default_rng(2).integers(4, 30, (2, 7))
    out = model.forward(token_ids)
    assert out["mlm_logits"].shape == (2, 7, 30)
    assert out["nsp_logits"].shape == (2, 2)
    assert out["sequence_output"].shape == (2, 7, 16)
    assert out["pooled_output"].shape == (2, 16)
    assert out["mlm_logits"].dtype == np.float32
    # backward of the pretraining model works on the (B, T, V) layout too
    model.backward(np.ones((2, 7, 30), np.float32), np.ones((2, 2), np.float32), 0.0)

    base = create_bert_model(30, 12, 16, 4, 32, 2, for_pretraining=False, position_embedding="sinusoidal")
    assert isinstance(base, BertBaseModel)
    sequence = base.forward(token_ids)
    assert sequence.shape == (2, 7, 16)
    # Same seed, same base weights: the heads do not shift the encoder's initialisation.
    np.testing.assert_array_equal(create_bert_model(30, 12, 16, 4, 32, 2, for_pretraining=False).forward(token_ids),
                                  model.bert.forward(token_ids))


def test_model_bad_input():
    model = BertModel(VOCAB, HIDDEN, HEADS, FF, LAYERS, MAX_LEN)
    ids = np.array([[1, 5, 6, 2]])
    with pytest.raises(ValueError, match=r"token_ids\[\(0, 1\)\] = 20 is out of range"):
        model.forward(np.array([[1, 20, 6, 2]]), None, None)
    with pytest.raises(ValueError, match=r"token_ids\[\(0, 0\)\] = -3"):
        model.forward(np.array([[-3, 5, 6, 2]]), None, None)
    with pytest.raises(ValueError, match="token_ids must have 2 dims"):
        model.forward(ids[None], None, None)
    with pytest.raises(ValueError, match=r"masked_positions\[\(0, 0\)\] = 4"):
        model.forward(ids, None, np.array([[4]]))
    with pytest.raises(ValueError, match="attention_mask shape"):
        model.forward(ids, None, None, attention_mask=np.ones((1, 3)))
    with pytest.raises(ValueError, match=r"dim_model \(30\) must be divisible by num_heads \(4\)"):
        BertModel(VOCAB, 30, 4, FF, LAYERS, MAX_LEN)
    with pytest.raises(ValueError, match="num_layers must be a positive integer"):
        BertModel(VOCAB, HIDDEN, HEADS, FF, 0, MAX_LEN)
    with pytest.raises(ValueError, match="dtype must be float32 or float64"):
        BertModel(VOCAB, HIDDEN, HEADS, FF, LAYERS, MAX_LEN, dtype=np.float16)
    with pytest.raises(RuntimeError, match="before forward"):
        BertModel(VOCAB, HIDDEN, HEADS, FF, LAYERS, MAX_LEN).backward(None, None, 0.1)
    model.forward(ids, None, np.array([[1, 2]]))
    with pytest.raises(ValueError, match="gradient shapes"):
        model.backward(np.zeros((1, 3, VOCAB)), None, 0.1)
