"""Embeddings, self-attention, feed-forward, encoder layer and encoder stack of the NumPy engine:
float64 finite-difference checks of every parameter and of the input, masking, and bad input.

Run: .venv/bin/python -m pytest tests/numpy_ref/test_encoder.py -q
"""

import numpy as np
import pytest

from bert_kit.numpy_ref.encoder import (BertEmbeddings, BertEncoder, FeedForward, MultiHeadSelfAttention,
                                        TransformerEncoderBlock, sinusoidal_positions)
from bert_kit.numpy_ref.gradcheck import check_layer

from .gradients import assert_all_small, randomise

F64 = np.float64


def linear_names(*prefixes: str) -> set[str]:
    return {f"{p}.{w}" for p in prefixes for w in ("weight", "bias")}


@pytest.mark.parametrize("masked", [False, True])
def test_attention_gradients(masked):
    rng = np.random.default_rng(0)
    attn = MultiHeadSelfAttention(8, 2, dtype=F64, rng=rng)
    randomise(attn, 1)
    x = rng.standard_normal((2, 5, 8))
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]) if masked else None
    errors = check_layer(attn, x, mask, entries=8)
    assert_all_small(errors, linear_names("query", "key", "value", "output") | {"input"})


def test_key_bias_gradient_is_zero():
    # Adding b_k shifts every score of a query row by q . b_k; softmax ignores shifts.
    rng = np.random.default_rng(2)
    attn = MultiHeadSelfAttention(8, 2, dtype=F64, rng=rng)
    randomise(attn, 3)
    attn.forward(rng.standard_normal((2, 4, 8)))
    attn.backward(rng.standard_normal((2, 4, 8)))
    assert np.abs(attn.key.grads["bias"]).max() < 1e-14
    assert np.abs(attn.query.grads["bias"]).max() > 1e-3


def test_attention_mask_hides_padded_keys():
    rng = np.random.default_rng(4)
    attn = MultiHeadSelfAttention(8, 4, dtype=F64, rng=rng)
    x = rng.standard_normal((1, 6, 8))
    mask = np.array([[1, 1, 1, 1, 0, 0]])
    out = attn.forward(x, mask)
    x_changed = x.copy()
    x_changed[:, 4:] = 100.0  # whatever the padded tokens hold, real tokens must not see it
    np.testing.assert_allclose(attn.forward(x_changed, mask)[:, :4], out[:, :4], rtol=0, atol=1e-12)


def test_attention_heads_must_divide_dim():
    with pytest.raises(ValueError, match=r"dim_model \(30\) must be divisible by num_heads \(4\)"):
        MultiHeadSelfAttention(30, 4)


@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_feedforward_gradients(activation):
    rng = np.random.default_rng(5)
    ffn = FeedForward(6, 10, activation=activation, dtype=F64, rng=rng)
    randomise(ffn, 6)
    errors = check_layer(ffn, rng.standard_normal((2, 3, 6)), entries=10)
    assert_all_small(errors, linear_names("dense_in", "dense_out") | {"input"})


def test_encoder_block_and_stack_gradients():
    rng = np.random.default_rng(7)
    block = TransformerEncoderBlock(8, 2, 12, dtype=F64, rng=rng)
    randomise(block, 8)
    x = rng.standard_normal((2, 4, 8))
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1]])
    block_names = (linear_names("attention.query", "attention.key", "attention.value", "attention.output",
                                "attention_norm", "ffn.dense_in", "ffn.dense_out", "ffn_norm") | {"input"})
    assert_all_small(check_layer(block, x, mask, entries=6), block_names)

    encoder = BertEncoder(8, 2, 12, 2, dtype=F64, rng=rng)
    randomise(encoder, 9)
    names = {f"layers.{i}.{n}" for i in range(2) for n in block_names - {"input"}} | {"input"}
    assert_all_small(check_layer(encoder, x, mask, entries=4), names)


def test_encoder_block_is_post_norm():
    rng = np.random.default_rng(10)
    block = TransformerEncoderBlock(8, 2, 12, dtype=F64, rng=rng)
    x = rng.standard_normal((1, 3, 8))
    out = block.forward(x)
    h = block.attention_norm.forward(x + block.attention.forward(x))
    expected = block.ffn_norm.forward(h + block.ffn.forward(h))
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-14)
    # Post-norm: every output row is normalised (LayerNorm weight 1, bias 0 at init).
    np.testing.assert_allclose(out.mean(-1), 0.0, atol=1e-12)
    np.testing.assert_allclose(out.std(-1), 1.0, atol=1e-9)


@pytest.mark.parametrize("position_embedding", ["learned", "sinusoidal"])
def test_embedding_gradients_reach_all_tables(position_embedding):
    rng = np.random.default_rng(11)
    emb = BertEmbeddings(12, 6, 8, dtype=F64, rng=rng, position_embedding=position_embedding)
    randomise(emb, 12)
    emb.word_embeddings.padding_idx = None  # pure lookup gradient for the check
    ids = rng.integers(0, 12, (3, 5))
    segments = rng.integers(0, 2, (3, 5))
    tables = {"word_embeddings.weight", "token_type_embeddings.weight", "norm.weight", "norm.bias"}
    if position_embedding == "learned":
        tables.add("position_embeddings.weight")
    errors = check_layer(emb, ids, segments, input_is_differentiable=False, entries=30)
    assert_all_small(errors, tables)
    if position_embedding == "learned":  # rows beyond the sequence length are never used
        np.testing.assert_array_equal(emb.position_embeddings.grads["weight"][5:], 0.0)
        assert np.abs(emb.position_embeddings.grads["weight"][:5]).min() > 0


def test_sinusoidal_table_is_fixed_and_correct():
    table = sinusoidal_positions(10, 6, np.float64)
    assert table.shape == (10, 6)
    np.testing.assert_allclose(table[3, 0], np.sin(3.0))
    np.testing.assert_allclose(table[3, 1], np.cos(3.0))
    np.testing.assert_allclose(table[7, 4], np.sin(7 / 10000 ** (4 / 6)))
    emb = BertEmbeddings(10, 6, 10, position_embedding="sinusoidal")
    assert "position_embeddings.weight" not in dict(emb.named_parameters())


def test_embedding_bad_input():
    emb = BertEmbeddings(10, 4, 6)
    with pytest.raises(ValueError, match=r"token_ids must have 2 dims, got shape \(6,\)"):
        emb.forward(np.arange(6))
    with pytest.raises(ValueError, match=r"token_ids\[\(0, 2\)\] = 10 is out of range"):
        emb.forward(np.array([[1, 2, 10]]))
    with pytest.raises(ValueError, match=r"token_ids\[\(0, 0\)\] = -1 is out of range"):
        emb.forward(np.array([[-1, 2, 3]]))
    with pytest.raises(ValueError, match=r"segment_ids\[\(0, 1\)\] = 2"):
        emb.forward(np.array([[1, 2]]), np.array([[0, 2]]))
    with pytest.raises(ValueError, match="segment_ids shape"):
        emb.forward(np.array([[1, 2]]), np.array([[0, 1, 1]]))
    with pytest.raises(ValueError, match="exceeds max_seq_len 6"):
        emb.forward(np.ones((1, 7), dtype=int))
    with pytest.raises(TypeError, match="must hold integers"):
        emb.forward(np.ones((1, 3)))
    with pytest.raises(ValueError, match="position_embedding must be"):
        BertEmbeddings(10, 4, 6, position_embedding="rotary")
