"""How the JAX engine compiles (`bert_kit/jax/compilation.py`): the cache folder's precedence, the
length buckets, the training buckets a run expects, and the persistent cache shared by runs at
once (processes of their own, each with a fresh JAX): both get the right result, a later run loads
the program, and an entry cut short is a warning and a compilation, not a failure.

Run: .venv/bin/python -m pytest tests/jax/test_compilation.py -q -n 0
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax")

from bert_kit.jax.compilation import DEFAULT_CACHE, cache_folder, compiler_options, length_bucket  # noqa: E402
from bert_kit.jax.compilation import eval_lengths, likely_buckets, over_leaves  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def test_the_cache_folder_by_setting_variable_jax_or_default(tmp_path):
    assert cache_folder("x", {"BERT_KIT_JAX_CACHE": "y", "JAX_COMPILATION_CACHE_DIR": "z"}) == Path("x")
    assert cache_folder(None, {"BERT_KIT_JAX_CACHE": "y", "JAX_COMPILATION_CACHE_DIR": "z"}) == Path("y")
    assert cache_folder(None, {"JAX_COMPILATION_CACHE_DIR": "z"}) == Path("z")
    assert cache_folder(None, {}) == DEFAULT_CACHE.expanduser() and str(DEFAULT_CACHE) == "~/.cache/bert-kit/jax"
    assert cache_folder("off", {"BERT_KIT_JAX_CACHE": "y"}) is None
    assert cache_folder(None, {"BERT_KIT_JAX_CACHE": "none"}) is None
    assert cache_folder("~/c", {}) == Path.home() / "c"
    assert cache_folder(False, {"BERT_KIT_JAX_CACHE": "y"}) is None  # RunSettings(jax_cache=False)
    assert cache_folder(True, {"BERT_KIT_JAX_CACHE": "y"}) == Path("y")
    assert cache_folder("true", {}) == cache_folder("on", {}) == Path.home() / ".cache/bert-kit/jax"  # not ./true


def test_gpu_programs_take_cublas_matrix_products_unless_xla_flags_say():
    assert compiler_options("gpu", {}) == {"xla_gpu_enable_triton_gemm": False}
    assert compiler_options("gpu", {"XLA_FLAGS": "--xla_gpu_enable_triton_gemm=true"}) == {}  # the user's choice
    assert compiler_options("cpu", {}) == {} and compiler_options("tpu", {}) == {}
    import jax
    import jax.numpy as jnp
    jitted = jax.jit(lambda x: x + 1, compiler_options=compiler_options("gpu", {}))
    assert jitted.lower(jnp.ones(2)).compile()(jnp.ones(2)).tolist() == [2.0, 2.0]  # an option XLA knows


def test_programs_run_a_few_times_are_not_autotuned_unless_xla_flags_say():
    once = compiler_options("gpu", {}, autotune=False)
    assert once == {"xla_gpu_enable_triton_gemm": False, "xla_gpu_autotune_level": 0}
    assert compiler_options("gpu", {"XLA_FLAGS": "--xla_gpu_autotune_level=4"}, autotune=False) == \
        {"xla_gpu_enable_triton_gemm": False}  # the user's choice
    assert compiler_options("cpu", {}, autotune=False) == {}
    import jax
    import jax.numpy as jnp
    jitted = jax.jit(lambda x: x * 2, compiler_options=once)
    assert jitted.lower(jnp.ones(2)).compile()(jnp.ones(2)).tolist() == [2.0, 2.0]  # options XLA knows


def test_length_buckets_are_powers_of_two_up_to_max_length():
    assert [length_bucket(n, 128) for n in (3, 32, 33, 64, 65, 100, 128)] == [32, 32, 64, 64, 128, 128, 128]
    assert [length_bucket(n, 384) for n in (200, 300, 384)] == [256, 384, 384]  # the last: max_length
    assert length_bucket(20, 24) == 24 and length_bucket(30, 24) == 30  # never shorter than the batch


def test_the_training_buckets_a_run_expects():
    lengths = np.array([20] * 90 + [50] * 9 + [120])  # mostly short, a few long, one very long
    # one-example batches: 900, 90 and 10 of 1,000 batches in buckets 32, 64, 128
    assert likely_buckets(lengths, 1, 1000, 128) == [32, 64, 128]
    # batches of 32 are padded to their longest: 64 with P = 0.99^32 - 0.9^32 = 0.69, 128 with
    # 1 - 0.99^32 = 0.28, 32 with 0.9^32 = 0.034 (3.4 of 100 batches)
    assert likely_buckets(lengths, 32, 100, 128) == [64, 128, 32]
    assert likely_buckets(lengths, 32, 10, 128) == [64, 128]  # 0.34 batches of 32: compiled if met
    assert likely_buckets(lengths, 32, 1, 128) == [64]


def test_a_program_over_leaves_is_the_program():
    """A program as a function of the state's and the frozen weights' leaves returns the items its
    flags mark as leaves (the new state's, the gradients'), equal to the program's on the trees."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    state = {"params": nnx.State({"w": nnx.Param(jnp.arange(3.0))}), "step": jnp.zeros((), jnp.int32)}
    frozen = nnx.State({"b": nnx.Param(jnp.ones(3))})

    def step(state, frozen, lr):
        w = state["params"]["w"][...] - lr * frozen["b"][...]
        return {"params": nnx.State({"w": nnx.Param(w)}), "step": state["step"] + 1}, w.sum()

    def gradients(state, frozen):
        return {"loss": state["params"]["w"][...].sum()}, jax.tree.map(lambda p: 2 * p, state["params"])

    flat = jax.tree.leaves(state), jax.tree.leaves(frozen)
    leaves, out = jax.jit(over_leaves(step, (state, frozen), (True, False)))(*flat, 0.5)
    new, expected = step(state, frozen, 0.5)
    assert isinstance(leaves, list) and float(out) == float(expected) == 1.5
    assert [np.asarray(x).tolist() for x in leaves] == [np.asarray(x).tolist() for x in jax.tree.leaves(new)]
    assert jax.tree.unflatten(jax.tree.structure(state), leaves)["step"] == 1
    losses, grads = jax.jit(over_leaves(gradients, (state, frozen), (False, True)))(*flat)
    assert float(losses["loss"]) == 3.0 and [np.asarray(g).tolist() for g in grads] == [[0.0, 2.0, 4.0]]


def test_a_small_evaluation_pads_every_batch_to_its_longest_bucket(monkeypatch):
    """Evaluation batches, longest first, each with its padded length: few batches share the
    longest one's (one program), more keep their own buckets."""
    import bert_kit.jax.compilation as compilation

    items = [{"input_ids": [0] * n} for n in (10, 100, 40, 70, 20, 50)]
    assert eval_lengths(items, 2, 128) == [([1, 3], 128), ([5, 2], 128), ([4, 0], 128)]
    monkeypatch.setattr(compilation, "ONE_EVAL_SHAPE", 2)
    assert eval_lengths(items, 2, 128) == [([1, 3], 128), ([5, 2], 64), ([4, 0], 32)]
    assert eval_lengths(items[:2], 2, 64) == [([1, 0], 100)] and eval_lengths([], 2, 64) == []


def run_workers(folder: Path, n: int) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    procs = [subprocess.Popen([sys.executable, "-m", "tests.jax.cache_worker", str(folder)], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(n)]
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-3000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def test_runs_share_the_cache_at_once_and_a_broken_entry_is_recompiled(tmp_path):
    folder = tmp_path / "cache"
    together = run_workers(folder, 2)  # two runs compiling the same program into an empty folder at once
    value = together[0]["value"]
    assert all(r["value"] == value and not r["warnings"] for r in together), together
    entries = [p for p in folder.iterdir() if p.name.endswith("-cache")]
    assert len(entries) == 1 and (folder / ".lockfile").exists()  # one entry, written under JAX's lock
    later = run_workers(folder, 1)[0]
    assert later["value"] == value and later["hits"] == 1 and not later["warnings"]  # loaded, not compiled
    entries[0].write_bytes(entries[0].read_bytes()[:100])  # cut short, as by a run killed while writing
    broken = run_workers(folder, 1)[0]
    assert broken["value"] == value and broken["hits"] == 0
    assert any("Error reading persistent compilation cache entry" in w for w in broken["warnings"])


def test_a_program_compiled_for_other_arguments_falls_back_to_jit(capsys):
    """The weights of a call in another dtype than the program compiled ahead was made for (as a
    bf16 compute copy would be): the call still runs, through jit's own dispatch, with one warning."""
    from concurrent.futures import ThreadPoolExecutor

    import jax
    import jax.numpy as jnp

    from bert_kit.jax.compilation import AheadOfTime

    def scaled(weights, batch):
        return {"y": batch["x"] * weights.sum()}

    with ThreadPoolExecutor(1) as pool:
        program = AheadOfTime(scaled, {}, 1, pool)
        batch = {"x": jnp.arange(4, dtype=jnp.float32)}
        program.ahead(jnp.ones(3, jnp.float32), batch)
        got = program(jnp.ones(3, jnp.bfloat16), batch)
        again = program(jnp.ones(3, jnp.bfloat16), batch)
    np.testing.assert_allclose(np.asarray(got["y"], np.float32), [0, 3, 6, 9])
    np.testing.assert_allclose(np.asarray(again["y"], np.float32), [0, 3, 6, 9])
    assert program.fallback and capsys.readouterr().err.count("compiled ahead does not take") == 1


def test_a_program_that_cannot_be_compiled_ahead_runs_through_jit(capsys):
    """Lowering for the abstract arguments fails (here: a compile that raises, as one for shardings
    the call does not have would): the call still runs, through jit, with one warning."""
    from concurrent.futures import ThreadPoolExecutor

    import jax
    import jax.numpy as jnp

    from bert_kit.jax.compilation import AheadOfTime

    class Refused(AheadOfTime):
        def compile(self, args):
            raise ValueError("Sharding passed to jit does not match the sharding on the argument")

    with ThreadPoolExecutor(1) as pool:
        program = Refused(lambda w, batch: batch["x"] * w, {}, 1, pool)
        batch = {"x": jnp.arange(3, dtype=jnp.float32)}
        program.ahead(jnp.float32(2), batch)
        got = program(jnp.float32(2), batch)
    np.testing.assert_allclose(np.asarray(got), [0, 2, 4])
    assert program.fallback and "Sharding passed to jit" in capsys.readouterr().err


CHECK: dict = {}  # the kernel's check a traced step asks (a global: the traces kept cannot key a Future)


def step_with_a_kernel(batch):
    from bert_kit.jax.compilation import assume

    works = assume(CHECK["future"])  # the kernel, if it works
    CHECK["seen"].append(CHECK["future"].done())
    return batch["x"] + (1.0 if works else 2.0)


def test_a_trace_takes_a_check_still_running_as_passed_and_traces_again_if_it_failed(tmp_path, monkeypatch):
    """A kernel's check that has not ended when a program compiled ahead traces (`assume`): the trace
    goes on as if it passed; the check's result is read once the program is compiled, and where the
    check failed the program is traced again without the kernel, and kept so for later runs."""
    import threading
    import time
    from concurrent.futures import Future, ThreadPoolExecutor

    import jax
    import jax.numpy as jnp

    from bert_kit.jax import trace_cache
    from bert_kit.jax.compilation import AheadOfTime, assume, kept
    from bert_kit.jax.trace_cache import TraceCache

    monkeypatch.setattr(trace_cache, "COMPILED_ON", (jax.default_backend(),))  # (as on a GPU)
    batch, spec = {"x": jnp.zeros(2, jnp.float32)}, {"x": jax.ShapeDtypeStruct((2,), jnp.float32)}
    for passed, added in ((True, 1.0), (False, 2.0)):
        CHECK.update(future=Future(), seen=[])
        folder = tmp_path / str(passed)
        with ThreadPoolExecutor(1) as pool:
            program = AheadOfTime(step_with_a_kernel, {}, 0, pool, traces=TraceCache(folder))
            program.ahead(spec)
            waited = time.monotonic()
            while not CHECK["seen"]:  # the trace goes on before the check ends
                if time.monotonic() - waited > 30:
                    CHECK["future"].set_result(passed)  # (so that the trace, and the pool, end)
                    pytest.fail("the trace waits for the check")
                time.sleep(0.01)
            threading.Timer(0.2, CHECK["future"].set_result, (passed,)).start()  # the trace did not wait for it
            np.testing.assert_array_equal(np.asarray(program(batch)), [added, added])
        assert CHECK["seen"] == ([False] if passed else [False, True])  # traced again once its check ended
        kept()  # written once compiled, and its check passed
        assert len(list(folder.glob("*.jaxexport"))) == len(list(folder.glob("*.executable"))) == 1
        later = TraceCache(folder)
        read_back = later.compile(step_with_a_kernel, {}, (spec,))
        np.testing.assert_array_equal(np.asarray(read_back(batch)), [added, added])
        assert later.loaded == 1 and len(CHECK["seen"]) == (1 if passed else 2)  # read back as traced last
    pending = Future()
    threading.Timer(0.1, pending.set_result, (False,)).start()
    assert assume(pending) is False  # any other trace waits for the check's result


KERNEL_FROM_TWO_CALLERS = """
import re, sys
import jax, jax.numpy as jnp
from jax import export
from bert_kit.jax.compilation import use_compilation_cache
from bert_kit.jax.kernels.residual_norm import fused_residual_norm
if sys.argv[1] != "default":
    use_compilation_cache(sys.argv[1], env={})
spec = jax.ShapeDtypeStruct
x, w, s = spec((256, 768), jnp.bfloat16), spec((768,), jnp.bfloat16), spec((2,), jnp.uint32)
def grads(x, y, w, b, s):
    out, pull = jax.vjp(lambda *a: fused_residual_norm(*a, s, 0.1), x, y, w, b)
    return pull(out)
def training_step(*a): return grads(*a)
def evaluation(*a): return grads(*a)
def triton_code(f):
    checks = [export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
    module = export.export(jax.jit(f), platforms=["cuda"], disabled_checks=checks)(x, x, w, w, s).mlir_module()
    return re.findall(r'ir = "([^"]*)"', module)
a, b = triton_code(training_step), triton_code(evaluation)
print(len(a), a == b)
"""


def test_a_kernel_is_one_program_whichever_code_path_traced_it(tmp_path):
    """The Triton code of a Pallas kernel (here lowered for CUDA on any machine) carries its source
    locations; with JAX's default, the whole stack that traced it, so the same kernel from two
    callers was two programs and a warm run missed its cache entry. With the cache on, one frame."""
    def run(setting: str) -> str:
        return subprocess.run([sys.executable, "-c", KERNEL_FROM_TWO_CALLERS, setting], capture_output=True, text=True,
                              cwd=REPO, check=True).stdout.split()

    assert run(str(tmp_path / "cache")) == ["2", "True"]  # the forward's and the backward's, the same for both
    assert run("default") == ["2", "False"]
