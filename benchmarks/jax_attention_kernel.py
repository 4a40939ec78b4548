"""The JAX engine's Pallas attention kernel against the reference, on the machine at hand (a diagnostic).

`bert_kit.jax.kernels.flash_attention` (Triton on a GPU; interpreted elsewhere) beside
`bert_kit.jax.model.attention` computed in float32 at full precision from the same inputs: the
largest difference of the output and of each gradient (of sum(output * w)), as a share of the
largest value, for float32 and bf16 inputs, with and without dropout, for a few tile settings; and
the kernel's dropout decisions beside the reference's, decision by decision.

    python benchmarks/jax_attention_kernel.py
    python benchmarks/jax_attention_kernel.py --seq 512 --head-dim 64
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from bert_kit.jax.kernels.flash_attention import Blocks, flash_attention
from bert_kit.jax.model import attention
from bert_kit.jax.randomness import dropout_keep

INTERPRET = jax.default_backend() != "gpu"


def dropout_decisions(T: int, rate: float) -> tuple[int, float, float]:
    """(decisions that differ, kept share in the kernel, kept share in the reference) of one (T, T) tile."""
    def kernel(seed_ref, o_ref):
        rows = lax.iota(jnp.int32, T)
        keep = dropout_keep((seed_ref[0], seed_ref[1]), jnp.int32(1), rows[:, None], rows[None, :], T, rate)
        o_ref[...] = keep.astype(jnp.int32)

    seed = jnp.asarray([1, 2], jnp.uint32)
    got = pl.pallas_call(kernel, grid=(1,), in_specs=[pl.BlockSpec((2,), lambda i: (0,))],
                         out_specs=pl.BlockSpec((T, T), lambda i: (0, 0)),
                         out_shape=jax.ShapeDtypeStruct((T, T), jnp.int32), interpret=INTERPRET)(seed)
    want = dropout_keep(seed, jnp.int32(1), jnp.arange(T)[:, None], jnp.arange(T)[None, :], T, rate)
    return int((got != want.astype(jnp.int32)).sum()), float(got.mean()), float(want.mean())


def errors(dtype: jnp.dtype, rate: float, blocks: Blocks, T: int, hd: int, B: int = 1, nh: int = 2) -> list[float]:
    """Relative errors of the output, dq, dk and dv; a quarter of each row's keys are padding."""
    rng = np.random.default_rng(0)
    q, k, v, w = (jnp.asarray(rng.normal(size=(B, T, nh, hd)), dtype) for _ in range(4))
    mask = jnp.asarray(np.arange(T)[None] < T - T // 4).repeat(B, 0)
    seed = jnp.asarray([1, 2], jnp.uint32)

    def output_and_grads(fn, *inputs):
        out, pull = jax.vjp(fn, *inputs)
        return (out, *pull(w.astype(out.dtype)))

    def fused(q, k, v):
        return flash_attention(q, k, v, mask.astype(jnp.int32), seed, rate, blocks, INTERPRET)

    got = jax.jit(lambda *x: output_and_grads(fused, *x))(q, k, v)
    with jax.default_matmul_precision("highest"):
        exact = lambda q, k, v: attention(q, k, v, mask, rate, seed)  # noqa: E731
        want = jax.jit(lambda *x: output_and_grads(exact, *x))(*(x.astype(jnp.float32) for x in (q, k, v)))
    return [float(jnp.abs(a.astype(jnp.float32) - b).max() / jnp.abs(b).max()) for a, b in zip(got, want)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--head-dim", type=int, default=64)
    args = p.parse_args()
    T, hd = args.seq, args.head_dim
    print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}{' (interpreted)' if INTERPRET else ''}")
    differ, kernel_share, reference_share = dropout_decisions(T, 0.1)
    print(f"dropout: {differ} of {T * T} decisions differ; "
          f"kept {kernel_share:.4f} (kernel), {reference_share:.4f} (reference)")
    tiles = {"default": Blocks(), "num_stages=1": Blocks(num_stages=1), "num_warps=8": Blocks(num_warps=8),
             "q=32,k=32": Blocks(q=32, k=32)}
    print(f"{'inputs':9s} {'dropout':>7s} {'tiles':13s} {'output':>8s} {'dq':>8s} {'dk':>8s} {'dv':>8s}")
    for dtype in (jnp.float32, jnp.bfloat16):
        for rate in (0.0, 0.1):
            for name, blocks in list(tiles.items())[:1 if dtype == jnp.float32 else None]:
                row = errors(dtype, rate, blocks.fit(T), T, hd)
                print(f"{jnp.dtype(dtype).name:9s} {rate:7.1f} {name:13s} " + " ".join(f"{e:8.1e}" for e in row))
    row = errors(jnp.bfloat16, 0.1, Blocks().fit(T), T, hd, B=2, nh=12)
    print(f"{'bfloat16':9s} {0.1:7.1f} {'2 x 12 heads':13s} " + " ".join(f"{e:8.1e}" for e in row))


if __name__ == "__main__":
    main()
