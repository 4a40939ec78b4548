"""A post-norm block's add & norm, LayerNorm(x + dropout(y)), in XLA with its backward written out.

`xla_residual_norm(x, y, weight, bias, seed, rate, eps)` computes the forward of
`bert_kit.jax.model.residual_norm` op for op (on a CPU the same output, bit for bit; on a GPU XLA
may fuse the two programs' reductions differently), and replaces what autodiff derives for its backward:

- autodiff keeps y's dropout mask (one byte an element) and the sum in float32 for the backward;
  here the backward keeps the sum as computed (bf16 in a bf16 step) and each row's mean and 1/std,
  and draws the mask again from the seed (`model.residual_keep`, a hash of each position);
- inside the scan over a short fine-tune's blocks (`BertEncoder.scan`), XLA read autodiff's
  stacked float32 sums and masks in two LayerNorm-backward fusions per block that took 1.3 ms of
  MiniLM's 5.5 ms step on an H200; with this backward the gradients took 4.17 ms, not 5.37-5.60
  (benchmarks/reports/2026-12-01-h200-jax-written-norm-backward.md).

With s^ = (s - mean) / std and g = dOut * weight (means over a row's H channels):
dS = (g - mean(g) - s^ * mean(g * s^)) / std, dWeight = sum over rows of dOut * s^, dBias = sum
of dOut; dX = dS, dY = dX * mask / (1 - p). In a bf16 step the gradients differ from autodiff's by
bf16's rounding of the sum (autodiff's backward read it unrounded, in float32): at most 1% of the
largest in the tests, the weight's most.

Shapes: x, y (N, H) of one dtype; weight, bias (H,); seed (2,) uint32 (any value without dropout).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from bert_kit.jax.model import residual_dropout, residual_keep


def xla_residual_norm(x: jax.Array, y: jax.Array, weight: jax.Array, bias: jax.Array, seed: jax.Array,
                      rate: float = 0.0, eps: float = 1e-12) -> jax.Array:
    """(N, H) x, y, (H,) weight, bias, (2,) uint32 seed -> (N, H): LayerNorm(x + dropout(y)) with
    dropout `rate`, as `bert_kit.jax.model.residual_norm` with that seed; statistics in float32."""
    return _written(x, y, weight, bias, seed, rate, eps)


def _forward(x, y, weight, bias, seed, rate: float, eps: float):
    if rate > 0:  # as the reference: dropout in y's dtype, then the sum in x's
        y = residual_dropout(y, rate, seed)
    s = x + y
    s32 = s.astype(jnp.float32)
    mean = s32.mean(-1, keepdims=True)
    rstd = jax.lax.rsqrt(jnp.square(s32 - mean).mean(-1, keepdims=True) + eps)
    out = ((s32 - mean) * rstd * weight + bias).astype(x.dtype)  # `LayerNorm.__call__`'s order of operations
    return out, (s, mean, rstd, weight, bias, seed)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _written(x, y, weight, bias, seed, rate, eps):
    return _forward(x, y, weight, bias, seed, rate, eps)[0]


def _written_forward(x, y, weight, bias, seed, rate, eps):
    return _forward(x, y, weight, bias, seed, rate, eps)


def _written_backward(rate, eps, residuals, do):
    s, mean, rstd, weight, bias, seed = residuals
    do = do.astype(jnp.float32)
    normed = (s.astype(jnp.float32) - mean) * rstd
    g = do * weight
    ds = rstd * (g - g.mean(-1, keepdims=True) - normed * (g * normed).mean(-1, keepdims=True))
    dx = ds.astype(s.dtype)
    dy = residual_dropout(dx, rate, seed) if rate > 0 else dx  # the forward's mask and scale, drawn again
    dweight, dbias = (do * normed).sum(0).astype(weight.dtype), do.sum(0).astype(bias.dtype)
    return dx, dy, dweight, dbias, np.zeros(seed.shape, jax.dtypes.float0)  # the seed takes none


_written.defvjp(_written_forward, _written_backward)
