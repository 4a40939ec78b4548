"""Pooler, MLM head and NSP head of the NumPy engine: float64 finite-difference checks, the
masked-position conventions (-1 padding, repeated positions) and bad input.

Run: .venv/bin/python -m pytest tests/numpy_ref/test_heads.py -q
"""

import numpy as np
import pytest

from bert_kit.numpy_ref.gradcheck import check_layer
from bert_kit.numpy_ref.heads import BertMLMHead, BertNSPHead, BertPooler
from bert_kit.numpy_ref.layers import Embedding

from .gradients import assert_all_small, randomise

F64 = np.float64


def test_pooler_gradients_and_cls_only():
    rng = np.random.default_rng(0)
    pooler = BertPooler(6, dtype=F64, rng=rng)
    randomise(pooler, 1)
    hidden = rng.standard_normal((3, 4, 6))
    assert_all_small(check_layer(pooler, hidden, entries=12), {"dense.weight", "dense.bias", "input"})
    pooled = pooler.forward(hidden)
    np.testing.assert_allclose(pooled, np.tanh(hidden[:, 0] @ pooler.dense.params["weight"].T
                                               + pooler.dense.params["bias"]), rtol=0, atol=1e-14)
    grad = pooler.backward(np.ones((3, 6)))
    assert grad.shape == (3, 4, 6)
    np.testing.assert_array_equal(grad[:, 1:], 0.0)
    assert np.abs(grad[:, 0]).min() > 0


def test_mlm_head_gradients_with_padding_and_repeated_positions():
    rng = np.random.default_rng(2)
    head = BertMLMHead(6, 11, dtype=F64, rng=rng)
    randomise(head, 3)
    hidden = rng.standard_normal((2, 5, 6))
    positions = np.array([[1, 3, 3], [4, -1, -1]])  # a repeat and two padding slots
    names = {"transform.weight", "transform.bias", "norm.weight", "norm.bias", "decoder_weight", "bias", "input"}
    assert_all_small(check_layer(head, hidden, positions, entries=12), names)


def test_mlm_head_padding_slots_are_zero_and_send_no_gradient():
    rng = np.random.default_rng(4)
    head = BertMLMHead(6, 11, dtype=F64, rng=rng)
    randomise(head, 5)
    hidden = rng.standard_normal((2, 5, 6))
    positions = np.array([[2, -1], [0, 4]])
    logits = head.forward(hidden, positions)
    assert logits.shape == (2, 2, 11)
    np.testing.assert_array_equal(logits[0, 1], 0.0)
    grad = head.backward(rng.standard_normal((2, 2, 11)))  # non-zero even at the padding slot
    np.testing.assert_array_equal(grad[0, [0, 1, 3, 4]], 0.0)  # only position 2 of row 0 was read
    assert np.abs(grad[0, 2]).min() > 0
    # None means every position: the (B, T, V) layout of the second API.
    assert head.forward(hidden).shape == (2, 5, 11)


def test_mlm_head_tied_to_embedding_reuses_the_table():
    rng = np.random.default_rng(6)
    table = Embedding(11, 6, dtype=F64, rng=rng)
    head = BertMLMHead(6, 11, word_embeddings=table, dtype=F64, rng=rng)
    assert "decoder_weight" not in head.params
    assert head.decoder_weight is table.params["weight"]
    hidden = rng.standard_normal((1, 3, 6))
    head.forward(hidden, np.array([[0, 2]]))
    before = table.params["weight"].copy()
    head.backward(rng.standard_normal((1, 2, 11)), lr=0.5)
    np.testing.assert_array_equal(table.params["weight"], before)  # the table's owner updates it
    assert head.grads["decoder_weight"].shape == (11, 6)
    with pytest.raises(ValueError, match="tied embedding shape"):
        BertMLMHead(5, 11, word_embeddings=table)


def test_nsp_head_gradients():
    rng = np.random.default_rng(7)
    head = BertNSPHead(6, dtype=F64, rng=rng)
    randomise(head, 8)
    errors = check_layer(head, rng.standard_normal((4, 6)), entries=12)
    assert_all_small(errors, {"dense.weight", "dense.bias", "input"})
    assert head.forward(np.zeros((4, 6))).shape == (4, 2)


def test_heads_bad_input():
    head = BertMLMHead(6, 11)
    hidden = np.zeros((2, 5, 6), np.float32)
    with pytest.raises(ValueError, match=r"masked_positions\[\(0, 1\)\] = 5 is out of range.*-1 for padding"):
        head.forward(hidden, np.array([[1, 5], [0, 0]]))
    with pytest.raises(ValueError, match=r"masked_positions\[\(1, 0\)\] = -2"):
        head.forward(hidden, np.array([[1, 2], [-2, 0]]))
    with pytest.raises(ValueError, match="masked_positions has batch 1"):
        head.forward(hidden, np.array([[1, 2]]))
    with pytest.raises(ValueError, match=r"MLM head expects \(batch, seq_len, 6\)"):
        head.forward(np.zeros((5, 6), np.float32), np.array([[1]]))
    with pytest.raises(ValueError, match="pooler expects"):
        BertPooler(6).forward(np.zeros((2, 6), np.float32))
    with pytest.raises(ValueError, match="NSP head expects"):
        BertNSPHead(6).forward(np.zeros((2, 3, 6), np.float32))
