"""The JAX model's fast path: which attention kernel each call runs, put on a model by one call.

    fast = fast_path.apply(model, dtype=jnp.bfloat16)     # the default backend's devices
    print(fast)   # fast path: Pallas attention with dropout (Triton), cuDNN attention without dropout

`plan` decides from the backend ("gpu", "cpu", "tpu"), the compute dtype, the head size and the
attention dropout, and is tested without a GPU; `apply` sets every `MultiHeadAttention.backend`
to a `FusedAttention` of the plan, and every block's `add_norm` to a `FusedResidualNorm` (frozen
dataclasses: two models of one plan have equal graphs, so their jitted steps are one program).
Each still checks, per call, what only the call knows (the shapes, dropout on or off) and
otherwise runs the reference, `attention` or `residual_norm`:

    call                          kernel                                   when the plan allows
    attention with dropout        Pallas, `flash_attention.py`             T a power of 2 <= 512, hd 16-128
    attention without dropout     cuDNN, `jax.nn.dot_product_attention`    16-bit, hd % 8 == 0, <= 128
    add & norm (training)         Pallas, `residual_norm.py`               H = C x W, W >= 16 a power of 2, C <= 8
                                  or XLA, its backward written out         add_norm="xla" (a short fine-tune's
                                  (`residual_norm_xla.py`)                 scanned blocks), x and y of one dtype

cuDNN's fused attention has dropout (`jax._src.cudnn.fused_attention_stablehlo`'s dropout_rate),
but only behind a private module, with its own random bits (not this model's mask, so no
reference to test it against) and no promise to stay; the public `jax.nn.dot_product_attention`
takes no dropout. So dropout runs in the Pallas kernel, whose mask is the reference's.

On several devices (`apply(..., mesh=...)`) each kernel runs on every device's rows of the
batch, in a `shard_map`: a Pallas kernel is one custom call, which XLA's partitioner has no rule
to split, so left to it every device would gather the batch and compute the whole of it. Each
device's kernel is told where its rows start, so its dropout masks are those of the whole batch.

On a GPU each Pallas kernel is tried once per shape before a step runs it (`kernel_works`,
`norm_works`: compiled and checked against the reference on small inputs); where one fails to
compile or disagrees, the run says so in one line and that shape runs the reference.
(Interpreted, on a CPU, they are not.) The checks of the lengths a run is likely to meet start as
`apply` puts the kernels on (its `lengths`); a program compiled ahead traces on while they run,
and is traced again without the kernel if its check fails (`compilation.assume`).
"""

from __future__ import annotations

import functools
import sys
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, PartitionSpec as P

from bert_kit.jax.compilation import assume, compiler_options
from bert_kit.jax.kernels import residual_norm as norm_kernel
from bert_kit.jax.kernels.flash_attention import Blocks, fits, flash_attention
from bert_kit.jax.kernels.residual_norm import Tiles, fused_residual_norm
from bert_kit.jax.kernels.residual_norm_xla import xla_residual_norm
from bert_kit.jax.model import LayerNorm, MultiHeadAttention, TransformerEncoderBlock, attention, residual_norm
from bert_kit.jax.sharding import AXIS

HALF = (jnp.bfloat16, jnp.float16)
KERNELS = ("auto", "pallas", "none")  # apply's `kernel`: as planned, the Pallas kernel wherever it fits, none
ADD_NORMS = ("pallas", "xla", "none")  # apply's `add_norm`: the Pallas kernel where planned, XLA's, the reference


@dataclass(frozen=True)
class FastPath:
    """What `apply` put on a model; `str()` is the line a run prints."""

    backend: str = "cpu"  # the JAX backend the plan is for
    pallas: bool = False  # attention with dropout: the Pallas kernel
    cudnn: bool = False  # attention without dropout: cuDNN's flash attention
    norm: bool = False  # each block's add & norm: the Pallas kernel
    xla_norm: bool = False  # ... or the reference's forward with its backward written out (`residual_norm_xla`)
    interpret: bool = False  # the Pallas kernels run through XLA (CPU tests)
    blocks: Blocks = field(default_factory=Blocks)
    tiles: Tiles = field(default_factory=Tiles)
    mesh: Mesh | None = None  # several devices, the batch split over their "data" axis: kernels per device
    note: str = ""  # why nothing applies

    @property
    def summary(self) -> str:
        how = " (interpreted)" if self.interpret else " (Triton)"
        parts = [("Pallas attention with dropout" + how, self.pallas), ("cuDNN attention without dropout", self.cudnn),
                 ("Pallas add & norm" + how, self.norm), ("add & norm with its backward written out", self.xla_norm)]
        return ", ".join(name for name, on in parts if on) or f"none ({self.note or self.backend + ': XLA attention'})"

    def __str__(self) -> str:
        return f"fast path: {self.summary}"


def plan(backend: str, dtype: jnp.dtype, head_dim: int, attention_dropout: float, *, training: bool = True,
         kernel: str = "auto", blocks: Blocks = Blocks(), tiles: Tiles = Tiles(), add_norm: str = "pallas",
         mesh: Mesh | None = None) -> FastPath:
    """The fast path of a model on `backend` computing in `dtype` (on `mesh`'s devices, if several).
    kernel: "auto" (the Pallas kernels on GPUs in 16 bits, for training: attention where it has
    dropout), "pallas" (also elsewhere, interpreted: tests), "none" (the references for attention
    with dropout and the add & norm).
    add_norm: "pallas" (the Pallas kernel where `kernel` puts it), "xla" (for a short run: no
    Pallas kernel to compile and check, but XLA's with its backward written out, unless `kernel`
    is "none"), "none" (the reference)."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if add_norm not in ADD_NORMS:
        raise ValueError(f"add_norm must be one of {ADD_NORMS}, got {add_norm!r}")
    gpu, half = backend == "gpu", jnp.dtype(dtype) in HALF
    with_dropout = training and attention_dropout > 0
    pallas_here = kernel == "pallas" or (kernel == "auto" and gpu and half)
    pallas, norm = with_dropout and pallas_here, training and add_norm == "pallas" and pallas_here
    return FastPath(backend=backend, pallas=pallas, cudnn=gpu and half and head_dim % 8 == 0 and head_dim <= 128,
                    norm=norm, xla_norm=training and add_norm == "xla" and kernel != "none",
                    interpret=(pallas or norm) and not gpu, blocks=blocks, tiles=tiles,
                    mesh=mesh if mesh is not None and mesh.size > 1 else None)


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
            return per_device(fast.mesh, lambda q, k, v, key_mask, seed, start=None: flash_attention(
                q, k, v, key_mask, seed, rate, fast.blocks, fast.interpret, start=start), q, k, v, key_mask, seed=seed)
        if rate == 0 and fast.cudnn and q.dtype in HALF:
            lengths = None if mask is None else mask.sum(-1, dtype=jnp.int32)  # (B,): rows are right-padded
            return jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=lengths, implementation="cudnn")
        return attention(q, k, v, mask, rate, seed)


@dataclass(frozen=True)
class FusedResidualNorm:
    """`model.residual_norm` on the plan's kernel: the `TransformerEncoderBlock.add_norm` `apply` sets."""

    fast: FastPath

    def __call__(self, x: jax.Array, y: jax.Array, norm: LayerNorm, rate: float, seed: jax.Array | None) -> jax.Array:
        (N, H), fast = x.shape, self.fast
        rate = rate if seed is not None else 0.0  # no seed: no dropout, as the reference
        devices = 1 if fast.mesh is None else fast.mesh.size
        if fast.norm and x.dtype == y.dtype and N % devices == 0 and norm_kernel.fits(N // devices, H, fast.tiles) and \
                (fast.interpret or norm_works(H, x.dtype.name, rate, fast.tiles)):
            seed = jnp.zeros(2, jnp.uint32) if seed is None else seed
            return per_device(fast.mesh, lambda x, y, weight, bias, seed, start=None: fused_residual_norm(
                x, y, weight, bias, seed, rate, norm.eps, fast.tiles, fast.interpret, start=start),
                x, y, weight=norm.weight[...], bias=norm.bias[...], seed=seed)
        if fast.xla_norm and x.dtype == y.dtype:  # XLA partitions it as the reference: no per-device call
            seed = jnp.zeros(2, jnp.uint32) if seed is None else seed
            return xla_residual_norm(x, y, norm.weight[...], norm.bias[...], seed, rate, norm.eps)
        return residual_norm(x, y, norm, rate, seed)


def per_device(mesh: Mesh | None, kernel: Callable, *rows: jax.Array, **whole: jax.Array) -> jax.Array:
    """kernel(*rows, **whole): on the whole batch without a mesh; with one, on each device's share
    of the `rows` arrays (split on their first axis) beside the `whole` ones (every device's the
    same), passing start, the (1,) index of the device's first row, and the output split likewise."""
    if mesh is None:
        return kernel(*rows, **whole)

    def local(rows: tuple, whole: dict) -> jax.Array:
        start = (jax.lax.axis_index(AXIS) * rows[0].shape[0]).astype(jnp.int32).reshape(1)
        return kernel(*rows, **whole, start=start)

    specs = ((P(AXIS),) * len(rows), {name: P() for name in whole})
    return jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=P(AXIS), check_vma=False)(rows, whole)


def in_a_thread(check: Callable[..., bool]) -> Callable[..., bool]:
    """`check`, run once per arguments in a thread of its own: a new thread traces nothing, so the
    check compiles and runs its programs while the step that asks is mid-trace. `checked.start(*args)`
    starts it without waiting (`apply`'s lengths), and the step's call finds it done or under way
    (then a program compiled ahead takes it as passed, and reads its result once compiled: `assume`).
    A check is not remembered between runs (one remembered on disk once made a warm run miss its
    cache: the kernel's Triton code then carried the step's stack, `compilation.py`): a run whose
    step traces the kernel checks it again; a warm run reads its step back, and need not
    (`engine.checked_ahead`)."""
    @functools.lru_cache(maxsize=None)
    def start(*args: Any, **kwargs: Any) -> Future:
        future: Future = Future()

        def run() -> None:
            try:
                future.set_result(check(*args, **kwargs))
            except BaseException as e:  # noqa: BLE001 -- the caller's to raise
                future.set_exception(e)

        threading.Thread(target=run, name="kernel-check", daemon=True).start()
        return future

    @functools.wraps(check)
    def checked(*args: Any, **kwargs: Any) -> bool:
        return assume(start(*args, **kwargs))  # a program compiled ahead traces on meanwhile

    checked.start = start
    return checked


@in_a_thread
def kernel_works(T: int, head_dim: int, dtype: str, rate: float, blocks: Blocks, interpret: bool = False) -> bool:
    """Whether the Pallas attention kernel compiles for this shape and agrees with the reference on
    one sequence (two heads, a quarter of the keys padding), forward and gradients; said once if not."""
    return _check_kernel(T, head_dim, dtype, rate, blocks, interpret)


@in_a_thread
def norm_works(H: int, dtype: str, rate: float, tiles: Tiles, interpret: bool = False) -> bool:
    """Whether the Pallas add & norm kernel compiles for rows of H and agrees with the reference on
    a few rows, forward and gradients; said once if not."""
    rng = np.random.default_rng(0)
    x, y, w = (jax.device_put(rng.normal(size=(4 * tiles.rows, H)).astype(jnp.dtype(dtype))) for _ in range(3))
    weight, bias = (jax.device_put(rng.normal(size=H).astype(jnp.dtype(dtype))) for _ in range(2))
    seed = jax.device_put(np.array([1, 2], np.uint32))

    def fused(x, y, weight, bias):
        return fused_residual_norm(x, y, weight, bias, seed, rate, 1e-12, tiles, interpret)

    def plain(x, y, weight, bias):
        norm = LayerNorm(H)
        norm.weight[...], norm.bias[...] = weight, bias
        return residual_norm(x, y, norm, rate, seed)

    return agrees("add & norm", f"H={H}", dtype, fused, plain, (x, y, weight, bias), w)


def _check_kernel(T: int, head_dim: int, dtype: str, rate: float, blocks: Blocks, interpret: bool) -> bool:
    # inputs put on the device as they are (`jnp.asarray` of a NumPy array is a program too) and errors
    # measured on the host: the check compiles its two programs and nothing else, where each small
    # eager op was a program of its own, compiled on every run
    rng = np.random.default_rng(0)
    q, k, v, w = (jax.device_put(rng.normal(size=(1, T, 2, head_dim)).astype(jnp.dtype(dtype))) for _ in range(4))
    mask = jax.device_put(np.arange(T)[None] < T - T // 4)
    seed = jax.device_put(np.array([1, 2], np.uint32))

    def fused(q, k, v):
        return flash_attention(q, k, v, mask.astype(jnp.int32), seed, rate, blocks, interpret)

    def plain(q, k, v):
        return attention(q, k, v, mask, rate, seed)

    return agrees("attention", f"T={T}, head size {head_dim}", dtype, fused, plain, (q, k, v), w)


def agrees(kernel: str, shape: str, dtype: str, fused: Callable, plain: Callable, inputs: tuple, w: jax.Array) -> bool:
    """Whether `fused` compiles and gives `plain`'s output and gradients (of sum(output * w)) on
    `inputs`; if not, one line says so. Not the sum itself: its terms cancel, and a sum near 0 makes
    bf16's rounding of its terms a large share of it."""
    def output_and_grads(fn):
        out, pull = jax.vjp(fn, *inputs)
        return (out, *pull(w.astype(out.dtype)))

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
        print(f"warning: the Pallas {kernel} kernel does not compile for {shape}, {dtype} "
              f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); using XLA {kernel}",
              file=sys.stderr, flush=True)
        return False
    if not error <= tolerance:
        print(f"warning: the Pallas {kernel} kernel differs from the reference by {error:.1%} for {shape}, {dtype}; "
              f"using XLA {kernel}", file=sys.stderr, flush=True)
        return False
    return True


def apply(model: nnx.Module, backend: str | None = None, dtype: jnp.dtype = jnp.float32, *, training: bool = True,
          kernel: str = "auto", blocks: Blocks = Blocks(), tiles: Tiles = Tiles(), add_norm: str = "pallas",
          mesh: Mesh | None = None, lengths: Sequence[int] = ()) -> FastPath:
    """Put the plan's kernels on every attention layer and block of `model` (in place); returns the
    plan. backend: the devices' ("gpu", "cpu", ...), default JAX's default backend; mesh: the
    devices a step splits its batch over (one "data" axis), if several; lengths: the sequence
    lengths its steps are likely to meet, whose attention checks (`kernel_works`) start now, in
    threads: a first run's step found them done, where it waited about a second for them."""
    layers = [m for _, m in nnx.iter_graph(model) if isinstance(m, MultiHeadAttention)]
    if not layers:
        return FastPath(note="no attention layer")
    config = layers[0]
    fast = plan(backend or jax.default_backend(), dtype, config.head_dim, config.dropout_rate, training=training,
                kernel=kernel, blocks=blocks, tiles=tiles, add_norm=add_norm, mesh=mesh)
    for layer in layers:
        layer.backend = FusedAttention(fast) if fast.pallas or fast.cudnn else None
    for block in (m for _, m in nnx.iter_graph(model) if isinstance(m, TransformerEncoderBlock)):
        block.add_norm = FusedResidualNorm(fast) if fast.norm or fast.xla_norm else None
    if fast.pallas and not fast.interpret:  # the arguments `FusedAttention` asks with
        for T in (T for T in lengths if fits(T, config.head_dim, fast.blocks)):
            kernel_works.start(T, config.head_dim, jnp.dtype(dtype).name, config.dropout_rate, fast.blocks)
    return fast
