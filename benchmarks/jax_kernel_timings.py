"""The JAX engine's Pallas kernels timed alone, beside what they replace, on the GPU at hand (a diagnostic).

- add & norm: `kernels/residual_norm.py`'s forward + backward of LayerNorm(x + dropout(y)) over
  one BERT-base layer's tokens (32,768 x 768, bf16, dropout 0.1), for several tilings, beside the
  reference `model.residual_norm` as XLA compiles it;
- attention: `kernels/flash_attention.py`'s forward + backward with dropout 0.1 (12 heads of 64,
  bf16) for several block settings and sequence lengths, beside cuDNN's flash attention without
  dropout (`jax.nn.dot_product_attention`: it has none).

Each time is the median of 30 calls after one (each call waits for its result). Needs a GPU.

    python benchmarks/jax_kernel_timings.py
    python benchmarks/jax_kernel_timings.py --only attention --shapes 256x128 64x512
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bert_kit.jax.kernels.flash_attention import Blocks, flash_attention  # noqa: E402
from bert_kit.jax.kernels.residual_norm import Tiles, fused_residual_norm  # noqa: E402
from bert_kit.jax.model import LayerNorm, residual_norm  # noqa: E402

SEED = np.array([1, 2], np.uint32)
TILES = [Tiles(rows, warps) for rows in (1, 2, 4, 8, 16, 32) for warps in (1, 2, 4, 8)]
BLOCKS = [Blocks(64, 64, 32, 32, 4, 2), Blocks(64, 64, 64, 64, 4, 2), Blocks(64, 64, 64, 64, 4, 3),
          Blocks(128, 64, 64, 64, 4, 2), Blocks(128, 64, 64, 64, 4, 3), Blocks(64, 64, 64, 32, 4, 2),
          Blocks(64, 64, 128, 64, 4, 2), Blocks(64, 64, 64, 64, 8, 2)]


def milliseconds(fn, *args, calls: int = 30) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def forward_backward(fn, n_inputs: int):
    """jit of (inputs..., dOut) -> fn's output and its gradients in the first n_inputs."""
    @jax.jit
    def run(*args):
        out, pull = jax.vjp(fn, *args[:n_inputs])
        return out, pull(args[-1])
    return run


def add_norm(rows: int = 32768, width: int = 768) -> None:
    rng = np.random.default_rng(0)
    x, y, dout = (jnp.asarray(rng.normal(size=(rows, width)), jnp.bfloat16) for _ in range(3))
    weight, bias = jnp.ones(width, jnp.bfloat16), jnp.zeros(width, jnp.bfloat16)
    seed = jnp.asarray(SEED)

    def reference(x, y, weight, bias):
        norm = LayerNorm(width)
        norm.weight[...], norm.bias[...] = weight, bias
        return residual_norm(x, y, norm, 0.1, seed)

    base = milliseconds(forward_backward(reference, 4), x, y, weight, bias, dout)
    print(f"add & norm, {rows} x {width} bf16, forward + backward: XLA (the reference) {base:.3f} ms")
    for tiles in TILES:
        kernel = forward_backward(lambda x, y, w, b, t=tiles: fused_residual_norm(x, y, w, b, seed, 0.1, 1e-12, t), 4)
        try:
            ms = milliseconds(kernel, x, y, weight, bias, dout)
            print(f"  kernel, {tiles.rows:>2} rows a program, {tiles.num_warps} warps: {ms:.3f} ms ({base / ms:.2f}x)")
        except Exception as e:  # noqa: BLE001 -- a setting Triton refuses: say so, go on
            print(f"  kernel, {tiles}: failed ({type(e).__name__}: {str(e)[:120]})")


def attention(shapes: list[tuple[int, int]], heads: int = 12, head_dim: int = 64) -> None:
    rng = np.random.default_rng(0)
    seed = jnp.asarray(SEED)
    for batch, T in shapes:
        q, k, v, dout = (jnp.asarray(rng.normal(size=(batch, T, heads, head_dim)), jnp.bfloat16) for _ in range(4))
        mask = jnp.ones((batch, T), jnp.int32)
        cudnn = forward_backward(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation="cudnn"), 3)
        base = milliseconds(cudnn, q, k, v, dout)
        print(f"attention, batch {batch} x {T} tokens, {heads} heads of {head_dim}, bf16, forward + backward: "
              f"cuDNN without dropout {base:.3f} ms")
        for blocks in BLOCKS:
            kernel = forward_backward(lambda q, k, v, b=blocks: flash_attention(q, k, v, mask, seed, 0.1, b), 3)
            try:
                ms = milliseconds(kernel, q, k, v, dout)
                print(f"  kernel with dropout 0.1, blocks (q, k, outer, inner) = ({blocks.q}, {blocks.k}, "
                      f"{blocks.outer}, {blocks.inner}), {blocks.num_warps} warps, {blocks.num_stages} stages: "
                      f"{ms:.3f} ms")
            except Exception as e:  # noqa: BLE001
                print(f"  kernel, {blocks}: failed ({type(e).__name__}: {str(e)[:120]})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", choices=("add-norm", "attention"), help="time one kernel only")
    p.add_argument("--shapes", nargs="*", default=["256x128", "64x512", "512x64"],
                   help="attention's batch x tokens (default: BERT-base's 32,768 tokens three ways)")
    args = p.parse_args()
    if jax.default_backend() != "gpu":
        raise SystemExit("jax_kernel_timings.py times the Triton kernels: it needs a GPU")
    if args.only != "attention":
        add_norm()
    if args.only != "add-norm":
        attention([tuple(int(n) for n in s.split("x")) for s in args.shapes])


if __name__ == "__main__":
    main()
