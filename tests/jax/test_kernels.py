"""The JAX fast path (`bert_kit/jax/kernels/`): the Pallas attention kernel with dropout, run
interpreted on the CPU in float32 against the reference `model.attention` with the same seed
(forward, gradients, padding), its dropout mask's statistics and determinism, the plan that picks
kernels (a pure function: no GPU needed), the fallback when the kernel does not compile, and, on a
GPU only, the Triton kernel in bf16 and a training step with and without it.

Run: .venv/bin/python -m pytest tests/jax/test_kernels.py -q -n 0
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("jax.experimental.pallas")
jnp = pytest.importorskip("jax.numpy")
nnx = pytest.importorskip("flax.nnx")

from bert_kit.jax.kernels import fast_path  # noqa: E402
from bert_kit.jax.kernels.fast_path import FusedAttention, kernel_works, plan  # noqa: E402
from bert_kit.jax.kernels.flash_attention import Blocks, fits, flash_attention  # noqa: E402
from bert_kit.jax.model import BERTForSequenceClassification, attention  # noqa: E402
from bert_kit.jax.randomness import dropout_keep  # noqa: E402
from tests.jax.common import classifier_with_dropout, max_abs, tiny  # noqa: E402

GPU = jax.default_backend() == "gpu"
SMALL = Blocks(q=32, k=32, outer=32, inner=16)  # two steps of every loop at T = 64


@pytest.fixture(autouse=True)
def exact_reference():
    """float32 products in full: on a GPU, XLA's default takes TF32 for them (errors ~1e-3)."""
    with jax.default_matmul_precision("highest"):
        yield


def inputs(B=2, T=64, nh=2, hd=16, lengths=(64, 37), dtype=jnp.float32, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v, w = (jnp.asarray(rng.normal(size=(B, T, nh, hd)), dtype) for _ in range(4))
    mask = jnp.asarray(np.arange(T)[None] < np.asarray(lengths)[:, None])  # (B, T): row 1 is padded
    return q, k, v, w, mask


def value_and_grads(fn, q, k, v, w):
    """sum(fn(q, k, v) * w) and its gradients in q, k, v (float32)."""
    loss = lambda q, k, v: (fn(q, k, v).astype(jnp.float32) * w.astype(jnp.float32)).sum()  # noqa: E731
    return jax.jit(jax.value_and_grad(loss, (0, 1, 2)))(q, k, v)


@pytest.mark.parametrize("rate", [0.0, 0.25])
def test_kernel_equals_the_reference_forward_and_gradients(rate):
    q, k, v, w, mask = inputs()
    seed = jnp.asarray([7, 11], jnp.uint32)
    got = value_and_grads(lambda q, k, v: flash_attention(q, k, v, mask.astype(jnp.int32), seed, rate, SMALL, True),
                          q, k, v, w)
    want = value_and_grads(lambda q, k, v: attention(q, k, v, mask, rate, seed), q, k, v, w)
    assert abs(float(got[0]) - float(want[0])) <= 1e-4
    for name, a, b in zip("qkv", got[1], want[1]):
        assert max_abs(a, b) <= 2e-5, name
    assert max_abs(got[1][1][1, 37:], 0.0) == 0.0  # padding keys take no gradient
    if rate:  # the probabilities were dropped: not the function without dropout
        plain = value_and_grads(lambda q, k, v: attention(q, k, v, mask), q, k, v, w)
        assert abs(float(got[0]) - float(plain[0])) > 1e-2


def test_kernel_is_deterministic_for_a_seed_and_differs_across_seeds():
    q, k, v, _, mask = inputs(B=1, T=32, nh=1, lengths=(32,))
    run = jax.jit(lambda s: flash_attention(q, k, v, mask.astype(jnp.int32), s, 0.5, SMALL, True))
    one, again, other = run(jnp.asarray([1, 2], jnp.uint32)), run(jnp.asarray([1, 2], jnp.uint32)), \
        run(jnp.asarray([1, 3], jnp.uint32))
    assert np.array_equal(np.asarray(one), np.asarray(again))  # bit for bit
    assert max_abs(one, other) > 1e-2


def test_dropout_mask_statistics():
    """The kept share is 1 - p; neighbours (along rows, columns, heads) and two seeds are independent."""
    B, nh, T, rate = 4, 3, 128, 0.1
    batch_head = (jnp.arange(B)[:, None] * nh + jnp.arange(nh))[:, :, None, None]
    rows, cols = jnp.arange(T)[:, None], jnp.arange(T)

    def mask(seed):
        keep = dropout_keep(jnp.asarray(seed, jnp.uint32), batch_head, rows, cols, T, rate)
        return np.asarray(keep, np.float64)  # (B, nh, T, T)

    a, b = mask([3, 4]), mask([3, 5])
    n = a.size
    assert abs(a.mean() - (1 - rate)) <= 4 * np.sqrt(rate * (1 - rate) / n)
    z = a - a.mean()
    for shifted in (z[..., 1:] * z[..., :-1], z[..., 1:, :] * z[..., :-1, :], z[:, 1:] * z[:, :-1]):
        assert abs(shifted.mean() / z.var()) <= 0.02  # correlation of neighbours
    agree = (a == b).mean()  # independent masks agree with probability p^2 + (1-p)^2
    assert abs(agree - (rate ** 2 + (1 - rate) ** 2)) <= 4 * np.sqrt(0.5 / n)
    assert np.array_equal(a, mask([3, 4]))


def test_plan_picks_kernels_by_backend_dtype_and_job():
    gpu = plan("gpu", jnp.bfloat16, 64, 0.1)
    assert gpu.pallas and gpu.cudnn and not gpu.interpret
    assert str(gpu) == ("fast path: Pallas attention with dropout (Triton), cuDNN attention without dropout, "
                        "Pallas add & norm (Triton)")
    assert not plan("gpu", jnp.bfloat16, 64, 0.1, training=False).pallas  # evaluation: no dropout
    assert not plan("gpu", jnp.bfloat16, 64, 0.0).pallas  # no attention dropout: cuDNN alone
    assert not plan("gpu", jnp.bfloat16, 64, 0.1, kernel="none").pallas
    fp32 = plan("gpu", jnp.float32, 64, 0.1)
    assert not fp32.pallas and not fp32.cudnn
    cpu = plan("cpu", jnp.float32, 64, 0.1)
    assert not cpu.pallas and not cpu.cudnn and str(cpu) == "fast path: none (cpu: XLA attention)"
    forced = plan("cpu", jnp.float32, 16, 0.1, kernel="pallas")
    assert forced.pallas and forced.interpret
    assert fits(128, 64) and fits(512, 64) and fits(32, 32)
    assert not fits(96, 64) and not fits(1024, 64) and not fits(128, 24) and not fits(128, 8)
    with pytest.raises(ValueError, match="kernel must be one of"):
        plan("gpu", jnp.bfloat16, 64, 0.1, kernel="triton")


CPU_ONLY = pytest.mark.skipif(GPU, reason="the interpreted kernel in float32: on a GPU the plan runs Triton, and the "
                                             "check's reference, in its own thread, multiplies in TF32")


@CPU_ONLY
def test_a_model_with_the_kernel_trains_as_the_reference():
    """`apply` puts the kernel on every attention layer; with dropout on, loss and gradients equal
    the reference model's (the same mask from the same key)."""
    model, _, step = classifier_with_dropout(tiny(num_hidden_layers=1, max_position_embeddings=32,
                                                  num_attention_heads=2, attention_probs_dropout_prob=0.2))
    want = step(model)
    assert fast_path.apply(model).summary == "none (cpu: XLA attention)"
    fast = fast_path.apply(model, kernel="pallas", blocks=Blocks(16, 16, 16, 16))
    assert all(isinstance(layer.attention.backend, FusedAttention) for layer in model.bert.encoder.layers)
    got = step(model)
    assert abs(float(got[0]) - float(want[0])) <= 1e-5 and fast.interpret
    assert max(max_abs(a, b) for a, b in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1]))) <= 1e-5


@CPU_ONLY
def test_the_kernel_is_checked_before_use_and_one_that_fails_leaves_the_reference(monkeypatch, capsys):
    assert kernel_works(32, 16, "float32", 0.1, SMALL, interpret=True)  # compiled, and agrees
    with monkeypatch.context() as patch:
        patch.setattr(fast_path, "flash_attention", lambda *args: attention(*args[:3], args[3] != 0, args[5], args[4]) * 1.1)
        assert not fast_path._check_kernel(32, 16, "float32", 0.1, SMALL, True)
    assert "differs from the reference by 10.0% for T=32, head size 16, float32" in capsys.readouterr().err

    def broken(*args):
        raise RuntimeError("Triton: out of shared memory")

    monkeypatch.setattr(fast_path, "flash_attention", broken)
    assert not kernel_works(32, 16, "float32", 0.1, SMALL)
    assert "does not compile for T=32, head size 16, float32 (RuntimeError: Triton: out of shared memory)" \
        in capsys.readouterr().err
    fused = FusedAttention(fast_path.FastPath(backend="gpu", pallas=True, blocks=SMALL))  # as on a GPU
    q, k, v, _, mask = inputs(T=32, lengths=(32, 20))
    seed = jnp.asarray([1, 2], jnp.uint32)
    both = jax.jit(lambda q, k, v: (fused(q, k, v, mask, 0.1, seed), attention(q, k, v, mask, 0.1, seed)))
    assert max_abs(*both(q, k, v)) == 0.0


@CPU_ONLY
def test_the_checks_of_a_runs_likely_lengths_start_with_apply_and_the_step_takes_their_results(monkeypatch):
    """`apply(..., lengths=...)` starts the kernel's check of each length that fits, in threads of
    their own, with the arguments a step's attention asks with: the step's trace waits for the check
    under way (each runs once) and takes its result (here a refusal: the reference runs)."""
    import threading

    started, release = [], threading.Event()

    def check(*args):
        started.append((threading.current_thread().name, args))
        release.wait(30)
        return False

    monkeypatch.setattr(fast_path, "kernel_works", fast_path.in_a_thread(check))
    model, _, step = classifier_with_dropout(tiny(num_hidden_layers=1, max_position_embeddings=64,
                                                  num_attention_heads=2, attention_probs_dropout_prob=0.2))
    want = step(model)
    fast = fast_path.apply(model, "gpu", jnp.float32, kernel="pallas", lengths=[32, 48, 64, 1000])  # as on a GPU
    hd = model.bert.encoder.layers[0].attention.head_dim
    lengths = [T for T in (32, 48, 64, 1000) if fits(T, hd, fast.blocks)]
    assert 32 in lengths and 1000 not in lengths and not fast.interpret
    timer = threading.Timer(0.5, release.set)  # the checks are under way while the step traces
    timer.start()
    got = step(model)  # its batch: 32 tokens
    timer.join()
    assert sorted(args[0] for _, args in started) == lengths  # once each: the step took the one under way
    assert {name for name, _ in started} == {"kernel-check"}
    assert all(args[1:] == (hd, "float32", 0.2, fast.blocks) for _, args in started)
    assert float(got[0]) == float(want[0])


def test_the_check_judges_outputs_and_gradients_not_a_sum_whose_terms_cancel(monkeypatch, capsys):
    """An output off by a bf16 rounding step everywhere is a kernel as good as the reference; the sum
    sum(output * w) whose gradients the check takes has terms that cancel, so the same offsets are a
    large share of it (on an H200 the Triton kernel was refused this way: "differs by 10.6%")."""
    def offset(q, k, v, key_mask, seed, rate, blocks, interpret):
        return attention(q, k, v, key_mask != 0, rate, seed) + jnp.asarray(0.004, q.dtype)

    monkeypatch.setattr(fast_path, "flash_attention", offset)
    assert fast_path._check_kernel(128, 64, "bfloat16", 0.1, Blocks(), True)
    assert capsys.readouterr().err == ""


def test_the_check_compiles_its_two_programs_and_nothing_else():
    """Every run checks the kernel at its start; each eager op it did besides (casts, the errors'
    arithmetic) was a program of its own, compiled on every run (too quick to be cached)."""
    events = []
    jax.monitoring.register_event_duration_secs_listener(lambda event, seconds, **kw: events.append(event))
    assert fast_path._check_kernel(32, 16, "bfloat16", 0.1, SMALL, True)
    assert events.count("/jax/core/compile/backend_compile_duration") == 2  # the kernel's, the reference's


@pytest.mark.skipif(not GPU, reason="the Triton kernel needs a GPU")
def test_triton_kernel_on_the_gpu_in_bf16():
    for T, hd in ((128, 64), (512, 64), (64, 32)):
        q, k, v, w, mask = inputs(B=4, T=T, nh=4, hd=hd, lengths=(T, T // 2, T - 3, 17), dtype=jnp.bfloat16)
        seed = jnp.asarray([5, 6], jnp.uint32)
        assert kernel_works(T, hd, "bfloat16", 0.1, Blocks())
        got = value_and_grads(lambda q, k, v: flash_attention(q, k, v, mask.astype(jnp.int32), seed, 0.1), q, k, v, w)
        # the reference from the same bf16 inputs, in float32
        f32 = [x.astype(jnp.float32) for x in (q, k, v, w)]
        want = value_and_grads(lambda q, k, v: attention(q, k, v, mask, 0.1, seed), *f32)
        for a, b in zip(got[1], want[1]):
            assert max_abs(a, b) <= 0.05 * max(1.0, float(jnp.abs(b).max())), (T, hd)


@pytest.mark.skipif(not GPU, reason="the Triton kernel needs a GPU")
def test_a_bf16_training_step_with_and_without_the_kernel_on_the_gpu():
    """BERT-base's head size and a 128-token batch: the engine's fast path (the Triton kernel) gives
    the loss and gradients of the reference with the same dropout, to bf16's precision."""
    from bert_kit.jax.train import cast

    config = tiny(hidden_size=256, num_attention_heads=4, intermediate_size=512, max_position_embeddings=128,
                  attention_probs_dropout_prob=0.1)
    model = BERTForSequenceClassification(config, num_labels=2, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    ids = rng.integers(1, config.vocab_size, (8, 128)).astype(np.int32)
    mask = (np.arange(128)[None] < rng.integers(40, 129, (8, 1))).astype(np.int32)
    graphdef, params = nnx.split(model, nnx.Param)

    def run(graphdef):
        def loss(p):
            m = nnx.merge(graphdef, cast(p, jnp.bfloat16))
            return m(ids, mask, rngs=nnx.Rngs(dropout=4)).astype(jnp.float32).sum()

        return jax.jit(jax.value_and_grad(loss))(params)

    want = run(graphdef)
    assert str(fast_path.apply(model, "gpu", jnp.bfloat16)).startswith("fast path: Pallas attention with dropout")
    got = run(nnx.split(model, nnx.Param)[0])
    assert abs(float(got[0]) - float(want[0])) <= 0.02 * max(1.0, abs(float(want[0])))
    for a, b in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1])):
        assert max_abs(a, b) <= 0.05 * max(1e-3, float(jnp.abs(b).max()))
