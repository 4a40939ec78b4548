"""Randomness of the JAX model: the keys a traced step draws, and dropout masks computed from a
seed by a hash of each element's position, so that a fused kernel, its backward and the reference
model draw the same mask without storing it.

Keys are drawn from keys by a hash of the key's data and a count (`derive`), not by
`jax.random.fold_in`, `split` or `bits`: each of those is threefry's 20 rounds, which a traced
step inlines at every draw (and XLA copies into each fusion that reads it). MiniLM's short
fine-tuning step drew about 14: its gradients program had 5,406 instructions after XLA's
optimizations, and 3,046 without them; XLA compiled it in 3.5-4.1 s on an H200, and now in 2.0-2.6 s."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


WEYL = 0x9E3779B9  # 2^32 / golden ratio


def derive(key: jax.Array, count: int | jax.Array) -> jax.Array:
    """The key numbered `count` of `key`'s stream, of `key`'s PRNG implementation (a legacy uint32
    key gives one): each word of the key's data hashed with its neighbour and the count. An array
    of counts (or of keys) gives an array of keys: derive(key, jnp.arange(L)) -> (L,) keys."""
    typed = jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
    data = (jax.random.key_data(key) if typed else key).astype(jnp.uint32)  # (..., words)
    count = jnp.asarray(count).astype(jnp.uint32)[..., None]
    lanes = jnp.arange(data.shape[-1], dtype=jnp.uint32) * jnp.uint32(0x632BE5AB)  # each word its own hash
    inner = _mix32(jnp.roll(data, -1, axis=-1) + (count + jnp.uint32(1)) * jnp.uint32(WEYL) + lanes)
    words = _mix32(data ^ inner)
    return jax.random.wrap_key_data(words, impl=jax.random.key_impl(key)) if typed else words


class HostKeys:
    """An `nnx.Rngs` for traced calls: `.dropout()` draws derive(key, 0), derive(key, 1), ...,
    counted on the host; `.params()` the same, for a model built under `nnx.eval_shape` (its shapes
    only: no key's value is used). nnx.Rngs counts in a traced array, and flax's update of it asks
    the new count for a sharding, which makes JAX trace the tracer's origin through the program
    traced so far (a scan of the program per draw); and it draws by `jax.random.fold_in`."""

    def __init__(self, key: jax.Array) -> None:
        self.key, self.count = key, 0

    def dropout(self) -> jax.Array:
        key = derive(self.key, self.count)
        self.count += 1
        return key

    params = dropout


def _mix32(z: jax.Array) -> jax.Array:
    """MurmurHash3's 32-bit finalizer: each input bit flips each output bit with probability ~1/2."""
    z = (z ^ (z >> jnp.uint32(16))) * jnp.uint32(0x85EBCA6B)
    z = (z ^ (z >> jnp.uint32(13))) * jnp.uint32(0xC2B2AE35)
    return z ^ (z >> jnp.uint32(16))


def dropout_keep(seed: jax.Array, stream: jax.Array, rows: jax.Array, cols: jax.Array, width: int,
                 rate: float) -> jax.Array:
    """Which elements dropout keeps: a hash of the (2,) uint32 `seed`, a `stream` and each element's
    (row, column) in rows of `width`, True with probability 1 - rate. Attention's probabilities
    are streams (batch * heads + head) of (T, T) rows, the residual's dropout one stream of
    (N, H). The arguments broadcast (a whole mask here, a tile of it in a kernel): a mask is never
    stored, a kernel's backward draws the forward's, and a seed gives the same mask on every device and run."""
    weyl = jnp.uint32(WEYL)
    stream = _mix32(seed[0] ^ _mix32(seed[1] + jnp.asarray(stream).astype(jnp.uint32) * weyl))
    bits = _mix32(stream + (rows.astype(jnp.uint32) * jnp.uint32(width) + cols.astype(jnp.uint32)) * weyl)
    # 24 bits compared as int32: signed and unsigned comparisons are the same on every backend
    return (bits >> jnp.uint32(8)).astype(jnp.int32) >= int(round(rate * (1 << 24)))


def dropout_seed(rngs: nnx.Rngs) -> jax.Array:
    """A (2,) uint32 seed for `dropout_keep`: the first two words of the `dropout` stream's next
    key (already a hash, of threefry's for an `nnx.Rngs`, `derive`'s for `HostKeys`)."""
    return jax.random.key_data(rngs.dropout()).astype(jnp.uint32).reshape(-1)[:2]
