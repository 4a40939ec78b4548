"""Attention fused with its dropout, for BERT's short sequences: a Pallas kernel (Triton on GPUs).

`flash_attention(q, k, v, key_mask, seed, rate)` computes what `bert_kit.jax.model.attention`
computes, softmax(q k^T / sqrt(hd), padding keys hidden) with dropout on the probabilities, times
v, without writing the (T, T) scores or probabilities to memory:

- forward: one program per (query block, batch row, head) loops over the key blocks with an
  online softmax (FlashAttention-2) and saves each query row's log-sum-exp (base 2);
- backward: one program per (batch row, head, block) computes dK and dV of a key block (looping
  over the query blocks) and dQ of the query block of the same index (looping over the key
  blocks), recomputing the probabilities from q, k and the saved log-sum-exp;
- dropout: the mask is not stored either. Each element's keep decision is a hash of the seed and
  its (batch * heads + head, row, column) (`randomness.dropout_keep`), so the backward draws
  the forward's mask, the kernel the reference model's, and the same key the same bits on any run.

The gradient of dropped probabilities: with P the softmax, Z the mask and Pd = P * Z / (1 - p),
O = Pd V gives dV = Pd^T dO, dP = (dO V^T) * Z / (1 - p) and dS = P * (dP - delta) with
delta = rowsum(dO * O) (the rowsum of P * dP), as without dropout.

Shapes: q, k, v (B, T, nh, hd), key_mask (B, T) int32 (nonzero = a token), seed (2,) uint32; start
(1,) int32, the index of q's first batch row among all rows (a device's share of a batch starts
there: its masks are the whole batch's).
T must be a multiple of the blocks (powers of two); `fast_path` uses the kernel where it fits.
`interpret=True` runs the same kernel through XLA on any backend: the CPU tests do.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from bert_kit.jax.randomness import dropout_keep

LOG2E = math.log2(math.e)  # exp(x) = exp2(x * log2(e)): the kernels work in base 2
MASKED = -0.7 * float(jnp.finfo(jnp.float32).max)  # a hidden key's score: exp2 of it minus any max is 0


@dataclass(frozen=True)
class Blocks:
    """Tile sizes (powers of two, at most T) and Triton's launch settings."""

    q: int = 128  # query rows per forward program
    k: int = 64  # key rows per step of the forward's loop
    outer: int = 64  # backward: the key block a program's dK, dV cover (and the query block of its dQ)
    inner: int = 64  # backward: the rows each step of its loops takes
    num_warps: int = 4
    num_stages: int = 3

    def fit(self, T: int) -> "Blocks":
        """These blocks, none longer than T."""
        return Blocks(min(self.q, T), min(self.k, T), min(self.outer, T), min(self.inner, T), self.num_warps,
                      self.num_stages)


def fits(T: int, head_dim: int, blocks: Blocks = Blocks()) -> bool:
    """Whether the kernel takes sequences of T tokens and heads of `head_dim`: T a power of two from
    16 to 512 (the blocks divide it), head_dim a power of two from 16 to 128 (Triton's dot)."""
    power = lambda n: n & (n - 1) == 0  # noqa: E731
    b = blocks.fit(T)
    return (16 <= T <= 512 and power(T) and 16 <= head_dim <= 128 and power(head_dim)
            and all(T % n == 0 for n in (b.q, b.k, b.outer, b.inner)))


def _forward_kernel(seed_ref, start_ref, q_ref, k_ref, v_ref, mask_ref, o_ref, lse_ref, *, scale: float, rate: float,
                    block_k: int, num_heads: int):
    """One (query block, batch row, head): q_ref (block_q, hd); k_ref, v_ref (T, hd); mask_ref (T,)."""
    T, block_q = k_ref.shape[0], q_ref.shape[0]
    i, b, h = pl.program_id(0), start_ref[0] + pl.program_id(1), pl.program_id(2)
    rows = i * block_q + lax.iota(jnp.int32, block_q)
    seed = (seed_ref[0], seed_ref[1])
    q = q_ref[...]

    def step(j, carry):
        o, m, l = carry
        keys = pl.ds(j * block_k, block_k)
        s = plgpu.dot(q, k_ref[keys, :].T) * (scale * LOG2E)  # (block_q, block_k) float32, base-2 logits
        s = jnp.where((mask_ref[keys] != 0)[None, :], s, MASKED)
        m_new = jnp.maximum(m, s.max(axis=-1))
        correction = jnp.exp2(m - m_new)
        p = jnp.exp2(s - m_new[:, None])
        l = l * correction + p.sum(axis=-1)  # the softmax's denominator: before dropout
        if rate > 0:
            cols = j * block_k + lax.iota(jnp.int32, block_k)
            keep = dropout_keep(seed, b * num_heads + h, rows[:, None], cols[None, :], T, rate)
            p = jnp.where(keep, p, 0.0)
        v = v_ref[keys, :]
        return o * correction[:, None] + plgpu.dot(p.astype(v.dtype), v), m_new, l

    init = (jnp.zeros(q.shape, jnp.float32), jnp.full((block_q,), -jnp.inf, jnp.float32),
            jnp.zeros((block_q,), jnp.float32))
    o, m, l = lax.fori_loop(0, T // block_k, step, init)
    o_ref[...] = (o * (1.0 / (1.0 - rate) / l)[:, None]).astype(o_ref.dtype)
    lse_ref[...] = m + jnp.log2(l)


def _forward(q, k, v, key_mask, seed, start, rate: float, blocks: Blocks, interpret: bool):
    B, T, nh, hd = q.shape
    b = blocks.fit(T)
    kernel = functools.partial(_forward_kernel, scale=1.0 / math.sqrt(hd), rate=rate, block_k=b.k, num_heads=nh)
    whole = pl.BlockSpec((None, T, None, hd), lambda i, j, n: (j, 0, n, 0))  # a (batch row, head)'s T rows
    return pl.pallas_call(
        kernel, grid=(T // b.q, B, nh),
        in_specs=[pl.BlockSpec((2,), lambda i, j, n: (0,)), pl.BlockSpec((1,), lambda i, j, n: (0,)),
                  pl.BlockSpec((None, b.q, None, hd), lambda i, j, n: (j, i, n, 0)), whole, whole,
                  pl.BlockSpec((None, T), lambda i, j, n: (j, 0))],
        out_specs=[pl.BlockSpec((None, b.q, None, hd), lambda i, j, n: (j, i, n, 0)),
                   pl.BlockSpec((None, None, b.q), lambda i, j, n: (j, n, i))],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((B, nh, T), jnp.float32)],
        compiler_params=plgpu.CompilerParams(num_warps=b.num_warps, num_stages=b.num_stages),
        interpret=interpret, name="bert_attention_forward",
    )(seed, start, q, k, v, key_mask)


def _backward_kernel(seed_ref, start_ref, q_ref, k_ref, v_ref, mask_ref, do_ref, lse_ref, delta_ref, dq_ref, dk_ref,
                     dv_ref, *, scale: float, rate: float, inner: int, num_heads: int):
    """One (batch row, head, block n): dK, dV of key block n and dQ of query block n. q_ref, k_ref,
    v_ref, do_ref (T, hd); lse_ref, delta_ref (T,); mask_ref (T,); the outputs (outer, hd)."""
    T, outer = q_ref.shape[0], dk_ref.shape[0]
    b, h, n = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    seed, stream = (seed_ref[0], seed_ref[1]), (start_ref[0] + b) * num_heads + h
    inv_keep = 1.0 / (1.0 - rate)

    def grads_of_scores(q, k, v, do, visible, lse, delta, rows, cols):
        """(dropped probabilities, dS) of one tile: q, do (r, hd); k, v (c, hd) -> (r, c) each."""
        s = jnp.where(visible[None, :], plgpu.dot(q, k.T) * (scale * LOG2E), MASKED)
        p = jnp.exp2(s - lse[:, None])  # the softmax, recomputed
        dp = plgpu.dot(do, v.T)  # the gradient of the dropped probabilities
        if rate > 0:
            keep = dropout_keep(seed, stream, rows[:, None], cols[None, :], T, rate)
            dropped, dp = jnp.where(keep, p * inv_keep, 0.0), jnp.where(keep, dp * inv_keep, 0.0)
        else:
            dropped = p
        return dropped, p * (dp - delta[:, None])

    # dK and dV of key block n, over every query block
    keys = pl.ds(n * outer, outer)
    k, v, visible = k_ref[keys, :], v_ref[keys, :], mask_ref[keys] != 0
    cols = n * outer + lax.iota(jnp.int32, outer)

    def over_queries(j, carry):
        dk, dv = carry
        queries = pl.ds(j * inner, inner)
        q, do = q_ref[queries, :], do_ref[queries, :]
        rows = j * inner + lax.iota(jnp.int32, inner)
        dropped, ds = grads_of_scores(q, k, v, do, visible, lse_ref[queries], delta_ref[queries], rows, cols)
        return dk + plgpu.dot(ds.astype(q.dtype).T, q), dv + plgpu.dot(dropped.astype(do.dtype).T, do)

    zeros = jnp.zeros((outer, k.shape[-1]), jnp.float32)
    dk, dv = lax.fori_loop(0, T // inner, over_queries, (zeros, zeros))
    dk_ref[...] = (dk * scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)

    # dQ of query block n, over every key block
    queries = pl.ds(n * outer, outer)
    q, do, lse, delta = q_ref[queries, :], do_ref[queries, :], lse_ref[queries], delta_ref[queries]
    rows = n * outer + lax.iota(jnp.int32, outer)

    def over_keys(j, dq):
        keys = pl.ds(j * inner, inner)
        k = k_ref[keys, :]
        cols = j * inner + lax.iota(jnp.int32, inner)
        _, ds = grads_of_scores(q, k, v_ref[keys, :], do, mask_ref[keys] != 0, lse, delta, rows, cols)
        return dq + plgpu.dot(ds.astype(k.dtype), k)

    dq = lax.fori_loop(0, T // inner, over_keys, zeros)
    dq_ref[...] = (dq * scale).astype(dq_ref.dtype)


def _backward(q, k, v, key_mask, seed, start, o, lse, do, rate: float, blocks: Blocks, interpret: bool):
    B, T, nh, hd = q.shape
    b = blocks.fit(T)
    # delta = rowsum(dO * O), (B, nh, T): a small XLA reduction
    delta = jnp.einsum("btnh,btnh->bnt", do.astype(jnp.float32), o.astype(jnp.float32))
    kernel = functools.partial(_backward_kernel, scale=1.0 / math.sqrt(hd), rate=rate, inner=b.inner, num_heads=nh)
    whole = pl.BlockSpec((None, T, None, hd), lambda i, j, n: (i, 0, j, 0))
    rows = pl.BlockSpec((None, None, T), lambda i, j, n: (i, j, 0))
    block = pl.BlockSpec((None, b.outer, None, hd), lambda i, j, n: (i, n, j, 0))
    return pl.pallas_call(
        kernel, grid=(B, nh, T // b.outer),
        in_specs=[pl.BlockSpec((2,), lambda i, j, n: (0,)), pl.BlockSpec((1,), lambda i, j, n: (0,)), whole, whole,
                  whole, pl.BlockSpec((None, T), lambda i, j, n: (i, 0)), whole, rows, rows],
        out_specs=[block, block, block],
        out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v)],
        compiler_params=plgpu.CompilerParams(num_warps=b.num_warps, num_stages=b.num_stages),
        interpret=interpret, name="bert_attention_backward",
    )(seed, start, q, k, v, key_mask, do, lse, delta)


def flash_attention(q: jax.Array, k: jax.Array, v: jax.Array, key_mask: jax.Array, seed: jax.Array,
                    rate: float = 0.0, blocks: Blocks = Blocks(), interpret: bool = False,
                    start: jax.Array | None = None) -> jax.Array:
    """(B, T, nh, hd) q, k, v, (B, T) int32 key_mask, (2,) uint32 seed -> (B, T, nh, hd): attention
    with dropout `rate` on its probabilities, as `bert_kit.jax.model.attention` with that seed.
    start: (1,) int32, q's first batch row among all rows (None: 0)."""
    start = jnp.zeros(1, jnp.int32) if start is None else start
    return _flash(q, k, v, key_mask, seed, start, rate, blocks, interpret)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8))
def _flash(q, k, v, key_mask, seed, start, rate, blocks, interpret):
    return _forward(q, k, v, key_mask, seed, start, rate, blocks, interpret)[0]


def _flash_forward(q, k, v, key_mask, seed, start, rate, blocks, interpret):
    o, lse = _forward(q, k, v, key_mask, seed, start, rate, blocks, interpret)
    return o, (q, k, v, key_mask, seed, start, o, lse)


def _flash_backward(rate, blocks, interpret, residuals, do):
    q, k, v, key_mask, seed, start, o, lse = residuals
    dq, dk, dv = _backward(q, k, v, key_mask, seed, start, o, lse, do, rate, blocks, interpret)
    return dq, dk, dv, None, None, None  # the mask, the seed and start take no gradient


_flash.defvjp(_flash_forward, _flash_backward)
