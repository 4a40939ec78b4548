"""Compiling the JAX engine's programs: once per shape, ahead of their use where the shapes are
known, and kept between runs.

- `use_compilation_cache(setting)`: JAX's persistent compilation cache, on by default in
  ~/.cache/bert-kit/jax (the `jax_cache` setting, else $BERT_KIT_JAX_CACHE, else a folder the user
  gave JAX itself, $JAX_COMPILATION_CACHE_DIR, used as JAX configured it); "off" keeps none. A
  later run of the same shapes loads its programs instead of compiling them. JAX writes an entry
  with one `write_bytes`, not a temporary file renamed into place: two runs sharing the folder
  could read half-written entries, or interleave two writes of one (GPU autotuning may compile
  the same program to other bytes). A size bound (8 GiB, least recently used evicted) turns on
  JAX's file lock around every read and write (the `filelock` package, which torch installs), so
  runs take turns; and an entry that cannot be read is only a warning and a compilation. Source
  locations name a frame, not the whole stack: they are in a kernel's Triton code, and the stack
  that traced it would make one kernel as many programs as the paths that reach it.
- `length_bucket`: fine-tuning batches are padded to powers of two from 32 tokens (at most to the
  run's max_length): a 128-token run compiles for 32, 64 and 128, a 512-token one for five lengths;
  `likely_buckets` are those a run's training batches are likely to meet, compiled ahead
  (`item_tokens`: an example's length; `eval_chunks`: the evaluation's batches, longest first;
  `eval_lengths`: their padded lengths, all alike for a small evaluation).
- `compiler_options`: on GPUs XLA writes matrix products with cuBLAS, not as Triton kernels it
  autotunes over many tilings: as fast for BERT's shapes, and a first run compiles sooner; programs
  that run a few times (evaluation) are not autotuned at all.
- `over_leaves`: a program as a function of the train state's leaves, which the engine keeps
  between steps (a call's arguments are flattened on every call).
- `AheadOfTime`: the programs of one jitted function, one per input shape, compiled in threads
  as soon as their shapes are known (the evaluation's while the run trains), and at the latest
  when a step needs them: that wait is shown as `compiling (first run of these shapes)`. Their
  traced and compiled forms are kept between runs (`kept_traces`, `trace_cache`), written after XLA
  compiled them (`keep_once_checked`). They are traced one at a time (`TRACING`), each without
  waiting for the kernels' checks still running (`assume`).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.util
import os
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

import jax
import numpy as np

from bert_kit.jax.trace_cache import TraceCache, on_trees

CACHE_VARIABLE = "BERT_KIT_JAX_CACHE"
DEFAULT_CACHE = Path("~/.cache/bert-kit/jax")
CACHE_MAX_BYTES = 8 << 30  # a bound (evicting the least recently used) turns on JAX's lock between runs
OFF = ("off", "none", "false", "no", "0", "")
ON = ("on", "true", "yes", "1")  # the default folder, as no setting
SHORTEST = 32  # the shortest length bucket
LIKELY = 0.5  # a training length bucket is compiled ahead when the run expects this many batches of it
ONE_EVAL_SHAPE = 32  # evaluations of at most this many batches pad them all alike (`eval_lengths`)
# programs are traced one at a time and compiled side by side: traces share one interpreter, so two
# at once both finish late, where one after the other the first asked for is ready first; XLA
# compiles without the interpreter
TRACING = threading.Lock()


_ASSUMING = threading.local()  # .checks: the checks this thread's trace took as passed; None: none may be


@contextlib.contextmanager
def assuming_checks(allowed: bool = True) -> Iterator[list[Future]]:
    """Within it, this thread's traces may take checks still running as passed (`assume`); yields
    the list of those taken so."""
    outer, taken = getattr(_ASSUMING, "checks", None), []
    _ASSUMING.checks = taken if allowed else None
    try:
        yield taken
    finally:
        _ASSUMING.checks = outer


def assume(check: Future) -> bool:
    """A check's result (a kernel's, `fast_path.kernel_works`) for the trace that asks: its result
    if it has ended; if it runs still, True at once where the trace may assume it (`AheadOfTime`'s
    programs: the check's result is read after compiling, and a program that assumed wrong is traced
    again), else its result when it ends. RTE's first runs on an H200 traced the step in 0.45 s
    beside the checks, where waiting for them its trace had taken 1.3-2.4 s."""
    taken = getattr(_ASSUMING, "checks", None)
    if check.done() or taken is None:
        return check.result()
    taken.append(check)
    return True


KEEPER = "keep-program"  # the threads that write the programs kept (`keep_once_checked`)


def keep_once_checked(keep: Callable[[], None], checks: list[Future]) -> None:
    """`keep()` (`TraceCache.load`'s, for a program compiled) in a thread of its own, once the checks
    its trace took as passed have passed: a program traced with a kernel that then failed its check
    is traced again, and only that one is kept. The process ends once the writes under way are done
    (`kept`, at exit)."""
    def run() -> None:
        try:
            passed = all(check.result() for check in checks)
        except Exception:  # noqa: BLE001 -- a check that raised: the program is traced again
            passed = False
        if passed:
            keep()

    # a daemon, so that `cli.exit_now` ends the process at once, after the exit handlers (`kept`)
    threading.Thread(target=run, name=KEEPER, daemon=True).start()


@atexit.register
def kept() -> None:
    """Wait for the programs being written (each is a file renamed whole when done)."""
    for thread in threading.enumerate():
        if thread.name == KEEPER and thread is not threading.current_thread():
            thread.join()


def cache_folder(setting: str | bool | None, env: dict[str, str] | None = None) -> Path | None:
    """The persistent cache's folder: the setting, $BERT_KIT_JAX_CACHE, $JAX_COMPILATION_CACHE_DIR
    or ~/.cache/bert-kit/jax, in that order; None when the first one given says "off" (or false)."""
    env = os.environ if env is None else env
    for value in (_given(setting), env.get(CACHE_VARIABLE), env.get("JAX_COMPILATION_CACHE_DIR")):
        if value is not None:
            return None if str(value).strip().lower() in OFF else Path(value).expanduser()
    return DEFAULT_CACHE.expanduser()


def _given(setting: str | bool | None) -> str | None:
    """The setting as a folder or "off"; None where it names no folder (unset, true, on)."""
    if setting is None or setting is True or (isinstance(setting, str) and setting.strip().lower() in ON):
        return None
    return "off" if setting is False else setting


def use_compilation_cache(setting: str | bool | None = None, env: dict[str, str] | None = None) -> Path | None:
    """Keep compiled programs in `cache_folder(setting)` (call before the first compilation);
    returns the folder, None when off. A folder the user gave JAX itself
    ($JAX_COMPILATION_CACHE_DIR, no bert-kit setting) is left as JAX configured it."""
    env = os.environ if env is None else env
    folder = cache_folder(setting, env)
    if folder is None:
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    if _given(setting) is None and env.get(CACHE_VARIABLE) is None:
        if env.get("JAX_COMPILATION_CACHE_DIR") is not None:
            return folder  # the user's JAX cache, as JAX reads it
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"warning: no JAX compilation cache ({folder}: {e.strerror}); every run compiles its programs "
              f"(set jax_cache=FOLDER or {CACHE_VARIABLE})", flush=True)
        return None
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.1)  # quicker ones are not worth a file
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    # a Pallas kernel's Triton code carries the source locations of its operations, by default with
    # the whole Python stack that traced it: the same kernel traced from the training step and from
    # the evaluation (or from a thread compiling ahead) were other programs, missing the cache
    jax.config.update("jax_include_full_tracebacks_in_locations", False)
    if importlib.util.find_spec("filelock") is not None:  # the lock between runs (JAX needs the package)
        jax.config.update("jax_compilation_cache_max_size", CACHE_MAX_BYTES)
    return folder


def kept_traces() -> TraceCache | None:
    """The traced programs kept between runs, beside the compiled ones (`traced/` in the compilation
    cache's folder); None without that cache, or across processes."""
    folder = jax.config.jax_compilation_cache_dir
    if not (jax.config.jax_enable_compilation_cache and folder) or jax.process_count() > 1:
        return None
    return TraceCache(Path(folder) / "traced")


def length_bucket(longest: int, max_length: int) -> int:
    """The padded length of a batch whose longest row has `longest` tokens: the next power of two
    from 32, at most max_length (and never less than the batch)."""
    bucket = max(SHORTEST, 1 << max(0, longest - 1).bit_length())
    return max(longest, min(bucket, max_length))


def likely_buckets(lengths: np.ndarray, batch: int, batches: int, max_length: int) -> list[int]:
    """The length buckets of the training batches a run is likely to meet, likeliest first: those
    of which `batches` random batches of `batch` examples (of these token counts) expect at least
    `LIKELY`. A batch pads to its longest example: P(bucket <= b) = F(b)^batch."""
    buckets = np.array([length_bucket(int(n), max_length) for n in lengths])
    expected = {}
    below = 0.0
    for b in sorted(set(buckets.tolist())):
        share = float((buckets <= b).mean()) ** batch
        expected[b], below = batches * (share - below), share
    return sorted((b for b, n in expected.items() if n >= LIKELY), key=lambda b: -expected[b])


def item_tokens(item: dict) -> int:
    """Tokens of an example's longest sentence (a bi-encoder pair has two, an embedding tuple k
    `texts`): the length it pads to."""
    if "texts" in item:
        return max(len(ids) for ids in item["texts"])
    if "pairs" in item:  # a reranker's group: its (query, candidate) pairs
        return max(item_tokens(pair) for pair in item["pairs"])
    return max(len(v) for k, v in item.items() if k.startswith("input_ids"))


def eval_chunks(items: list[dict], size: int) -> list[list[int]]:
    """The indices of each evaluation batch: the items longest first, `size` at a time (as `Task.outputs`)."""
    order = sorted(range(len(items)), key=lambda i: -item_tokens(items[i]))
    return [order[start:start + size] for start in range(0, len(order), size)]


def eval_lengths(items: list[dict], size: int, max_length: int) -> list[tuple[list[int], int]]:
    """The evaluation's batches (`eval_chunks`) with the length each is padded to: its longest
    example's bucket, or, for an evaluation of at most `ONE_EVAL_SHAPE` batches, the longest batch's:
    one program to compile (and trace, on every run) where a few batches run longer."""
    chunks = eval_chunks(items, size)
    lengths = [length_bucket(item_tokens(items[chunk[0]]), max_length) for chunk in chunks]
    if len(chunks) <= ONE_EVAL_SHAPE:
        lengths = lengths[:1] * len(chunks)
    return list(zip(chunks, lengths))


def compiler_options(platform: str, env: dict[str, str] | None = None, *, autotune: bool = True) -> dict[str, Any]:
    """XLA options for the engine's programs on `platform`. On GPUs: matrix products by cuBLAS
    (`xla_gpu_enable_triton_gemm` off): on an H200 the BERT-base step ran 555.9k tokens/s against
    553.5k with Triton's, and compiled 12 s sooner; RTE's first run compiled for 32.8 s against 61.0 s.
    autotune=False, for programs that run a few times (an evaluation's, a check's, a short
    fine-tune's step): no timing of cuBLAS's algorithms while compiling (`xla_gpu_autotune_level`
    0). Autotuning takes the GPU in turns: three evaluation programs compiled beside the train step
    took 8.5 s each, 1.5 s without.
    XLA_FLAGS naming an option keeps the user's choice."""
    env = os.environ if env is None else env
    if platform != "gpu":
        return {}
    flags = env.get("XLA_FLAGS", "")
    options: dict[str, Any] = {}
    if "xla_gpu_enable_triton_gemm" not in flags:
        options["xla_gpu_enable_triton_gemm"] = False
    if not autotune and "xla_gpu_autotune_level" not in flags:
        options["xla_gpu_autotune_level"] = 0
    return options


def signature(batch: dict[str, Any]) -> tuple:
    """The shapes and dtypes of a batch's arrays (or ShapeDtypeStructs): which program it needs."""
    return tuple((k, tuple(v.shape), str(v.dtype)) for k, v in sorted(batch.items()))


def abstract(tree: Any, shardings: Any = None) -> Any:
    """ShapeDtypeStructs (with shardings) of a pytree of arrays: what a program is compiled for.
    shardings: a tree of the same structure giving each leaf's (for shapes without them: `jax.eval_shape`'s)."""
    if shardings is not None:
        return jax.tree.map(lambda x, sharding: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                            tree, shardings)
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), tree)


def over_leaves(fn: Callable, trees: tuple, flat_out: tuple[bool, ...]) -> Callable:
    """`fn` as a function of the leaves of its first arguments (lists in the structures of `trees`),
    returning the items of its result that `flat_out` marks as their leaves: jit flattens a list in
    C++, an NNX State's Variables in Python (MiniLM's train state: 1-2 ms of the host's time a call).
    The engine keeps the train state as its leaves between steps."""
    defs = [jax.tree.structure(tree) for tree in trees]

    def on_leaves(*args: Any) -> tuple:
        trees = [jax.tree.unflatten(d, leaves) for d, leaves in zip(defs, args)]
        out = fn(*trees, *args[len(defs):])
        return tuple(jax.tree.leaves(x) if flat else x for x, flat in zip(out, flat_out))

    on_leaves.__name__ = on_leaves.__qualname__ = fn.__name__  # the program's name in JAX's logs and the cache
    return on_leaves


class AheadOfTime:
    """The compiled programs of `jax.jit(fn, **jit_options)`, by the signature of the argument at
    `batch_arg`; the other arguments keep their shapes (the train state, the weights). `status`
    shows a line while a call waits for its program. With `traces`, each program's lowered form
    is kept between runs (`trace_cache`): a later run does not trace it again."""

    def __init__(self, fn: Callable, jit_options: dict[str, Any], batch_arg: int, pool: ThreadPoolExecutor,
                 status: Callable[[str], None] = lambda text: None, traces: TraceCache | None = None) -> None:
        self.fn, self.jit_options, self.traces = fn, jit_options, traces
        self.jitted = jax.jit(fn, **jit_options)
        self.batch_arg, self.pool, self.status = batch_arg, pool, status
        self.programs: dict[tuple, Future] = {}
        self.compile_s = 0.0  # seconds spent compiling (or loading from the cache), in any thread
        self.fallback = False  # compiled programs refused the call's arguments: jit's dispatch instead

    def compile(self, args: tuple) -> Any:
        start = time.perf_counter()
        compiled, assumed = self.lower_and_compile(args, assuming=True)
        if not all(check.result() for check in assumed):  # a kernel its check then failed: traced without it
            compiled, _ = self.lower_and_compile(args, assuming=False)
        self.compile_s += time.perf_counter() - start
        return compiled

    def lower_and_compile(self, args: tuple, assuming: bool) -> tuple[Callable, list[Future]]:
        """The program for `args`, and the checks its trace assumed passed (`assume`). Not assuming,
        it is traced again, not read back from the traces kept (whose entry it replaces)."""
        assumed: list[Future] = []

        @contextlib.contextmanager
        def turn() -> Iterator[None]:  # a trace's: one at a time, and the checks it takes as passed noted
            with TRACING, assuming_checks(assuming) as taken:
                try:
                    yield
                finally:
                    assumed.extend(taken)

        traces = self.traces
        found = traces.load(self.fn, self.jit_options, args, assuming, turn) if traces is not None else None
        if found is None:  # no program kept (or none can be): traced here, as every run did
            with turn():  # (again: as another function, which JAX's cache of traces has not seen)
                lowered = (self.jitted if assuming else jax.jit(functools.partial(self.fn), **self.jit_options)) \
                    .lower(*args)
            return lowered.compile(), assumed
        program, keep = found
        if isinstance(program, jax.stages.Lowered):
            program = program.compile()
            keep_once_checked(functools.partial(keep, program), list(assumed))
        return on_trees(program), assumed  # the program kept takes the arguments' leaves

    def ahead(self, *args: Any) -> None:
        """Compile for these arguments (arrays or ShapeDtypeStructs) in a thread, unless done or under way."""
        key = signature(args[self.batch_arg])
        if key not in self.programs:
            self.programs[key] = self.pool.submit(self.compile, abstract(args))

    def __call__(self, *args: Any) -> Any:
        if self.fallback:
            return self.jitted(*args)
        key = signature(args[self.batch_arg])
        future = self.programs.get(key)
        if future is None or future.cancel():  # unknown, or still queued: compiled here, now
            future = self.programs[key] = Future()
            self.status("compiling (first run of these shapes)")
            try:
                future.set_result(self.compile(abstract(args)))
            except Exception as e:  # noqa: BLE001 -- jit's own dispatch tries, and raises a real error
                future.set_exception(e)
            finally:
                self.status("")
        elif not future.done():
            self.status("compiling (first run of these shapes)")
            try:
                future.exception()  # waits
            finally:
                self.status("")
        if future.exception() is not None:  # lowering for the abstract arguments failed
            return self.fall_back(future.exception(), args)
        try:
            return future.result()(*args)
        except (TypeError, ValueError) as e:  # the arguments are checked before anything runs (or is donated)
            return self.fall_back(e, args)

    def fall_back(self, error: BaseException, args: tuple) -> Any:
        """A program compiled ahead that does not take the call's arguments (their types or
        shardings differ from those it was made for): jit's own dispatch compiles what each call
        needs, from then on, after one warning."""
        self.fallback = True
        first = str(error).strip().splitlines()[0][:400] if str(error).strip() else type(error).__name__
        print(f"warning: a program compiled ahead does not take the run's arguments ({type(error).__name__}: "
              f"{first}); compiling at first use instead", file=sys.stderr, flush=True)
        return self.jitted(*args)

    @property
    def count(self) -> int:
        """Programs compiled (or loaded) so far, and under way."""
        return len(self.programs)
