"""Traced programs kept between runs: a later run loads a program's lowered form (StableHLO, by
`jax.export`) instead of tracing the model again. Tracing MiniLM's train step is about a second of
Python on every run, before the compilation cache can answer. On GPUs what XLA compiled is kept
beside it (`jax.experimental.serialize_executable`), by the same key, the compiler's options and
XLA_FLAGS: a later run loads it onto its devices, and traces, lowers and looks up nothing.

A stale program would train silently wrong, so its key is everything the trace reads:
- the code: bert-kit's source files, and the versions of Python, JAX, jaxlib, Flax, Optax, NumPy;
- the devices (platform, kind, ids, processes) and JAX's configuration;
- the function traced and all it reaches, walked value by value (`Fingerprint`): its closure and
  defaults, the objects its methods are bound to (the model's graph with the kernels put on it,
  the optimizer's closures, a task head's fields and constants taken from the data), the globals
  bert-kit's functions name and the methods (with their constants) of bert-kit's classes;
- the jit's shardings and donation, and the arguments' shapes, dtypes and shardings.
An object the walk cannot read (a lock, a C object whose state it cannot see) keys nothing: that
program is traced, as without this cache. The kernels' checks run when the step is traced: a
program loaded skips them and keeps the kernels its first run chose, on the same devices and code.
Entries are written whole (a temporary file, renamed) in the compilation cache's `traced/` folder,
once their program is compiled; the keys of one run's programs walk the objects they share once (`Memo`).
"""

from __future__ import annotations

import contextlib
import enum
import functools
import hashlib
import importlib.metadata
import logging
import os
import pickle
import re
import sys
import tempfile
import threading
import types
from pathlib import Path
from typing import Any, Callable, ContextManager

import jax
import numpy as np
from jax import export

PACKAGE = Path(__file__).resolve().parents[1]  # bert_kit/
VERSIONED = ("jax", "jaxlib", "flax", "optax", "numpy", "ml_dtypes")
SCALARS = (type(None), bool, int, float, complex, str, bytes)
# every custom call may be kept: the program is read back by the same versions on the same devices
ANY_CUSTOM_CALL = [export.DisabledSafetyCheck.custom_call("ALL")]
SUFFIX = ".jaxexport"
Program = jax.stages.Lowered | jax.stages.Compiled  # `TraceCache.load`'s: to compile, or compiled
COMPILED = ".executable"  # a program compiled, beside its trace
# where compiled programs are kept: on a CPU, XLA's programs read back in the process that compiled
# them failed to run ("Function copy_gather_fusion not found"), and a CPU run's start is not that wait
COMPILED_ON = ("gpu",)
# the members of bert-kit's classes walked: methods, and the constants and tables they may read
CLASS_MEMBERS = (types.FunctionType, staticmethod, classmethod, property, type, *SCALARS, tuple, list, dict, set,
                 frozenset, np.ndarray, enum.Enum)
CLASS_BOOKKEEPING = ("__dict__", "__weakref__", "__doc__", "__module__", "__qualname__", "__annotations__",
                     "__slots__", "__parameters__", "__orig_bases__", "__abstractmethods__", "_abc_impl")
MAX_ENTRIES = 64  # programs kept of each kind (each a few MB), the least recently used evicted


class Unkeyable(TypeError):
    """A value whose content the key cannot see."""


class Memo:
    """The digests of objects walked, shared by the keys of one run's programs (`TraceCache`): its
    programs reach mostly the same objects (the model's graph, the optimizer, bert-kit's code), which
    are then walked once. Each object is kept alive with it: its id names no other value meanwhile."""

    def __init__(self) -> None:
        self.digests: dict[int, bytes] = {}
        self.kept: list[Any] = []


class Fingerprint:
    """A SHA-256 of values walked in a fixed order. Each object stands for the digest of its own
    walk, so two equal objects give one digest whether or not they are one object; a reference
    back to an object being walked (a cycle) is named by how far up it is."""

    def __init__(self, memo: Memo | None = None) -> None:
        self.hash = hashlib.sha256()
        memo = Memo() if memo is None else memo
        self.digests = memo.digests  # id -> the digest of an object walked
        self.active: list[int] = []  # the objects being walked, outermost first
        self.kept = memo.kept  # alive while walked: an id is never reused by another value

    def put(self, *parts: Any) -> None:
        for part in parts:
            self.hash.update(part if isinstance(part, bytes) else str(part).encode())
            self.hash.update(b"\x00")

    def hexdigest(self) -> str:
        return self.hash.hexdigest()

    def walk(self, x: Any) -> None:
        if isinstance(x, SCALARS):
            self.put(type(x).__name__, repr(x))
            return
        if id(x) in self.digests:
            self.put(self.digests[id(x)])
            return
        if id(x) in self.active:
            self.put("cycle", len(self.active) - self.active.index(id(x)))
            return
        outer, self.hash = self.hash, hashlib.sha256()
        self.active.append(id(x))
        self.kept.append(x)
        try:
            self.content(x)
            digest = self.hash.digest()
        finally:
            self.active.pop()
            self.hash = outer
        self.digests[id(x)] = digest
        self.put(digest)

    def content(self, x: Any) -> None:
        kind = type(x)
        if isinstance(x, types.ModuleType):
            self.put("module", x.__name__)
        elif isinstance(x, type):
            self.put("type", x.__module__, x.__qualname__)
            if ours(x.__module__):  # its methods and the constants they read (a library's are its version's)
                self.walk(x.__bases__)
                for name, member in sorted(vars(x).items()):
                    if name not in CLASS_BOOKKEEPING:
                        self.put("member", name)
                        if isinstance(member, CLASS_MEMBERS):
                            self.walk(member)
                        else:  # a field's or slot's descriptor, a C object: its source is in the key
                            self.put(type(member).__qualname__)
        elif isinstance(x, (staticmethod, classmethod)):
            self.walk(x.__func__)
        elif isinstance(x, property):
            self.walk((x.fget, x.fset, x.fdel))
        elif isinstance(x, (np.ndarray, np.generic)):
            self.put("array", x.dtype.str, np.shape(x), np.ascontiguousarray(x).tobytes())
        elif isinstance(x, jax.Array):
            if not x.is_fully_addressable:
                raise Unkeyable("an array of several processes")
            self.walk(np.asarray(x))
        elif isinstance(x, (np.dtype, jax.sharding.Sharding, jax.tree_util.PyTreeDef, enum.Enum)):
            self.put(kind.__qualname__, repr(x))
            if isinstance(x, jax.sharding.Sharding):
                self.put(sorted(d.id for d in x.device_set))
        elif isinstance(x, jax.ShapeDtypeStruct):
            self.put("abstract", x.shape, x.dtype, x.weak_type)
            self.walk(x.sharding)
        elif isinstance(x, (list, tuple)):
            self.put(kind.__qualname__, len(x))
            for item in x:
                self.walk(item)
            if hasattr(x, "_fields") or kind not in (list, tuple):  # a NamedTuple's class, a subclass's fields
                self.walk(kind)
                self.attributes(x)
        elif isinstance(x, dict):
            self.put(kind.__qualname__, len(x))
            for k, v in sorted(x.items(), key=lambda kv: constant(kv[0])):
                self.walk(k)
                self.walk(v)
            if kind is not dict:
                self.walk(kind)
                self.attributes(x)
        elif isinstance(x, logging.Logger):  # where messages go: nothing a program computes
            self.put("logger", x.name)
        elif isinstance(x, threading.local):  # a thread's own bookkeeping (`compilation.assume`'s): a program
            self.put("thread-local")  # keys alike in every thread, within a trace's turn or not
        elif isinstance(x, re.Pattern):
            self.put("pattern", x.pattern, x.flags)
        elif isinstance(x, (set, frozenset)):
            self.put(kind.__qualname__, sorted(constant(item) for item in x))
        elif isinstance(x, types.FunctionType):
            self.function(x)
        elif isinstance(x, types.MethodType):
            self.walk(x.__func__)
            self.walk(x.__self__)
        elif isinstance(x, functools.partial):
            self.put("partial")
            self.walk((x.func, x.args, x.keywords))
        elif isinstance(x, (types.BuiltinFunctionType, types.WrapperDescriptorType, types.MethodDescriptorType)):
            self.put("builtin", getattr(x, "__module__", None), x.__qualname__)
            owner = getattr(x, "__self__", None)
            if owner is not None and not isinstance(owner, types.ModuleType):
                self.walk(owner)
        elif isinstance(x, types.CodeType):
            self.code(x)
        elif callable(x) and hasattr(x, "__wrapped__") and hasattr(x, "lower"):  # jax.jit's function: what it traces
            self.put("jit")
            self.walk(x.__wrapped__)
        elif isinstance(x, types.MappingProxyType):
            self.walk(dict(x))
        elif hasattr(x, "__dict__") or "__slots__" in vars(kind):  # a Python object: its class and state
            self.walk(kind)
            self.attributes(x)
        else:
            raise Unkeyable(f"{kind.__module__}.{kind.__qualname__}")

    def attributes(self, x: Any) -> None:
        names = sorted(getattr(x, "__dict__", {}))
        for cls in type(x).__mro__:
            slots = getattr(cls, "__slots__", ())
            names += [slots] if isinstance(slots, str) else [s for s in slots if s not in ("__dict__", "__weakref__")]
        for name in sorted(set(names)):
            self.put("attribute", name)
            self.walk(getattr(x, name, None))

    def function(self, f: types.FunctionType) -> None:
        self.put("function", f.__module__, f.__qualname__)
        self.code(f.__code__)
        self.walk((f.__defaults__, f.__kwdefaults__))
        for cell in f.__closure__ or ():
            try:
                self.walk(cell.cell_contents)
            except ValueError:  # a cell not yet filled
                self.put("empty cell")
        if ours(f.__module__):  # a library's globals are its version's
            for name in sorted(names_of(f.__code__)):
                if name in f.__globals__:
                    self.put("global", name)
                    self.walk(f.__globals__[name])

    def code(self, code: types.CodeType) -> None:
        self.put("code", code.co_filename.rsplit(os.sep, 1)[-1], code.co_firstlineno, code.co_code)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                self.code(const)
            else:
                self.put(constant(const))


def constant(value: Any) -> str:
    """A code constant as text that no process's string hashing reorders (a frozenset's items,
    as in `name in {"a", "b"}`, are in the order of their hashes)."""
    if isinstance(value, (frozenset, set)):
        return "{" + ", ".join(sorted(constant(v) for v in value)) + "}"
    if isinstance(value, tuple):
        return "(" + ", ".join(constant(v) for v in value) + ")"
    return repr(value)


def ours(module: str | None) -> bool:
    """Whether `module` is bert-kit's: its functions' globals and its classes' methods are walked."""
    return (module or "").split(".")[0] == PACKAGE.name


def last_used(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:  # evicted by another run meanwhile
        return 0.0


def names_of(code: types.CodeType) -> set[str]:
    """The names a function's code (and the code it defines) reads: its globals among them."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= names_of(const)
    return names


@functools.lru_cache(maxsize=None)
def context() -> str:
    """The part of every key a process shares: code, versions, devices, JAX's configuration."""
    fp = Fingerprint()
    for path in sorted(PACKAGE.rglob("*.py")):
        fp.put(path.relative_to(PACKAGE).as_posix(), path.read_bytes())
    for name in VERSIONED:
        try:
            fp.put(name, importlib.metadata.version(name))
        except importlib.metadata.PackageNotFoundError:
            fp.put(name, None)
    fp.put(sys.version, jax.devices()[0].client.platform_version, jax.process_index(), jax.process_count())
    fp.put([(d.id, d.platform, d.device_kind, d.process_index) for d in jax.devices()])
    fp.put(sorted((k, constant(v)) for k, v in jax.config.values.items()))
    return fp.hexdigest()


def program_key(fn: Callable, jit_options: dict[str, Any], args: tuple, memo: Memo | None = None) -> str | None:
    """The key of `jax.jit(fn, **jit_options)` lowered for `args` (ShapeDtypeStructs), or None where
    something it reaches is `Unkeyable`. The compiler's options are not in it: the program loaded is
    compiled with the current ones. memo: the digests of objects other keys walked (that have not
    changed since)."""
    fp = Fingerprint(memo)
    fp.put(context())
    try:
        fp.walk(fn)
        for tree in ({k: v for k, v in jit_options.items() if k != "compiler_options"}, args):
            leaves, structure = jax.tree.flatten(tree)  # (an NNX Variable's own state is its trace's, not the key's)
            fp.walk((structure, leaves))
    except (Unkeyable, RecursionError):
        return None
    return fp.hexdigest()


def flat_program(fn: Callable, jit_options: dict[str, Any], args: tuple) -> tuple[Callable, dict, list] | None:
    """`fn` as a function of the leaves of `args`, its jit options for them (a sharding and a donation
    per leaf), and the leaves; None where the options do not fit the arguments."""
    leaves, structure = jax.tree.flatten(args)

    def on_leaves(*xs: Any) -> Any:
        return fn(*jax.tree.unflatten(structure, xs))

    on_leaves.__name__ = getattr(fn, "__name__", "program")
    options = dict(jit_options)
    try:
        if "in_shardings" in options:
            options["in_shardings"] = tuple(jax.tree.leaves(jax.tree.broadcast(tuple(options["in_shardings"]), args)))
    except (ValueError, TypeError):
        return None
    if "donate_argnums" in options:
        donated = options["donate_argnums"]
        donated = {donated} if isinstance(donated, int) else set(donated)
        firsts = np.cumsum([0] + [len(jax.tree.leaves(a)) for a in args])
        options["donate_argnums"] = tuple(i for a in sorted(donated) for i in range(firsts[a], firsts[a + 1]))
    return on_leaves, options, leaves


def on_trees(compiled: Callable) -> Callable:
    """A program kept, which takes its arguments' leaves, called with the arguments themselves."""
    return lambda *args: compiled(*jax.tree.leaves(args))


class TraceCache:
    """Lowered programs in `folder`, by `program_key`, and the programs compiled from them, by that
    key and the compiler's options (`compiled_key`); of each kind the `MAX_ENTRIES` last used are kept."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.loaded = self.traced = 0  # programs read back (traced or compiled), and traced in this run
        self.failed = False  # a program could not be exported: said once, then every program is traced
        # the objects the keys walk, walked once: on an H200 a warm run's train step took 0.07-0.32 s to
        # key, each other program 0.05-0.06 s; with the train step's digests at hand, 0.008 s for three
        self.memo = Memo()

    def keeps_any(self) -> bool:
        """Whether any traced program is kept (a later run of one's settings reads it back)."""
        return next(self.folder.glob(f"*{SUFFIX}"), None) is not None

    def compile(self, fn: Callable, jit_options: dict[str, Any], args: tuple) -> Callable | None:
        """`jax.jit(fn, **jit_options).lower(*args).compile()`, from the program an earlier run compiled
        or traced where its key matches; else traced now, and kept for the next run. None where the program
        cannot be kept: the caller compiles it as without this cache (whose errors are the program's)."""
        found = self.load(fn, jit_options, args)
        if found is None:
            return None
        program, keep = found
        if isinstance(program, jax.stages.Lowered):
            program = program.compile()
            keep(program)
        return on_trees(program)

    def load(self, fn: Callable, jit_options: dict[str, Any], args: tuple, reuse: bool = True,
             turn: Callable[[], ContextManager] = contextlib.nullcontext) -> tuple[Program, Callable] | None:
        """`fn`'s program for `args`, taking their leaves (an NNX State is no type `jax.export` can
        write): compiled, as an earlier run compiled it with these compiler options; else lowered for
        XLA, from the trace an earlier run kept, or traced now. Not to `reuse` them, it is traced now.
        With it, the call that keeps it for later runs, given it compiled (its trace, if traced now,
        and what XLA made of it): the caller makes it (in a thread) once the checks its trace took as
        passed are known to have passed. None where the program cannot be kept.
        turn: a context held while walking the key or tracing (`compilation.TRACING`), not while
        loading a compiled program (whose reading and loading onto the devices let other threads run)."""
        with turn():
            key = None if self.failed else program_key(fn, jit_options, args, self.memo)
        flat = None if key is None else flat_program(fn, jit_options, args)
        if flat is None:
            return None
        flat_fn, flat_options, leaves = flat
        name = f"{getattr(fn, '__name__', 'program')}-{key[:40]}"
        built = self.folder / f"{name}-{compiled_key(key, jit_options)[:16]}{COMPILED}"
        platform = platform_of(args)
        compiling = platform in COMPILED_ON
        compiled = self.read_compiled(built) if reuse and compiling else None
        if compiled is not None:
            self.loaded += 1
            return compiled, lambda compiled: None
        path = self.folder / f"{name}{SUFFIX}"
        with turn():
            exported = self.read(path) if reuse else None
            traced = exported is None
            if traced:
                try:
                    # for the arguments' devices (a CPU run on a machine with GPUs is not JAX's default)
                    platforms = None if platform == jax.default_backend() else [platform]
                    exported = export.export(jax.jit(flat_fn, **flat_options), platforms=platforms,
                                             disabled_checks=ANY_CUSTOM_CALL)(*leaves)
                except Exception as e:  # noqa: BLE001 -- the caller's own lowering raises the program's real errors
                    self.failed = True
                    print(f"warning: traced programs are not kept ({type(e).__name__}: {str(e).strip()[:300]})",
                          file=sys.stderr, flush=True)
                    return None

            # the same wrapping in both cases: the compilation cache sees one program in every run
            def program(*xs: Any) -> Any:
                return exported.call(*xs)

            program.__name__ = flat_fn.__name__  # JAX's logs and the compilation cache's entries name it
            lowered = jax.jit(program, **flat_options).lower(*leaves)
        if traced:
            self.traced += 1
        else:
            self.loaded += 1

        def keep(compiled: jax.stages.Compiled) -> None:
            if traced:
                self.write(path, exported.serialize())
            data = serialized(compiled) if compiling else None
            if data is not None:
                self.write(built, data)

        return lowered, keep

    def read(self, path: Path) -> export.Exported | None:
        try:
            exported = export.deserialize(bytearray(path.read_bytes()))
            os.utime(path)  # used: the last to be evicted
            return exported
        except FileNotFoundError:
            return None
        except Exception as e:  # noqa: BLE001 -- a damaged entry is traced again and rewritten
            print(f"warning: {path} cannot be read ({type(e).__name__}); tracing the program again",
                  file=sys.stderr, flush=True)
            return None

    def read_compiled(self, path: Path) -> jax.stages.Compiled | None:
        """A compiled program kept (`serialized`), loaded onto the devices it was compiled for. Like
        JAX's own compilation cache, it is code to run: the folder is the user's, written by their runs."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            from jax.experimental.serialize_executable import deserialize_and_load

            payload, in_tree, out_tree, ids = pickle.loads(data)
            devices = {d.id: d for d in jax.devices()}
            compiled = deserialize_and_load(payload, in_tree, out_tree, execution_devices=[devices[i] for i in ids])
            os.utime(path)
            return compiled
        except Exception as e:  # noqa: BLE001 -- a damaged entry: compiled again, and rewritten
            print(f"warning: {path} cannot be loaded ({type(e).__name__}); compiling the program again",
                  file=sys.stderr, flush=True)
            return None

    def write(self, path: Path, data: bytes | bytearray) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=path.parent, prefix=path.name, suffix=".part", delete=False) as f:
                f.write(data)
            os.replace(f.name, path)
            entries = sorted(path.parent.glob(f"*{path.suffix}"), key=last_used, reverse=True)
            for old in entries[MAX_ENTRIES:]:
                old.unlink(missing_ok=True)
        except OSError as e:  # a full disk, a folder another run is evicting from: the next run traces
            print(f"warning: {path.parent}: {e.strerror}; the program is not kept", file=sys.stderr, flush=True)


def platform_of(args: tuple) -> str:
    """The platform of the devices a program's arguments are put on (JAX's default where none is said)."""
    for leaf in jax.tree.leaves(args):
        sharding = getattr(leaf, "sharding", None)
        if sharding is not None:
            return next(iter(sharding.device_set)).platform
    return jax.default_backend()


def compiled_key(key: str, jit_options: dict[str, Any]) -> str:
    """The key of a program compiled: its trace's (`program_key`), the compiler's options, and the
    XLA_FLAGS it was compiled under."""
    options = sorted((name, constant(value)) for name, value in (jit_options.get("compiler_options") or {}).items())
    return hashlib.sha256(repr((key, options, os.environ.get("XLA_FLAGS", ""))).encode()).hexdigest()


def serialized(compiled: jax.stages.Compiled) -> bytes | None:
    """A compiled program as bytes (`jax.experimental.serialize_executable`), with the ids of the
    devices it runs on, in order; None where it cannot be written (the trace is kept alone)."""
    try:
        from jax.experimental.serialize_executable import serialize

        payload, in_tree, out_tree = serialize(compiled)
        ids = [d.id for d in compiled._executable._unloaded_executable.device_list]  # (as `serialize` reads it)
        return pickle.dumps((payload, in_tree, out_tree, ids))
    except Exception:  # noqa: BLE001 -- a program the backend cannot serialize
        return None
