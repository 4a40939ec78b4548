"""The keys a traced step draws (`randomness.derive`, `HostKeys`) and the dropout masks drawn
from them: deterministic, one stream per count, and masks that look independent."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from bert_kit.jax.model import residual_keep  # noqa: E402
from bert_kit.jax.randomness import HostKeys, derive, dropout_seed  # noqa: E402


def data(key: jax.Array) -> np.ndarray:
    return np.asarray(jax.random.key_data(key))


def test_derive_numbers_a_stream_of_keys_of_the_keys_kind():
    key = jax.random.key(0)
    np.testing.assert_array_equal(data(derive(key, 5)), data(derive(key, 5)))
    many = data(derive(key, jnp.arange(4)))  # an array of counts: one key each
    assert many.shape == (4, 2)
    for i in range(4):
        np.testing.assert_array_equal(many[i], data(derive(key, i)))
    drawn = {tuple(row) for row in data(derive(key, jnp.arange(1000)))}
    drawn |= {tuple(row) for row in data(derive(jax.random.key(1), jnp.arange(1000)))}
    assert len(drawn) == 2000  # no count, nor another key, repeats a key
    rbg = jax.random.key(0, impl="rbg")  # four words: each is hashed
    assert jax.random.key_impl(derive(rbg, 1)) == jax.random.key_impl(rbg)
    assert data(derive(rbg, 1)).shape == (4,) and len(set(data(derive(rbg, 1)).tolist())) == 4
    legacy = jax.random.PRNGKey(0)  # a uint32 (2,) key gives one, the typed key's words
    assert derive(legacy, 3).dtype == jnp.uint32
    np.testing.assert_array_equal(np.asarray(derive(legacy, 3)), data(derive(jax.random.wrap_key_data(legacy), 3)))


def test_the_masks_of_successive_draws_keep_their_rate_and_look_independent():
    """Eight masks of one step (HostKeys of a step's key) and one of the next step: each keeps
    1 - rate of 4,096 x 384 elements, and two agree on p^2 + (1 - p)^2 of them, as independent
    masks do."""
    rate, (N, H) = 0.1, (4096, 384)
    step_key = derive(jax.random.key(42), 7)
    keys = HostKeys(step_key)
    seeds = [dropout_seed(keys) for _ in range(8)] + [dropout_seed(HostKeys(derive(jax.random.key(42), 8)))]
    masks = [np.asarray(residual_keep(seed, N, H, rate)) for seed in seeds]
    for mask in masks:
        assert abs(mask.mean() - (1 - rate)) < 0.003
    agree = (1 - rate) ** 2 + rate ** 2
    for a in range(len(masks)):
        for b in range(a + 1, len(masks)):
            assert abs((masks[a] == masks[b]).mean() - agree) < 0.003, (a, b)
    rows, cols = masks[0].mean(1), masks[0].mean(0)  # no row or column much off the rate
    assert rows.min() > 0.8 and cols.min() > 0.85
