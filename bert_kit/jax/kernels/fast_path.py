"""The JAX model's fast path: which attention kernel each call runs, put on a model by one call.

    fast = fast_path.apply(model, dtype=jnp.bfloat16)     # the default backend's devices
    print(fast)   # fast path: Pallas attention with dropout (Triton), cuDNN attention without dropout

`plan` decides from the backend ("gpu", "cpu", "tpu"), the compute dtype, the head size and the
attention dropout, and is tested without a GPU; `apply` sets every `MultiHeadAttention.backend`
to a `FusedAttention` of the plan (a frozen dataclass: two models of one plan have equal graphs,
so their jitted steps are one program). A `FusedAttention` still checks, per call, what only the
call knows (the sequence length, dropout on or off) and otherwise runs the reference, `attention`:

    call                          kernel                                   when the plan allows
    dropout (training)            Pallas, `flash_attention.py`             T a power of 2 <= 512, hd 16-128
    no dropout (eval, or p = 0)   cuDNN, `jax.nn.dot_product_attention`    16-bit, hd % 8 == 0, <= 128

cuDNN's fused attention has dropout (`jax._src.cudnn.fused_attention_stablehlo`'s dropout_rate),
but only behind a private module, with its own random bits (not this model's mask, so no
reference to test it against) and no promise to stay; the public `jax.nn.dot_product_attention`
takes no dropout. So dropout runs in the Pallas kernel, whose mask is the reference's.

On a GPU the Pallas kernel is tried once per shape before a step uses it (`kernel_works`: compiled
and checked against the reference on one sequence); where it fails to compile or disagrees, the
run says so in one line and that shape runs the reference. (Interpreted, on a CPU, it is not.)
"""

from __future__ import annotations

import functools
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bert_kit.jax.compilation import compiler_options
from bert_kit.jax.kernels.flash_attention import Blocks, fits, flash_attention
from bert_kit.jax.model import MultiHeadAttention, attention

HALF = (jnp.bfloat16, jnp.float16)
KERNELS = ("auto", "pallas", "none")  # apply's `kernel`: as planned, the Pallas kernel wherever it fits, none


@dataclass(frozen=True)
class FastPath:
    """What `apply` put on a model; `str()` is the line a run prints."""

    backend: str = "cpu"  # the JAX backend the plan is for
    pallas: bool = False  # attention with dropout: the Pallas kernel
    cudnn: bool = False  # attention without dropout: cuDNN's flash attention
    interpret: bool = False  # the Pallas kernel run through XLA (CPU tests)
    blocks: Blocks = field(default_factory=Blocks)
    note: str = ""  # why nothing applies

    @property
    def summary(self) -> str:
        parts = [("Pallas attention with dropout" + (" (interpreted)" if self.interpret else " (Triton)"), self.pallas),
                 ("cuDNN attention without dropout", self.cudnn)]
        return ", ".join(name for name, on in parts if on) or f"none ({self.note or self.backend + ': XLA attention'})"

    def __str__(self) -> str:
        return f"fast path: {self.summary}"


def plan(backend: str, dtype: jnp.dtype, head_dim: int, attention_dropout: float, *, training: bool = True,
         kernel: str = "auto", blocks: Blocks = Blocks()) -> FastPath:
    """The fast path of a model on `backend` computing in `dtype`. kernel: "auto" (the Pallas kernel
    on GPUs, for training with attention dropout), "pallas" (also elsewhere, interpreted: tests),
    "none" (the reference for attention with dropout)."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    gpu, half = backend == "gpu", jnp.dtype(dtype) in HALF
    with_dropout = training and attention_dropout > 0
    pallas = with_dropout and (kernel == "pallas" or (kernel == "auto" and gpu and half))
    return FastPath(backend=backend, pallas=pallas, cudnn=gpu and half and head_dim % 8 == 0 and head_dim <= 128,
                    interpret=pallas and not gpu, blocks=blocks)


@dataclass(frozen=True)
class FusedAttention:
    """`model.attention` on the plan's kernels: the `MultiHeadAttention.backend` `apply` sets."""

    fast: FastPath

    def __call__(self, q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | None, rate: float,
                 seed: jax.Array | None) -> jax.Array:
        B, T, nh, hd = q.shape
        fast = self.fast
        if rate > 0 and seed is not None and fast.pallas and fits(T, hd, fast.blocks) and \
                (fast.interpret or kernel_works(T, hd, q.dtype.name, rate, fast.blocks)):
            key_mask = jnp.ones((B, T), jnp.int32) if mask is None else mask.astype(jnp.int32)
            return flash_attention(q, k, v, key_mask, seed, rate, fast.blocks, fast.interpret)
        if rate == 0 and fast.cudnn and q.dtype in HALF:
            lengths = None if mask is None else mask.sum(-1, dtype=jnp.int32)  # (B,): rows are right-padded
            return jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=lengths, implementation="cudnn")
        return attention(q, k, v, mask, rate, seed)


@functools.lru_cache(maxsize=None)
def kernel_works(T: int, head_dim: int, dtype: str, rate: float, blocks: Blocks, interpret: bool = False) -> bool:
    """Whether the Pallas kernel compiles for this shape and agrees with the reference on one
    sequence (two heads, a quarter of the keys padding), forward and gradients; said once if not.
    Run in a thread of its own: a new thread traces nothing, so the check computes while the step
    that asks is being traced. Every run checks, before the step traces the kernel: a kernel traced
    first by the step and not the check has other source locations in its Triton code, so the step's
    program would miss its compilation cache entry (seen on an H200)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(_check_kernel, T, head_dim, dtype, rate, blocks, interpret).result()


def _check_kernel(T: int, head_dim: int, dtype: str, rate: float, blocks: Blocks, interpret: bool) -> bool:
    # inputs put on the device as they are (`jnp.asarray` of a NumPy array is a program too) and errors
    # measured on the host: the check compiles its two programs and nothing else, where each small
    # eager op was a program of its own, compiled on every run
    rng = np.random.default_rng(0)
    q, k, v, w = (jax.device_put(rng.normal(size=(1, T, 2, head_dim)).astype(jnp.dtype(dtype))) for _ in range(4))
    mask = jax.device_put(np.arange(T)[None] < T - T // 4)
    seed = jax.device_put(np.array([1, 2], np.uint32))

    def output_and_grads(fn):
        # the output, and the gradients of sum(output * w): not the sum itself, whose terms cancel
        # (a sum near 0 makes bf16's rounding of its terms a large share of it)
        out, pull = jax.vjp(fn, q, k, v)
        return (out, *pull(w.astype(out.dtype)))

    def fused(q, k, v):
        return flash_attention(q, k, v, mask.astype(jnp.int32), seed, rate, blocks, interpret)

    def plain(q, k, v):
        return attention(q, k, v, mask, rate, seed)

    try:
        options = compiler_options(jax.default_backend(), autotune=False)  # programs run once
        got = jax.device_get(jax.jit(lambda: output_and_grads(fused), compiler_options=options)())
        want = jax.device_get(jax.jit(lambda: output_and_grads(plain), compiler_options=options)())
        # the largest difference, as a share of the largest value, of the output and each gradient
        tolerance = 1e-4 if jnp.dtype(dtype) == jnp.float32 else 0.05
        error = max(float(np.abs(a.astype(np.float32) - b.astype(np.float32)).max()
                          / max(float(np.abs(b.astype(np.float32)).max()), 1e-6))
                    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)))
    except Exception as e:  # noqa: BLE001 -- any compiler error: the reference runs instead
        print(f"warning: the Pallas attention kernel does not compile for T={T}, head size {head_dim}, {dtype} "
              f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); using XLA attention",
              file=sys.stderr, flush=True)
        return False
    if not error <= tolerance:
        print(f"warning: the Pallas attention kernel differs from the reference by {error:.1%} for T={T}, head "
              f"size {head_dim}, {dtype}; using XLA attention", file=sys.stderr, flush=True)
        return False
    return True


def apply(model: nnx.Module, backend: str | None = None, dtype: jnp.dtype = jnp.float32, *, training: bool = True,
          kernel: str = "auto", blocks: Blocks = Blocks()) -> FastPath:
    """Put the plan's kernels on every attention layer of `model` (in place); returns the plan.
    backend: the devices' ("gpu", "cpu", ...), default JAX's default backend."""
    layers = [m for _, m in nnx.iter_graph(model) if isinstance(m, MultiHeadAttention)]
    if not layers:
        return FastPath(note="no attention layer")
    config = layers[0]
    fast = plan(backend or jax.default_backend(), dtype, config.head_dim, config.dropout_rate, training=training,
                kernel=kernel, blocks=blocks)
    for layer in layers:
        layer.backend = FusedAttention(fast) if fast.pallas or fast.cudnn else None
    return fast
