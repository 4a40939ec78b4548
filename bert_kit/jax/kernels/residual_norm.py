"""A post-norm block's add & norm fused: LayerNorm(x + dropout(y)), a Pallas kernel (Triton on GPUs).

`fused_residual_norm(x, y, weight, bias, seed, rate, eps)` computes what `bert_kit.jax.model.residual_norm`
computes, reading and writing each tensor once each way, where XLA split the forward and the
backward into several fusions that pass the sum, the mask and the statistics through memory:

- forward: one program per block of rows reads x and y, draws y's dropout mask from the seed (the
  reference's, `randomness.dropout_keep`), and writes the normalized output and each row's mean
  and 1/std;
- backward: the same programs read x, y and dOut, draw the mask again, and write dX (the gradient
  of the sum s = x + dropout(y)), dY = dX * mask / (1 - p), and each block's partial sums of the
  weight's and the bias's gradients (XLA adds up the blocks').

With s^ = (s - mean) / std and g = dOut * weight (sums over a row's H channels):
dS = (g - sum(g) / H - s^ * sum(g * s^) / H) / std, dWeight = sum over rows of dOut * s^, dBias = sum of dOut.

Triton's tiles have power-of-two sides, so a row of H channels is read as C tiles of W, W the
largest power of two dividing H (BERT-base: 768 = 3 x 256; MiniLM: 384 = 3 x 128).

Shapes: x, y (N, H) of one dtype; weight, bias (H,); seed (2,) uint32; start (1,) int32, the index
of x's first row among all rows (a device's share of a batch starts there: its masks are the
whole batch's). `fits` says which N and H the kernel takes; `interpret=True` runs it through XLA
on any backend (the CPU tests).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from bert_kit.jax.randomness import dropout_keep


@dataclass(frozen=True)
class Tiles:
    """Rows per program (a power of two) and Triton's launch settings."""

    rows: int = 8
    num_warps: int = 4


def split(H: int) -> tuple[int, int]:
    """(C, W): a row of H channels as C tiles of W, W the largest power of two dividing H."""
    W = H & -H
    return H // W, W


def fits(N: int, H: int, tiles: Tiles = Tiles()) -> bool:
    """Whether the kernel takes N rows of H channels: N a multiple of the rows per program, the
    tiles at least 16 wide and at most 8 of them (H = 768: 3 of 256)."""
    C, W = split(H)
    return N % tiles.rows == 0 and W >= 16 and C <= 8


def _residual_sum(seed_ref, x_ref, y_ref, c: int, rows: jax.Array, rate: float):
    """Tile c of s = x + dropout(y), float32 (R, W), and its keep mask (None without dropout)."""
    _, C, W = x_ref.shape
    x, y = x_ref[:, c, :].astype(jnp.float32), y_ref[:, c, :].astype(jnp.float32)
    if rate == 0:
        return x + y, None
    cols = c * W + lax.iota(jnp.int32, W)
    keep = dropout_keep((seed_ref[0], seed_ref[1]), 0, rows[:, None], cols[None, :], C * W, rate)
    return x + jnp.where(keep, y * (1.0 / (1.0 - rate)), 0.0), keep


def _rows(start_ref, R: int) -> jax.Array:
    """The indices among all rows of this program's R rows."""
    return start_ref[0] + pl.program_id(0) * R + lax.iota(jnp.int32, R)


def _forward_kernel(seed_ref, start_ref, x_ref, y_ref, w_ref, b_ref, out_ref, mean_ref, rstd_ref, *, rate: float,
                    eps: float):
    """One block of R rows: x_ref, y_ref, out_ref (R, C, W); w_ref, b_ref (C, W); mean_ref, rstd_ref (R,)."""
    R, C, W = x_ref.shape
    rows = _rows(start_ref, R)
    s = [_residual_sum(seed_ref, x_ref, y_ref, c, rows, rate)[0] for c in range(C)]
    mean = sum(t.sum(axis=1) for t in s) / (C * W)
    var = sum(jnp.square(t - mean[:, None]).sum(axis=1) for t in s) / (C * W)
    rstd = lax.rsqrt(var + eps)
    for c in range(C):
        normed = (s[c] - mean[:, None]) * rstd[:, None]
        out_ref[:, c, :] = (normed * w_ref[c, :].astype(jnp.float32) + b_ref[c, :].astype(jnp.float32)).astype(
            out_ref.dtype)
    mean_ref[...] = mean
    rstd_ref[...] = rstd


def _backward_kernel(seed_ref, start_ref, x_ref, y_ref, w_ref, mean_ref, rstd_ref, do_ref, dx_ref, dy_ref, dw_ref,
                     db_ref, *, rate: float):
    """One block of R rows: x_ref, y_ref, do_ref, dx_ref, dy_ref (R, C, W); w_ref (C, W); mean_ref,
    rstd_ref (R,); dw_ref, db_ref (C, W): this block's sums over its rows."""
    R, C, W = x_ref.shape
    rows = _rows(start_ref, R)
    mean, rstd = mean_ref[...][:, None], rstd_ref[...][:, None]

    def tile(c: int):
        s, keep = _residual_sum(seed_ref, x_ref, y_ref, c, rows, rate)
        normed = (s - mean) * rstd
        do = do_ref[:, c, :].astype(jnp.float32)
        return normed, do, do * w_ref[c, :].astype(jnp.float32), keep

    # pass 1: the row sums of g and g * s^; pass 2 reads the tiles again (from cache) and writes,
    # where holding every tile of both would spill Triton's registers
    g_sum, gs_sum = 0.0, 0.0
    for c in range(C):
        normed, _, g, _ = tile(c)
        g_sum, gs_sum = g_sum + g.sum(axis=1), gs_sum + (g * normed).sum(axis=1)
    g_mean, gs_mean = g_sum[:, None] / (C * W), gs_sum[:, None] / (C * W)
    for c in range(C):
        normed, do, g, keep = tile(c)
        ds = (g - g_mean - normed * gs_mean) * rstd
        dx_ref[:, c, :] = ds.astype(dx_ref.dtype)
        dy = ds if keep is None else jnp.where(keep, ds * (1.0 / (1.0 - rate)), 0.0)
        dy_ref[:, c, :] = dy.astype(dy_ref.dtype)
        dw_ref[c, :] = (do * normed).sum(axis=0)
        db_ref[c, :] = do.sum(axis=0)


def _specs(N: int, H: int, tiles: Tiles):
    C, W = split(H)
    rows = pl.BlockSpec((tiles.rows, C, W), lambda i: (i, 0, 0))  # (N, C, W): a block of rows
    channels = pl.BlockSpec((C, W), lambda i: (0, 0))  # the weight or bias, whole
    stats = pl.BlockSpec((tiles.rows,), lambda i: (i,))
    per_block = pl.BlockSpec((None, C, W), lambda i: (i, 0, 0))  # (N // rows, C, W) partial sums
    scalars = [pl.BlockSpec((2,), lambda i: (0,)), pl.BlockSpec((1,), lambda i: (0,))]  # the seed, the start
    return (C, W), rows, channels, stats, per_block, scalars


def _forward(x, y, weight, bias, seed, start, rate: float, eps: float, tiles: Tiles, interpret: bool):
    N, H = x.shape
    (C, W), rows, channels, stats, _, scalars = _specs(N, H, tiles)
    out, mean, rstd = pl.pallas_call(
        functools.partial(_forward_kernel, rate=rate, eps=eps), grid=(N // tiles.rows,),
        in_specs=[*scalars, rows, rows, channels, channels], out_specs=[rows, stats, stats],
        out_shape=[jax.ShapeDtypeStruct((N, C, W), x.dtype), jax.ShapeDtypeStruct((N,), jnp.float32),
                   jax.ShapeDtypeStruct((N,), jnp.float32)],
        compiler_params=plgpu.CompilerParams(num_warps=tiles.num_warps, num_stages=1),
        interpret=interpret, name="bert_residual_norm_forward",
    )(seed, start, x.reshape(N, C, W), y.reshape(N, C, W), weight.reshape(C, W), bias.reshape(C, W))
    return out.reshape(N, H), mean, rstd


def _backward(x, y, weight, seed, start, mean, rstd, do, rate: float, tiles: Tiles, interpret: bool):
    N, H = x.shape
    (C, W), rows, channels, stats, per_block, scalars = _specs(N, H, tiles)
    blocks = N // tiles.rows
    dx, dy, dw, db = pl.pallas_call(
        functools.partial(_backward_kernel, rate=rate), grid=(blocks,),
        in_specs=[*scalars, rows, rows, channels, stats, stats, rows], out_specs=[rows, rows, per_block, per_block],
        out_shape=[jax.ShapeDtypeStruct((N, C, W), x.dtype), jax.ShapeDtypeStruct((N, C, W), y.dtype),
                   jax.ShapeDtypeStruct((blocks, C, W), jnp.float32),
                   jax.ShapeDtypeStruct((blocks, C, W), jnp.float32)],
        compiler_params=plgpu.CompilerParams(num_warps=tiles.num_warps, num_stages=1),
        interpret=interpret, name="bert_residual_norm_backward",
    )(seed, start, x.reshape(N, C, W), y.reshape(N, C, W), weight.reshape(C, W), mean, rstd, do.reshape(N, C, W))
    return dx.reshape(N, H), dy.reshape(N, H), dw.sum(0).reshape(H), db.sum(0).reshape(H)


def fused_residual_norm(x: jax.Array, y: jax.Array, weight: jax.Array, bias: jax.Array, seed: jax.Array,
                        rate: float = 0.0, eps: float = 1e-12, tiles: Tiles = Tiles(), interpret: bool = False,
                        start: jax.Array | None = None) -> jax.Array:
    """(N, H) x, y, (H,) weight, bias, (2,) uint32 seed -> (N, H): LayerNorm(x + dropout(y)) with
    dropout `rate`, as `bert_kit.jax.model.residual_norm` with that seed; statistics in float32.
    start: (1,) int32, x's first row among all rows (None: 0)."""
    start = jnp.zeros(1, jnp.int32) if start is None else start
    return _fused(x, y, weight, bias, seed, start, rate, eps, tiles, interpret)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8, 9))
def _fused(x, y, weight, bias, seed, start, rate, eps, tiles, interpret):
    return _forward(x, y, weight, bias, seed, start, rate, eps, tiles, interpret)[0]


def _fused_forward(x, y, weight, bias, seed, start, rate, eps, tiles, interpret):
    out, mean, rstd = _forward(x, y, weight, bias, seed, start, rate, eps, tiles, interpret)
    return out, (x, y, weight, bias, seed, start, mean, rstd)


def _fused_backward(rate, eps, tiles, interpret, residuals, do):
    x, y, weight, bias, seed, start, mean, rstd = residuals
    dx, dy, dw, db = _backward(x, y, weight, seed, start, mean, rstd, do, rate, tiles, interpret)
    return dx, dy, dw.astype(weight.dtype), db.astype(bias.dtype), None, None  # the seed and start take none


_fused.defvjp(_fused_forward, _fused_backward)
