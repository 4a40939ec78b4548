"""Traced programs kept between runs (`bert_kit.jax.trace_cache`): a program read back computes what
the traced one computes and donates as it does; its key changes with anything the trace reads (a
closure's constant, a head's field, an array's values, a bert-kit global, the arguments' shapes,
dtypes and shardings) and not between two builds of the same program; what the key cannot read is
traced, and a damaged entry is traced again.

Run: .venv/bin/python -m pytest tests/jax/test_trace_cache.py -q
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import bert_kit.jax.compilation as compilation  # noqa: E402
from bert_kit.jax import trace_cache  # noqa: E402
from bert_kit.jax.trace_cache import TraceCache, program_key  # noqa: E402


def abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


@pytest.fixture
def compiled_kept(monkeypatch):
    """Compiled programs kept on this CPU too (`COMPILED_ON`): these programs run when read back."""
    monkeypatch.setattr(trace_cache, "COMPILED_ON", (*trace_cache.COMPILED_ON, jax.default_backend()))


def step(state, batch):
    return [s + batch["x"].sum() for s in state], batch["x"] * 2


def test_a_program_read_back_computes_and_donates_as_the_traced_one(tmp_path, compiled_kept):
    """A second run loads the program the first compiled; a run with other compiler options compiles
    the trace the first kept. Each computes and donates as the program traced."""
    batch = {"x": jnp.arange(3.0)}
    args = abstract(([jnp.ones(4), jnp.zeros(4)], batch))
    want = jax.jit(step)([jnp.ones(4), jnp.zeros(4)], batch)
    other = {"xla_backend_optimization_level": 1}
    for run, options in (("first", {}), ("second", {}), ("other options", other)):
        cache = TraceCache(tmp_path)
        program = cache.compile(step, dict(donate_argnums=0, compiler_options=options), args)
        state = [jnp.ones(4), jnp.zeros(4)]
        got = program(state, batch)
        assert all(s.is_deleted() for s in state)  # the state's buffers were donated
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert (cache.traced, cache.loaded) == ((1, 0) if run == "first" else (0, 1))
        compiled = sorted(tmp_path.glob("step-*.executable"))
        assert len(compiled) == (2 if run == "other options" else 1)
        if run == "first":
            first = compiled[0].stat().st_mtime_ns
        elif run == "second":
            assert compiled[0].stat().st_mtime_ns != first  # read back (its use noted), not written again
    assert len(list(tmp_path.glob("step-*.jaxexport"))) == 1


@dataclass(frozen=True)
class Head:
    weights: tuple


def scaled_by(factor):
    return lambda x: x * factor


def test_the_key_changes_with_what_the_trace_reads_and_only_with_it(monkeypatch):
    x = (jax.ShapeDtypeStruct((4,), jnp.float32),)

    def key(fn, args=x, **options):
        return program_key(fn, options, args)

    assert key(scaled_by(2.0)) == key(scaled_by(2.0)) is not None  # two builds of one program
    assert key(scaled_by(2.0)) != key(scaled_by(3.0))  # a closure's constant
    assert key(Head((1.0, 2.0)).__eq__) != key(Head((1.0, 2.5)).__eq__)  # the fields of a bound object
    assert key(scaled_by(np.ones(3))) != key(scaled_by(np.array([1.0, 1.0, 2.0])))  # an array's values
    assert key(scaled_by(2.0)) != key(scaled_by(2.0), (jax.ShapeDtypeStruct((5,), jnp.float32),))
    assert key(scaled_by(2.0)) != key(scaled_by(2.0), (jax.ShapeDtypeStruct((4,), jnp.bfloat16),))
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    assert key(scaled_by(2.0)) != key(scaled_by(2.0), (jax.ShapeDtypeStruct((4,), jnp.float32, sharding=device),))
    assert key(scaled_by(2.0)) != key(scaled_by(2.0), donate_argnums=0)
    # a global of bert-kit's code, as a setting read at trace time would be; and one a method of a
    # bert-kit class reads (the loss scale's growth interval, read by `LossScale.update`)
    before = key(compilation.length_bucket)
    monkeypatch.setattr(compilation, "SHORTEST", 16)
    assert key(compilation.length_bucket) != before
    from bert_kit.jax import train as jax_train
    from bert_kit.jax.engine import Programs

    before = key(Programs.initial_state)
    assert before is not None
    monkeypatch.setattr(jax_train, "GROWTH_INTERVAL", 3)
    assert key(Programs.initial_state) != before


KEY_IN_A_PROCESS = """
import jax, jax.numpy as jnp
from bert_kit.jax.trace_cache import program_key
def picked(x):
    return x * (1.0 if "b" in {"a", "b", "c", "d"} else 2.0)  # a frozenset among the code's constants
print(program_key(picked, {}, (jax.ShapeDtypeStruct((4,), jnp.float32),)))
"""


def test_the_key_is_the_same_in_every_process():
    """Python orders a frozenset's strings by their hashes, which differ from process to process
    (PYTHONHASHSEED): a code constant's items are sorted before they are hashed."""
    keys = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", KEY_IN_A_PROCESS], env=env, capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parents[2], check=True)
        keys.add(done.stdout.strip().splitlines()[-1])
    assert len(keys) == 1 and "None" not in keys, keys


def test_what_the_key_cannot_read_is_traced_and_not_kept(tmp_path):
    lock = threading.Lock()

    def locked(batch):
        with lock:
            return batch["x"] + 1

    args = ({"x": jax.ShapeDtypeStruct((2,), jnp.float32)},)
    assert program_key(locked, {}, args) is None
    cache = TraceCache(tmp_path)
    assert cache.compile(locked, {}, args) is None  # the caller compiles it, as without this cache
    assert (cache.traced, cache.loaded) == (0, 0) and not list(tmp_path.iterdir())
    with ThreadPoolExecutor(1) as pool:
        program = compilation.AheadOfTime(locked, {}, 0, pool, traces=cache)
        np.testing.assert_array_equal(np.asarray(program({"x": jnp.zeros(2)})), [1, 1])


def test_a_damaged_entry_is_traced_again_and_rewritten(tmp_path, capsys, compiled_kept):
    args = abstract(([jnp.ones(4)], {"x": jnp.arange(3.0)}))
    TraceCache(tmp_path).compile(step, {}, args)
    (entry,), (compiled,) = tmp_path.glob("*.jaxexport"), tmp_path.glob("*.executable")
    compiled.write_bytes(b"half a program")
    cache = TraceCache(tmp_path)  # compiled again from the trace kept
    state, out = cache.compile(step, {}, args)([jnp.ones(4)], {"x": jnp.arange(3.0)})
    np.testing.assert_array_equal(np.asarray(state[0]), [4, 4, 4, 4])
    assert f"{compiled} cannot be loaded" in capsys.readouterr().err and (cache.traced, cache.loaded) == (0, 1)
    assert TraceCache(tmp_path).read_compiled(compiled) is not None
    entry.write_bytes(b"half an entry")
    compiled.unlink()
    cache = TraceCache(tmp_path)
    state, out = cache.compile(step, {}, args)([jnp.ones(4)], {"x": jnp.arange(3.0)})
    np.testing.assert_array_equal(np.asarray(state[0]), [4, 4, 4, 4])
    assert f"{entry} cannot be read" in capsys.readouterr().err and cache.traced == 1
    assert TraceCache(tmp_path).read(entry) is not None


def test_the_last_used_entries_are_kept(tmp_path, monkeypatch, compiled_kept):
    monkeypatch.setattr(trace_cache, "MAX_ENTRIES", 2)
    cache = TraceCache(tmp_path)
    for factor in (1.0, 2.0, 3.0):
        cache.compile(scaled_by(factor), {}, (jax.ShapeDtypeStruct((2,), jnp.float32),))
    assert len(list(tmp_path.glob("*.jaxexport"))) == len(list(tmp_path.glob("*.executable"))) == 2


def test_the_kernels_checks_start_with_the_model_unless_traced_programs_are_kept(tmp_path):
    """A warm run reads its step back and never traces the kernel: where the cache keeps traced
    programs, the checks wait for a trace that asks (`engine.checked_ahead`)."""
    from bert_kit.jax.engine import checked_ahead

    cache = TraceCache(tmp_path / "traced")
    assert checked_ahead([128, 64], None) == [128, 64] and checked_ahead([128, 64], cache) == [128, 64]
    assert not cache.keeps_any()
    cache.compile(step, {}, abstract(([jnp.ones(4)], {"x": jnp.arange(3.0)})))
    assert cache.keeps_any() and checked_ahead([128, 64], cache) == []


def test_the_key_is_the_same_within_a_traces_turn_and_outside_it():
    """A program that reaches a kernel's check (`compilation.assume`, whose bookkeeping is per
    thread) keys alike within a trace's turn (`AheadOfTime`) and outside it (`TraceCache.compile`)."""
    step = scaled_by(compilation.assume)  # (the key walks it and the globals it reads; nothing calls it)
    args = ({"x": jax.ShapeDtypeStruct((2,), jnp.float32)},)
    with compilation.assuming_checks():
        within = program_key(step, {}, args)
    keys = []
    worker = threading.Thread(target=lambda: keys.append(program_key(step, {}, args)))
    worker.start(), worker.join()
    assert keys == [within] == [program_key(step, {}, args)] and within is not None


def test_keys_walked_with_a_memo_are_the_keys_walked_alone():
    """The keys of one run's programs share the digests of what they reach (`Memo`): each key is
    the one walked alone, in whichever order the programs come."""
    shared = Head((1.0, 2.0))
    programs = [scaled_by(shared), scaled_by((shared, 3.0)), Head((1.0, 2.5)).__eq__]
    x = (jax.ShapeDtypeStruct((4,), jnp.float32),)
    alone = [program_key(fn, {}, x) for fn in programs]
    memo = trace_cache.Memo()
    assert [program_key(fn, {}, x, memo) for fn in programs] == alone and len(set(alone)) == 3
    memo = trace_cache.Memo()
    assert [program_key(fn, {}, x, memo) for fn in reversed(programs)] == alone[::-1]
    assert memo.digests  # (shared: the second and third keys read the first's)
