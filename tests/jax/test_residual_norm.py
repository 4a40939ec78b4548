"""The Pallas add & norm kernel (`bert_kit/jax/kernels/residual_norm.py`): LayerNorm(x + dropout(y)),
run interpreted on the CPU in float32 against the reference `model.residual_norm` with the same
seed (forward and the gradients of x, y, weight and bias), its tiling of a row, its lowering to
Triton for CUDA (no GPU needed), the blocks of a model with the fast path, the check that keeps a
failing kernel off, and, on a GPU only, the Triton kernel in bf16. And XLA's add & norm with its
backward written out (`residual_norm_xla.py`): the reference's values and gradients, from fewer
residuals, in a model whose blocks are scanned.

Run: .venv/bin/python -m pytest tests/jax/test_residual_norm.py -q -n 0
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("jax.experimental.pallas")
jnp = pytest.importorskip("jax.numpy")
nnx = pytest.importorskip("flax.nnx")

from bert_kit.jax.kernels import fast_path  # noqa: E402
from bert_kit.jax.kernels.fast_path import FusedResidualNorm, norm_works, plan  # noqa: E402
from bert_kit.jax.kernels.residual_norm import Tiles, fits, fused_residual_norm, split  # noqa: E402
from bert_kit.jax.kernels.residual_norm_xla import xla_residual_norm  # noqa: E402
from bert_kit.jax.model import LayerNorm, residual_norm  # noqa: E402
from tests.jax.common import classifier_with_dropout, max_abs, tiny  # noqa: E402

GPU = jax.default_backend() == "gpu"
SEED = np.array([7, 11], np.uint32)


def inputs(N=48, H=96, dtype=jnp.float32, seed=0):
    rng = np.random.default_rng(seed)
    x, y, w = (jnp.asarray(rng.normal(size=(N, H)), dtype) for _ in range(3))
    weight, bias = jnp.asarray(1 + 0.5 * rng.normal(size=H), dtype), jnp.asarray(rng.normal(size=H), dtype)
    return x, y, weight, bias, w


def reference(rate, eps=1e-12, seed=SEED):
    def fn(x, y, weight, bias):
        norm = LayerNorm(x.shape[-1], eps)
        norm.weight[...], norm.bias[...] = weight, bias
        return residual_norm(x, y, norm, rate, jnp.asarray(seed))
    return fn


def output_and_grads(fn, x, y, weight, bias, w):
    """fn's output and the gradients of sum(output * w) in x, y, weight and bias."""
    out, pull = jax.jit(lambda *a: jax.vjp(fn, *a))(x, y, weight, bias)
    return (out, *pull(w))


@pytest.mark.parametrize("rate", [0.0, 0.25])
@pytest.mark.parametrize("H", [96, 64])  # three tiles of 32; one tile of 64
def test_kernel_equals_the_reference_forward_and_gradients(rate, H):
    x, y, weight, bias, w = inputs(H=H)
    got = output_and_grads(lambda *a: fused_residual_norm(*a, jnp.asarray(SEED), rate, 1e-12, Tiles(rows=8), True),
                           x, y, weight, bias, w)
    want = output_and_grads(reference(rate), x, y, weight, bias, w)
    for name, a, b in zip(("output", "x", "y", "weight", "bias"), got, want):
        assert max_abs(a, b) <= 2e-5 * max(1.0, float(jnp.abs(b).max())), name
    if rate:  # y was dropped: some of its gradient is exactly zero, x's nowhere
        assert 0.15 < float((got[2] == 0).mean()) < 0.35 and float((got[1] == 0).mean()) == 0.0
        plain = output_and_grads(reference(0.0), x, y, weight, bias, w)
        assert max_abs(got[0], plain[0]) > 0.1


@pytest.mark.parametrize("rate", [0.0, 0.25])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_xla_add_norm_gives_the_references_output_and_gradients(rate, dtype):
    """The forward op for op (equal bit for bit on a CPU); the gradients as autodiff's: in float32 to
    their rounding; in bf16 within 1% of the largest, as the backward reads the sum rounded to bf16 where
    autodiff's kept it in float32 (the weight's gradient, a sum over rows, differs most)."""
    x, y, weight, bias, w = inputs(dtype=dtype)
    got = output_and_grads(lambda *a: xla_residual_norm(*a, jnp.asarray(SEED), rate), x, y, weight, bias, w)
    want = output_and_grads(reference(rate), x, y, weight, bias, w)
    share = 0.01 if dtype == jnp.bfloat16 else 2e-5  # (float32: as the Pallas kernel's)
    if GPU:  # two programs, whose reductions XLA may split differently
        assert max_abs(got[0], want[0]) <= share * max(1.0, float(jnp.abs(want[0].astype(jnp.float32)).max()))
    else:
        assert np.array_equal(np.asarray(got[0]), np.asarray(want[0]))
    for name, a, b in zip(("x", "y", "weight", "bias"), got[1:], want[1:]):
        assert a.dtype == b.dtype, name
        assert max_abs(a, b) <= share * max(1.0, float(jnp.abs(b.astype(jnp.float32)).max())), name
    if rate:  # the mask drawn again in the backward: y's gradient is zero where y was dropped
        dropped = np.asarray(got[2] == 0)
        assert 0.15 < dropped.mean() < 0.35 and np.array_equal(dropped, np.asarray(want[2] == 0))


def test_xla_add_norm_keeps_neither_the_mask_nor_a_float32_sum_for_its_backward():
    """What the backward reads is what made XLA's scanned blocks slow: autodiff keeps y's (N, H)
    mask and the float32 sum; the written backward keeps the bf16 sum and each row's statistics."""
    x, y, weight, bias, _ = inputs(dtype=jnp.bfloat16)

    def kept(fn):
        _, pull = jax.vjp(fn, x, y, weight, bias)
        return {(a.dtype.name, a.shape) for a in jax.tree.leaves(pull) if a.shape == x.shape}

    assert kept(lambda *a: xla_residual_norm(*a, jnp.asarray(SEED), 0.25)) == {("bfloat16", x.shape)}
    assert {("bool", x.shape), ("float32", x.shape)} <= kept(reference(0.25))


def test_a_scanned_model_with_xla_add_norm_trains_as_the_reference():
    """`apply(add_norm="xla")` on a short fine-tune's model (blocks scanned, dropout on): its loss
    and gradients are the reference's."""
    from bert_kit.jax.model import BertEncoder

    model, _, step = classifier_with_dropout(tiny(num_hidden_layers=3, max_position_embeddings=32,
                                                  hidden_dropout_prob=0.2))
    assert isinstance(model.bert.encoder, BertEncoder)
    model.bert.encoder.scan = True
    want = step(model)
    fast = fast_path.apply(model, kernel="pallas", add_norm="xla")
    assert fast.xla_norm and all(isinstance(b.add_norm, FusedResidualNorm) for b in model.bert.encoder.layers)
    got = step(model)
    assert abs(float(got[0]) - float(want[0])) <= 1e-5
    assert max(max_abs(a, b) for a, b in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1]))) <= 1e-5


def test_kernel_repeats_for_a_seed_and_differs_across_seeds():
    x, y, weight, bias, _ = inputs()
    run = jax.jit(lambda s: fused_residual_norm(x, y, weight, bias, s, 0.5, 1e-12, Tiles(rows=8), True))
    one, again, other = run(jnp.asarray(SEED)), run(jnp.asarray(SEED)), run(jnp.asarray([7, 12], jnp.uint32))
    assert np.array_equal(np.asarray(one), np.asarray(again))
    assert max_abs(one, other) > 0.1


def test_a_row_is_read_as_tiles_of_a_power_of_two():
    assert split(768) == (3, 256) and split(384) == (3, 128) and split(1024) == (1, 1024) and split(312) == (39, 8)
    assert fits(32768, 768) and fits(8, 384) and fits(64, 1024)
    assert not fits(30, 768)  # not a multiple of the 8 rows a program takes
    assert not fits(64, 312)  # tiles of 8: too narrow, too many
    assert fits(30, 768, Tiles(rows=2))


def test_the_kernels_lower_to_triton_for_cuda():
    """Exported for CUDA on any machine: Pallas lowers the kernels to Triton's IR here, where a tile
    whose side is not a power of two (a row of 768 read whole) fails."""
    from jax import export

    from bert_kit.jax.kernels.flash_attention import flash_attention

    def norm_grads(x, y, w, b, s):
        out, pull = jax.vjp(lambda *a: fused_residual_norm(*a, s, 0.1), x, y, w, b)
        return pull(out)

    def attention_grads(q, k, v, mask, s):
        out, pull = jax.vjp(lambda q, k, v: flash_attention(q, k, v, mask, s, 0.1), q, k, v)
        return pull(out)

    spec = jax.ShapeDtypeStruct
    seed = spec((2,), jnp.uint32)
    triton = [export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
    for H in (768, 384):
        x, w = spec((256, H), jnp.bfloat16), spec((H,), jnp.bfloat16)
        module = export.export(jax.jit(norm_grads), platforms=["cuda"], disabled_checks=triton)(x, x, w, w, seed)
        assert module.mlir_module().count("bert_residual_norm_") >= 2  # the forward's and the backward's
    q = spec((2, 128, 12, 64), jnp.bfloat16)
    module = export.export(jax.jit(attention_grads), platforms=["cuda"], disabled_checks=triton)(
        q, q, q, spec((2, 128), jnp.int32), seed)
    assert module.mlir_module().count("bert_attention_") >= 2


def test_plan_puts_the_kernel_on_gpus_in_16_bits_for_training():
    gpu = plan("gpu", jnp.bfloat16, 64, 0.1)
    assert gpu.norm and str(gpu).endswith(", Pallas add & norm (Triton)")
    assert plan("gpu", jnp.bfloat16, 64, 0.0).norm  # with or without attention dropout
    assert not plan("gpu", jnp.bfloat16, 64, 0.1, training=False).norm
    assert not plan("gpu", jnp.bfloat16, 64, 0.1, kernel="none").norm
    short = plan("gpu", jnp.bfloat16, 64, 0.1, add_norm="xla")  # the engine's short fine-tunes
    assert short.pallas and not short.norm and short.xla_norm and not short.interpret
    assert str(short).endswith(", add & norm with its backward written out")
    assert not plan("gpu", jnp.bfloat16, 64, 0.1, add_norm="xla", kernel="none").xla_norm
    assert not plan("gpu", jnp.bfloat16, 64, 0.1, add_norm="xla", training=False).xla_norm
    assert not plan("gpu", jnp.bfloat16, 64, 0.1, add_norm="none").norm
    with pytest.raises(ValueError, match="add_norm must be one of"):
        plan("gpu", jnp.bfloat16, 64, 0.1, add_norm=False)
    assert not plan("gpu", jnp.float32, 64, 0.1).norm and not plan("cpu", jnp.float32, 64, 0.1).norm
    forced = plan("cpu", jnp.float32, 16, 0.1, kernel="pallas")
    assert forced.norm and forced.interpret and "Pallas add & norm (interpreted)" in forced.summary


def test_a_model_with_the_kernel_trains_as_the_reference():
    """`apply` puts the kernel on every block; with dropout on, loss and gradients equal the
    reference model's (the same masks from the same key)."""
    model, loss, step = classifier_with_dropout(tiny(num_hidden_layers=2, max_position_embeddings=32,
                                                     hidden_dropout_prob=0.2))
    want = step(model)
    fast_path.apply(model, kernel="pallas")
    blocks = model.bert.encoder.layers
    assert all(isinstance(block.add_norm, FusedResidualNorm) for block in blocks)
    got = step(model)
    assert abs(float(got[0]) - float(want[0])) <= 1e-5
    assert max(max_abs(a, b) for a, b in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1]))) <= 1e-5
    without = nnx.jit(loss)
    model.bert.encoder.layers[0].dropout_rate = 0.0
    assert abs(float(without(model)) - float(got[0])) > 1e-4  # the dropout ran, in the kernel
    fast_path.apply(model, kernel="pallas", add_norm="none")
    assert all(block.add_norm is None for block in blocks)


def test_a_kernel_that_fails_its_check_leaves_the_reference(monkeypatch, capsys):
    assert norm_works(64, "float32", 0.1, Tiles(rows=8), interpret=True)
    with monkeypatch.context() as patch:
        patch.setattr(fast_path, "fused_residual_norm", lambda *a: residual_norm_scaled(*a))
        assert not norm_works.__wrapped__(96, "float32", 0.1, Tiles(rows=8), True)
    assert "the Pallas add & norm kernel differs from the reference by 10.0% for H=96, float32" \
        in capsys.readouterr().err

    def broken(*args):
        raise RuntimeError("Triton: out of resources")

    monkeypatch.setattr(fast_path, "fused_residual_norm", broken)
    assert not norm_works(128, "float32", 0.1, Tiles(rows=8))
    assert "does not compile for H=128, float32 (RuntimeError: Triton: out of resources); using XLA add & norm" \
        in capsys.readouterr().err
    fused = FusedResidualNorm(fast_path.FastPath(backend="gpu", norm=True, tiles=Tiles(rows=8)))  # as on a GPU
    x, y, weight, bias, _ = inputs(H=128)
    norm = LayerNorm(128)
    norm.weight[...], norm.bias[...] = weight, bias
    got = fused(x, y, norm, 0.1, jnp.asarray(SEED))
    assert max_abs(got, residual_norm(x, y, norm, 0.1, jnp.asarray(SEED))) == 0.0


def residual_norm_scaled(x, y, weight, bias, seed, rate, eps, tiles, interpret):
    """A kernel 10% off the reference."""
    return reference(rate, eps, seed)(x, y, weight, bias) * 1.1


@pytest.mark.skipif(not GPU, reason="the Triton kernel needs a GPU")
def test_triton_kernel_on_the_gpu_in_bf16():
    for N, H in ((32768, 768), (4096, 384), (256, 1024)):
        x, y, weight, bias, w = inputs(N, H, jnp.bfloat16)
        assert norm_works(H, "bfloat16", 0.1, Tiles())
        got = output_and_grads(lambda *a: fused_residual_norm(*a, jnp.asarray(SEED), 0.1), x, y, weight, bias, w)
        f32 = [t.astype(jnp.float32) for t in (x, y, weight, bias, w)]
        want = output_and_grads(reference(0.1), *f32)
        for name, a, b in zip(("output", "x", "y", "weight", "bias"), got, want):
            assert max_abs(a, b) <= 0.02 * max(1.0, float(jnp.abs(b).max())), (N, H, name)
